"""Vector exp(x) for float32.

exp(x) = 2^n * exp(r) with n = round(x / ln2) and r = x - n*ln2 (ln2 split in two parts so r is exact to ~1 ulp);
exp(r) on |r| <= ln2/2 by its degree-6 Taylor polynomial (relative error < 1.3e-7 there). 2^n is applied with
vscalefps on AVX-512 (one instruction, handles overflow and underflow); elsewhere by writing n into the exponent
field, split in two factors so results down to the denormals come out right. x is clamped to [-104, hi] first:
with the default hi the result overflows to +inf from 88.73 on; callers that must stay finite (sigmoid) lower hi.
NaN propagates through the arithmetic.
"""

from __future__ import annotations

from llvmlite import ir

from .irutil import fconst, fma, fmax, fmin, int_vec, intrinsic, polyval, unary
from .isa import avx512_f32

_LN2_HI = 0.693145751953125
_LN2_LO = 1.428606765330187045e-06
_LOG2E = 1.4426950408889634
_EXP_POLY = [1.0, 1.0, 0.5, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720]


def vexp(b: ir.IRBuilder, x: ir.Value, hi: float = 88.8) -> ir.Value:
    xc = fmin(b, fmax(b, x, fconst(x, -104.0)), fconst(x, hi))
    n = unary(b, "rint", b.fmul(xc, fconst(x, _LOG2E)))
    r = fma(b, n, fconst(x, -_LN2_HI), xc)
    r = fma(b, n, fconst(x, -_LN2_LO), r)
    p = polyval(b, r, _EXP_POLY)
    if avx512_f32(b, x):
        return intrinsic(b, "llvm.x86.avx512.mask.scalef.ps.512", x.type,
                         [p, n, fconst(x, 0.0), ir.Constant(ir.IntType(16), -1), ir.Constant(ir.IntType(32), 4)])
    ivec = int_vec(x)
    ni = b.fptosi(n, ivec)
    half = b.ashr(ni, ir.Constant(ivec, [1] * ivec.count))
    rest = b.sub(ni, half)
    bias = ir.Constant(ivec, [127] * ivec.count)
    shift = ir.Constant(ivec, [23] * ivec.count)
    s1 = b.bitcast(b.shl(b.add(half, bias), shift), x.type)
    s2 = b.bitcast(b.shl(b.add(rest, bias), shift), x.type)
    return b.fmul(b.fmul(p, s1), s2)


def vexp_nonpositive(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """exp(x) for x <= 0 or NaN (a softmax's s - max): the same reduction and polynomial as `vexp`, without the
    upper clamp and with 2^n written into the exponent in one step (n >= -126 after the clamp at -87); below -87 the
    result is 0 rather than a denormal (at most 1.6e-38, nothing beside the row's largest term, exp(0) = 1). NaN
    propagates. About two thirds of `vexp`'s instructions on AVX2: this runs once per attention score."""
    xc = fmax(b, x, fconst(x, -87.0))
    n = unary(b, "rint", b.fmul(xc, fconst(x, _LOG2E)))
    r = fma(b, n, fconst(x, -_LN2_HI), xc)
    r = fma(b, n, fconst(x, -_LN2_LO), r)
    p = polyval(b, r, _EXP_POLY)
    ivec = int_vec(x)
    scale = b.bitcast(b.shl(b.add(b.fptosi(n, ivec), ir.Constant(ivec, [127] * ivec.count)),
                            ir.Constant(ivec, [23] * ivec.count)), x.type)
    y = b.fmul(p, scale)
    return b.select(b.fcmp_ordered("<", x, fconst(x, -87.0)), fconst(x, 0.0), y)
