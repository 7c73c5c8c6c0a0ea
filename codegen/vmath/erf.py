"""Vector erf for float32.

|x| < 0.75: the Maclaurin series of erf up to x^19 (relative error < 1e-9 there).
|x| >= 0.75: 1 - t*P(t)*exp(-x^2) with t = 1/(1+p|x|) (Abramowitz & Stegun 7.1.26, absolute error <= 1.5e-7),
sign restored; for |x| > 4, erf is +-1 to float precision.
"""

from __future__ import annotations

import math

from llvmlite import ir

from .exp import vexp
from .irutil import fabs, fconst, is_nan, polyval
from .recip import vrecip

# erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)): coefficients of x*(c0 + c1 x^2 + ...).
_SERIES = [2.0 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(10)]
_AS_P = 0.3275911
_AS_A = [0.0, 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429]


def verf(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    x2 = b.fmul(x, x)
    small = b.fmul(x, polyval(b, x2, _SERIES))
    ax = fabs(b, x)
    t = vrecip(b, b.fadd(fconst(x, 1.0), b.fmul(ax, fconst(x, _AS_P))), finite_nonzero=True)
    poly = polyval(b, t, _AS_A)
    large = b.fsub(fconst(x, 1.0), b.fmul(poly, vexp(b, b.fneg(x2))))
    large = b.select(b.fcmp_ordered(">", ax, fconst(x, 4.0)), fconst(x, 1.0), large)
    neg = b.fcmp_ordered("<", x, fconst(x, 0.0))
    large = b.select(neg, b.fneg(large), large)
    y = b.select(b.fcmp_ordered("<", ax, fconst(x, 0.75)), small, large)
    return b.select(is_nan(b, x), x, y)
