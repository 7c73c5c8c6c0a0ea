"""Lowering of each elementwise ONNX op to LLVM IR on vectors.

Every function takes the builder, the argument vectors, their dtypes, the op (for attributes) and returns the
result vector. The semantics follow onnxruntime's CPU kernels, including NaN propagation where they propagate.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from onnxopt.codegen.vmath.erf import verf
from onnxopt.codegen.vmath.exp import vexp
from onnxopt.codegen.vmath.irutil import fabs, fmax, fmin, splat, unary
from onnxopt.codegen.vmath.log import vlog
from onnxopt.codegen.vmath.sigmoid import vsigmoid
from onnxopt.codegen.vmath.tanh import vtanh

from .types import LLVM_SCALAR, is_float, is_signed, vec


def _zero(x):
    return splat(x.type, 0.0 if isinstance(x.type.element, (ir.FloatType, ir.DoubleType)) else 0)


def _k(x, v):
    """A splatted constant of x's type."""
    if isinstance(x.type.element, (ir.FloatType, ir.DoubleType)):
        return splat(x.type, float(v))
    return splat(x.type, int(v))


def _lt(b, dt, x, y):
    if is_float(dt):
        return b.fcmp_ordered("<", x, y)
    return b.icmp_signed("<", x, y) if is_signed(dt) else b.icmp_unsigned("<", x, y)


def _cmp(b, dt, pred, x, y):
    if is_float(dt):
        return b.fcmp_ordered(pred, x, y)
    if dt == "bool" or not is_signed(dt):
        return b.icmp_unsigned(pred, x, y)
    return b.icmp_signed(pred, x, y)


def _arith(fop, iop):
    def lower(b, args, dts, op):
        x, y = args
        return getattr(b, fop)(x, y) if is_float(dts[0]) else getattr(b, iop)(x, y)

    return lower


def _splat_value(v):
    """The one value of a splatted float constant vector, else None."""
    if not isinstance(v, ir.Constant) or not isinstance(v.constant, list):
        return None
    values = {float(c.constant) for c in v.constant}
    return values.pop() if len(values) == 1 else None


def _divide(b, args, dts, op):
    x, y = args
    if not is_float(dts[0]):
        return b.sdiv(x, y)
    # x / c as x * (1/c) when c is a constant whose reciprocal is a normal float32 (GELU's x / sqrt(2)): a multiply
    # instead of a division in every GEMM epilogue, at most one more rounding (onnxruntime's Gelu does the same).
    c = _splat_value(y)
    if c is not None and isinstance(x.type.element, ir.FloatType) and math.isfinite(c) and 2.0 ** -125 < abs(c) < 2.0 ** 125:
        return b.fmul(x, _k(x, float(np.float32(1.0) / np.float32(c))))
    return b.fdiv(x, y)


def _max2(b, dt, x, y):
    return fmax(b, x, y) if is_float(dt) else b.select(_lt(b, dt, x, y), y, x)


def _min2(b, dt, x, y):
    return fmin(b, x, y) if is_float(dt) else b.select(_lt(b, dt, y, x), y, x)


def _variadic(pair):
    def lower(b, args, dts, op):
        acc = args[0]
        for a in args[1:]:
            acc = pair(b, dts[0], acc, a)
        return acc

    return lower


def _neg(b, args, dts, op):
    (x,) = args
    return b.fneg(x) if is_float(dts[0]) else b.sub(_zero(x), x)


def _abs(b, args, dts, op):
    (x,) = args
    if is_float(dts[0]):
        return fabs(b, x)
    if not is_signed(dts[0]):
        return x
    return b.select(b.icmp_signed("<", x, _zero(x)), b.sub(_zero(x), x), x)


def _sign(b, args, dts, op):
    (x,) = args
    pos = _lt(b, dts[0], _zero(x), x)
    neg = _lt(b, dts[0], x, _zero(x))
    r = b.select(pos, _k(x, 1), b.select(neg, _k(x, -1), _zero(x)))
    return b.select(b.fcmp_unordered("uno", x, x), x, r) if is_float(dts[0]) else r


def _relu(b, args, dts, op):
    (x,) = args
    return b.select(_lt(b, dts[0], x, _zero(x)), _zero(x), x)


def _leaky_relu(b, args, dts, op):
    (x,) = args
    alpha = op.attr("alpha", 0.01)
    return b.select(_lt(b, dts[0], x, _zero(x)), b.fmul(x, _k(x, alpha)), x)


def _elu(b, args, dts, op):
    (x,) = args
    alpha = op.attr("alpha", 1.0)
    neg = b.fmul(_k(x, alpha), b.fsub(vexp(b, x), _k(x, 1.0)))
    return b.select(_lt(b, dts[0], x, _zero(x)), neg, x)


def _celu(b, args, dts, op):
    (x,) = args
    alpha = op.attr("alpha", 1.0)
    neg = b.fmul(_k(x, alpha), b.fsub(vexp(b, b.fdiv(x, _k(x, alpha))), _k(x, 1.0)))
    return b.select(_lt(b, dts[0], x, _zero(x)), neg, x)


def _selu(b, args, dts, op):
    (x,) = args
    alpha = op.attr("alpha", 1.67326319217681884765625)
    gamma = op.attr("gamma", 1.05070102214813232421875)
    neg = b.fmul(_k(x, alpha), b.fsub(vexp(b, x), _k(x, 1.0)))
    return b.fmul(_k(x, gamma), b.select(b.fcmp_ordered("<=", x, _zero(x)), neg, x))


def _thresholded_relu(b, args, dts, op):
    (x,) = args
    alpha = op.attr("alpha", 1.0)
    return b.select(b.fcmp_ordered(">", x, _k(x, alpha)), x, _zero(x))


def _clamp01(b, y):
    return fmin(b, fmax(b, y, _zero(y)), _k(y, 1.0))


def _hard_sigmoid(b, args, dts, op):
    (x,) = args
    y = b.fadd(b.fmul(x, _k(x, op.attr("alpha", 0.2))), _k(x, op.attr("beta", 0.5)))
    return _clamp01(b, y)


def _hard_swish(b, args, dts, op):
    (x,) = args
    y = b.fadd(b.fmul(x, _k(x, 1.0 / 6.0)), _k(x, 0.5))
    return b.fmul(x, _clamp01(b, y))


def _softplus_f32(b, x):
    # log(1 + exp(x)) = max(x, 0) + log(1 + exp(-|x|)): never overflows.
    return b.fadd(fmax(b, x, _zero(x)), vlog(b, b.fadd(_k(x, 1.0), vexp(b, b.fneg(fabs(b, x))))))


def _softplus(b, args, dts, op):
    return _softplus_f32(b, args[0])


def _softsign(b, args, dts, op):
    (x,) = args
    return b.fdiv(x, b.fadd(_k(x, 1.0), fabs(b, x)))


def _mish(b, args, dts, op):
    (x,) = args
    return b.fmul(x, vtanh(b, _softplus_f32(b, x)))


def _gelu(b, args, dts, op):
    (x,) = args
    half = b.fmul(x, _k(x, 0.5))
    if op.attr("approximate", "none") == "tanh":
        inner = b.fmul(_k(x, math.sqrt(2.0 / math.pi)), b.fadd(x, b.fmul(_k(x, 0.044715), b.fmul(x, b.fmul(x, x)))))
        return b.fmul(half, b.fadd(_k(x, 1.0), vtanh(b, inner)))
    return b.fmul(half, b.fadd(_k(x, 1.0), verf(b, b.fmul(x, _k(x, 1.0 / math.sqrt(2.0))))))


def _f32_only(fn):
    def lower(b, args, dts, op):
        return fn(b, args[0])

    return lower


def _sqrt(b, args, dts, op):
    return unary(b, "sqrt", args[0])


def _reciprocal(b, args, dts, op):
    (x,) = args
    return b.fdiv(_k(x, 1.0), x)


def _rounding(name):
    def lower(b, args, dts, op):
        return unary(b, name, args[0])

    return lower


def _ipow(b, x, n):
    """x**n for a small integer n by repeated squaring (exact like onnxruntime's std::pow for these cases)."""
    if n == 0:
        return _k(x, 1.0)
    result, base, k = None, x, abs(n)
    while k:
        if k & 1:
            result = base if result is None else b.fmul(result, base)
        k >>= 1
        if k:
            base = b.fmul(base, base)
    return b.fdiv(_k(x, 1.0), result) if n < 0 else result


def _pow(b, args, dts, op):
    x = args[0]
    e = op.attr("exponent")  # the fusion stage only admits Pow with a constant scalar exponent
    if float(e).is_integer() and abs(e) <= 16:
        return _ipow(b, x, int(e))
    if e == 0.5:
        return unary(b, "sqrt", x)
    if dts[0] != "float32":
        raise NotImplementedError("Pow with a fractional exponent is lowered for float32 only")
    return vexp(b, b.fmul(_k(x, e), vlog(b, x)))


def _clip(b, args, dts, op):
    x = args[0]
    dt = dts[0]
    if len(args) > 1 and args[1] is not None:
        lo = args[1]
        x = b.select(_lt(b, dt, x, lo), lo, x)
    if len(args) > 2 and args[2] is not None:
        hi = args[2]
        x = b.select(_lt(b, dt, hi, x), hi, x)
    return x


def _identity(b, args, dts, op):
    return args[0]


def _where(b, args, dts, op):
    c, x, y = args
    return b.select(c, x, y)


def _cast(b, args, dts, op):
    (x,) = args
    src, dst = dts[0], op.dtype
    lanes = x.type.count
    dty = vec(dst, lanes)
    if src == dst:
        return x
    if dst == "bool":
        return b.fcmp_unordered("une", x, _zero(x)) if is_float(src) else b.icmp_unsigned("!=", x, _zero(x))
    if src == "bool":
        return b.uitofp(x, dty) if is_float(dst) else b.zext(x, dty)
    if is_float(src) and is_float(dst):
        return b.fpext(x, dty) if dst == "float64" else b.fptrunc(x, dty)
    if is_float(src):
        from onnxopt.codegen.vmath.irutil import intrinsic, suffix

        name = "llvm.fptosi.sat" if is_signed(dst) else "llvm.fptoui.sat"
        return intrinsic(b, f"{name}.{suffix(dty)}.{suffix(x.type)}", dty, [x])
    if is_float(dst):
        return b.sitofp(x, dty) if is_signed(src) else b.uitofp(x, dty)
    sw, dw = LLVM_SCALAR[src].width, LLVM_SCALAR[dst].width
    if dw < sw:
        return b.trunc(x, dty)
    if dw > sw:
        return b.sext(x, dty) if is_signed(src) else b.zext(x, dty)
    return x


def _to_float(b, x, dt):
    """An int8 or uint8 vector as float32 (exact)."""
    f = vec("float32", x.type.count)
    return b.sitofp(x, f) if is_signed(dt) else b.uitofp(x, f)


def _dequantize(b, args, dts, op):
    """(x - zero point) * scale, as DequantizeLinear: the difference is exact in float32."""
    x, scale, zero_point = args
    return b.fmul(b.fsub(_to_float(b, x, dts[0]), _to_float(b, zero_point, dts[2])), scale)


def _quantize(b, args, dts, op):
    """x / scale (a division, as onnxruntime's quantizer: a multiply by the reciprocal is off by a step at 0.5% of
    values), rounded half to even, plus the zero point, saturated to the type; NaN gives the type's least value."""
    x, scale, zero_point = args
    info = np.iinfo(op.dtype)
    q = b.fadd(unary(b, "roundeven", b.fdiv(x, scale)), _to_float(b, zero_point, dts[2]))
    lo, hi = _k(q, info.min), _k(q, info.max)
    q = b.select(b.fcmp_unordered("<", q, lo), lo, q)  # NaN too
    q = b.select(b.fcmp_ordered(">", q, hi), hi, q)
    ty = vec(op.dtype, x.type.count)
    return b.fptosi(q, ty) if is_signed(op.dtype) else b.fptoui(q, ty)


def _compare(pred):
    def lower(b, args, dts, op):
        return _cmp(b, dts[0], pred, args[0], args[1])

    return lower


def _logic(name):
    def lower(b, args, dts, op):
        return getattr(b, name)(args[0], args[1])

    return lower


def _not(b, args, dts, op):
    return b.not_(args[0])


LOWER = {
    "Add": _arith("fadd", "add"), "Sub": _arith("fsub", "sub"), "Mul": _arith("fmul", "mul"),
    "Div": _divide,
    "Neg": _neg, "Abs": _abs, "Sign": _sign, "Relu": _relu, "LeakyRelu": _leaky_relu, "Elu": _elu,
    "Selu": _selu, "Celu": _celu, "ThresholdedRelu": _thresholded_relu, "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish, "Sigmoid": _f32_only(vsigmoid), "Tanh": _f32_only(vtanh), "Erf": _f32_only(verf),
    "Exp": _f32_only(vexp), "Log": _f32_only(vlog), "Softplus": _softplus, "Softsign": _softsign, "Mish": _mish,
    "Gelu": _gelu, "Sqrt": _sqrt, "Reciprocal": _reciprocal, "Pow": _pow,
    "Floor": _rounding("floor"), "Ceil": _rounding("ceil"), "Round": _rounding("roundeven"),
    "Clip": _clip, "Min": _variadic(_min2), "Max": _variadic(_max2), "Identity": _identity,
    "Where": _where, "Cast": _cast,
    "Equal": _compare("=="), "Less": _compare("<"), "Greater": _compare(">"),
    "LessOrEqual": _compare("<="), "GreaterOrEqual": _compare(">="),
    "Not": _not, "And": _logic("and_"), "Or": _logic("or_"), "Xor": _logic("xor"),
    "DequantizeLinear": _dequantize, "QuantizeLinear": _quantize,
}
