"""Vector 1/d for float32.

AVX-512: vrcp14ps (relative error < 2^-14) refined by one Newton step, r + r(1 - d r), to ~1 ulp, in three
instructions where vdivps would stall the loop. Elsewhere a plain division. d = 0 gives inf, d = inf gives 0.
"""

from __future__ import annotations

from llvmlite import ir

from .irutil import fconst, fma, intrinsic
from .isa import avx512_f32


def vrecip(b: ir.IRBuilder, d: ir.Value, finite_nonzero: bool = False) -> ir.Value:
    """`finite_nonzero`: the caller guarantees 1 <= |d| < 2^126 (sigmoid, tanh, erf), which skips the special-case fix."""
    if not avx512_f32(b, d):
        return b.fdiv(fconst(d, 1.0), d)
    r0 = intrinsic(b, "llvm.x86.avx512.rcp14.ps.512", d.type,
                   [d, fconst(d, 0.0), ir.Constant(ir.IntType(16), -1)])
    e = fma(b, b.fneg(d), r0, fconst(d, 1.0))
    r1 = fma(b, r0, e, r0)
    if finite_nonzero:
        return r1
    # The Newton step turns rcp(0)=inf and rcp(inf)=0 into NaN; keep the estimate there.
    special = b.fcmp_unordered("uno", r1, r1)
    return b.select(special, r0, r1)
