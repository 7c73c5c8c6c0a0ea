"""The int8 GEMM tile in LLVM IR: mr rows of A x one panel of B (16 columns), the K loop on a dot-product
instruction of codegen/instructions, then A's zero point, the float epilogue and the stores. On a 16-lane target
(AVX-512) wide tiles take 4 panels at once and up to 6 rows (wide_shape), which exec.c runs wherever a task has 4
panels left.

    tile_m<mi>(const int64 *t)      t: the qm_tile record of desc.py, filled per call by exec.c
    tile_w<mi>(const int64 *t)      a wide tile: mi rows x 4 panels

Per group of 4 along K, each row's 4 bytes of A are loaded as one i32 and splat over the lanes (the operand the
inspector finds broadcast along the instruction's lanes), the panel's 16 x 4 bytes are one or two vector loads, and
the instruction adds the 4 products of every lane into its s32 accumulator: MR x NR accumulators, independent
chains that hide the instruction's latency (UNIT's unrolled parallel tile under the reduction loop; its mr and the
call's parallel extent are the schedule that onnxopt/tune/int8_schedule.py times). Then
acc - za * colsum(B) is the exact sum of (a - za) b; the program (Cast, the scale, the bias, GELU, the residual:
find.py) runs on it in registers, and every output is stored with the panel's column mask.
"""

from __future__ import annotations

from llvmlite import ir

from onnxopt.codegen.compile import compile_object, new_module
from onnxopt.codegen.elementwise.lower import emit_body
from onnxopt.codegen.elementwise.types import ONNX_ENUM
from onnxopt.codegen.instructions import available
from onnxopt.codegen.instructions.tile_program import emulating
from onnxopt.codegen.microkernel.outer_product import lane_mask
from onnxopt.codegen.target import Target
from onnxopt.codegen.vmath.irutil import (broadcast, for_range, intrinsic, masked_load, masked_store,
                                           record_function)

from . import amx
from .desc import QM_MAX_EXTRA, QM_MAX_OUT, QM_TILE, QMatMulKernelDesc
from .params import CHANNEL, COLUMN, PANEL, QUANT, SCALAR

F32, I8, I32, I64 = ir.FloatType(), ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
# A tile: p.mr rows (4 by default; onnxopt/tune/int8_schedule.py times others) x NR s32 accumulators, NR panel
# vectors, one splat of A and the sequence's temporaries
# qm_tile slots (desc.py, QM_TILE)
SLOT_A, SLOT_A_RS, SLOT_B, SLOT_COLSUM, SLOT_K4, SLOT_AZP, SLOT_M0, SLOT_LDC, SLOT_N0, SLOT_NCOLS = (
    QM_TILE.index(n) for n in ("a", "a_rs", "b", "colsum", "k4", "azp", "m0", "ldc", "n0", "ncols"))
SLOT_FIX, SLOT_NFIX = QM_TILE.index("fix"), QM_TILE.index("nfix")  # the panel's (k, column, residual) triples
SLOT_FIX_OFFSETS = QM_TILE.index("fix_offsets")  # a wide tile's: where each of its panels' triples begin
MAX_OUT, MAX_EXTRA = QM_MAX_OUT.value, QM_MAX_EXTRA.value
SLOT_OUT, SLOT_EXTRA, SLOT_EXTRA_ROWS = QM_TILE.index("out"), QM_TILE.index("extra"), QM_TILE.index("extra_rows")
SLOT_QSCALE = QM_TILE.index("qscale")  # QUANT: the panel's scales per column
SLOT_QBIAS = QM_TILE.index("qbias")  # QUANT with a bias: the panel's int32 bias per column
SLOT_ASUM, SLOT_DVEC = QM_TILE.index("asum"), QM_TILE.index("dvec")  # has_asum: the row term's factors


def instruction_for(target: Target):
    """The best dot-product instruction for activations x s8 weights on this target: u8 x s8 (x86's VNNI and AVX2
    sequence), else s8 x s8 (aarch64's sdot), which takes u8 activations moved to s8 (`signed_operand`)."""
    found = available(target, ("u8", "s8")) or available(target, ("s8", "s8"))
    if not found:
        raise ValueError(f"target {target.name} has no int8 dot-product instruction (VNNI, AVX2 or aarch64 dotprod)")
    return found[0]


def splits_weight_pairs(target: Target | None) -> bool:
    """Whether int8 weights are packed for `target` with their saturating pairs split (avx2_u8s8.split_pairs): where
    its instruction sums pairs of products in 16 saturating bits (AVX2), or where the target is not known (exact
    on every instruction). VNNI, AMX and sdot do not saturate, so their kernels run no corrections."""
    if target is None:
        return True
    try:
        return instruction_for(target).pair_sums_saturate
    except ValueError:  # no int8 instruction: no kernel either, and the tables stay the portable ones
        return True


def signed_operand(ins) -> bool:
    """Whether `ins` multiplies s8 activations: then u8 ones go in as a - 128 (their top bit flipped), their zero
    point too, which leaves every sum of (a - za) * w as it was."""
    return ins.source_dtypes[0] == "s8"


def _corrections(b: ir.IRBuilder, acc: list, rows: list, fix, nfix, offsets, mi: int, nr: int, lanes: int,
                 flip: bool, buf, panels: int = 1) -> list:
    """acc with the panels' corrections added: acc[i][column] += a[row i][k] * residual for each (k, column within
    its panel, residual), through a stack copy of the tile (a column is a lane known only at run time); only where
    there are any. `nfix`: the entries of all `panels` panels, in panel order from `fix`; `offsets`: the panels'
    offsets into the entries (the first panel's at offsets[0]), which say where each panel's begin."""
    acc_t = acc[0].type  # buf: the tile, row-major: [mi][nr * lanes]

    def vector_at(q):
        return b.bitcast(b.gep(buf, [ir.Constant(I64, q * lanes)]), acc_t.as_pointer())
    pre = b.block
    work = b.function.append_basic_block("fix")
    done = b.function.append_basic_block("fix.done")
    b.cbranch(b.icmp_signed(">", nfix, ir.Constant(I64, 0)), work, done)
    b.position_at_end(work)
    for q, v in enumerate(acc):
        b.store(v, vector_at(q), align=4)

    def entries(q, first, last):
        """Panel q's entries [first, last): its columns are lanes q * PANEL on."""
        def entry(e, _):
            at = b.mul(e, ir.Constant(I64, 3))
            field = [b.sext(b.load(b.gep(fix, [b.add(at, ir.Constant(I64, f))], source_etype=I32), typ=I32), I64)
                     for f in range(3)]
            k, col, res = field
            lane = b.add(col, ir.Constant(I64, q * PANEL))
            for i in range(mi):
                a = b.zext(b.load(b.gep(rows[i], [k], source_etype=I8), typ=I8), I32)
                if flip:  # the activation as the instruction saw it
                    a = b.sub(a, ir.Constant(I32, 128))
                slot = b.gep(buf, [b.add(ir.Constant(I64, i * nr * lanes), lane)])
                b.store(b.add(b.load(slot, typ=I32), b.mul(a, b.trunc(res, I32))), slot)
            return []

        for_range(b, first, last, ir.Constant(I64, 1), entry)

    if panels == 1:
        entries(0, ir.Constant(I64, 0), nfix)
    else:
        def offset(q):
            return b.sext(b.load(b.gep(offsets, [ir.Constant(I64, q)], source_etype=I32), typ=I32), I64)
        base = offset(0)
        for q in range(panels):
            entries(q, b.sub(offset(q), base), b.sub(offset(q + 1), base))
    fixed = [b.load(vector_at(q), align=4) for q in range(len(acc))]
    fixed_bb = b.block
    b.branch(done)
    b.position_at_end(done)
    out = []
    for q, v in enumerate(acc):
        phi = b.phi(acc_t)
        phi.add_incoming(v, pre)
        phi.add_incoming(fixed[q], fixed_bb)
        out.append(phi)
    return out


# Wide tiles: WIDE_PANELS panels side by side (their column sums, scales and biases are contiguous; B's panels are
# K * PANEL bytes apart) and WIDE_ROWS rows, on a target with 32 vector registers and 16 s32 lanes: 24 accumulators,
# 4 panel vectors and the splat of A. One panel's tile (mr x 1 vector there) keeps only mr dot products in flight,
# fewer than the instruction's latency times its throughput (two a cycle on Zen 4/5 and Sapphire Rapids): 38-46% of
# the int8 peak on BERT's GEMMs, measured.
WIDE_PANELS, WIDE_ROWS = 4, 6


def wide_shape(lanes: int) -> tuple[int, int] | None:
    """(panels, rows) of the wide tiles, or None where the tile stays one panel wide: fewer than 16 lanes (a target
    with 16 vector registers has no room for them)."""
    if lanes != PANEL:
        return None
    return WIDE_PANELS, WIDE_ROWS


def define_tile(module: ir.Module, name: str, params, program, emit, lanes: int, mi: int,
                flip: bool = False, panels: int = 1) -> None:
    """`flip`: the instruction takes s8 activations (signed_operand): A's bytes go in with their top bit flipped.
    `panels`: side by side (a wide tile: wide_shape)."""
    nr = panels * PANEL // lanes
    b, slot = record_function(module, name)
    a, a_rs, m0 = slot(SLOT_A, PTR), slot(SLOT_A_RS), slot(SLOT_M0)
    rows = [b.gep(a, [b.mul(b.add(m0, ir.Constant(I64, i)), a_rs)], source_etype=I8) for i in range(mi)]
    zero = ir.Constant(ir.VectorType(I32, lanes), [0] * lanes)
    acc = accumulate(b, slot, rows, emit, lanes, ir.Constant(I64, 0), [zero] * (mi * nr), flip, panels)
    fix_buf = b.alloca(I32, size=ir.Constant(I32, mi * nr * lanes)) if params.has_fix else None
    finish_rows(b, slot, params, program, acc, rows, [b.add(m0, ir.Constant(I64, i)) for i in range(mi)], lanes,
                flip, fix_buf, panels)
    b.ret_void()


def accumulate(b: ir.IRBuilder, slot, rows: list, emit, lanes: int, start, acc: list, flip: bool,
               panels: int = 1) -> list:
    """acc (len(rows) x NR vectors) plus the products of groups of 4 along K from group `start` to k4: each row's
    4 bytes of A splat over the lanes, each panel's 16 x 4 bytes one or two vector loads."""
    per_panel = PANEL // lanes
    nr = panels * per_panel
    bp, k4 = slot(SLOT_B, PTR), slot(SLOT_K4)
    src_t = ir.VectorType(I8, 4 * lanes)
    panel_bytes = b.mul(k4, ir.Constant(I64, 4 * PANEL))
    bases = [b.gep(bp, [b.mul(panel_bytes, ir.Constant(I64, q))], source_etype=I8) for q in range(panels)]

    def k_step(g, acc):
        step = b.mul(g, ir.Constant(I64, 4 * PANEL))
        bv = [b.load(b.gep(bases[j // per_panel], [b.add(step, ir.Constant(I64, 4 * lanes * (j % per_panel)))],
                           source_etype=I8), typ=src_t, align=1)
              for j in range(nr)]
        out = list(acc)
        for i, row in enumerate(rows):
            quad = b.load(b.gep(row, [b.mul(g, ir.Constant(I64, 4))], source_etype=I8), typ=I32, align=1)
            if flip:
                quad = b.xor(quad, ir.Constant(I32, 0x80808080))
            av = b.bitcast(broadcast(b, quad, lanes), src_t)
            for j in range(nr):
                out[i * nr + j] = emit(b, acc[i * nr + j], av, bv[j])
        return out

    return for_range(b, start, k4, ir.Constant(I64, 1), k_step, acc)


def finish_rows(b: ir.IRBuilder, slot, params, program, acc: list, rows: list, row_index: list, lanes: int,
                flip: bool, fix_buf, panels: int = 1) -> None:
    """The sums of len(rows) rows (acc: NR vectors a row) to outputs: the panel's corrections, A's zero point, then
    the requantization or the float program, stored with the panel's column mask. `row_index`: each row's number
    (an i64 value); `fix_buf`: the corrections' stack tile (allocated by the caller, outside any loop); `panels`:
    side by side, their per-column tables contiguous (exec.c pads them to whole panels)."""
    nr, mi = panels * PANEL // lanes, len(rows)
    colsum, azp, ldc, n0, ncols = (slot(SLOT_COLSUM, PTR), slot(SLOT_AZP), slot(SLOT_LDC), slot(SLOT_N0),
                                   slot(SLOT_NCOLS))
    acc_t = ir.VectorType(I32, lanes)
    if params.has_fix:
        acc = _corrections(b, acc, rows, slot(SLOT_FIX, PTR), slot(SLOT_NFIX), slot(SLOT_FIX_OFFSETS, PTR), mi, nr,
                           lanes, flip, fix_buf, panels)
    za = b.trunc(azp, I32)
    if flip:
        za = b.sub(za, ir.Constant(I32, 128))
    za = broadcast(b, za, lanes)
    corr = [b.mul(za, b.load(b.gep(colsum, [ir.Constant(I64, j * lanes)], source_etype=I32), typ=acc_t, align=4))
            for j in range(nr)]
    masks = [lane_mask(b, b.sub(ncols, ir.Constant(I64, j * lanes)), lanes) for j in range(nr)]
    outs = [slot(SLOT_OUT + k, PTR) for k in range(len(program.outputs))]
    extras = [slot(SLOT_EXTRA + e, PTR) for e in range(len(params.extra_kinds))]
    extra_rows = [slot(SLOT_EXTRA_ROWS + e) for e in range(len(params.extra_kinds))]
    fty = ir.VectorType(F32, lanes)
    if params.has_asum:  # u8 weights stored as B - 128: + (128 - zw[col]) x sum over k of (a - za), exact
        asum, dvec = slot(SLOT_ASUM, PTR), slot(SLOT_DVEC, PTR)
        dv = [b.load(b.gep(dvec, [ir.Constant(I64, j * lanes)], source_etype=I32), typ=acc_t, align=4)
              for j in range(nr)]
        acc = list(acc)
        for i in range(mi):
            s = broadcast(b, b.load(b.gep(asum, [row_index[i]], source_etype=I32), typ=I32), lanes)
            for j in range(nr):
                acc[i * nr + j] = b.add(acc[i * nr + j], b.mul(s, dv[j]))
    if params.mode == QUANT:  # q = clamp(round_half_even(float(S + bias) * scale[col]) + zero point), as QGemm
        qscale = slot(SLOT_QSCALE, PTR)
        scales = [b.load(b.gep(qscale, [ir.Constant(I64, j * lanes)], source_etype=F32), typ=fty, align=4)
                  for j in range(nr)]
        if params.has_bias:  # the int32 bias joins the sums before the scale, as MLAS's output processor adds it
            qbias = slot(SLOT_QBIAS, PTR)
            corr = [b.sub(corr[j], b.load(b.gep(qbias, [ir.Constant(I64, j * lanes)], source_etype=I32), typ=acc_t,
                                          align=4)) for j in range(nr)]
        lo, hi = (-128, 127) if params.out_signed else (0, 255)
        if params.relu:  # a Relu before the quantizer: nothing below the zero point
            lo = max(lo, params.out_zero)
        ity = ir.VectorType(I32, lanes)
        for i in range(mi):
            row = row_index[i]
            for j in range(nr):
                x = b.fmul(b.sitofp(b.sub(acc[i * nr + j], corr[j]), fty), scales[j])
                q = b.add(b.fptosi(intrinsic(b, f"llvm.roundeven.v{lanes}f32", fty, [x]), ity),
                          broadcast(b, ir.Constant(I32, params.out_zero), lanes))
                q = b.select(b.icmp_signed("<", q, broadcast(b, ir.Constant(I32, lo), lanes)),
                             broadcast(b, ir.Constant(I32, lo), lanes), q)
                q = b.select(b.icmp_signed(">", q, broadcast(b, ir.Constant(I32, hi), lanes)),
                             broadcast(b, ir.Constant(I32, hi), lanes), q)
                pos = b.add(b.mul(row, ldc), b.add(n0, ir.Constant(I64, j * lanes)))
                masked_store(b, b.trunc(q, ir.VectorType(I8, lanes)), b.gep(outs[0], [pos], source_etype=I8),
                             masks[j], 1)
        return
    for i in range(mi):
        row = row_index[i]
        for j in range(nr):
            col = b.add(n0, ir.Constant(I64, j * lanes))
            values = {program.inputs[0].name: b.sub(acc[i * nr + j], corr[j])}
            for e, kind in enumerate(params.extra_kinds):
                name = program.inputs[e + 1].name
                if kind == SCALAR:
                    values[name] = broadcast(b, b.load(extras[e], typ=F32), lanes)
                elif kind == CHANNEL:
                    values[name] = broadcast(b, b.load(b.gep(extras[e], [b.srem(row, extra_rows[e])],
                                                             source_etype=F32), typ=F32), lanes)
                else:
                    at = col if kind == COLUMN else b.add(b.mul(b.srem(row, extra_rows[e]), ldc), col)
                    values[name] = masked_load(b, b.gep(extras[e], [at], source_etype=F32), fty, masks[j], 4)
            emit_body(b, program, values, lanes)
            pos = b.add(b.mul(row, ldc), col)
            for k, v in enumerate(program.outputs):
                masked_store(b, values[v.name], b.gep(outs[k], [pos], source_etype=F32), masks[j], 4)


def define_amx_tile(module: ir.Module, name: str, params, prog, ins_program, emit, groups: int) -> None:
    """`void name(const int64 *qm_tile)`: 16 x `groups` rows from row m0, through `ins_program` (amx.py) then the
    dot-product instruction for the rest of K and the epilogue, a row at a time."""
    lanes = PANEL
    b, slot = record_function(module, name)
    a, a_rs, k4, m0 = slot(SLOT_A, PTR), slot(SLOT_A_RS), slot(SLOT_K4), slot(SLOT_M0)
    acc_buf = b.alloca(I32, size=ir.Constant(I32, groups * amx.ROWS * PANEL))
    fix_buf = b.alloca(I32, size=ir.Constant(I32, lanes)) if params.has_fix else None
    chunks = b.udiv(k4, ir.Constant(I64, 16))  # 16 groups of 4 bytes: 64 bytes of K a chunk
    ins_program.emit(b, {"a": a, "b": slot(SLOT_B, PTR), "acc": acc_buf}, {"m0": m0, "a_rs": a_rs, "chunks": chunks},
                     emulate=emulating())
    acc_t = ir.VectorType(I32, lanes)

    def row_step(i, _):
        acc = b.load(b.bitcast(b.gep(acc_buf, [b.mul(i, ir.Constant(I64, PANEL))]), acc_t.as_pointer()), align=4)
        index = b.add(m0, i)
        row = b.gep(a, [b.mul(index, a_rs)], source_etype=I8)
        acc = accumulate(b, slot, [row], emit, lanes, b.mul(chunks, ir.Constant(I64, 16)), [acc], False)
        finish_rows(b, slot, params, prog, acc, [row], [index], lanes, False, fix_buf)
        return []

    for_range(b, ir.Constant(I64, 0), ir.Constant(I64, groups * amx.ROWS), ir.Constant(I64, 1), row_step)
    b.ret_void()


def build(region, target: Target) -> tuple[bytes, QMatMulKernelDesc, str]:
    """Returns (object code, the glue's description, LLVM IR text)."""
    p = region.params
    ins = instruction_for(target)
    emit, lanes = ins.emit, ins.lanes
    module = new_module(target, region.op_type)
    names = []
    for mi in range(1, p.mr + 1):
        names.append(f"{region.op_type}_m{mi}")
        define_tile(module, names[-1], p, region.program, emit, lanes, mi, signed_operand(ins))
    wide = wide_shape(lanes)
    wide_names = []
    if wide is not None:
        for mi in range(1, wide[1] + 1):
            wide_names.append(f"{region.op_type}_w{mi}")
            define_tile(module, wide_names[-1], p, region.program, emit, lanes, mi, signed_operand(ins), wide[0])
    matrix, _ = amx.choose(target)
    amx_names = []
    if matrix is not None and not signed_operand(ins):
        for groups in range(1, amx.MAX_GROUPS + 1):
            amx_names.append(f"{region.op_type}_amx{groups}")
            define_amx_tile(module, amx_names[-1], p, region.program, amx.program(matrix, groups), emit, groups)
    ir_text = str(module)
    obj = compile_object(ir_text, target, vectorize=False)
    in_types = [ONNX_ENUM["uint8"]] + ([ONNX_ENUM["uint8"]] if p.has_azp else []) + \
        [ONNX_ENUM["int8"], ONNX_ENUM["int32"]] + \
        ([ONNX_ENUM["int32"], ONNX_ENUM["int32"], ONNX_ENUM["int64"], ONNX_ENUM["int32"]] if p.has_fix else []) + \
        ([ONNX_ENUM["float32"]] + [ONNX_ENUM["int32"]] * p.has_bias +
         [ONNX_ENUM["int32"], ONNX_ENUM["int8"]] * p.has_asum if p.mode == QUANT else
         [ONNX_ENUM["float32"]] * len(p.extra_kinds))
    out_types = [ONNX_ENUM["int8" if p.out_signed else "uint8"]] if p.mode == QUANT else \
        [ONNX_ENUM["float32"]] * len(region.outputs)
    desc = QMatMulKernelDesc(op_type=region.op_type, in_types=in_types,
                             out_types=out_types, k=p.k, n=p.n,
                             has_azp=p.has_azp, has_fix=p.has_fix, extra_kinds=list(p.extra_kinds), mr=p.mr,
                             tiles=names, instruction=ins.name, tasks=p.tasks, mode=p.mode,
                             has_bias=p.has_bias, has_asum=p.has_asum, amx_tiles=amx_names,
                             matrix_instruction=matrix.name if amx_names else "",
                             wide_tiles=wide_names, wide_panels=wide[0] if wide else 0,
                             amx_emulated=bool(amx_names) and emulating())
    return obj, desc, ir_text
