"""The cpu backend's device details in words: what the decode matvecs run, the BLAS library behind prefill,
numba's threading layer."""

from __future__ import annotations

from threadpoolctl import ThreadpoolController

from ...numba_jit import numba
from . import matvec as mv
from .gemm_kquant_int8 import HAS_AVX2
from .kernel_table import AVX2, WIDE


def decode_kernels(vnni: bool, interleaved: bool) -> str:
    """What the decode matvecs run: 512-, 256- or 128-bit int16 kernels, int8 ones by VNNI, rows interleaved."""
    if vnni:
        return "512-bit, int8 activations by vpdpbusd (AVX512-VNNI host)"
    if WIDE:
        wide = "512-bit (AVX-512BW host)"
    else:
        wide = "256-bit for Q4_K and Q6_K_I8 rows, else 128-bit" if AVX2 else "128-bit"
    if not interleaved:
        return wide
    return f"{wide}; Q8_0, Q5_0, Q4_K rows interleaved 16 at a time" + (" (vpdpwssd)" if mv.HAS_VNNI else "")


def blas_label(blas: ThreadpoolController) -> str:
    """The BLAS library and the kernels it runs (OPENBLAS_CORETYPE pins them; unset, OpenBLAS detects them)."""
    libs = [i for i in blas.info() if i.get("user_api") == "blas"]
    return (
        "; ".join(
            f"{i.get('internal_api')} {i.get('version')} {i.get('architecture') or ''}".strip() for i in libs
        )
        or "none loaded"
    )


def threading_layer() -> str:
    try:
        return numba.threading_layer()
    except ValueError:  # no parallel kernel has run yet
        return "not initialized"


def prefill_gemm(choice: str, layouts: list[str]) -> str:
    """What prefill's projections run (``prefill_gemm`` resolved; ``layouts``: the model's layouts the int8
    GEMM reads, e.g. none of Q4_K where the weights were interleaved 16 rows at a time)."""
    if choice == "int8":
        how = "vpmaddubsw" if HAS_AVX2 else "plain integer IR (no AVX2: slow)"
        which = ", ".join(layouts) or "none of this model's"
        return f"int8: {which} weights x int8 activations per 256 values ({how}); other layouts float"
    return "float: weights dequantized to float32, BLAS"
