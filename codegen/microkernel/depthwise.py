"""The depthwise-convolution micro-kernel on channel vectors, as LLVM IR for any x86 vector width.

In the blocked layout one vector holds L channels of one pixel, and a depthwise convolution (one input channel per
output channel) multiplies each input vector by its tap's vector of L filters, lane by lane: no broadcasts and no
reduction across channels. The tile computes MI output pixels of one row for one channel vector, a kernel row at a
time:

    for each kernel row r:
        w[c] = B[(r * kw + c) * L : + L]                          kw filter vectors, in registers for the row
        for each input position p in {i * sw + c * dw}:           every input vector the row's taps read, once
            x = A[koff[r * kw] + p * L : + L]
            C[i] = fma(x, w[c], C[i])  for each (i, c) with i * sw + c * dw == p

Loading each tap's input for each output pixel would take one load per FMA, and a 512-bit load per FMA is all the
load ports of an AVX-512 core that splits zmm loads in two (AMD Zen 4) give: the loop would run at the loads' rate.
Sharing the input vectors between the taps that read them (stride 1: pixel i + c) cuts the loads to
(MI - 1) * sw + (kw - 1) * dw + 1 + kw per MI * kw FMAs, a third of that for a 3x3 at MI = 14. The kernel's width,
stride and dilation along the row are compile-time constants for that (each fused op has its own tiles).

`koff[r * kw]` is the offset of the row's first tap from the tile's first pixel (the glue's tap table, whose next
entries are that row's other taps at c * dw * L: both the input itself and the glue's border windows are rows of
pixels L floats apart). MI accumulators, kw filters and one input vector must fit the register file:
`depthwise_mi` picks MI under that limit.
"""

from __future__ import annotations

from llvmlite import ir

from ..vmath.irutil import broadcast, fma, masked_load
from .outer_product import F32, I64, as_i64, emit_k_loop

DEPTHWISE_MI_MAX = 14  # a 14-wide row (MobileNet's 14x14 stages) in one tile; wider rows in near-equal tiles


def depthwise_mi(registers: int, kw: int, mask_registers: int = 0) -> int:
    """The widest tile whose accumulators, kw filters, one input vector and the epilogue's masks fit `registers`."""
    return max(1, min(DEPTHWISE_MI_MAX, registers - kw - 1 - mask_registers))


def depthwise_mi_for(kernel, kw: int) -> int:
    """`depthwise_mi` on a target's micro-kernel (registry.MicroKernel): its registers, and one lane mask when the
    target keeps masks in vector registers (AVX2)."""
    return depthwise_mi(kernel.registers, kw, int(kernel.masks_in_vector_registers))


def emit_depthwise(b: ir.IRBuilder, lanes: int, mi: int, kw: int, sw: int, dw: int, a_ptr, b_ptr, koff_ptr,
                   rows, bounds=None) -> list[ir.Value]:
    """Emit the kernel-row loop (`rows` iterations) at the builder's position; returns the mi accumulators.

    `bounds` = (lo, hi), runtime i64 values: only input positions lo <= p < hi exist (a tile at the image's left or
    right border under zero padding); the others read as zeros through masked loads, which touch no memory in
    their off lanes. The rows of taps above and below the image are left out by the caller."""
    vty = ir.VectorType(F32, lanes)
    uses: dict[int, list[tuple[int, int]]] = {}
    for i in range(mi):
        for c in range(kw):
            uses.setdefault(i * sw + c * dw, []).append((i, c))

    def step(r, acc):
        k = b.mul(r, ir.Constant(I64, kw))  # the row's first tap
        row = b.gep(a_ptr, [b.load(b.gep(koff_ptr, [k], source_etype=I64), typ=I64)], source_etype=F32)
        w_row = b.gep(b_ptr, [b.mul(k, ir.Constant(I64, lanes))], source_etype=F32)
        # Packed filters are zero-padded to whole vectors: full loads, no masks.
        w = [b.load(b.gep(w_row, [ir.Constant(I64, c * lanes)], source_etype=F32), typ=vty, align=4)
             for c in range(kw)]
        new = [a[0] for a in acc]
        for p in sorted(uses):
            at = b.gep(row, [ir.Constant(I64, p * lanes)], source_etype=F32)
            if bounds is None:
                x = b.load(at, typ=vty, align=4)
            else:
                pos = ir.Constant(I64, p)
                inside = b.and_(b.icmp_signed("<=", bounds[0], pos), b.icmp_signed(">", bounds[1], pos))
                x = masked_load(b, at, vty, broadcast(b, inside, lanes), 4)
            for i, c in uses[p]:
                new[i] = fma(b, x, w[c], new[i])
        return [[v] for v in new]

    acc = emit_k_loop(b, lanes, mi, 1, as_i64(rows), step)
    return [row[0] for row in acc]
