"""The int8 convolution tile in LLVM IR: mr output channels x one panel of 16 output pixels, the K loop on a
dot-product instruction of codegen/instructions, then the zero-point terms, the corrections and the epilogue.

    tile_m<mi>(const int64 *t)      t: the qc_tile record of desc.py, filled per call by exec.c
    tile_w<mi>(const int64 *t)      a wide tile (AVX-512, packed form): mi channels x 4 panels of one image

The activations are the instruction's vector operand: exec.c packs each panel's receptive fields (im2col) as
[k4 / 4][16 pixels][4] u8, so one load gives 8 (AVX2) or 16 (AVX-512) pixels their 4 consecutive k. In the implicit
form (stride 1, few output channels: find.py `implicit`) it lays the input out as [c / 4][h + pads][w + pads][4]
instead, and the tile reads a tap's window over 16 pixels of an output row there, 64 contiguous bytes. The weights are
the broadcast operand: a channel's 4 bytes at k are one i32 splat over the lanes (the inspector's broadcast of the
weight along the pixel loop). Rows are output channels and lanes pixels, so the outputs are stored as NCHW rows.

After the K loop, per channel r and pixel p:
    S = acc + d[r] * asum[p] - za * vsum[r] + (the corrections of r's split weight pairs) = sum (a - za)(w - zw)
exactly, where w' = w - 128 for u8 weights and d[r] = 128 - zw[r] (u8 weights) or -zw[r] (s8), vsum[r] = sum
(w - zw). FLOAT runs the program (Cast, the scale, the bias: find.py) on S; QUANT computes
    q = clamp(round_half_even(float(S + bias[r]) * scale[r]) + y_zero, lo, hi)
as onnxruntime's QLinearConv requantizes (scale = x_scale * w_scale[r] / y_scale in float32).

A depthwise convolution has its own tile (define_depthwise_tile): a channel's rows on its padded plane, a product
per tap and pixel, then the same epilogues.
"""

from __future__ import annotations

from llvmlite import ir

from onnxopt.codegen.compile import compile_object, new_module
from onnxopt.codegen.elementwise.lower import emit_body
from onnxopt.codegen.elementwise.types import ONNX_ENUM
from onnxopt.codegen.instructions.tile_program import emulating
from onnxopt.codegen.isa import isa_of
from onnxopt.codegen.microkernel.outer_product import lane_mask
from onnxopt.codegen.target import Target
from onnxopt.codegen.vmath.irutil import (broadcast, for_range, intrinsic, masked_load, masked_store,
                                           record_function)
from onnxopt.kinds.qmatmul.lower import instruction_for, signed_operand

from . import amx
from .desc import QC_MAX_EXTRA, QC_MAX_OUT, QC_TILE, QConvKernelDesc
from .find import TAP_SHIFT
from .params import CHANNEL, PANEL, POSITION, QUANT, SCALAR

F32, I8, I32, I64 = ir.FloatType(), ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
# A tile: p.mr output channels (4 by default; onnxopt/tune/int8_schedule.py times others) x NR s32 accumulators,
# NR activation vectors, one weight splat and temporaries
# qc_tile slots (desc.py, QC_TILE)
(SLOT_W, SLOT_PANEL, SLOT_K4Q, SLOT_AZP, SLOT_M0, SLOT_VSUM, SLOT_DVEC, SLOT_ASUM, SLOT_NCOLS, SLOT_OUT_OFF,
 SLOT_OHW, SLOT_FIX_OFFSETS, SLOT_FIX_ENTRIES, SLOT_CHAN_BASE, SLOT_BIAS, SLOT_SCALE, SLOT_TAPS, SLOT_PLANE4,
 SLOT_CIN4Q) = (QC_TILE.index(n) for n in ("w", "panel", "k4q", "azp", "m0", "vsum", "dvec", "asum", "ncols",
                                            "out_off", "ohw", "fix_offsets", "fix_entries", "chan_base", "bias",
                                            "scale", "taps", "plane4", "cin4q"))
MAX_OUT, MAX_EXTRA = QC_MAX_OUT.value, QC_MAX_EXTRA.value
SLOT_OUT, SLOT_EXTRA, SLOT_EXTRA_COUNT = QC_TILE.index("out"), QC_TILE.index("extra"), QC_TILE.index("extra_count")
# the depthwise tile's slots: the channel's padded input plane, the weights [cout][taps] (int32, less their zero
# point), the padded plane's row length, the output rows [y0, y1) and the output's width
SLOT_DW_IN, SLOT_DW_W, SLOT_DW_WP, SLOT_DW_Y0, SLOT_DW_Y1, SLOT_DW_OW = (
    QC_TILE.index(n) for n in ("dw_in", "dw_w", "dw_wp", "dw_y0", "dw_y1", "dw_ow"))
SLOT_LUT = QC_TILE.index("lut")  # QUANT with a tail: the tables (lookup.py)
SLOT_BIAS_REST = QC_TILE.index("bias_rest")  # QUANT: a float bias's part below the sums' step, in output steps


def _corrections(b, acc: list, group_at, offsets, entries, row, nr: int, lanes: int, emit) -> list:
    """A row's accumulators plus its split pairs' residuals: per (group of 4 k, quad of s8 residuals) entry of the
    channel, the panel's activations at `group_at(k)` (the address of k's group: a list, one per panel of a wide
    tile) times the quad, on the instruction (`emit`) as the K loop runs the safe weights."""
    acc_t = acc[0].type
    src_t = ir.VectorType(I8, 4 * lanes)
    lo = b.sext(b.load(b.gep(offsets, [row], source_etype=I32), typ=I32), I64)
    hi = b.sext(b.load(b.gep(offsets, [b.add(row, ir.Constant(I64, 1))], source_etype=I32), typ=I32), I64)

    def entry(e, carried):
        k = b.load(b.gep(entries, [b.mul(e, ir.Constant(I64, 2))], source_etype=I32), typ=I32)
        quad = b.load(b.gep(entries, [b.add(b.mul(e, ir.Constant(I64, 2)), ir.Constant(I64, 1))], source_etype=I32),
                      typ=I32)
        at = group_at(b.sext(k, I64))
        at = at if isinstance(at, list) else [at]
        per = nr // len(at)
        wv = b.bitcast(broadcast(b, quad, lanes), src_t)
        return [emit(b, carried[j], b.load(b.gep(at[j // per], [ir.Constant(I64, j % per * lanes * 4)],
                                                 source_etype=I8), typ=src_t, align=4), wv) for j in range(nr)]

    assert acc_t.count == lanes
    return for_range(b, lo, hi, ir.Constant(I64, 1), entry, acc)


def k_group(b, emit, wrows: list, act, g, acc: list, lanes: int, nr: int) -> list:
    """One group of 4 along K: the 16 pixels' 4 bytes at `act` (a list: one per panel of a wide tile), the
    weights' at group g of each row in `wrows`."""
    src_t = ir.VectorType(I8, 4 * lanes)
    acts = act if isinstance(act, list) else [act]
    per = nr // len(acts)
    av = [b.load(b.gep(acts[j // per], [ir.Constant(I64, j % per * lanes * 4)], source_etype=I8), typ=src_t, align=4)
          for j in range(nr)]
    out = list(acc)
    for i, wrow in enumerate(wrows):
        quad = b.load(b.gep(wrow, [b.mul(g, ir.Constant(I64, 4))], source_etype=I8), typ=I32, align=1)
        wv = b.bitcast(broadcast(b, quad, lanes), src_t)
        for j in range(nr):
            out[i * nr + j] = emit(b, acc[i * nr + j], av[j], wv)
    return out


# Wide tiles: WIDE_PANELS panels of consecutive pixels of one image (packed K * PANEL bytes apart) by up to
# WIDE_ROWS channels, on a 16-lane target, in the packed (im2col) form: as the qmatmul kind's (kinds/qmatmul/lower.py),
# since one panel's tile keeps only mr dot products in flight on AVX-512 (17-35% of the int8 peak, measured).
WIDE_PANELS, WIDE_ROWS = 4, 6


def wide_shape(lanes: int, params) -> tuple[int, int] | None:
    """(panels, channels) of the wide tiles, or None: fewer than 16 lanes, or the implicit or depthwise form."""
    if lanes != PANEL or params.implicit or params.depthwise:
        return None
    return WIDE_PANELS, WIDE_ROWS


def define_tile(module: ir.Module, name: str, params, program, emit, lanes: int, mi: int, nr: int = 0,
                panels: int = 1) -> None:
    """mi output channels x one panel on the instruction `emit` (codegen/instructions), whose activation operand
    exec.c packs with the instruction's signedness; `nr`: the vectors of pixels it computes, the panel's PANEL //
    lanes by default (a half tile, half that, reads and writes only the panel's first PANEL / 2 pixels);
    `panels`: side by side (a wide tile: wide_shape), their pixels consecutive."""
    nr = nr or panels * PANEL // lanes
    b, slot = record_function(module, name)
    w, panel, k4q, m0 = slot(SLOT_W, PTR), slot(SLOT_PANEL, PTR), slot(SLOT_K4Q), slot(SLOT_M0)
    acc_t = ir.VectorType(I32, lanes)
    k4 = b.mul(k4q, ir.Constant(I64, 4))
    rows = [b.add(m0, ir.Constant(I64, i)) for i in range(mi)]
    wrows = [b.gep(w, [b.mul(r, k4)], source_etype=I8) for r in rows]
    zero = ir.Constant(acc_t, [0] * lanes)

    def step(act, g, acc):
        return k_group(b, emit, wrows, act, g, acc, lanes, nr)

    one = ir.Constant(I64, 1)
    if params.implicit:
        # Per tap, the panel's window starts at panel[tap] in the channel-grouped input, whose groups are plane4
        # bytes apart; the K loop takes a group's taps one after another (rows of the window in L1), the weights'
        # groups in that order (find.py pack, group_major).
        taps, plane4, cin4q = slot(SLOT_TAPS), slot(SLOT_PLANE4), slot(SLOT_CIN4Q)

        def tap_at(tap):
            return b.load(b.gep(panel, [tap], source_etype=PTR), typ=PTR)

        def group_loop(c, acc):
            offset = b.mul(c, plane4)
            return for_range(b, ir.Constant(I64, 0), taps, one,
                             lambda tap, a: step(b.gep(tap_at(tap), [offset], source_etype=I8),
                                                 b.add(b.mul(c, taps), tap), a), acc)

        acc = for_range(b, ir.Constant(I64, 0), cin4q, one, group_loop, [zero] * (mi * nr))

        def group_at(k):  # k = tap << TAP_SHIFT | channel (find.py pack)
            tap = b.ashr(k, ir.Constant(I64, TAP_SHIFT))
            c4 = b.ashr(b.and_(k, ir.Constant(I64, (1 << TAP_SHIFT) - 1)), ir.Constant(I64, 2))
            return b.gep(tap_at(tap), [b.mul(c4, plane4)], source_etype=I8)
    else:
        panel_bytes = b.mul(k4q, ir.Constant(I64, PANEL * 4))
        bases = [b.gep(panel, [b.mul(panel_bytes, ir.Constant(I64, q))], source_etype=I8) for q in range(panels)]

        def at_group(g):
            return [b.gep(base, [b.mul(g, ir.Constant(I64, PANEL * 4))], source_etype=I8) for base in bases]

        acc = for_range(b, ir.Constant(I64, 0), k4q, one, lambda g, a: step(at_group(g), g, a), [zero] * (mi * nr))

        def group_at(k):
            return at_group(b.ashr(k, ir.Constant(I64, 2)))
    finish_channels(b, slot, params, program, emit, acc, rows, m0, lanes, nr, group_at)
    b.ret_void()


def finish_channels(b, slot, params, program, emit, acc: list, rows: list, m0, lanes: int, nr: int,
                    group_at) -> None:
    """The sums of len(rows) channels (acc: nr vectors a channel) to outputs: the corrections of split weight
    pairs (`group_at(k)`: the activations of K group k), the zero-point terms, then the requantization or the float
    program, stored (the blocked int8 output from channel m0, a multiple of 4)."""
    mi = len(rows)
    azp, ncols, out_off, ohw = (slot(s) for s in (SLOT_AZP, SLOT_NCOLS, SLOT_OUT_OFF, SLOT_OHW))
    vsum = slot(SLOT_VSUM, PTR)
    acc_t = ir.VectorType(I32, lanes)
    if params.has_fix:
        offsets, entries = slot(SLOT_FIX_OFFSETS, PTR), slot(SLOT_FIX_ENTRIES, PTR)
        for i in range(mi):
            acc[i * nr:(i + 1) * nr] = _corrections(b, acc[i * nr:(i + 1) * nr], group_at, offsets, entries, rows[i],
                                                    nr, lanes, emit)
    za = b.trunc(azp, I32)
    asums = []
    if params.has_asum:
        asum, dvec = slot(SLOT_ASUM, PTR), slot(SLOT_DVEC, PTR)
        asums = [b.load(b.gep(asum, [ir.Constant(I64, j * lanes)], source_etype=I32), typ=acc_t, align=4)
                 for j in range(nr)]
    masks = [lane_mask(b, b.sub(ncols, ir.Constant(I64, j * lanes)), lanes) for j in range(nr)]
    full = b.icmp_signed("==", ncols, ir.Constant(I64, nr * lanes))
    rows_sums = []
    for i in range(mi):
        r = rows[i]
        shift = b.mul(za, b.load(b.gep(vsum, [r], source_etype=I32), typ=I32))
        sums = []
        for j in range(nr):
            s = b.sub(acc[i * nr + j], broadcast(b, shift, lanes))
            if params.has_asum:
                d = b.load(b.gep(dvec, [r], source_etype=I32), typ=I32)
                s = b.add(s, b.mul(broadcast(b, d, lanes), asums[j]))
            sums.append(s)
        if params.int_bias and params.mode != QUANT:
            bias = b.load(b.gep(slot(SLOT_BIAS, PTR), [r], source_etype=I32), typ=I32)
            sums = [b.add(v, broadcast(b, bias, lanes)) for v in sums]
        rows_sums.append(sums)
    if params.mode == QUANT and params.out_blocked:
        _requantize_blocked(b, params, slot, rows, rows_sums, m0, out_off, ohw, masks, full, lanes)
    elif params.mode == QUANT:
        for i in range(mi):
            _requantize(b, params, slot, rows[i], rows_sums[i], b.add(out_off, b.mul(rows[i], ohw)), masks, full,
                        lanes)
    else:
        # A whole panel loads and stores plain vectors; only the last, partial one goes through masks (masked
        # stores are slow on AMD's cores).
        with b.if_else(full) as (then, otherwise):
            with then:
                _float_epilogue(b, params, program, slot, rows, rows_sums, out_off, ohw, None, lanes)
            with otherwise:
                _float_epilogue(b, params, program, slot, rows, rows_sums, out_off, ohw, masks, lanes)


def _float_epilogue(b, params, program, slot, rows, rows_sums, out_off, ohw, masks, lanes: int) -> None:
    """FLOAT's epilogue: the program (Cast, the scale, the bias...) on each row's sums, and the stores; through
    `masks` where given (a partial panel)."""
    nr = len(rows_sums[0])
    fty = ir.VectorType(F32, lanes)
    extras = [slot(SLOT_EXTRA + e, PTR) for e in range(len(params.extra_kinds))]
    counts = [slot(SLOT_EXTRA_COUNT + e) for e in range(len(params.extra_kinds))]
    outs = [slot(SLOT_OUT + k, PTR) for k in range(len(program.outputs))]
    chan_base = slot(SLOT_CHAN_BASE)
    for r, sums in zip(rows, rows_sums):
        row_off = b.add(out_off, b.mul(r, ohw))
        for j in range(nr):
            pos = b.add(row_off, ir.Constant(I64, j * lanes))
            values = {program.inputs[0].name: sums[j]}
            for e, kind in enumerate(params.extra_kinds):
                name = program.inputs[e + 1].name
                if kind == SCALAR:
                    values[name] = broadcast(b, b.load(extras[e], typ=F32), lanes)
                elif kind == CHANNEL:
                    at = b.srem(b.add(chan_base, r), counts[e])
                    values[name] = broadcast(b, b.load(b.gep(extras[e], [at], source_etype=F32), typ=F32), lanes)
                else:
                    assert kind == POSITION
                    ptr = b.gep(extras[e], [b.srem(pos, counts[e])], source_etype=F32)
                    values[name] = masked_load(b, ptr, fty, masks[j], 4) if masks else \
                        b.load(ptr, typ=fty, align=4)
            emit_body(b, program, values, lanes)
            for k, v in enumerate(program.outputs):
                ptr = b.gep(outs[k], [pos], source_etype=F32)
                if masks:
                    masked_store(b, values[v.name], ptr, masks[j], 4)
                else:
                    b.store(values[v.name], b.bitcast(ptr, fty.as_pointer()), align=4)


def _requantized(b, params, slot, r, sums, lanes: int) -> list:
    """QUANT's arithmetic for one channel: float(S + bias) * scale [+ bias_rest], rounded half to even, plus the
    output's zero point, clamped to the range the Relu or Clip leaves (int32 vectors)."""
    bias = b.load(b.gep(slot(SLOT_BIAS, PTR), [r], source_etype=I32), typ=I32)
    scale = b.load(b.gep(slot(SLOT_SCALE, PTR), [r], source_etype=F32), typ=F32)
    rest = b.load(b.gep(slot(SLOT_BIAS_REST, PTR), [r], source_etype=F32), typ=F32) if params.bias_rest else None
    fty, ity = ir.VectorType(F32, lanes), ir.VectorType(I32, lanes)
    lo, hi = (broadcast(b, ir.Constant(I32, v), lanes) for v in params.clamp)
    out = []
    for s in sums:
        x = b.fmul(b.sitofp(b.add(s, broadcast(b, bias, lanes)), fty), broadcast(b, scale, lanes))
        if rest is not None:
            x = b.fadd(x, broadcast(b, rest, lanes))
        q = b.fptosi(intrinsic(b, f"llvm.roundeven.v{lanes}f32", fty, [x]), ity)
        q = b.add(q, broadcast(b, ir.Constant(I32, params.out_zero), lanes))
        q = b.select(b.icmp_signed("<", q, lo), lo, q)
        out.append(b.select(b.icmp_signed(">", q, hi), hi, q))
    if params.lut:  # the tail (lookup.py): channel r's table at the value
        table = b.gep(slot(SLOT_LUT, PTR), [b.mul(r, ir.Constant(I64, 256))], source_etype=I8)
        offset = broadcast(b, ir.Constant(I32, params.lut_offset), lanes)
        out = _table_lookup(b, table, [b.add(q, offset) for q in out], lanes)
    return out


def _table_lookup(b, table, indices: list, lanes: int) -> list:
    """table[index] per lane of each int32 vector of `indices` (values 0..255), as int32 vectors, by the target's
    method (codegen/isa.py TABLE_LOOKUPS, recorded on the module by build)."""
    method = getattr(b.module, "table_lookup", "lanes")
    if method == "permute_bytes":
        return _permuted_lookup(b, table, indices, lanes)
    if method == "gather_dwords" and lanes % 8 == 0:
        return [_gathered_lookup(b, table, index, lanes) for index in indices]
    return [_lane_lookup(b, table, index, lanes) for index in indices]


def _permuted_lookup(b, table, indices: list, lanes: int) -> list:
    """The whole 256-byte table in 4 registers of 64 bytes, the indices packed to bytes, 64 at a time: vpermi2b
    reads entries 0..127 from the first pair and 128..255 from the second by the low 7 bits of each index, and the
    index's top bit picks between them."""
    v64 = ir.VectorType(I8, 64)
    quarters = [b.load(b.gep(table, [ir.Constant(I64, 64 * k)], source_etype=I8), typ=v64, align=1)
                for k in range(4)]
    per = max(1, 64 // lanes)  # index vectors a register of bytes holds
    out = []
    for first in range(0, len(indices), per):
        group = indices[first:first + per]
        joined = group[0]
        for v in group[1:]:  # concatenate: both operands widened to the joined width
            width = joined.type.count
            if width > lanes:
                v = b.shuffle_vector(v, ir.Constant(v.type, None), ir.Constant(
                    ir.VectorType(I32, width), list(range(lanes)) + [lanes] * (width - lanes)))
            joined = b.shuffle_vector(joined, v, ir.Constant(ir.VectorType(I32, width + lanes),
                                                             list(range(width)) + list(range(width, width + lanes))))
        total = joined.type.count
        idx = b.trunc(joined, ir.VectorType(I8, total))
        if total < 64:  # pad with undefined lanes (the undef operand's) to a whole register
            idx = b.shuffle_vector(idx, ir.Constant(idx.type, None),
                                   ir.Constant(ir.VectorType(I32, 64), list(range(total)) + [total] * (64 - total)))
        low = intrinsic(b, "llvm.x86.avx512.vpermi2var.qi.512", v64, [quarters[0], idx, quarters[1]])
        high = intrinsic(b, "llvm.x86.avx512.vpermi2var.qi.512", v64, [quarters[2], idx, quarters[3]])
        looked = b.select(b.icmp_signed("<", idx, ir.Constant(v64, [0] * 64)), high, low)
        for n in range(len(group)):
            part = b.shuffle_vector(looked, ir.Constant(v64, None), ir.Constant(
                ir.VectorType(I32, lanes), list(range(n * lanes, (n + 1) * lanes))))
            out.append(b.zext(part, ir.VectorType(I32, lanes)))
    return out


def _gathered_lookup(b, table, index, lanes: int):
    """AVX2's gather of a dword at each byte offset (the tables have 4 bytes of slack past their end), the low byte
    kept."""
    ity = ir.VectorType(I32, lanes)
    v8 = ir.VectorType(I32, 8)
    parts = []
    for h in range(lanes // 8):
        sub = index if lanes == 8 else b.shuffle_vector(index, ir.Constant(ity, None),
                                                         ir.Constant(v8, list(range(8 * h, 8 * h + 8))))
        parts.append(intrinsic(b, "llvm.x86.avx2.gather.d.d.256", v8,
                               [ir.Constant(v8, [0] * 8), table, sub, ir.Constant(v8, [-1] * 8),
                                ir.Constant(I8, 1)]))
    v = parts[0]
    for h in range(1, len(parts)):
        v = b.shuffle_vector(v, parts[h], ir.Constant(ir.VectorType(I32, 8 * (h + 1)), list(range(8 * (h + 1)))))
    return b.and_(v, broadcast(b, ir.Constant(I32, 255), lanes))


def _lane_lookup(b, table, index, lanes: int):
    """A load a lane (a CPU with neither)."""
    ity = ir.VectorType(I32, lanes)
    v = ir.Constant(ity, [0] * lanes)
    for lane in range(lanes):
        i = b.sext(b.extract_element(index, ir.Constant(I32, lane)), I64)
        v = b.insert_element(v, b.zext(b.load(b.gep(table, [i], source_etype=I8), typ=I8), I32),
                             ir.Constant(I32, lane))
    return v


def _requantize_blocked(b, params, slot, rows, rows_sums, m0, out_off, ohw, masks, full, lanes: int) -> None:
    """QUANT's epilogue into the blocked layout (layout.py): per group of 4 channels, a pixel's 4 bytes as one word,
    the rows past the tile's zero (the padding channels of the last group); `ohw` is the bytes between groups and
    m0 a multiple of 4."""
    nr = len(masks)
    ity = ir.VectorType(I32, lanes)
    byte = broadcast(b, ir.Constant(I32, 255), lanes)
    qs = [_requantized(b, params, slot, r, sums, lanes) for r, sums in zip(rows, rows_sums)]
    out = slot(SLOT_OUT, PTR)
    stores = []
    for grp in range(-(-len(rows) // 4)):
        base = b.add(out_off, b.mul(b.add(b.ashr(m0, ir.Constant(I64, 2)), ir.Constant(I64, grp)), ohw))
        for j in range(nr):
            word = None
            for i in range(4 * grp, min(4 * grp + 4, len(rows))):
                v = b.and_(qs[i][j], byte) if params.out_signed else qs[i][j]  # an s8 byte's two's complement
                if i % 4:
                    v = b.shl(v, broadcast(b, ir.Constant(I32, 8 * (i % 4)), lanes))
                word = v if word is None else b.or_(word, v)
            stores.append((b.gep(out, [b.add(base, ir.Constant(I64, j * lanes * 4))], source_etype=I8), word, j))
    with b.if_else(full) as (then, otherwise):
        with then:
            for ptr, word, _ in stores:
                b.store(word, b.bitcast(ptr, ity.as_pointer()), align=4)
        with otherwise:
            for ptr, word, j in stores:
                masked_store(b, word, ptr, masks[j], 4)


def _requantize(b, params, slot, r, sums, row_off, masks, full, lanes: int) -> None:
    """QUANT's epilogue for one channel (_requantized), stored as bytes (the partial panel through a mask)."""
    out = slot(SLOT_OUT, PTR)
    packed = [b.trunc(q, ir.VectorType(I8, lanes)) for q in _requantized(b, params, slot, r, sums, lanes)]

    def store(masked: bool):
        for j, v in enumerate(packed):
            ptr = b.gep(out, [b.add(row_off, ir.Constant(I64, j * lanes))], source_etype=I8)
            if masked:
                masked_store(b, v, ptr, masks[j], 1)
            else:
                b.store(v, b.bitcast(ptr, v.type.as_pointer()), align=1)
        return []

    with b.if_else(full) as (then, otherwise):
        with then:
            store(False)
        with otherwise:
            store(True)


def define_amx_tile(module: ir.Module, name: str, params, program, emit, ins_program, groups: int) -> None:
    """`void name(const int64 *qc_tile)`: 16 x `groups` channels from m0 x one panel through `ins_program` (amx.py),
    then per 4 channels the rest of K on the dot-product instruction `emit` and `finish_channels`."""
    lanes, nr = PANEL, 1
    b, slot = record_function(module, name)
    w, panel, k4q, m0 = slot(SLOT_W, PTR), slot(SLOT_PANEL, PTR), slot(SLOT_K4Q), slot(SLOT_M0)
    k4 = b.mul(k4q, ir.Constant(I64, 4))
    acc_buf = b.alloca(I32, size=ir.Constant(I32, groups * amx.ROWS * PANEL))
    chunks = b.udiv(k4q, ir.Constant(I64, 16))  # 64 bytes of K: 16 groups of 4
    ins_program.emit(b, {"w": w, "panel": panel, "acc": acc_buf}, {"m0": m0, "k4": k4, "chunks": chunks},
                     emulate=emulating())
    acc_t = ir.VectorType(I32, lanes)

    def group_at(k):
        return b.gep(panel, [b.mul(b.ashr(k, ir.Constant(I64, 2)), ir.Constant(I64, PANEL * 4))], source_etype=I8)

    def four_channels(q, _):
        first = b.add(m0, b.mul(q, ir.Constant(I64, 4)))
        rows = [b.add(first, ir.Constant(I64, i)) for i in range(4)]
        wrows = [b.gep(w, [b.mul(r, k4)], source_etype=I8) for r in rows]
        at = b.mul(q, ir.Constant(I64, 4 * PANEL))
        acc = [b.load(b.bitcast(b.gep(acc_buf, [b.add(at, ir.Constant(I64, i * PANEL))]), acc_t.as_pointer()),
                      align=4) for i in range(4)]
        acc = for_range(b, b.mul(chunks, ir.Constant(I64, 16)), k4q, ir.Constant(I64, 1),
                        lambda g, a: k_group(b, emit, wrows, b.gep(panel, [b.mul(g, ir.Constant(I64, PANEL * 4))],
                                                                   source_etype=I8), g, a, lanes, nr), acc)
        finish_channels(b, slot, params, program, emit, acc, rows, first, lanes, nr, group_at)
        return []

    for_range(b, ir.Constant(I64, 0), ir.Constant(I64, 4 * groups), ir.Constant(I64, 1), four_channels)
    b.ret_void()


# The depthwise tile's panels: 1, 2 or 4 vectors of output pixels along a row (up to 64 on AVX-512), the fewest
# that cover the row (exec.c reserves the loads' slack past the planes for the widest).
DW_VECTORS = (1, 2, 4)


def define_depthwise_tile(module: ir.Module, name: str, params, program, lanes: int) -> None:
    """A depthwise convolution's channel m0 (one input channel per output channel), over output rows [y0, y1) in
    panels of 16 pixels: per tap, the panel's activations times the tap's weight into 16 / lanes accumulators, no
    packing and no dot-product instruction (a tap is one product per pixel). exec.c lays the channel's plane out
    padded with the zero point and as float, so that a tap is one multiply-add with a memory operand; exact, as
    |a * w| <= 2^15 and at most 64 taps keep every sum below 2^24. Then S = acc - za * vsum[m0] in int32 and the
    kind's epilogue."""
    b, slot = record_function(module, name)
    kh, kw = params.kernel
    sh, sw = params.strides
    dh, dw = params.dilations
    src, wt, wp = slot(SLOT_DW_IN, PTR), slot(SLOT_DW_W, PTR), slot(SLOT_DW_WP)
    y0, y1, ow = slot(SLOT_DW_Y0), slot(SLOT_DW_Y1), slot(SLOT_DW_OW)
    m0, out_off, ohw, azp = slot(SLOT_M0), slot(SLOT_OUT_OFF), slot(SLOT_OHW), slot(SLOT_AZP)
    fty = ir.VectorType(F32, lanes)
    load_t = ir.VectorType(F32, lanes * sw)
    taps = kh * kw
    weights = [b.sitofp(b.load(b.gep(wt, [b.add(b.mul(m0, ir.Constant(I64, taps)), ir.Constant(I64, t))],
                                     source_etype=I32), typ=I32), F32) for t in range(taps)]
    shift = b.mul(b.trunc(azp, I32), b.load(b.gep(slot(SLOT_VSUM, PTR), [m0], source_etype=I32), typ=I32))
    one = ir.Constant(I64, 1)

    def row(y, _):
        base_row = b.mul(b.mul(y, ir.Constant(I64, sh)), wp)

        def panel(x0, vecs: int):
            """`vecs` vectors of output pixels from x0 on."""
            acc = [ir.Constant(fty, [0.0] * lanes) for _ in range(vecs)]
            for t in range(taps):
                dy, dx = (t // kw) * dh, (t % kw) * dw
                at = b.add(b.add(base_row, b.mul(ir.Constant(I64, dy), wp)),
                           b.add(b.mul(x0, ir.Constant(I64, sw)), ir.Constant(I64, dx)))
                wv = broadcast(b, weights[t], lanes)
                for j in range(vecs):
                    ptr = b.gep(src, [b.add(at, ir.Constant(I64, j * lanes * sw))], source_etype=F32)
                    v = b.load(ptr, typ=load_t, align=4)
                    if sw > 1:
                        v = b.shuffle_vector(v, ir.Constant(load_t, None),
                                             ir.Constant(ir.VectorType(I32, lanes), [k * sw for k in range(lanes)]))
                    # contract: one fused multiply-add; exact either way (integers below 2^24)
                    acc[j] = b.fadd(acc[j], b.fmul(v, wv, flags=("contract",)), flags=("contract",))
            ity = ir.VectorType(I32, lanes)
            sums = [b.sub(b.fptosi(a, ity), broadcast(b, shift, lanes)) for a in acc]
            if params.int_bias and params.mode != QUANT:
                bias = b.load(b.gep(slot(SLOT_BIAS, PTR), [m0], source_etype=I32), typ=I32)
                sums = [b.add(v, broadcast(b, bias, lanes)) for v in sums]
            ncols = b.sub(ow, x0)
            masks = [lane_mask(b, b.sub(ncols, ir.Constant(I64, j * lanes)), lanes) for j in range(vecs)]
            full = b.icmp_signed(">=", ncols, ir.Constant(I64, vecs * lanes))
            at_out = b.add(out_off, b.add(b.mul(y, ow), x0))  # the panel's first pixel in channel 0
            if params.mode == QUANT:
                # A partial panel below the plane's last row stores whole too: its spill lands on the next row's
                # first pixels, which that row writes after it (byte masks are a store a lane).
                spill = b.and_(b.icmp_signed("<", b.add(y, one), y1),
                               b.icmp_signed("<=", b.sub(ir.Constant(I64, vecs * lanes), ncols), ow))
                _requantize(b, params, slot, m0, sums, b.add(at_out, b.mul(m0, ohw)), masks, b.or_(full, spill),
                            lanes)
            else:
                with b.if_else(full) as (then, otherwise):
                    with then:
                        _float_epilogue(b, params, program, slot, [m0], [sums], at_out, ohw, None, lanes)
                    with otherwise:
                        _float_epilogue(b, params, program, slot, [m0], [sums], at_out, ohw, masks, lanes)
            return []

        def panels(vecs: int):
            for_range(b, ir.Constant(I64, 0), ow, ir.Constant(I64, vecs * lanes), lambda x0, _: panel(x0, vecs))

        def widest(options):
            """Panels of the fewest vectors in `options` that cover a row, else of the most: independent
            accumulators hide the multiply-adds' latency, and a short row wastes no more than one vector."""
            if len(options) == 1:
                panels(options[0])
                return
            with b.if_else(b.icmp_signed("<=", ow, ir.Constant(I64, options[0] * lanes))) as (narrow, wide):
                with narrow:
                    panels(options[0])
                with wide:
                    widest(options[1:])

        widest(DW_VECTORS)
        return []

    for_range(b, y0, y1, one, row)
    b.ret_void()


def _short_panels(region, ins) -> bool:
    """Whether half tiles pay: the panel holds two vectors or more, and a row's (the implicit form's) or an image's
    last panel holds PANEL / 2 pixels or fewer, or the shape is not known."""
    p = region.params
    if p.depthwise or ins is None or PANEL // ins.lanes < 2:
        return False
    shape = region.shape or []
    oh, ow = shape[-2:] if len(shape) >= 4 else (None, None)
    if not isinstance(oh, int) or not isinstance(ow, int):
        return True
    last = (ow if p.implicit else oh * ow) % PANEL
    return 0 < last <= PANEL // 2


def build(region, target: Target) -> tuple[bytes, QConvKernelDesc, str]:
    """Returns (object code, the glue's description, LLVM IR text)."""
    p = region.params
    try:
        ins = instruction_for(target)
    except ValueError:
        if not p.depthwise:
            raise
        ins = None  # the depthwise tile needs no dot-product instruction
    module = new_module(target, region.op_type)
    module.table_lookup = isa_of(target).table_lookup  # _table_lookup's method
    names = []
    if p.depthwise:  # its own tile: no dot-product instruction, a product per tap and pixel
        names.append(f"{region.op_type}_dw")
        define_depthwise_tile(module, names[-1], p, region.program, target.vector_bits // 32)
    half = [f"{region.op_type}_h{mi}" for mi in range(1, p.mr + 1)] if _short_panels(region, ins) else []
    for mi in range(1, p.mr + 1):
        if p.depthwise:
            break
        names.append(f"{region.op_type}_m{mi}")
        define_tile(module, names[-1], p, region.program, ins.emit, ins.lanes, mi)
        if half:  # a short panel (7 pixels of a 7 x 7 plane) on half the panel's vectors
            define_tile(module, half[mi - 1], p, region.program, ins.emit, ins.lanes, mi, nr=PANEL // ins.lanes // 2)
    wide = wide_shape(ins.lanes, p) if ins is not None else None
    wide_names = []
    if wide is not None:
        for mi in range(1, wide[1] + 1):
            wide_names.append(f"{region.op_type}_w{mi}")
            define_tile(module, wide_names[-1], p, region.program, ins.emit, ins.lanes, mi, panels=wide[0])
    matrix = amx.instruction(target, p) if ins is not None and not signed_operand(ins) else None
    amx_names = []
    if matrix is not None:
        for groups in range(1, amx.MAX_GROUPS + 1):
            amx_names.append(f"{region.op_type}_amx{groups}")
            define_amx_tile(module, amx_names[-1], p, region.program, ins.emit, amx.program(matrix, groups), groups)
    ir_text = str(module)
    obj = compile_object(ir_text, target, vectorize=False)
    i32 = ONNX_ENUM["int32"]
    act = ONNX_ENUM["int8" if p.act_signed else "uint8"]
    in_types = [act, act, ONNX_ENUM["int8"], i32] + ([i32] if p.depthwise else []) + \
        ([i32] if p.has_asum else []) + ([i32, i32, ONNX_ENUM["int64"], i32] if p.has_fix else [])
    if p.int_bias and p.mode != QUANT:
        in_types.append(i32)
    if p.mode == QUANT:
        in_types += [i32, ONNX_ENUM["float32"]] + ([ONNX_ENUM["float32"]] if p.bias_rest else []) + \
            ([ONNX_ENUM["uint8"]] if p.lut else [])
        out_types = [ONNX_ENUM["int8" if p.out_signed else "uint8"]]
    else:
        in_types += [ONNX_ENUM["float32"]] * len(p.extra_kinds)
        out_types = [ONNX_ENUM["float32"]] * len(region.outputs)
    desc = QConvKernelDesc(op_type=region.op_type, in_types=in_types, out_types=out_types, params=p,
                           mr=1 if p.depthwise else p.mr,
                           tiles=names, instruction=ins.name if ins else "s32 products",
                           packed_signed=ins is not None and signed_operand(ins),
                           half_cols=PANEL // 2 if half else 0, half_tiles=half or None, amx_tiles=amx_names,
                           matrix_instruction=matrix.name if amx_names else "",
                           amx_emulated=bool(amx_names) and emulating(),
                           wide_tiles=wide_names, wide_panels=wide[0] if wide else 0)
    return obj, desc, ir_text
