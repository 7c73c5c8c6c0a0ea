"""The int8 convolution tile in LLVM IR: MR output channels x one panel of 16 output pixels, the K loop on a
dot-product instruction of codegen/instructions, then the zero-point terms, the corrections and the epilogue.

    tile_m<mi>(const int64 *t)      t: the qc_tile record of glue.h, filled per call by exec.c

The activations are the instruction's vector operand: exec.c packs each panel's receptive fields (im2col) as
[k4 / 4][16 pixels][4] u8, so one load gives 8 (AVX2) or 16 (AVX-512) pixels their 4 consecutive k. The weights are
the broadcast operand: a channel's 4 bytes at k are one i32 splat over the lanes (the inspector's broadcast of the
weight along the pixel loop). Rows are output channels and lanes pixels, so the outputs are stored as NCHW rows.

After the K loop, per channel r and pixel p:
    S = acc + d[r] * asum[p] - za * vsum[r] + (the corrections of r's split weight pairs) = sum (a - za)(w - zw)
exactly, where w' = w - 128 for u8 weights and d[r] = 128 - zw[r] (u8 weights) or -zw[r] (s8), vsum[r] = sum
(w - zw). FLOAT runs the program (Cast, the scale, the bias, SiLU...: find.py) on S; QUANT computes
    q = clamp(round_half_even(float(S + bias[r]) * scale[r]) + y_zero, lo, hi)
as onnxruntime's QLinearConv requantizes (scale = x_scale * w_scale[r] / y_scale in float32).
"""

from __future__ import annotations

from llvmlite import ir

from onnxopt.codegen.compile import compile_object, new_module
from onnxopt.codegen.elementwise.lower import emit_body
from onnxopt.codegen.elementwise.types import ONNX_ENUM
from onnxopt.codegen.microkernel.outer_product import lane_mask
from onnxopt.codegen.target import Target
from onnxopt.codegen.vmath.irutil import broadcast, for_range, intrinsic, masked_load, masked_store
from onnxopt.kinds.qmatmul.lower import instruction_for

from .desc import QConvKernelDesc
from .params import CHANNEL, PANEL, POSITION, QUANT, SCALAR

F32, I8, I32, I64 = ir.FloatType(), ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
MR = 4  # output channels a tile: MR x NR s32 accumulators, NR activation vectors, one weight splat, temporaries
# qc_tile slots (glue.h)
(SLOT_W, SLOT_PANEL, SLOT_K4Q, SLOT_AZP, SLOT_M0, SLOT_VSUM, SLOT_DVEC, SLOT_ASUM, SLOT_NCOLS, SLOT_OUT_OFF,
 SLOT_OHW, SLOT_FIX_OFFSETS, SLOT_FIX_ENTRIES, SLOT_CHAN_BASE, SLOT_BIAS, SLOT_SCALE) = range(16)
MAX_OUT, MAX_EXTRA = 4, 8
SLOT_OUT = 16
SLOT_EXTRA = SLOT_OUT + MAX_OUT
SLOT_EXTRA_COUNT = SLOT_EXTRA + MAX_EXTRA


def _corrections(b, acc: list, panel, offsets, entries, row, i: int, nr: int, lanes: int) -> list:
    """Row i's accumulators plus its split pairs' residuals: acc += a[k] * residual for each (k, residual) of the
    channel, a[k] of every pixel taken from the packed panel (byte k % 4 of each pixel's 4 at group k / 4)."""
    acc_t = acc[0].type
    lo = b.sext(b.load(b.gep(offsets, [row], source_etype=I32), typ=I32), I64)
    hi = b.sext(b.load(b.gep(offsets, [b.add(row, ir.Constant(I64, 1))], source_etype=I32), typ=I32), I64)
    byte = broadcast(b, ir.Constant(I32, 255), lanes)

    def entry(e, carried):
        k = b.load(b.gep(entries, [b.mul(e, ir.Constant(I64, 2))], source_etype=I32), typ=I32)
        res = b.load(b.gep(entries, [b.add(b.mul(e, ir.Constant(I64, 2)), ir.Constant(I64, 1))], source_etype=I32),
                     typ=I32)
        group = b.mul(b.sext(b.lshr(k, ir.Constant(I32, 2)), I64), ir.Constant(I64, PANEL * 4))
        shift = broadcast(b, b.mul(b.and_(k, ir.Constant(I32, 3)), ir.Constant(I32, 8)), lanes)
        r = broadcast(b, res, lanes)
        out = []
        for j in range(nr):
            v = b.load(b.gep(panel, [b.add(group, ir.Constant(I64, j * lanes * 4))], source_etype=I8),
                       typ=acc_t, align=4)
            out.append(b.add(carried[j], b.mul(b.and_(b.lshr(v, shift), byte), r)))
        return out

    return for_range(b, lo, hi, ir.Constant(I64, 1), entry, acc)


def define_tile(module: ir.Module, name: str, params, program, emit, lanes: int, mi: int) -> None:
    nr = PANEL // lanes
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), name=name)
    fn.args[0].add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    t = fn.args[0]

    def slot(i, ty=I64):
        return b.load(b.gep(t, [ir.Constant(I64, i)], source_etype=I64), typ=ty)

    w, panel, vsum = slot(SLOT_W, PTR), slot(SLOT_PANEL, PTR), slot(SLOT_VSUM, PTR)
    k4q, azp, m0, ncols, out_off, ohw = (slot(s) for s in (SLOT_K4Q, SLOT_AZP, SLOT_M0, SLOT_NCOLS, SLOT_OUT_OFF,
                                                           SLOT_OHW))
    acc_t = ir.VectorType(I32, lanes)
    src_t = ir.VectorType(I8, 4 * lanes)
    k4 = b.mul(k4q, ir.Constant(I64, 4))
    rows = [b.add(m0, ir.Constant(I64, i)) for i in range(mi)]
    wrows = [b.gep(w, [b.mul(r, k4)], source_etype=I8) for r in rows]
    zero = ir.Constant(acc_t, [0] * lanes)

    def k_step(g, acc):
        base = b.mul(g, ir.Constant(I64, PANEL * 4))
        av = [b.load(b.gep(panel, [b.add(base, ir.Constant(I64, j * lanes * 4))], source_etype=I8), typ=src_t,
                     align=4) for j in range(nr)]
        out = list(acc)
        for i in range(mi):
            quad = b.load(b.gep(wrows[i], [b.mul(g, ir.Constant(I64, 4))], source_etype=I8), typ=I32, align=1)
            wv = b.bitcast(broadcast(b, quad, lanes), src_t)
            for j in range(nr):
                out[i * nr + j] = emit(b, acc[i * nr + j], av[j], wv)
        return out

    acc = for_range(b, ir.Constant(I64, 0), k4q, ir.Constant(I64, 1), k_step, [zero] * (mi * nr))
    if params.has_fix:
        offsets, entries = slot(SLOT_FIX_OFFSETS, PTR), slot(SLOT_FIX_ENTRIES, PTR)
        for i in range(mi):
            acc[i * nr:(i + 1) * nr] = _corrections(b, acc[i * nr:(i + 1) * nr], panel, offsets, entries, rows[i],
                                                    i, nr, lanes)
    za = b.trunc(azp, I32)
    asums = []
    if params.has_asum:
        asum, dvec = slot(SLOT_ASUM, PTR), slot(SLOT_DVEC, PTR)
        asums = [b.load(b.gep(asum, [ir.Constant(I64, j * lanes)], source_etype=I32), typ=acc_t, align=4)
                 for j in range(nr)]
    masks = [lane_mask(b, b.sub(ncols, ir.Constant(I64, j * lanes)), lanes) for j in range(nr)]
    full = b.icmp_signed("==", ncols, ir.Constant(I64, PANEL))
    fty = ir.VectorType(F32, lanes)
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
        row_off = b.add(out_off, b.mul(r, ohw))
        if params.mode == QUANT:
            _requantize(b, params, slot, r, sums, row_off, masks, full, lanes)
            continue
        extras = [slot(SLOT_EXTRA + e, PTR) for e in range(len(params.extra_kinds))]
        counts = [slot(SLOT_EXTRA_COUNT + e) for e in range(len(params.extra_kinds))]
        outs = [slot(SLOT_OUT + k, PTR) for k in range(len(program.outputs))]
        for j in range(nr):
            pos = b.add(row_off, ir.Constant(I64, j * lanes))
            values = {program.inputs[0].name: sums[j]}
            for e, kind in enumerate(params.extra_kinds):
                name = program.inputs[e + 1].name
                if kind == SCALAR:
                    values[name] = broadcast(b, b.load(extras[e], typ=F32), lanes)
                elif kind == CHANNEL:
                    at = b.srem(b.add(slot(SLOT_CHAN_BASE), r), counts[e])
                    values[name] = broadcast(b, b.load(b.gep(extras[e], [at], source_etype=F32), typ=F32), lanes)
                else:
                    assert kind == POSITION
                    values[name] = masked_load(b, b.gep(extras[e], [b.srem(pos, counts[e])], source_etype=F32),
                                               fty, masks[j], 4)
            emit_body(b, program, values, lanes)
            for k, v in enumerate(program.outputs):
                masked_store(b, values[v.name], b.gep(outs[k], [pos], source_etype=F32), masks[j], 4)
    b.ret_void()


def _requantize(b, params, slot, r, sums, row_off, masks, full, lanes: int) -> None:
    """QUANT's epilogue for one channel: float(S + bias) * scale, rounded half to even, plus the output's zero point,
    clamped to the range the Relu or Clip leaves, stored as bytes (the partial panel through a mask)."""
    bias = b.load(b.gep(slot(SLOT_BIAS, PTR), [r], source_etype=I32), typ=I32)
    scale = b.load(b.gep(slot(SLOT_SCALE, PTR), [r], source_etype=F32), typ=F32)
    fty, ity = ir.VectorType(F32, lanes), ir.VectorType(I32, lanes)
    lo, hi = (broadcast(b, ir.Constant(I32, v), lanes) for v in params.clamp)
    out = slot(SLOT_OUT, PTR)
    packed = []
    for s in sums:
        x = b.fmul(b.sitofp(b.add(s, broadcast(b, bias, lanes)), fty), broadcast(b, scale, lanes))
        q = b.fptosi(intrinsic(b, f"llvm.roundeven.v{lanes}f32", fty, [x]), ity)
        q = b.add(q, broadcast(b, ir.Constant(I32, params.out_zero), lanes))
        q = b.select(b.icmp_signed("<", q, lo), lo, q)
        q = b.select(b.icmp_signed(">", q, hi), hi, q)
        packed.append(b.trunc(q, ir.VectorType(I8, lanes)))

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


def build(region, target: Target) -> tuple[bytes, QConvKernelDesc, str]:
    """Returns (object code, the glue's description, LLVM IR text)."""
    p = region.params
    ins = instruction_for(target)
    module = new_module(target, region.op_type)
    names = []
    for mi in range(1, MR + 1):
        names.append(f"{region.op_type}_m{mi}")
        define_tile(module, names[-1], p, region.program, ins.emit, ins.lanes, mi)
    ir_text = str(module)
    obj = compile_object(ir_text, target, vectorize=False)
    i32 = ONNX_ENUM["int32"]
    act = ONNX_ENUM["int8" if p.act_signed else "uint8"]
    in_types = [act, act, ONNX_ENUM["int8"], i32] + ([i32] if p.has_asum else []) + \
        ([i32, i32, ONNX_ENUM["int64"], i32] if p.has_fix else [])
    if p.mode == QUANT:
        in_types += [i32, ONNX_ENUM["float32"]]
        out_types = [ONNX_ENUM["int8" if p.out_signed else "uint8"]]
    else:
        in_types += [ONNX_ENUM["float32"]] * len(p.extra_kinds)
        out_types = [ONNX_ENUM["float32"]] * len(region.outputs)
    desc = QConvKernelDesc(op_type=region.op_type, in_types=in_types, out_types=out_types, params=p, mr=MR,
                           tiles=names, instruction=ins.name)
    return obj, desc, ir_text
