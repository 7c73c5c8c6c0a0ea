"""One tile of a compute op (convolution or matmul) with its fused epilogue, as LLVM IR.

The C glue splits an op into tiles and calls, per tile,

    void <op>_m<mi>v<nv>(const int64 *tile)

with `tile` pointing at a `ct_tile` record (declared once in codegen/glue/contract.py, CT_TILE: the slots below and
the C struct compute_exec.c fills are both generated from it). The function runs the
micro-kernel's K loop for `mi` rows and `nv` vectors, then the epilogue in registers: the region's elementwise
program (bias, activation chains, residual adds, per-channel scales) on each accumulator vector, and stores every
program output with masked stores. Nothing between the micro-kernel and the final outputs touches memory.

Epilogue inputs other than the accumulator come in four kinds, fixed at optimize time:
- POSITION: a tensor laid out like the output (a residual): vector at base + row * ldc + coff[j];
- CHANNEL: one value per output row (bias, a folded BatchNorm shift, an SE scale): scalar at base + row;
- COLUMN: one value per output column (Gemm's bias over N): vector at base + coff[j];
- SCALAR: one value for the tensor: scalar at base.
The glue has already moved each base to the current batch item and group.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from onnxopt.codegen.elementwise.lower import emit_body
from onnxopt.codegen.vmath.isa import set_features
from onnxopt.fusion.region import EwProgram

from ..glue.contract import CT_MAX_EXTRA, CT_MAX_OUT, CT_NV_MAX, CT_TILE
from ..microkernel.outer_product import (F32, I16, I64, PTR, emit_outer_product, emit_packed_b_low_precision, lane_mask,
                                         to_16bit)
from ..vmath.irutil import broadcast, masked_load, masked_store
from ..microkernel.register_tile import RegisterTile

POSITION, CHANNEL, COLUMN, SCALAR = 0, 1, 2, 3
KIND_NAMES = {"position": POSITION, "channel": CHANNEL, "column": COLUMN, "scalar": SCALAR}

# ct_tile: 8-byte slots (codegen/glue/contract.py, CT_TILE).
NV_MAX = CT_NV_MAX.value
MAX_OUTPUTS = CT_MAX_OUT.value
MAX_EXTRAS = CT_MAX_EXTRA.value
SLOT_A, SLOT_A_MS, SLOT_A_KS, SLOT_B, SLOT_KOFF, SLOT_K, SLOT_LDC, SLOT_M0 = (
    CT_TILE.index(n) for n in ("a", "a_ms", "a_ks", "b", "koff", "k", "ldc", "m0"))
SLOT_VOFF, SLOT_COFF, SLOT_LANES = CT_TILE.index("voff"), CT_TILE.index("coff"), CT_TILE.index("lanes")
SLOT_OUT, SLOT_EXTRA = CT_TILE.index("out"), CT_TILE.index("extra")
# A packed-B tile runs K in blocks (the glue's ct_run_task): `acc` is the tile's partial sums, [mi][NI * lanes],
# and `phase` says which block this is: bit 1, continue the sums in `acc`; bit 0, store them there rather than
# run the epilogue. 0 is the whole K at once.
SLOT_ACC, SLOT_PHASE = CT_TILE.index("acc"), CT_TILE.index("phase")
SLOTS = CT_TILE.n_slots


@dataclass(frozen=True)
class TileSpec:
    """What is fixed per fused op: the register tile, packed-A strides when known, the epilogue."""

    tile: RegisterTile
    epilogue: EwProgram  # inputs[0] is the accumulator; the rest are extras, in order
    extra_kinds: tuple[int, ...]
    packed_a: bool  # A is packed [M/MI][K][MI]: a_ms = 1, a_ks = MI, known at compile time
    packed_b: int = 0  # > 0: B is a constant matrix packed [N / packed_b][K][packed_b] (the tile's panel from b)
    # How a packed B is stored and multiplied (microkernel/outer_product.py, B_FORMATS): "f32", or bfloat16 /
    # float16 weights with float32 sums (onnxopt/driver/precision.py)
    b_format: str = "f32"


def _slot(b, tile_ptr, index, ty):
    return b.load(b.gep(tile_ptr, [ir.Constant(I64, index)], source_etype=I64), typ=ty)


def define_tile_function(module: ir.Module, name: str, spec: TileSpec, mi: int, nv: int) -> ir.Function:
    lanes = spec.tile.lanes
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), name=name)
    fn.args[0].add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    t = fn.args[0]
    a = _slot(b, t, SLOT_A, PTR)
    if spec.packed_a:
        a_ms, a_ks = 1, spec.tile.mi
    else:
        a_ms, a_ks = _slot(b, t, SLOT_A_MS, I64), _slot(b, t, SLOT_A_KS, I64)
    bp = _slot(b, t, SLOT_B, PTR)
    koff = None if spec.packed_b else _slot(b, t, SLOT_KOFF, PTR)
    k_count = _slot(b, t, SLOT_K, I64)
    ldc = _slot(b, t, SLOT_LDC, I64)
    m0 = _slot(b, t, SLOT_M0, I64)
    voff = [_slot(b, t, SLOT_VOFF + j, I64) for j in range(nv)]
    coff = [_slot(b, t, SLOT_COFF + j, I64) for j in range(nv)]
    masks = [lane_mask(b, _slot(b, t, SLOT_LANES + j, I64), lanes) for j in range(nv)]
    prog = spec.epilogue
    outs = [_slot(b, t, SLOT_OUT + k, PTR) for k in range(len(prog.outputs))]
    extras = [_slot(b, t, SLOT_EXTRA + e, PTR) for e in range(len(prog.inputs) - 1)]

    init = None
    if spec.packed_b:
        partial, phase = _slot(b, t, SLOT_ACC, PTR), _slot(b, t, SLOT_PHASE, I64)
        init = _load_partial_sums(b, partial, phase, mi, nv, lanes)
    if spec.b_format != "f32":
        acc = emit_packed_b_low_precision(b, spec.tile, mi, nv, a, a_ms, bp, k_count, voff, spec.packed_b,
                                          spec.b_format, init=init)
    else:
        acc = emit_outer_product(b, spec.tile, mi, nv, a, a_ms, a_ks, bp, koff, k_count, voff, masks,
                                 b_panel=spec.packed_b, init=init)
    if spec.packed_b:
        _store_partial_sums(b, acc, partial, phase, lanes)

    for i in range(mi):
        emit_row_epilogue(b, spec, b.add(m0, ir.Constant(I64, i)), acc[i], ldc, coff, masks, outs, extras)
    b.ret_void()
    return fn


def emit_row_epilogue(b: ir.IRBuilder, spec: TileSpec, row, acc_row: list, ldc, coff: list, masks: list, outs: list,
                      extras: list, out16: bool = False) -> None:
    """Output row `row`'s epilogue on its accumulator vectors `acc_row` (one per vector of the tile), and the
    stores of every program output: float32, or with `out16` rounded to bfloat16 (vcvtneps2bf16, as a bf16 GEMM
    rounds its A: the AMX tiles' output kept in bf16 for the next GEMM, sequence_exec.c)."""
    lanes, prog = spec.tile.lanes, spec.epilogue
    row_off = b.mul(row, ldc)
    # Per-row values are loaded once for the row's vectors.
    row_values = {}
    for e, kind in enumerate(spec.extra_kinds):
        if kind == CHANNEL:
            row_values[e] = broadcast(b, b.load(b.gep(extras[e], [row], source_etype=F32), typ=F32), lanes)
        elif kind == SCALAR:
            row_values[e] = broadcast(b, b.load(extras[e], typ=F32), lanes)
    for j, acc in enumerate(acc_row):
        pos = b.add(row_off, coff[j])
        values = {prog.inputs[0].name: acc}
        for e, kind in enumerate(spec.extra_kinds):
            name = prog.inputs[e + 1].name
            if kind in (CHANNEL, SCALAR):
                values[name] = row_values[e]
            else:
                at = pos if kind == POSITION else coff[j]
                values[name] = masked_load(b, b.gep(extras[e], [at], source_etype=F32), ir.VectorType(F32, lanes),
                                           masks[j], 4)
        emit_body(b, prog, values, lanes)
        for k, v in enumerate(prog.outputs):
            if out16:
                masked_store(b, to_16bit(b, values[v.name]), b.gep(outs[k], [pos], source_etype=I16), masks[j], 2)
            else:
                masked_store(b, values[v.name], b.gep(outs[k], [pos], source_etype=F32), masks[j], 4)


def _load_partial_sums(b: ir.IRBuilder, partial, phase, mi: int, nv: int, lanes: int) -> list[list[ir.Value]]:
    """The accumulators' start: the partial sums of the earlier K blocks where phase bit 1 says so, else zeros."""
    vty = ir.VectorType(F32, lanes)
    zeros = ir.Constant(vty, [0.0] * lanes)
    pre = b.block
    load_bb = b.function.append_basic_block("sums.load")
    join = b.function.append_basic_block("sums.start")
    b.cbranch(b.icmp_unsigned("!=", b.and_(phase, ir.Constant(I64, 2)), ir.Constant(I64, 0)), load_bb, join)
    b.position_at_end(load_bb)
    loaded = [[b.load(b.gep(partial, [ir.Constant(I64, (i * nv + j) * lanes)], source_etype=F32), typ=vty, align=4)
               for j in range(nv)] for i in range(mi)]
    b.branch(join)
    b.position_at_end(join)
    out = []
    for i in range(mi):
        row = []
        for j in range(nv):
            p = b.phi(vty)
            p.add_incoming(zeros, pre)
            p.add_incoming(loaded[i][j], load_bb)
            row.append(p)
        out.append(row)
    return out


def _store_partial_sums(b: ir.IRBuilder, acc, partial, phase, lanes: int) -> None:
    """Where phase bit 0 says the block is not the last: store the sums to `partial` and return."""
    store_bb = b.function.append_basic_block("sums.store")
    epilogue = b.function.append_basic_block("epilogue")
    b.cbranch(b.icmp_unsigned("!=", b.and_(phase, ir.Constant(I64, 1)), ir.Constant(I64, 0)), store_bb, epilogue)
    b.position_at_end(store_bb)
    nv = len(acc[0])
    for i, row in enumerate(acc):
        for j, v in enumerate(row):
            b.store(v, b.gep(partial, [ir.Constant(I64, (i * nv + j) * lanes)], source_etype=F32), align=4)
    b.ret_void()
    b.position_at_end(epilogue)


def define_tile_functions(module: ir.Module, prefix: str, spec: TileSpec, features, define=None,
                          tag: str = "m") -> list[list[str]]:
    """All (mi, nv) variants of `define` (this file's tile by default); returns their names as [mi - 1][nv - 1]."""
    define = define or define_tile_function
    set_features(module, features)
    names = []
    for mi in range(1, spec.tile.mi + 1):
        row = []
        for nv in range(1, spec.tile.ni + 1):
            name = f"{prefix}_{tag}{mi}v{nv}"
            define(module, name, spec, mi, nv)
            row.append(name)
        names.append(row)
    return names
