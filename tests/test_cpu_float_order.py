"""The hand-built vector code keeps float sums in the order written (no ``fast`` or ``reassoc`` flags).

numba links a kernel's compiled code into each caller as one shared definition per name; with
reassociation allowed, a copy re-optimized inside another caller summed rows in another order, and which copy
ran depended on what numba's cache held: the same step's logits moved by up to 2.6e-3 between runs (and a
program against its op-by-op run). Each intrinsic is compiled here, uncached, and its LLVM IR read."""

from __future__ import annotations

import re

import pytest
from numba import types

from workbench.backends.numba_cpu import attend_simd, dispatch, dot_int16_128bit, dot_int16_512bit, nm, qsimd
from workbench.numba_jit import numba

FLAGS = "fast|reassoc|nnan|ninf|nsz|arcp|contract|afn"
FLOAT_OP = re.compile(rf"= (fadd|fsub|fmul|fdiv|fneg|call)((?: (?:{FLAGS}))*) ")


def _intrinsics() -> dict[str, object]:
    found = {  # every kernel of the cpu backend's table (kernel_table.KERNELS)
        name: obj
        for name, obj in vars(dispatch).items()
        if re.fullmatch(r"[a-z0-9_]+_q\w+", name) and hasattr(obj, "_defn")
    }
    for f in dot_int16_128bit.BODIES:
        found[f"narrow_{int(f)}"] = dot_int16_128bit.make_dot_i16(f)
    for f in dot_int16_512bit.BODIES:
        found[f"wide_{int(f)}"] = dot_int16_512bit.make_dot_i16_wide(f)
    found["score_keys"], found["weigh_values"] = attend_simd.score_keys, attend_simd.weigh_values
    for kind in nm.VALUE_BYTES:
        found[f"nm_{kind}"] = nm.make_dot_2_4(kind)
    for asym in (False, True):
        for int8 in (False, True):
            found[f"int4_{asym}_{int8}"] = qsimd.make_dot_int4(32, asym, int8)
    return found


INTRINSICS = _intrinsics()


def _compiled_ir(fn) -> str:
    """The LLVM IR of a fresh, uncached function that calls intrinsic ``fn`` with its declared argument types."""
    sig, _ = fn._defn(None, *[types.intp] * (fn._defn.__code__.co_argcount - 1))
    names = [f"a{i}" for i in range(len(sig.args))]
    scope: dict = {"fn": fn}
    exec(f"def call({', '.join(names)}):\n    return fn({', '.join(names)})", scope)
    wrapper = numba.njit(sig.return_type(*sig.args), cache=False)(scope["call"])
    return wrapper.inspect_llvm(wrapper.signatures[0])


def test_the_intrinsics_are_all_found():
    assert len(INTRINSICS) > 30 and {
        "i16_q8_0",
        "i8_q4_k",
        "i16_x16_q4_k_r16",
        "f32_rows8_q6_k",
        "score_keys",
        "wide_8",
    } <= set(INTRINSICS)


@pytest.mark.parametrize("name", sorted(INTRINSICS))
def test_intrinsic_float_math_is_never_reassociated(name):
    ops = [
        (op, flags) for op, flags in FLOAT_OP.findall(_compiled_ir(INTRINSICS[name])) if op != "call" or flags
    ]
    assert ops, "none of the kernel's float math found"
    assert not [f for _, f in ops if "fast" in f or "reassoc" in f]
