"""Vector natural log for float32.

x = m * 2^e with m in [sqrt(1/2), sqrt(2)); log(m) = 2*atanh(s), s = (m-1)/(m+1), |s| <= 0.1716, by the odd series
up to s^11 (truncation error < 1e-9). log(0) = -inf, log(x<0) = NaN, log(inf) = inf, NaN stays NaN. Denormal inputs
are scaled up by 2^23 first so their exponent field is meaningful.
"""

from __future__ import annotations

from llvmlite import ir

from .irutil import fconst, fma, int_vec, polyval


def vlog(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    ivec = int_vec(x)

    def ic(v):
        return ir.Constant(ivec, [v] * ivec.count)

    tiny = b.fcmp_ordered("<", x, fconst(x, 1.1754943508222875e-38))
    xs = b.select(tiny, b.fmul(x, fconst(x, 8388608.0)), x)
    bits = b.bitcast(xs, ivec)
    # Shift by the offset of sqrt(1/2) so m lands in [sqrt(1/2), sqrt(2)).
    off = b.sub(bits, ic(0x3F3504F3))
    e = b.ashr(off, ic(23))
    mbits = b.add(b.and_(off, ic(0x007FFFFF)), ic(0x3F3504F3))
    m = b.bitcast(mbits, x.type)
    ef = b.sitofp(e, x.type)
    ef = b.select(tiny, b.fsub(ef, fconst(x, 23.0)), ef)
    s = b.fdiv(b.fsub(m, fconst(x, 1.0)), b.fadd(m, fconst(x, 1.0)))
    s2 = b.fmul(s, s)
    series = polyval(b, s2, [2.0, 2.0 / 3, 2.0 / 5, 2.0 / 7, 2.0 / 9, 2.0 / 11])
    logm = b.fmul(s, series)
    y = fma(b, ef, fconst(x, 0.6931471805599453), logm)
    # Special values.
    y = b.select(b.fcmp_ordered("==", x, fconst(x, 0.0)), fconst(x, float("-inf")), y)
    y = b.select(b.fcmp_unordered("<", x, fconst(x, 0.0)), fconst(x, float("nan")), y)  # x<0 or NaN
    y = b.select(b.fcmp_ordered("==", x, fconst(x, float("inf"))), x, y)
    return y
