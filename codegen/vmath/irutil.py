"""Small helpers for writing vector math in llvmlite IR: splatted constants, fma, min/max, bit casts."""

from __future__ import annotations

from llvmlite import ir

F32 = ir.FloatType()
I32 = ir.IntType(32)


def lanes(v: ir.Value) -> int:
    return v.type.count


def splat(ty: ir.VectorType, value) -> ir.Constant:
    return ir.Constant(ty, [value] * ty.count)


def fconst(like: ir.Value, value: float) -> ir.Constant:
    return splat(like.type, float(value))


def intrinsic(b: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
    """Call an overloaded LLVM intrinsic such as llvm.fma.v16f32."""
    module = b.module
    fnty = ir.FunctionType(ret, [a.type for a in args])
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, fnty, name=name)
    return b.call(fn, args)


def suffix(ty: ir.Type) -> str:
    """LLVM's type suffix for overloaded intrinsics: v16f32, f32, v8f64, v16i32..."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{suffix(ty.element)}"
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    if isinstance(ty, ir.IntType):
        return f"i{ty.width}"
    raise TypeError(ty)


def fma(b, x, y, z):
    return intrinsic(b, f"llvm.fma.{suffix(x.type)}", x.type, [x, y, z])


def polyval(b, x, coeffs):
    """Horner: coeffs[0] + x*(coeffs[1] + x*(...)), evaluated with fused multiply-adds."""
    acc = fconst(x, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = fma(b, acc, x, fconst(x, c))
    return acc


def fabs(b, x):
    return intrinsic(b, f"llvm.fabs.{suffix(x.type)}", x.type, [x])


def unary(b, name, x):
    return intrinsic(b, f"llvm.{name}.{suffix(x.type)}", x.type, [x])


def fmin(b, x, y):
    """min(x, y) that returns x when x is NaN (so NaN inputs propagate when x is the data)."""
    return b.select(b.fcmp_ordered(">", x, y), y, x)


def fmax(b, x, y):
    return b.select(b.fcmp_ordered("<", x, y), y, x)


def int_vec(like: ir.Value, width: int = 32) -> ir.VectorType:
    return ir.VectorType(ir.IntType(width), lanes(like))


def is_nan(b, x):
    return b.fcmp_unordered("uno", x, x)
