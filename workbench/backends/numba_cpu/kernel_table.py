"""Which kernel multiplies a weight row of each layout by each kind of activation: one table, one dispatcher.

Every quantized matvec of the cpu backend ends in a call ``kernel(row address, activation..., n_units)``
whose kernel depends on the weight's layout (a GGUF block format, or a layout it is repacked into at load:
``Q6_K_I8``, ``Q5_0_X4``, the 16-row interleaved ``*_R16``) and on the kind of activation. ``KERNELS`` maps
``(layout, kind)`` to the factory that builds it; the kinds are

- ``i16``: one weight row . one activation row of int16 codes (block scales, code sums); 512-bit kernels
  (``dot_int16_512bit``) on AVX-512BW hosts for the formats that have them, 256-bit ones (``dot_int16_256bit``,
  the 128-bit kernels' bits) on other AVX2 hosts with full-width cores, else 128-bit (``dot_int16_128bit``);
- ``i8``: the same with int8 codes, by ``vpdpbusd`` (``dot_int8_vnni``; AVX512-VNNI hosts);
- ``f32``: one weight row . one exact float32 activation row (``simd.make_dot_f32``);
- ``dequant``: the row as float32 values (``simd.make_dequant``);
- ``f32_rows8`` / ``i16_rows8``: one weight row . 8 activation rows, each weight block decoded once
  (``dot_f32_rows8``, ``dot_int16_rows8``: the batched kernels);
- ``i16_x16``: 16 interleaved weight rows . one int16 activation row (``dot_int16_interleaved``).

``python -m workbench.backends.numba_cpu.kernel_table`` writes :mod:`.dispatch` from this table: for each
kind, one compiled function that tests the layout code and calls its kernel over a range of rows. Adding a
layout or a kind is a row here and a regeneration (``tests/test_cpu_kernel_table.py`` checks the file is
current). The dispatcher is a generated source file, not built at import, so numba can cache it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...quant.formats import GGMLType
from .dot_f32_rows8 import ROWS, make_dot_rows_f32
from .dot_int8_vnni import make_dot_vnni
from .dot_int16_128bit import make_dot_i16
from .dot_int16_256bit import BODIES as AVX2_LAYOUTS
from .dot_int16_256bit import make_dot_i16_256, use_256bit_kernels
from .dot_int16_512bit import make_dot_i16_wide, use_wide_kernels
from .dot_int16_interleaved import make_dot_r16
from .dot_int16_rows8 import make_dot_rows_i16
from .simd import Q4_K_R16, Q5_0_R16, Q5_0_X4, Q6_K_I8, Q8_0_R16, make_dequant, make_dot_f32

Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K = (
    int(t) for t in (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)
)
LAYOUT_NAMES = {
    Q8_0: "q8_0", Q4_0: "q4_0", Q5_0: "q5_0", Q4_K: "q4_k", Q5_K: "q5_k", Q6_K: "q6_k",
    Q6_K_I8: "q6_k_i8", Q5_0_X4: "q5_0_x4", Q8_0_R16: "q8_0_r16", Q5_0_R16: "q5_0_r16", Q4_K_R16: "q4_k_r16",
}  # fmt: skip
# AVX-512BW hosts: Q8_0, Q5_0, Q4_K, Q6_K_I8 rows in 512-bit operations; Q5_0_X4 (repacked on such hosts
# only) has only a 512-bit kernel, which compiles and is correct anywhere
WIDE = use_wide_kernels()
# full-width AVX2 hosts: Q4_K and Q6_K_I8 rows in 256-bit operations (the 128-bit kernels' bits)
AVX2 = use_256bit_kernels()


def _i16(f: int) -> Callable:
    """The int16 kernel of layout ``f`` on this host: 512-bit, 256-bit where the layout has one, or 128-bit."""
    if WIDE:
        return make_dot_i16_wide(f)
    return make_dot_i16_256(f) if AVX2 and f in AVX2_LAYOUTS else make_dot_i16(f)


_BLOCK_LAYOUTS = (Q8_0, Q5_0, Q4_K, Q6_K_I8, Q5_0_X4, Q6_K, Q4_0, Q5_K)

KERNELS: dict[tuple[int, str], Callable[[], Callable]] = {
    **{(f, "i16"): (lambda f=f: _i16(f)) for f in (Q8_0, Q5_0, Q4_K, Q6_K_I8)},
    (Q5_0_X4, "i16"): lambda: make_dot_i16_wide(Q5_0_X4),
    **{(f, "i16"): (lambda f=f: make_dot_i16(f)) for f in (Q6_K, Q4_0, Q5_K)},
    **{(f, "i8"): (lambda f=f: make_dot_vnni(f)) for f in (Q8_0, Q5_0_X4, Q4_K, Q6_K_I8)},
    **{(f, "f32"): (lambda f=f: make_dot_f32(f)) for f in _BLOCK_LAYOUTS},
    **{(f, "dequant"): (lambda f=f: make_dequant(f)) for f in _BLOCK_LAYOUTS},
    **{(f, "f32_rows8"): (lambda f=f: make_dot_rows_f32(f, ROWS)) for f in _BLOCK_LAYOUTS},
    **{(f, "i16_rows8"): (lambda f=f: make_dot_rows_i16(f, ROWS)) for f in _BLOCK_LAYOUTS},
    **{(f, "i16_x16"): (lambda f=f: make_dot_r16(f)) for f in (Q8_0_R16, Q5_0_R16, Q4_K_R16)},
}


@dataclass(frozen=True)
class Dispatch:
    """One generated function: ``name(fmt, *params)`` runs ``call`` with the kernel of ``(fmt, kind)``
    (``{k}`` in ``call``); for a layout without one it returns False where ``partial``, else it runs the
    last layout's kernel (callers only pass layouts of the kind)."""

    name: str
    kind: str
    params: str
    call: str
    doc: str
    partial: bool = False


DISPATCHES = (
    Dispatch("dot_rows_i16", "i16", "wa, rb, n_units, r0, r1, q, d, s, out, c0",
             "for n in range(r0, r1):\n    out[c0 + n - r0] = {k}(wa + n * rb, q, d, s, n_units)",
             "out[c0 + i] = row r0 + i . one int16 activation row (codes q, block scales d, code sums s)."),
    Dispatch("dot_rows_i8", "i8", "wa, rb, n_units, r0, r1, q8, d, s, out, c0",
             "for n in range(r0, r1):\n    out[c0 + n - r0] = {k}(wa + n * rb, q8, d, s, n_units)",
             "out[c0 + i] = row r0 + i . one int8 activation row; False for a layout without an int8 kernel.",
             partial=True),
    Dispatch("dot_rows_f32", "f32", "wa, rb, n_units, r0, r1, xp, s, out, c0",
             "for n in range(r0, r1):\n    out[c0 + n - r0] = {k}(wa + n * rb, xp, s, n_units)",
             "out[c0 + i] = row r0 + i . one float32 activation row (at xp; block sums s)."),
    Dispatch("dequant_row", "dequant", "row, out, n_units", "{k}(row, out, n_units)",
             "The weight row at address ``row`` as float32 values at address ``out``."),
    Dispatch("dot_row_f32_rows8", "f32_rows8", "wa, xa, xs, n_units, oa, os", "{k}(wa, xa, xs, n_units, oa, os)",
             "One weight row . 8 float32 activation rows (stride xs) into 8 outputs (stride os)."),
    Dispatch("dot_row_i16_rows8", "i16_rows8", "wa, q, qs, d, s, ds, n_units, oa, os",
             "{k}(wa, q, qs, d, s, ds, n_units, oa, os)",
             "One weight row . 8 int16 activation rows into 8 outputs (stride os)."),
    Dispatch("dot16_i16", "i16_x16", "ga, q, d, s, n_units, oa", "{k}(ga, q, d, s, n_units, oa)",
             "16 interleaved weight rows (their group at ga) . one int16 activation row into 16 floats at oa."),
)  # fmt: skip


def kernel_name(fmt: int, kind: str) -> str:
    return f"{kind}_{LAYOUT_NAMES[fmt]}"


def layouts_of(kind: str) -> list[int]:
    """The layouts with a kernel of ``kind``, in table order."""
    return [f for (f, k) in KERNELS if k == kind]


def build_kernels() -> dict[str, Callable]:
    """Every kernel of the table, by :func:`kernel_name`."""
    return {kernel_name(f, kind): make() for (f, kind), make in KERNELS.items()}


def render() -> str:
    """The source of :mod:`.dispatch`."""
    lines = [
        '"""Generated by ``python -m workbench.backends.numba_cpu.kernel_table`` from its ``KERNELS`` table: do',
        'not edit. One function per activation kind: the layout code picks the kernel (docs in kernel_table)."""',
        "",
        "from __future__ import annotations",
        "",
        "from ...numba_jit import numba",
        "from .kernel_table import build_kernels",
        "",
        "_K = build_kernels()",
    ]
    names = sorted({kernel_name(f, kind) for (f, kind) in KERNELS})
    lines += [f'{n} = _K["{n}"]' for n in names]
    lines += [f"{n.upper()} = {f}" for f, n in sorted(LAYOUT_NAMES.items())]
    for d in DISPATCHES:
        lines += [
            "",
            "",
            '@numba.njit(cache=True, inline="always")',
            f"def {d.name}(fmt, {d.params}):  # pragma: no cover - compiled",
        ]
        lines.append(f'    """{d.doc}"""')
        fmts = layouts_of(d.kind)
        for i, f in enumerate(fmts):
            last = i == len(fmts) - 1 and not d.partial
            head = (
                "else:"
                if last and i
                else ("if" if i == 0 else "elif") + f" fmt == {LAYOUT_NAMES[f].upper()}:"
            )
            lines.append(f"    {head}")
            body = d.call.format(k=kernel_name(f, d.kind)).splitlines()
            lines += [f"        {b}" for b in body]
            if d.partial:
                lines.append("        return True")
        if d.partial:
            lines.append("    return False")
    return "\n".join(lines) + "\n"


DISPATCH_FILE = Path(__file__).with_name("dispatch.py")


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if DISPATCH_FILE.read_text() != text:
            print(f"{DISPATCH_FILE} is out of date: run `python -m {__spec__.name}`", file=sys.stderr)
            return 1
        return 0
    DISPATCH_FILE.write_text(text)
    print(f"wrote {DISPATCH_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
