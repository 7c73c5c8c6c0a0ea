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

from ..vmath.irutil import broadcast, fma, intrinsic, masked_load, masked_store
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


# A constant B stored in a lower precision (onnxopt/driver/precision.py, fusion/compute.py `lower_packed_b`), read
# by the packed-B tile. Accumulation stays float32 in every format.
#   "bf16_dot": bfloat16 pairs along K, [K/2][panel][2], times A rounded to bfloat16 (round to nearest even) on
#               vdpbf16ps (avx512_bf16): two multiply-adds per lane per instruction.
#   "bf16":     the same pairs widened to float32 in registers (a shift and a mask) and float32 FMAs with A as it
#               is: half the weight bytes, the float32 FMA rate (targets without avx512_bf16).
#   "f16_pairs": float16 in pairs along K as "bf16" is (the layout AMX-FP16's tdpfp16ps reads, K padded to its
#               steps), widened the same way for the rows the tiles do not take. (float16 weights elsewhere are
#               only stored as float16, for the float32 tile: fusion/compute.py `store_weights_f16`.)
B_FORMATS = ("f32", "bf16_dot", "bf16", "f16_pairs")
I16 = ir.IntType(16)
F16 = ir.HalfType()


def emit_packed_b_low_precision(b: ir.IRBuilder, tile: RegisterTile, mi: int, nv: int, a_ptr, a_ms, b_ptr,
                                k_count, voff: list, b_panel: int, b_format: str, init=None) -> list[list[ir.Value]]:
    """The K loop of a packed-B tile whose B is bfloat16 or float16 (`b_format`, B_FORMATS), at the builder's
    position; returns the float32 accumulators. A is row-major (a_ks = 1: the glue packs B only without transA),
    rows a_ms apart. The bfloat16 formats step K two at a time: the glue gives them even K blocks but for the
    last of an odd K, whose pair has a zero row stored for its second k (fusion/compute.py `bfloat16_pairs`)."""
    lanes = tile.lanes
    vty = ir.VectorType(F32, lanes)
    ity = ir.VectorType(I32, lanes)
    a_ms = as_i64(a_ms)
    k_count = as_i64(k_count)
    a_rows = [b.gep(a_ptr, [b.mul(ir.Constant(I64, i), a_ms)], source_etype=F32) for i in range(mi)]

    def b_pairs(kk):
        """The nv vectors of pair kk: lane c holds columns c's (B[2kk, c], B[2kk + 1, c]) as one i32."""
        row = b.gep(b_ptr, [b.mul(kk, ir.Constant(I64, 2 * b_panel))], source_etype=I16)
        return [b.load(b.gep(row, [b.mul(voff[j], ir.Constant(I64, 2))], source_etype=I16), typ=ity, align=4)
                for j in range(nv)]

    if b_format in ("bf16", "f16_pairs"):
        high = ir.Constant(ity, [0xFFFF0000 - (1 << 32)] * lanes)  # the odd k's bf16 is the pair's high half
        shift = ir.Constant(ity, [16] * lanes)
        hty = ir.VectorType(F16, lanes)

        def widen(w, h):
            """Half h of the pair words as float32: bfloat16 by its bits, float16 through vcvtph2ps."""
            if b_format == "bf16":
                return b.bitcast(b.shl(w, shift) if h == 0 else b.and_(w, high), vty)
            half = b.trunc(w if h == 0 else b.lshr(w, shift), ir.VectorType(I16, lanes))
            return b.fpext(b.bitcast(half, hty), vty)

        def step(kk, acc, halves=2):
            words = b_pairs(kk)
            k = b.shl(kk, ir.Constant(I64, 1))
            out = [list(row) for row in acc]
            for h in range(halves):  # the even k's weights are the low halves, the odd k's the high ones
                vecs = [widen(w, h) for w in words]
                at = b.add(k, ir.Constant(I64, h))
                for i in range(mi):
                    a = broadcast(b, b.load(b.gep(a_rows[i], [at], source_etype=F32), typ=F32), lanes)
                    for j in range(nv):
                        out[i][j] = fma(b, a, vecs[j], out[i][j])
            return out

        acc = emit_k_loop(b, lanes, mi, nv, b.lshr(k_count, ir.Constant(I64, 1)), step, init)
        # An odd K's last k: the even half of its pair only (A has no k + 1 to read).
        return _if_then(b, b.trunc(k_count, ir.IntType(1)), acc,
                        lambda: step(b.lshr(k_count, ir.Constant(I64, 1)), acc, halves=1))

    if b_format != "bf16_dot" or lanes != 16:
        raise ValueError(f"B format {b_format!r} on {lanes} lanes: vdpbf16ps takes 16 (avx512_bf16)")
    # A's rows rounded to bfloat16 once per call, into a stack buffer [mi][k_count rounded up to pairs, the odd
    # one's second k zero] that the loop's broadcasts read: per pair, one load per row instead of a load, a
    # conversion and a broadcast.
    stride = b.and_(b.add(k_count, ir.Constant(I64, 1)), ir.Constant(I64, -2))
    a16 = b.alloca(I16, size=b.mul(stride, ir.Constant(I64, mi)))
    round_rows_16bit(b, a_rows, a16, k_count, stride)
    a16_rows = [b.gep(a16, [b.mul(ir.Constant(I64, i), stride)], source_etype=I16) for i in range(mi)]
    dot = "llvm.x86.avx512bf16.dpbf16ps.512"

    def step(kk, acc):
        words = b_pairs(kk)
        k = b.shl(kk, ir.Constant(I64, 1))
        avals = [broadcast(b, b.load(b.gep(a16_rows[i], [k], source_etype=I16), typ=I32, align=4), lanes)
                 for i in range(mi)]
        return [[intrinsic(b, dot, vty, [acc[i][j], avals[i], words[j]]) for j in range(nv)] for i in range(mi)]

    return emit_k_loop(b, lanes, mi, nv, b.lshr(stride, ir.Constant(I64, 1)), step, init)


def emit_conv_bf16_dot(b: ir.IRBuilder, tile: RegisterTile, mi: int, nv: int, a_ptr, a_ms, b_ptr, koff_ptr,
                       pairs, voff: list, b_ks: int) -> list[list[ir.Value]]:
    """The K loop of a blocked convolution in bfloat16 on vdpbf16ps (16 lanes), at the builder's position; returns
    the float32 accumulators. A is the glue's bfloat16 copy of the blocked input: pixel i of pair kk at
    a_ptr + i * a_ms + koff[kk] (bfloat16 elements), where two adjacent input channels of one tap lie side by side,
    so one 32-bit broadcast is the instruction's pair. B is the weights' pairs, [pairs][b_ks][2] bfloat16 (rows
    b_ks columns wide, zero-padded): vector j of pair kk at b_ptr + (kk * b_ks + voff[j]) * 2."""
    if tile.lanes != 16:
        raise ValueError(f"a bfloat16 convolution on {tile.lanes} lanes: vdpbf16ps takes 16 (avx512_bf16)")
    vty = ir.VectorType(F32, 16)
    ity = ir.VectorType(I32, 16)
    a_ms = as_i64(a_ms)
    dot = "llvm.x86.avx512bf16.dpbf16ps.512"
    offsets = [b.mul(ir.Constant(I64, i), a_ms) for i in range(mi)]

    def step(kk, acc):
        table = b.load(b.gep(koff_ptr, [kk], source_etype=I64), typ=I64)
        a_k = b.gep(a_ptr, [table], source_etype=I16)
        row = b.gep(b_ptr, [b.mul(kk, ir.Constant(I64, 2 * b_ks))], source_etype=I16)
        words = [b.load(b.gep(row, [b.mul(voff[j], ir.Constant(I64, 2))], source_etype=I16), typ=ity, align=4)
                 for j in range(nv)]
        out = [[None] * nv for _ in range(mi)]
        for g in range(0, mi, tile.mii):
            rows = range(g, min(g + tile.mii, mi))
            avals = {i: broadcast(b, b.load(b.gep(a_k, [offsets[i]], source_etype=I16), typ=I32, align=2), 16)
                     for i in rows}
            for i in rows:
                for j in range(nv):
                    out[i][j] = intrinsic(b, dot, vty, [acc[i][j], avals[i], words[j]])
        return out

    return emit_k_loop(b, 16, mi, nv, pairs, step)


def _if_then(b: ir.IRBuilder, cond, acc, then) -> list[list[ir.Value]]:
    """The accumulators after `then()` (which emits code and returns new ones) where `cond` holds, else `acc`."""
    pre = b.block
    then_bb = b.function.append_basic_block("k.tail")
    join = b.function.append_basic_block("k.joined")
    b.cbranch(cond, then_bb, join)
    b.position_at_end(then_bb)
    new = then()
    then_end = b.block
    b.branch(join)
    b.position_at_end(join)
    out = []
    for row, new_row in zip(acc, new):
        out.append([])
        for v, w in zip(row, new_row):
            p = b.phi(v.type)
            p.add_incoming(v, pre)
            p.add_incoming(w, then_end)
            out[-1].append(p)
    return out


def to_16bit(b: ir.IRBuilder, x, dtype: str = "bf16"):
    """16 floats as the bits of 16 bfloat16 ("bf16": vcvtneps2bf16) or float16 ("f16": vcvtps2ph) values, rounded
    to nearest even."""
    hty = ir.VectorType(I16, 16)
    if dtype == "bf16":
        return intrinsic(b, "llvm.x86.avx512bf16.cvtneps2bf16.512", hty, [x])
    if dtype == "f16":
        return b.bitcast(b.fptrunc(x, ir.VectorType(F16, 16)), hty)
    raise ValueError(f"no 16-bit rounding to {dtype}")


def round_rows_16bit(b: ir.IRBuilder, a_rows: list, out, k_count, stride, dtype: str = "bf16") -> None:
    """out[i * stride + k] = A[i, k] rounded to `dtype` (to_16bit) for k < k_count, and 0 up to `stride` (k_count
    rounded up to pairs), 16 values per step, the last step masked."""
    vty = ir.VectorType(F32, 16)
    fn = b.function
    pre = b.block
    loop = fn.append_basic_block("a16.loop")
    done = fn.append_basic_block("a16.done")
    b.cbranch(b.icmp_signed(">", stride, ir.Constant(I64, 0)), loop, done)  # zeros alone too (k_count 0)
    b.position_at_end(loop)
    k = b.phi(I64, name="ka")
    k.add_incoming(ir.Constant(I64, 0), pre)
    valid = lane_mask(b, b.sub(k_count, k), 16)  # lanes past k_count load as zeros
    written = lane_mask(b, b.sub(stride, k), 16)
    for i, row in enumerate(a_rows):
        x = masked_load(b, b.gep(row, [k], source_etype=F32), vty, valid, 4)
        h = to_16bit(b, x, dtype)
        dst = b.gep(out, [b.add(b.mul(ir.Constant(I64, i), stride), k)], source_etype=I16)
        masked_store(b, h, dst, written, 2)
    k_next = b.add(k, ir.Constant(I64, 16))
    k.add_incoming(k_next, b.block)
    b.cbranch(b.icmp_signed("<", k_next, stride), loop, done)
    b.position_at_end(done)
