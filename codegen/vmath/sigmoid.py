"""Vector logistic sigmoid for float32: 1 / (1 + exp(-x)).

exp(-x) is clamped below overflow (x >= -88.7 after negation), so 1 + exp(-x) stays finite and the fast reciprocal
applies; for x < -88.7 the true result is below 3e-39 and we return that order of magnitude (or 0). For large x the
result rounds to 1 as it should.
"""

from __future__ import annotations

from llvmlite import ir

from .exp import vexp
from .irutil import fconst
from .recip import vrecip


def vsigmoid(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return vrecip(b, b.fadd(fconst(x, 1.0), vexp(b, b.fneg(x), hi=88.7)), finite_nonzero=True)
