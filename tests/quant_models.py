"""Tiny models for the quantization / sparsity / eval tests: tests/tiny.py's weights as F32 or Q8_0 GGUF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tiny import TINY, tiny_vocab, tiny_weights

from workbench.models.gguf_writer import write_gguf
from workbench.quant.formats import GGMLType

IDS = list(range(10, 34))


def tiny_model(folder: Path, qtype: str = "F32"):
    """The tiny random model with its matrices stored as ``qtype`` (F32 or Q8_0 blocks)."""
    import gguf

    import workbench as wb

    path = Path(folder) / f"tiny-{qtype}.gguf"
    if not path.exists():
        tensors = {}
        for name, w in tiny_weights().items():
            if w.ndim == 2 and qtype == "Q8_0":
                tensors[name] = (GGMLType.Q8_0, gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0))
            else:
                tensors[name] = (GGMLType.F32, w)
        write_gguf(path, TINY, tensors, tiny_vocab())
    return wb.load(str(path))


def forward_logits(model, backend: str, ids: list[int] = IDS, prefill: int = 16) -> np.ndarray:
    """Logits of a prefill of ``prefill`` tokens (every row) then one decode step per remaining token."""
    import workbench as wb

    e = wb.Engine(model, backend)
    seq = e.new_sequence()
    rows = [e.forward(seq, ids[:prefill], logits="all")]
    rows += [e.forward(seq, [t])[None] for t in ids[prefill:]]
    e.close()
    return np.concatenate(rows)
