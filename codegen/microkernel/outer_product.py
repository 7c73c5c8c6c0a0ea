"""The outer-product fp32 matmul micro-kernel (Chimera, Algorithm 2), as LLVM IR for any x86 vector width.

    for k in [0, K):
        b[j] = B[k, voff[j] : voff[j] + lanes]                    NI vector loads (masked: tails and edges)
        for each group of MII rows i:
            a[i] = broadcast A[i, k]                              MII broadcasts
            C[i][j] = fma(a[i], b[j], C[i][j])                    MII * NI FMAs

C stays in MI x NI vector registers for the whole K loop. B rows are addressed through a table of element offsets
(`koff[k]`), so one kernel serves a GEMM (koff[k] = k * ldb) and a convolution whose k runs over (ic, kh, kw) taps
of a padded input (koff[k] = the tap's offset); the NI vectors of a row start at per-tile offsets `voff[j]`, which
lets a tile cover one flat run of columns or NI separate output rows. A is read at a_ptr + i * a_ms + k * a_ks:
packed weights ([M/MI][K][MI], a_ms = 1, a_ks = MI) or a row-major matrix.

The broadcasts are `vbroadcastss` from memory (LLVM folds them into the FMA as `{1to16}` in the smaller variants).
The accumulators, the NI B vectors, the broadcasts and, on AVX2, the lane masks fit the register file by
construction (register_tile.py), which the tests check on the generated assembly (no vector stack traffic).
"""

from __future__ import annotations

from llvmlite import ir

from ..vmath.irutil import broadcast, fma, masked_load
from .register_tile import RegisterTile

F32 = ir.FloatType()
I64 = ir.IntType(64)
I32 = ir.IntType(32)
PTR = ir.PointerType()


def as_i64(v) -> ir.Value:
    return v if isinstance(v, ir.Value) else ir.Constant(I64, int(v))


def lane_mask(b: ir.IRBuilder, valid: ir.Value, lanes: int) -> ir.Value:
    """<lanes x i1>: lane l is on when l < valid."""
    # 32-bit lanes: one compare into a mask register (64-bit lanes would take two and a merge).
    idx = ir.Constant(ir.VectorType(I32, lanes), list(range(lanes)))
    return b.icmp_signed("<", idx, broadcast(b, b.trunc(valid, I32), lanes))


def emit_outer_product(b: ir.IRBuilder, tile: RegisterTile, mi: int, nv: int, a_ptr, a_ms, a_ks, b_ptr, koff_ptr,
                       k_count, voff: list, masks: list, a_by_table: bool = False, b_ks=None,
                       b_panel: int = 0, init=None) -> list[list[ir.Value]]:
    """Emit the K loop at the builder's position; returns the accumulators C[i][j] after it (i < mi, j < nv).

    `a_by_table`: the table addresses A instead of B (A[i, k] at a_ptr + i * a_ms + koff[k]) and B rows are
    linear (b_ptr + k * b_ks). This is the blocked-layout convolution, where the broadcasts are input pixels at the
    taps' offsets and the vectors are output channels of the packed weights.

    `b_panel` > 0: B is a constant matrix packed in panels of `b_panel` columns, zero-padded ([K][b_panel] from
    b_ptr): row k at b_ptr + k * b_panel, full loads, no table."""
    lanes = tile.lanes
    vty = ir.VectorType(F32, lanes)
    a_ms = as_i64(a_ms)
    a_ks = None if a_by_table else as_i64(a_ks)

    # Packed B: one pointer per row of A, set before the loop, so the broadcasts' addresses do not hang on a chain
    # of adds inside it.
    a_rows = [b.gep(a_ptr, [b.mul(ir.Constant(I64, i), a_ms)], source_etype=F32) for i in range(mi)] \
        if b_panel else None

    def step(k, acc):
        if b_panel:
            b_row = b.gep(b_ptr, [b.mul(k, ir.Constant(I64, b_panel))], source_etype=F32)
            bvec = [b.load(b.gep(b_row, [voff[j]], source_etype=F32), typ=vty, align=4) for j in range(nv)]
            ka = b.mul(k, a_ks)
            avals = [broadcast(b, b.load(b.gep(a_rows[i], [ka], source_etype=F32), typ=F32), lanes)
                     for i in range(mi)]
            return [[fma(b, avals[i], bvec[j], acc[i][j]) for j in range(nv)] for i in range(mi)]
        table = b.load(b.gep(koff_ptr, [k], source_etype=I64), typ=I64)
        if a_by_table:
            b_row = b.gep(b_ptr, [b.mul(k, as_i64(b_ks))], source_etype=F32)
            a_k = b.gep(a_ptr, [table], source_etype=F32)
            # Packed weights are zero-padded to whole vectors: full loads, no masks.
            bvec = [b.load(b.gep(b_row, [voff[j]], source_etype=F32), typ=vty, align=4) for j in range(nv)]
        else:
            b_row = b.gep(b_ptr, [table], source_etype=F32)
            a_k = b.gep(a_ptr, [b.mul(k, a_ks)], source_etype=F32)
            bvec = [masked_load(b, b.gep(b_row, [voff[j]], source_etype=F32), vty, masks[j], 4) for j in range(nv)]
        return _fma_rows(b, tile, mi, nv, a_k, a_ms, lanes, bvec, acc)

    return emit_k_loop(b, lanes, mi, nv, k_count, step, init)


def _fma_rows(b, tile: RegisterTile, mi: int, nv: int, a_k, a_ms, lanes: int, bvec, acc) -> list[list[ir.Value]]:
    """One k step: MII broadcasts of A at a time, each times the row's B vectors into the accumulators."""
    new_acc = [[None] * nv for _ in range(mi)]
    for g in range(0, mi, tile.mii):
        rows = range(g, min(g + tile.mii, mi))
        avals = {i: broadcast(b, b.load(b.gep(a_k, [b.mul(ir.Constant(I64, i), a_ms)], source_etype=F32),
                                        typ=F32), lanes)
                 for i in rows}
        for i in rows:
            for j in range(nv):
                new_acc[i][j] = fma(b, avals[i], bvec[j], acc[i][j])
    return new_acc


def emit_k_loop(b: ir.IRBuilder, lanes: int, mi: int, nv: int, k_count, step, init=None) -> list[list[ir.Value]]:
    """The loop k in [0, k_count) around mi x nv vector accumulators, `init` (zeros when None) at the start and when
    k_count is 0. `step(k, acc)` emits one iteration's body and returns the new accumulators; returns them after the
    loop."""
    vty = ir.VectorType(F32, lanes)
    zeros = ir.Constant(vty, [0.0] * lanes)
    start = init or [[zeros] * nv for _ in range(mi)]
    k_count = as_i64(k_count)
    fn = b.function
    pre = b.block
    loop = fn.append_basic_block("k.loop")
    body = fn.append_basic_block("k.body")
    done = fn.append_basic_block("k.done")
    b.cbranch(b.icmp_signed(">", k_count, ir.Constant(I64, 0)), loop, done)

    b.position_at_end(loop)
    k = b.phi(I64, name="k")
    k.add_incoming(ir.Constant(I64, 0), pre)
    acc_phis = [[b.phi(vty, name=f"c{i}_{j}") for j in range(nv)] for i in range(mi)]
    for i, row in enumerate(acc_phis):
        for j, p in enumerate(row):
            p.add_incoming(start[i][j], pre)
    b.branch(body)

    b.position_at_end(body)
    new_acc = step(k, acc_phis)
    body_end = b.block
    k_next = b.add(k, ir.Constant(I64, 1))
    for i in range(mi):
        for j in range(nv):
            acc_phis[i][j].add_incoming(new_acc[i][j], body_end)
    k.add_incoming(k_next, body_end)
    b.cbranch(b.icmp_signed("<", k_next, k_count), loop, done)

    b.position_at_end(done)
    result = []
    for i in range(mi):
        row = []
        for j in range(nv):
            p = b.phi(vty, name=f"r{i}_{j}")
            p.add_incoming(start[i][j], pre)
            p.add_incoming(new_acc[i][j], body_end)
            row.append(p)
        result.append(row)
    return result
