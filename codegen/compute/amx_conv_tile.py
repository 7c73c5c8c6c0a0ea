"""A blocked convolution in bfloat16 on AMX tiles (`tdpbf16ps`; `--precision bf16` on an AMX target, issue 46).

The convolution is the GEMM out[pixel, channel] += x[pixel + tap, ic] * w[ic, tap, channel] over K = (ic, tap),
and AMOS's mapper (amx_tile.py `choose`, the same tensor-language GEMM) puts pixels on the tile's rows, output
channels on its columns and 32 input channels of one tap on its reduction. Nothing is copied per tap (no im2col):

- A is the glue's bfloat16 copy of the input in blocks of 32 channels, zero-padded in space and channels,
  [N][ceil(C / 32)][Hp][Wp][32] (conv_blocked_exec.c, cb_copy32_row): one pixel's 32 channels are one 64-byte tile
  row, and the 16 pixels of a tile are `a_ms` bytes apart (the stride times 64), so the tile of tap (r, c) and
  channel block q is one `tileloadd` at a16 + q * plane + r * row + c * col.
- B is the weights as lower_blocked_conv stores them (fusion/layout.py): pairs of input channels, row (pair, tap)
  of [ceil(C / 32) * 16 * taps][NI * 16][2] (an AMX target pads the channels to 32 with zero weights): the 16 pair
  rows of channel block q and tap t are one tile load, rows taps * NI * 64 bytes apart.
- C is 16 pixels x 16 output channels in float32: a vector of the blocked output per pixel. The sums stay in the
  C tiles over all of K (channel blocks, then kernel rows, then columns), are stored once to a stack buffer, and
  take the blocked convolution's epilogue per pixel (blocked_tile.py `store_epilogue`), at the output offsets the
  glue gives per pixel (the `pos` table; a negative one is not stored): a stride-1 convolution's tiles run over
  the padded width, row after row, and the pixels in the padding columns are computed and dropped; a strided one's
  tiles stay in one output row, and of its last call only the first `count` pixels are stored.

The geometry (byte steps of the three K loops, their counts, the weights' steps) is per convolution and per call
the same, so the glue passes it as one table (`geometry`, AMX_GEOMETRY's order). One call computes 16 x `groups`
pixels (1 or 2 groups) of `nv` channel vectors; with two groups the vectors go two at a time (4 C, 2 A and 1 B
tile of the 8). The program runs in the reference interpreter on any host and as plain code in a library built
with ONNXOPT_EMULATE_TILES=1 (tests/codegen/test_amx_conv.py).
"""

from __future__ import annotations

from llvmlite import ir

from onnxopt.codegen.instructions.tile_program import Load, TileProgram, affine
from onnxopt.codegen.vmath.irutil import for_range, when

from ..glue.contract import CT_TILE
from ..microkernel.outer_product import F32, I64, PTR, lane_mask
from .amx_tile import ROWS, define_variants, passes
from .blocked_tile import channel_inputs, store_epilogue
from .tile import SLOT_B, SLOT_COFF, SLOT_EXTRA, SLOT_LANES, SLOT_OUT, TileSpec, _slot

SLOT_A16, SLOT_A_MS = CT_TILE.index("a16"), CT_TILE.index("a_ms")
SLOT_GEOMETRY, SLOT_POS, SLOT_COUNT = CT_TILE.index("geometry"), CT_TILE.index("pos"), CT_TILE.index("count")

# The geometry table's entries, in order (conv_blocked_prepare_exec.c, cb_prepare_amx, fills it): bytes between channel
# blocks, kernel rows and kernel columns of the input copy; their counts; the weights' bytes between channel
# blocks, kernel rows, kernel columns and tile rows (pairs).
AMX_GEOMETRY = ("plane", "row", "col", "blocks", "kh", "kw", "b_block", "b_row", "b_col", "b_stride")


def program(ins, groups: int, nv: int) -> TileProgram:
    """16 x `groups` pixels (`a_ms` bytes apart from `a16`) times `nv` 16-channel vectors of the weights at `b`,
    over every channel block and tap; the float32 sums [16 groups][nv * 16] are stored to `cout`."""
    return passes(f"conv_bf16_amx_g{groups}v{nv}", ins, groups, nv,
                  (("q", affine("blocks")), ("r", affine("kh")), ("c", affine("kw"))),
                  lambda g: Load(f"a{g}", "a16", affine((1, "q", "plane"), (1, "r", "row"), (1, "c", "col"),
                                                        (ROWS * g, "a_ms")), affine("a_ms")),
                  lambda j: Load("b", "b", affine((1, "q", "b_block"), (1, "r", "b_row"), (1, "c", "b_col"),
                                                  const=j * 64), affine("b_stride")))


def define_amx_conv_function(module: ir.Module, name: str, spec: TileSpec, ins, groups: int, nv: int,
                             emulate: bool) -> ir.Function:
    """`void name(const int64 *tile)`: the program, then the epilogue of the first `count` pixels, pixel i's
    vector j stored at pos[i] + coff[j] in every output (and read there from a residual)."""
    rows, lanes = ROWS * groups, spec.tile.lanes
    vty = ir.VectorType(F32, lanes)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), name=name)
    fn.args[0].add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    t = fn.args[0]
    a16, bp, a_ms = _slot(b, t, SLOT_A16, PTR), _slot(b, t, SLOT_B, PTR), _slot(b, t, SLOT_A_MS, I64)
    geometry, pos = _slot(b, t, SLOT_GEOMETRY, PTR), _slot(b, t, SLOT_POS, PTR)
    count = _slot(b, t, SLOT_COUNT, I64)
    coff = [_slot(b, t, SLOT_COFF + j, I64) for j in range(nv)]
    masks = [lane_mask(b, _slot(b, t, SLOT_LANES + j, I64), lanes) for j in range(nv)]
    outs = [_slot(b, t, SLOT_OUT + k, PTR) for k in range(len(spec.epilogue.outputs))]
    extras = [_slot(b, t, SLOT_EXTRA + e, PTR) for e in range(len(spec.epilogue.inputs) - 1)]
    scalars = {n: b.load(b.gep(geometry, [ir.Constant(I64, i)], source_etype=I64), typ=I64)
               for i, n in enumerate(AMX_GEOMETRY)}
    scalars["a_ms"] = a_ms

    sums = b.alloca(F32, size=ir.Constant(I64, rows * nv * 16))
    prog = program(ins, groups, nv)
    # named registers in the glue's configuration (matrix_engine.c amx_tiles_configure, once a task): LLVM's own
    # ldtilecfg at every call cost most where K is short (a 1x1 convolution of 96 channels: 3 tile steps)
    assert all((s.rows, s.colsb) == (16, 64) for _, s in prog.shapes), prog.shapes
    prog.emit(b, {"a16": a16, "b": bp, "cout": sums}, scalars, emulate=emulate, fixed_registers=True)

    chan = channel_inputs(b, spec, extras, [ir.Constant(I64, j * lanes) for j in range(nv)], masks)

    def pixel(i, _):
        at = b.load(b.gep(pos, [i], source_etype=I64), typ=I64)

        def store(_):
            for j in range(nv):
                acc = b.load(b.bitcast(b.gep(sums, [b.add(b.mul(i, ir.Constant(I64, nv * 16)),
                                                          ir.Constant(I64, j * 16))], source_etype=F32),
                                       vty.as_pointer()), typ=vty, align=4)
                store_epilogue(b, spec, acc, extras, {e: v[j] for e, v in chan.items()}, b.add(at, coff[j]),
                               masks[j], outs)
            return []

        when(b, b.icmp_signed(">=", at, ir.Constant(I64, 0)), store)  # < 0: a pixel past its output row
        return []

    last = b.select(b.icmp_signed("<", count, ir.Constant(I64, rows)), count, ir.Constant(I64, rows))
    for_range(b, ir.Constant(I64, 0), last, ir.Constant(I64, 1), pixel)
    b.ret_void()
    return fn


def define_amx_conv_functions(module: ir.Module, prefix: str, spec: TileSpec, ins_name: str,
                              emulate: bool) -> list[list[str]]:
    """Every (groups, nv) variant; returns their names as [groups - 1][nv - 1]."""
    return define_variants(module, prefix, spec, ins_name, emulate, define_amx_conv_function)
