"""NPU ops run through XRT: each op's schedule selects a built design, whose kernel is loaded once.

:class:`XrtOps` is what the ``npu`` backend calls in ``mode=xrt``: the design of a schedule is found where
``mlir/build.py`` put it (:func:`~workbench.backends.npu.designs.artifacts`), loaded as one
:class:`~workbench.backends.npu.xrt.XrtKernel` the first time an op needs it, its inputs packed into the
layouts of the design's runtime sequence (:mod:`workbench.backends.npu.hostside`; each weight packed once
per design into a buffer of its own that stays), run, and its outputs unpacked. Every time returned is the
XrtKernel's measured sync + launch + wait time: ``measured (npu, XRT)``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import hostside
from .designs import MissingDesignsError, artifacts
from .emulator.numerics import quantize_rows_i8
from .schedule import Schedule
from .xrt import XrtKernel

TIMING = "measured (npu, XRT)"


class XrtOps:
    """Designs under ``root`` run on the NPU through pyxrt; ``command()`` is the build command that makes
    the missing ones (the error names it)."""

    def __init__(self, root: str | Path, command: Callable[[], str]):
        self.root, self.command = Path(root), command
        self.kernels: dict[str, XrtKernel] = {}
        self._weights: dict[tuple[str, str], np.ndarray] = {}
        self.measured_s = 0.0

    def missing(self, schedules: list[Schedule]) -> dict[str, str]:
        """``design name -> problem`` for the schedules whose artifacts cannot run (not yet loaded ones)."""
        out = {}
        for s in schedules:
            art = artifacts(s, self.root)
            if art.name not in self.kernels and (why := art.problem(s)):
                out[art.name] = why
        return out

    def _kernel(self, s: Schedule) -> XrtKernel:
        art = artifacts(s, self.root)
        kernel = self.kernels.get(art.name)
        if kernel is None:
            why = art.problem(s)
            if why:
                raise MissingDesignsError({art.name: why}, self.command())
            kernel = self.kernels[art.name] = XrtKernel(art.xclbin, art.insts)
        return kernel

    def _run(
        self, s: Schedule, inputs: list[np.ndarray], output: tuple[int, Any], weight: int | None = None
    ) -> tuple[np.ndarray, float]:
        """Run ``s``'s design on ``inputs`` (``inputs[weight]``: a packed weight, kept in its own buffer);
        its one output buffer holds ``output`` = (count, dtype)."""
        resident = () if weight is None else (weight,)
        (result,), seconds = self._kernel(s).run(inputs, [((output[0],), np.dtype(output[1]))], resident)
        self.measured_s += seconds
        return result, seconds

    def _packed_weight(self, s: Schedule, name: str, weight: Any) -> np.ndarray:
        """The weight ``name`` (NPU format, see :meth:`matmul`) packed for ``s``'s design: converted and packed
        on its first use by that design only."""
        key = (name, artifacts(s, self.root).name)
        packed = self._weights.get(key)
        if packed is None:
            if s.dtype_in == "bf16":
                w, shift = hostside.bf16_bits(weight), None
            else:
                w, shift = weight[0].astype(np.int8), weight[2]  # the kernel reads the shift from B
            if s.op == "gemv":
                packed = hostside.pack_gemv_weight(s, w)
            else:
                packed = hostside.pack_gemm_weight(s, w, shift)
            self._weights[key] = packed
        return packed

    def matmul(self, s: Schedule, x: np.ndarray, name: str, weight: Any) -> tuple[np.ndarray, float]:
        """``x @ W.T`` for the weight ``name`` in NPU format (bf16 values, or int8 values + row scales +
        shift as the emulator holds it)."""
        rows, n_pad = x.shape[0], s.tile["N_pad"]
        w = self._packed_weight(s, name, weight)
        if s.dtype_in == "bf16":
            if s.op == "gemv":
                y, seconds = self._run(s, [w, hostside.bf16_bits(x[0])], (n_pad, np.float32), weight=0)
            else:
                a = hostside.pack_gemm_rows(s, hostside.bf16_bits(x))
                y, seconds = self._run(s, [a, w], (s.tile["M_pad"] * n_pad, np.float32), weight=1)
            return hostside.unpack_matmul(s, y, rows), seconds
        _, w_scale, shift = weight
        xq, x_scale = quantize_rows_i8(x)
        a = hostside.pack_gemm_rows(s, xq)
        c, seconds = self._run(s, [a, w], (s.tile["M_pad"] * n_pad, np.int16), weight=1)
        return hostside.dequantize_i16(hostside.unpack_matmul(s, c, rows), shift, x_scale, w_scale), seconds

    def rmsnorm(self, s: Schedule, x: np.ndarray, w_bf16: np.ndarray) -> tuple[np.ndarray, float]:
        """RMSNorm of the rows of ``x`` (``L`` values each) with the bf16 weight."""
        size = hostside.rowwise_rows(s) * s.problem["L"]
        y, seconds = self._run(s, [hostside.pack_rows(s, x), hostside.bf16_bits(w_bf16)], (size, np.uint16))
        return hostside.unpack_rows(s, y, x.size // s.problem["L"]).reshape(x.shape), seconds

    def attention(
        self,
        s: Schedule,
        q: np.ndarray,
        keys: np.ndarray,
        values: np.ndarray,
        q_pos: np.ndarray,
        k_pos: np.ndarray,
    ) -> tuple[np.ndarray, float]:
        """Attention of ``q`` over the keys: Q and K|V packed, per-split states back, merged on the host."""
        inputs = [hostside.pack_attention_q(s, q, q_pos), hostside.pack_attention_kv(s, keys, values, k_pos)]
        out, seconds = self._run(s, inputs, (hostside.attention_out_size(s), np.float32))
        merged = hostside.merge_splits(*hostside.unpack_attention_states(s, out, q.shape[0]))
        return merged.reshape(q.shape[0], -1).astype(np.float32), seconds
