"""Vector tanh for float32.

|x| < 0.3: odd Taylor polynomial to x^11 (relative error < 1e-8). Otherwise 1 - 2/(exp(2|x|)+1) with the sign put
back. 2|x| is clamped to 40 before the exp (tanh is +-1.0 in float32 from |x| = 9.1 on): the reciprocal of a larger
exp would be a denormal, which costs a microcode assist per instruction (see sigmoid.py).
"""

from __future__ import annotations

from llvmlite import ir

from .exp import vexp
from .irutil import fabs, fconst, fmin, is_nan, polyval
from .recip import vrecip

_TAYLOR = [1.0, -1.0 / 3, 2.0 / 15, -17.0 / 315, 62.0 / 2835, -1382.0 / 155925]


def vtanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    x2 = b.fmul(x, x)
    small = b.fmul(x, polyval(b, x2, _TAYLOR))
    ax = fabs(b, x)
    # exp(2|x|) <= exp(40): finite, which the fast reciprocal needs, and its reciprocal a normal number.
    e = vexp(b, fmin(b, b.fmul(ax, fconst(x, 2.0)), fconst(x, 40.0)))
    big = b.fsub(fconst(x, 1.0), b.fmul(fconst(x, 2.0), vrecip(b, b.fadd(e, fconst(x, 1.0)), finite_nonzero=True)))
    big = b.select(b.fcmp_ordered("<", x, fconst(x, 0.0)), b.fneg(big), big)
    y = b.select(b.fcmp_ordered("<", ax, fconst(x, 0.3)), small, big)
    return b.select(is_nan(b, x), x, y)
