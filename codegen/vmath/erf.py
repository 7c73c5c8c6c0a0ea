"""Vector erf for float32.

One rational function over the whole range: erf(x) = x * P(x^2) / Q(x^2) with x clamped to [-3.92, 3.92] (beyond
it erf rounds to +-1 in float32). P has degree 6 and Q degree 5 in x^2; the coefficients are a weighted
least-squares fit of the relative error on [0, 3.92] (Sanathanan-Koerner iterations), made for this file. The fit
itself is good to 3e-8; evaluated in float32 the error is below 4e-7 relative (tests/codegen/test_vmath_accuracy.py).
One division and eleven fused multiply-adds, where a series for small |x| plus 1 - t P(t) exp(-x^2) for the rest
needed both branches, an exp and a reciprocal: this sits in every GELU epilogue of a transformer's FFN. NaN
propagates through the clamp.
"""

from __future__ import annotations

from llvmlite import ir

from .irutil import fconst, fmax, fmin, polyval

_CLAMP = 3.92
_P = (1.128379225730896, 0.185135617852211, 0.05424398183822632, 0.003838630160316825, 0.0003767572343349457,
      4.609179086401127e-06, -1.2799534765406406e-08)
_Q = (1.0, 0.4974055588245392, 0.11387385427951813, 0.015430056490004063, 0.001301524112932384,
      6.239866343094036e-05)


def verf(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    xc = fmax(b, fmin(b, x, fconst(x, _CLAMP)), fconst(x, -_CLAMP))
    t = b.fmul(xc, xc)
    return b.fmul(xc, b.fdiv(polyval(b, t, _P), polyval(b, t, _Q)))
