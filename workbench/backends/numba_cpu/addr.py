"""Raw addresses in compiled code: typed pointers from integer addresses (weights and caches that kernels
find through address tables), and a prefetch hint."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


def _cast(numba_type, ir_type, addr):
    def codegen(context, b, signature, args):
        return b.inttoptr(args[0], ir.PointerType(ir_type))

    return types.CPointer(numba_type)(addr), codegen


@intrinsic
def f32_ptr(typingctx, addr):
    return _cast(types.float32, ir.FloatType(), addr)


@intrinsic
def i64_ptr(typingctx, addr):
    return _cast(types.int64, ir.IntType(64), addr)


@intrinsic
def i8_ptr(typingctx, addr):
    return _cast(types.int8, ir.IntType(8), addr)


@intrinsic
def u8_ptr(typingctx, addr):
    return _cast(types.uint8, ir.IntType(8), addr)


@intrinsic
def i16_ptr(typingctx, addr):
    return _cast(types.int16, ir.IntType(16), addr)


@intrinsic
def u16_ptr(typingctx, addr):
    return _cast(types.uint16, ir.IntType(16), addr)


@intrinsic
def prefetch(typingctx, addr):
    """Hint the CPU to load the cache line at ``addr`` (``llvm.prefetch``: read, keep in all levels)."""

    def codegen(context, b, signature, args):
        i8p, i32 = ir.PointerType(ir.IntType(8)), ir.IntType(32)
        name = "llvm.prefetch.p0"
        fn = b.module.globals.get(name) or ir.Function(
            b.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), name
        )
        b.call(fn, [b.inttoptr(args[0], i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.none(addr), codegen
