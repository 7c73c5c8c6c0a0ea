"""One tile of a convolution in the blocked layout (NCHW16c on AVX-512, NCHW8c on AVX2), with its fused epilogue.

In the blocked layout a tensor [N, C, H, W] is stored as [N, ceil(C / L), H, W, L] (L = the vector's lanes, the
channels past C zero), so one vector holds L channels of one pixel. The tile computes `mi` output pixels of one
output row (the broadcast side of the outer product: input values at each tap) times `nv` vectors of L output
channels (the vector side: packed weights), so every lane does useful work whatever the image width, which is where
the NCHW kernel (vectors along the image row) loses: 7x7 and 14x14 outputs, 56-wide rows.

The record is the same `ct_tile` as tile.py, with these meanings:
- A: the input pixel under tap 0 of the tile's first pixel (the input, or its zero-padded copy, blocked or NCHW: the
  broadcasts do not care); A_MS: the distance between the tile's pixels (stride * L blocked, stride NCHW); KOFF: per
  k = (ic, kh, kw), the tap's offset from A;
- B: the packed weights of this group of NI channel vectors, [K][NI * L] (zero-padded), rows NI * L apart;
- VOFF[j] = j * L: vector j within a weights row, and within per-channel epilogue inputs;
- COFF[j]: the output offset of vector j of the tile's first pixel; LDC: the stride between pixels (L);
- LANES[j]: the real channels of vector j (the rest are written as zeros, which the next blocked kernel relies on);
- M0 (COUNT): how many tiles of `mi` pixels, side by side in one row, the call computes (0 or 1: one). The next
  tile's pixels start `mi * A_MS` floats further in A and `mi * LDC` further in the outputs.

A depthwise convolution's tile (microkernel/depthwise.py) is one channel vector (nv = 1) of up to
`depthwise_mi` pixels: A is the input vector of the same channels, B the filters [taps][L], KOFF as above, and it
reads the input in place whatever the padding: a border tile's variant takes the range of input positions that
exist, LO <= p < HI (the slots `lo` and `hi`: a_ks and m0 by other names, unused by these tiles), and
reads the rest as zeros. One call
computes ROWS such tiles one above the other (VOFF[1], 0 or 1: one), the next one's input A_ROW floats further
(VOFF[2]) and its outputs C_ROW floats further (VOFF[3]): rows whose kernel rows all lie inside the image, which
share the tap table, the weights and K.

Epilogue inputs: CHANNEL (bias, BatchNorm, SE scale) are vectors at base + VOFF[j]; POSITION (a residual) must be
a blocked tensor of the output's shape, read like the output; SCALAR is broadcast.
"""

from __future__ import annotations

from llvmlite import ir
from onnxopt.codegen.elementwise.lower import emit_body

from ..glue.contract import CT_TILE
from ..microkernel.depthwise import emit_depthwise
from ..microkernel.outer_product import F32, I16, I64, PTR, emit_conv_bf16_dot, emit_outer_product, lane_mask
from ..vmath.irutil import broadcast, masked_load
from ..vmath.isa import set_features
from .tile import (
    CHANNEL,
    POSITION,
    SCALAR,
    SLOT_A,
    SLOT_A_MS,
    SLOT_B,
    SLOT_COFF,
    SLOT_EXTRA,
    SLOT_K,
    SLOT_KOFF,
    SLOT_LANES,
    SLOT_LDC,
    SLOT_OUT,
    SLOT_VOFF,
    TileSpec,
    _slot,
    define_tile_functions,
)

# Other names of ct_tile's slots (codegen/glue/contract.py, CT_TILE's aliases; the C writes them by these names):
SLOT_LO, SLOT_HI = CT_TILE.index("lo"), CT_TILE.index("hi")  # a depthwise border tile's input positions (see above)
SLOT_COUNT = CT_TILE.index("count")  # a convolution tile's number of tiles in a row, one call (0 reads as 1)
# A depthwise tile has one vector (nv = 1), so the other vectors' VOFF slots hold its rows per call (see above).
SLOT_DW_ROWS, SLOT_DW_A_ROW, SLOT_DW_C_ROW = (CT_TILE.index(n) for n in ("dw_rows", "dw_a_row", "dw_c_row"))


def define_blocked_tile_function(module: ir.Module, name: str, spec: TileSpec, mi: int, nv: int,
                                 depthwise: tuple[int, int, int, bool] | None = None) -> ir.Function:
    """`depthwise` = (kw, sw, dw, bounded): the kernel-row loop of microkernel/depthwise.py (one channel vector,
    nv = 1) instead of the outer product, with the input positions bounded by the LO and HI slots when `bounded`;
    the epilogue is the same."""
    lanes = spec.tile.lanes
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), name=name)
    fn.args[0].add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    t = fn.args[0]
    a = _slot(b, t, SLOT_A, PTR)
    a_ms = _slot(b, t, SLOT_A_MS, I64)
    bp = _slot(b, t, SLOT_B, PTR)
    koff = _slot(b, t, SLOT_KOFF, PTR)
    k_count = _slot(b, t, SLOT_K, I64)
    ldc = _slot(b, t, SLOT_LDC, I64)
    voff = [_slot(b, t, SLOT_VOFF + j, I64) for j in range(nv)]
    coff = [_slot(b, t, SLOT_COFF + j, I64) for j in range(nv)]
    masks = [lane_mask(b, _slot(b, t, SLOT_LANES + j, I64), lanes) for j in range(nv)]
    prog = spec.epilogue
    outs = [_slot(b, t, SLOT_OUT + k, PTR) for k in range(len(prog.outputs))]
    extras = [_slot(b, t, SLOT_EXTRA + e, PTR) for e in range(len(prog.inputs) - 1)]

    if depthwise:
        # ROWS tiles one above the other (at least one), A_ROW floats apart in the input and C_ROW in the outputs:
        # the glue's rows whose kernel rows all lie inside the image (compute_exec.c, cb_depthwise_rows).
        kw, sw, dw, bounded = depthwise
        bounds = (_slot(b, t, SLOT_LO, I64), _slot(b, t, SLOT_HI, I64)) if bounded else None
        chan = channel_inputs(b, spec, extras, voff[:nv], masks)
        a_row, c_row = _slot(b, t, SLOT_DW_A_ROW, I64), _slot(b, t, SLOT_DW_C_ROW, I64)

        def one_row(index):
            a_r = b.gep(a, [b.mul(index, a_row)], source_etype=F32)
            acc = [[v] for v in emit_depthwise(b, lanes, mi, kw, sw, dw, a_r, bp, koff,
                                               b.sdiv(k_count, ir.Constant(I64, kw)), bounds)]
            _store_tile(b, spec, mi, nv, acc, extras, chan, ldc, coff, masks, outs, b.mul(index, c_row))

        _repeat(b, _slot(b, t, SLOT_DW_ROWS, I64), one_row, "rows")
        return fn

    # COUNT tiles of mi pixels side by side along the row (at least one): the record is read, the lane masks and
    # the per-channel epilogue inputs loaded once for all of them. One call per tile cost about as much as the K
    # loop of a 1x1 convolution with 16 to 32 input channels (MobileNetV2's expansions).
    chan = channel_inputs(b, spec, extras, voff[:nv], masks)

    def one_tile(index):
        first = b.mul(index, ir.Constant(I64, mi))
        if spec.b_format == "bf16_dot":  # A is bfloat16, K counts pairs (the glue's bfloat16 input copy)
            a_tile = b.gep(a, [b.mul(first, a_ms)], source_etype=I16)
            acc = emit_conv_bf16_dot(b, spec.tile, mi, nv, a_tile, a_ms, bp, koff, k_count, voff,
                                     spec.tile.ni * lanes)
        else:
            a_tile = b.gep(a, [b.mul(first, a_ms)], source_etype=F32)
            acc = emit_outer_product(b, spec.tile, mi, nv, a_tile, a_ms, None, bp, koff, k_count, voff, masks,
                                     a_by_table=True, b_ks=spec.tile.ni * lanes)
        _store_tile(b, spec, mi, nv, acc, extras, chan, ldc, coff, masks, outs, b.mul(first, ldc))

    _repeat(b, _slot(b, t, SLOT_COUNT, I64), one_tile, "tiles")
    return fn


def _repeat(b: ir.IRBuilder, count, body, name: str) -> None:
    """body(index) for index in [0, max(count, 1)), then return."""
    one = ir.Constant(I64, 1)
    count = b.select(b.icmp_signed("<", count, one), one, count)
    entry = b.block
    loop = b.function.append_basic_block(name)
    done = b.function.append_basic_block(name + ".done")
    b.branch(loop)
    b.position_at_end(loop)
    index = b.phi(I64, name=name[:-1])
    index.add_incoming(ir.Constant(I64, 0), entry)
    body(index)
    following = b.add(index, one)
    index.add_incoming(following, b.block)
    b.cbranch(b.icmp_signed("<", following, count), loop, done)
    b.position_at_end(done)
    b.ret_void()


def _store_tile(b: ir.IRBuilder, spec: TileSpec, mi: int, nv: int, acc, extras: list, chan: dict, ldc, coff: list,
                masks: list, outs: list, shift) -> None:
    """The epilogue and stores of one tile whose first pixel is `shift` floats past the record's outputs."""
    for i in range(mi):
        pix = b.add(shift, b.mul(ir.Constant(I64, i), ldc))
        for j in range(nv):
            store_epilogue(b, spec, acc[i][j], extras, {e: v[j] for e, v in chan.items()}, b.add(pix, coff[j]),
                           masks[j], outs)


def channel_inputs(b: ir.IRBuilder, spec: TileSpec, extras: list, offsets: list, masks: list) -> dict[int, list]:
    """The epilogue inputs that are the same for every pixel, per output vector j: CHANNEL ones (bias, BatchNorm,
    SE scale) loaded at extras[e] + offsets[j] under the vector's lane mask, SCALAR ones broadcast. Loaded once, before
    the pixels."""
    lanes = spec.tile.lanes
    vty = ir.VectorType(F32, lanes)
    chan = {}
    for e, kind in enumerate(spec.extra_kinds):
        if kind == CHANNEL:
            chan[e] = [masked_load(b, b.gep(extras[e], [off], source_etype=F32), vty, mask, 4)
                       for off, mask in zip(offsets, masks)]
        elif kind == SCALAR:
            chan[e] = [broadcast(b, b.load(extras[e], typ=F32), lanes)] * len(offsets)
        elif kind != POSITION:
            raise ValueError("a blocked convolution's epilogue inputs are per channel, per pixel or scalars")
    return chan


def store_epilogue(b: ir.IRBuilder, spec: TileSpec, acc, extras: list, chan: dict, pos, mask, outs: list) -> None:
    """One output vector of a blocked convolution: the epilogue on the accumulator `acc` (POSITION inputs read at
    `pos`, like the outputs; `chan` the vector's channel_inputs) and every output stored at outs[k] + pos."""
    lanes = spec.tile.lanes
    vty = ir.VectorType(F32, lanes)
    prog = spec.epilogue
    values = {prog.inputs[0].name: acc}
    for e, kind in enumerate(spec.extra_kinds):
        name = prog.inputs[e + 1].name
        if kind == POSITION:
            values[name] = b.load(b.gep(extras[e], [pos], source_etype=F32), typ=vty, align=4)
        else:
            values[name] = chan[e]
    emit_body(b, prog, values, lanes)
    zero = ir.Constant(vty, [0.0] * lanes)
    for k, v in enumerate(prog.outputs):
        # Channels past C are stored as exact zeros: the next kernel's packed weights are zero there, and
        # 0 * (inf or NaN from an epilogue on padding) would not be.
        b.store(b.select(mask, values[v.name], zero), b.gep(outs[k], [pos], source_etype=F32), align=4)


def define_blocked_tile_functions(module: ir.Module, prefix: str, spec: TileSpec, features) -> list[list[str]]:
    """All (mi, nv) variants; returns their names as [mi - 1][nv - 1]."""
    return define_tile_functions(module, prefix, spec, features, define=define_blocked_tile_function, tag="b")


def define_depthwise_tile_functions(module: ir.Module, prefix: str, spec: TileSpec, features, mi: int, kw: int,
                                    sw: int, dw: int) -> list[list[str]]:
    """The depthwise tiles of 1..mi pixels (one channel vector each), inside the image and at its border; returns
    their names as [mi - 1][border]. The glue runs them with the register tile (mi, 1)."""
    set_features(module, features)
    names = []
    for m in range(1, mi + 1):
        row = []
        for bounded in (False, True):
            name = f"{prefix}_d{m}" + ("b" if bounded else "")
            define_blocked_tile_function(module, name, spec, m, 1, depthwise=(kw, sw, dw, bounded))
            row.append(name)
        names.append(row)
    return names
