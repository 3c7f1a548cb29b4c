"""Which design each NPU op runs, and where ``mlir/build.py`` puts a design's artifacts.

A design is compiled for fixed shapes, so ops are planned on padded shapes: the token rows of a step
rounded up to a power of two (:func:`token_rows`; 1 stays 1: decode), the keys an attention sees rounded
up to a power of two of at least :data:`MIN_KEY_SLOTS` (:func:`key_slots`). The emulator and the XRT path
both take their schedule from here, and ``mlir/build.py`` builds these same schedules
(:func:`~workbench.backends.npu.iron.model_schedules`), so a run needs a bounded set of designs and each
op finds the one built for it: ``<root>/<design name>/`` with ``final.xclbin``, ``insts.bin`` and the
``schedule.json`` it was generated from (:func:`artifacts`).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base import BackendUnavailableError
from .arch import AieArray
from .schedule import Schedule, matmul_schedule, plan_attention, plan_rowwise

MIN_KEY_SLOTS = 64
DEFAULT_ROOT = Path(__file__).resolve().parents[3] / "mlir" / "build"
XCLBIN, INSTS, SCHEDULE_JSON = "final.xclbin", "insts.bin", "schedule.json"
XCLBIN_MAGIC = b"xclbin2\0"  # the axlf header's first 8 bytes


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def token_rows(n: int) -> int:
    """Rows a design is built for to run ``n`` token rows: the next power of two (1 stays 1)."""
    if n < 1:
        raise ValueError(f"token rows must be >= 1, got {n}")
    return _pow2(n)


def key_slots(n: int) -> int:
    """Keys an attention design is built for to attend over ``n`` keys (padding keys are masked)."""
    return max(MIN_KEY_SLOTS, _pow2(n))


def matmul_design(array: AieArray, rows: int, n_out: int, k_in: int, dtype: str) -> Schedule:
    """The GEMV/GEMM of ``rows`` activation rows times an ``n_out x k_in`` weight."""
    return matmul_schedule(array, token_rows(rows), n_out, k_in, dtype)


def rmsnorm_design(array: AieArray, tokens: int, rows_per_token: int, length: int) -> Schedule:
    """RMSNorm of ``tokens`` x ``rows_per_token`` rows of ``length`` (per-head norms: one row per head)."""
    return plan_rowwise(array, "rmsnorm", token_rows(tokens) * rows_per_token, length)


def attention_design(
    array: AieArray, tokens: int, keys: int, n_heads: int, n_kv_heads: int, head_dim: int, window: int
) -> Schedule:
    """Attention of ``tokens`` queries over ``keys`` keys (bf16)."""
    return plan_attention(
        array, token_rows(tokens), key_slots(keys), n_heads, n_kv_heads, head_dim, window=window
    )


def design_name(s: Schedule) -> str:
    """The name of ``s``'s design: its folder under the build root, its golden file's stem."""
    dims = "x".join(str(v) for v in s.problem.values())
    return f"{s.op}_{s.device}_{s.dtype_in}_{dims}"


def schedule_record(s: Schedule) -> dict[str, Any]:
    """``s`` as ``schedule.json`` holds it (build.py writes it; the runtime compares against it)."""
    return json.loads(json.dumps(s.to_dict(), default=list))


@dataclass(frozen=True)
class Artifacts:
    """The files ``mlir/build.py`` writes for one design."""

    name: str
    folder: Path

    @property
    def xclbin(self) -> Path:
        return self.folder / XCLBIN

    @property
    def insts(self) -> Path:
        return self.folder / INSTS

    @property
    def schedule_json(self) -> Path:
        return self.folder / SCHEDULE_JSON

    def problem(self, s: Schedule) -> str:
        """Why these artifacts cannot run ``s`` ("" when they can): files missing, an xclbin that is not
        one, or a design generated from another schedule (a stale build)."""
        missing = [p.name for p in (self.xclbin, self.insts, self.schedule_json) if not p.exists()]
        if missing:
            return f"missing {', '.join(missing)}"
        with open(self.xclbin, "rb") as f:
            if f.read(len(XCLBIN_MAGIC)) != XCLBIN_MAGIC:
                return f"{self.xclbin} is not an xclbin (no xclbin2 header)"
        try:
            built = json.loads(self.schedule_json.read_text())
        except ValueError as e:
            return f"{self.schedule_json} is not JSON ({e})"
        if built != schedule_record(s):
            return f"built from another schedule than this run plans ({self.schedule_json}): rebuild it"
        return ""


def artifacts(s: Schedule, root: str | Path = DEFAULT_ROOT) -> Artifacts:
    """Where ``mlir/build.py --out root`` puts the artifacts of ``s``'s design."""
    name = design_name(s)
    return Artifacts(name, Path(root) / name)


def build_command(
    model: str, device: str, dtype: str, prompt_tokens: Iterable[int], max_keys: int, root: str | Path
) -> str:
    """The ``mlir/build.py`` command that builds every design a run of ``model`` with these prefill row
    counts and up to ``max_keys`` keys needs (:func:`~workbench.backends.npu.iron.model_schedules`)."""
    script = DEFAULT_ROOT.parent / "build.py"
    args = ["python", str(script), "--model", model, "--device", device, "--dtype", dtype]
    rows = sorted({token_rows(t) for t in prompt_tokens if t > 1})
    if rows:
        args += ["--prompt-tokens", *map(str, rows)]
    args += ["--max-keys", str(max_keys), "--out", str(root)]
    return shlex.join(args)


class MissingDesignsError(BackendUnavailableError):
    """Designs a run needs are not built (or not usable)."""

    def __init__(self, problems: dict[str, str], command: str):
        self.problems, self.command = problems, command
        lines = "\n".join(f"  {name}: {why}" for name, why in sorted(problems.items()))
        super().__init__(
            f"npu backend (mode=xrt): {len(problems)} design(s) this step needs are not built or not usable:\n"
            f"{lines}\nbuild them with mlir-aie installed (see mlir/README.md):\n  {command}"
        )
