"""The fused attention kernel in LLVM IR: one block of query rows of one (batch, head), the score rows kept whole.

    attn(q, q_rs, kp, kp_ps, vp, vp_ps, mask, mask_rs, out, out_rs, rows, L, d, dv, s, s_rs)

    q     rows x d (row stride q_rs)
    kp    K^T in panels of W = NR * lanes keys: panel p at kp + p * kp_ps holds [d][W] (keys past L are zeros)
    vp    V in panels of W value columns: panel p at vp + p * vp_ps holds [L][W] (columns past dv are zeros)
    mask  rows x L (row stride mask_rs; 0: one row for all)
    out   rows x dv (row stride out_rs)         s    scratch, MR x s_rs floats, s_rs >= L rounded up to W, then
                                                     (softmax) each row's score max and exp sum: 2 x rows floats

The glue (exec.c) packs K^T and V into the panels once per task, so both GEMMs read their B operand as one
contiguous run a panel, with full vector loads and no masks, the way the packed-B GEMMs do (fusion/compute.py).
Per block of MR query rows: the scores s = scale * q K^T (+ mask) by an outer-product micro-kernel (MR broadcasts of
q times NR vectors of a K^T panel), the padding columns set to -inf; each row's max, then exp(s - max) in place and
its sum; then out = s V by the same micro-kernel (MR broadcasts of s times NR vectors of a V panel row), each output
row scaled by 1 / sum at the store. The scores never leave the block's scratch (T_L = L: the rows fit the cache,
onnxopt/annotate/data_movement.py's `softmax_strategy`), and the normalization costs dv multiplies a row, not L.
A row masked everywhere gives zeros with `nan_guard` (torch's Where(IsNaN(p), 0, p)), else NaN as Softmax does.
"""

from __future__ import annotations

from llvmlite import ir

from onnxopt.codegen.compile import compile_object, new_module
from onnxopt.codegen.instructions.tile_program import emulating
from onnxopt.codegen.target import Target
from onnxopt.codegen.vmath.exp import vexp_nonpositive
from onnxopt.codegen.vmath.irutil import broadcast, fma, masked_load, masked_store, reduce_lanes as _reduce, while_loop
from onnxopt.dtypes import dtype

from . import amx
from .capacity import key_floats
from .desc import AttentionKernelDesc, kernel_function
from .params import AttentionParams

F32 = ir.FloatType()  # the kernel's element type: it is written for float32 (build() checks the params' dtype)
I64 = ir.IntType(64)
I32 = ir.IntType(32)
I8 = ir.IntType(8)
PTR = ir.PointerType()
# Query rows x vectors of the micro-kernel: MR * NR accumulators, NR loads and one broadcast in 16 AVX2 registers
# (the packed-B GEMM's 6 x 16 tile); 4 x 2 read K^T unpacked and was load-bound. With 32 registers (AVX-512) the
# schedule may take NR_WIDE vectors a row (24 accumulators). Measured on Zen 5, 2 threads, against NR in one run:
# plain GEMM chains 1.05-1.11x where L and dv are multiples of the 64-column panel (G1, G4, G10), 0.84-0.86x where
# dv = 80 pads to 128 (G6, G9); softmax chains 0.92-1.04x. So NR stays the default and NR_WIDE is a knob.
MR, NR = 6, 2
NR_WIDE = 4


def vectors_per_row(p: AttentionParams, lanes: int) -> int:
    """The micro-kernel's vectors a row: the schedule's, else NR."""
    return p.vectors or NR
# The default schedule: a call is split into at least this many tasks where the (batch, head) pairs are fewer, by
# giving a task fewer query rows (threads to feed); the schedule space's knob (schedule.py).
MIN_TASKS = 8
SOFTMAX_ROWS = 2  # rows a softmax pass carries at once: NR * SOFTMAX_ROWS max and sum chains


def _loop(b, start, stop, step, body, carried=()):
    return while_loop(b, start, lambda i: b.icmp_signed("<", i, stop), step, body, carried)[1]


def _when(b: ir.IRBuilder, cond, then):
    then_bb = b.function.append_basic_block("when")
    done = b.function.append_basic_block("when.done")
    b.cbranch(cond, then_bb, done)
    b.position_at_end(then_bb)
    then()
    b.branch(done)
    b.position_at_end(done)


def _vmax(b, x, y):
    return b.select(b.fcmp_ordered(">", x, y), x, y)


def define_attention(module: ir.Module, name: str, p: AttentionParams, lanes: int) -> str:
    fn, b = kernel_function(module, name)
    q, q_rs, kp, kp_ps, vp, vp_ps, mask, mask_rs, out, out_rs, rows, L, d, dv, s, s_rs = fn.args
    vty = ir.VectorType(F32, lanes)
    NR = vectors_per_row(p, lanes)  # noqa: N806 (the module's NR, per target)
    width = NR * lanes
    zero = ir.Constant(vty, [0.0] * lanes)
    minus_inf = ir.Constant(vty, [float("-inf")] * lanes)
    iota = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))
    c = lambda x: ir.Constant(I64, x)  # noqa: E731

    def at(base, i, ety=F32):
        return b.gep(base, [i], source_etype=ety)

    def vload(ptr, m=None):
        return masked_load(b, ptr, vty, m, 4) if m is not None else b.load(ptr, typ=vty, align=4)

    def vstore(val, ptr, m=None):
        if m is not None:
            masked_store(b, val, ptr, m, 4)
        else:
            b.store(val, ptr, align=4)

    def lane_masks(start, stop):
        """Per vector j of a block starting at `start`: the lanes before `stop`; None for a full block."""
        rem = broadcast(b, b.sub(stop, start), lanes)
        return [b.icmp_signed("<", b.add(iota, ir.Constant(iota.type, [j * lanes] * lanes)), rem) for j in range(NR)]

    def micro(mr, a_at, panel, n):
        """acc[i][j] = sum over t < n of a(i, t) * panel[t][vector j]: a_at(i, t) a float pointer, `panel` rows of
        W floats, read whole."""
        def body(t, acc):
            row = at(panel, b.mul(t, c(width)))
            bv = [vload(at(row, c(j * lanes))) for j in range(NR)]
            out_acc = list(acc)
            for i in range(mr):
                ab = broadcast(b, b.load(a_at(i, t), typ=F32, align=4), lanes)
                for j in range(NR):
                    out_acc[i * NR + j] = fma(b, ab, bv[j], acc[i * NR + j])
            return out_acc

        return _loop(b, c(0), n, c(1), body, [zero] * (mr * NR))

    scale = ir.Constant(vty, [p.scale] * lanes)
    fill = ir.Constant(vty, [p.fill] * lanes)
    row_max = b.alloca(vty, size=ir.Constant(I32, MR))  # each row's running max over the score vectors so far

    def block(r0, mr):
        qrow = [at(q, b.mul(b.add(r0, c(i)), q_rs)) for i in range(mr)]
        srow = [at(s, b.mul(c(i), s_rs)) for i in range(mr)]  # one block's scores at a time
        mrow = [at(mask, b.mul(b.add(r0, c(i)), mask_rs), F32 if p.mask_kind == "add" else I8) for i in range(mr)]
        orow = [at(out, b.mul(b.add(r0, c(i)), out_rs)) for i in range(mr)]

        # scores, a column block of `width` at a time, and each row's max as they are stored
        maxes = [b.gep(row_max, [c(i)], source_etype=vty) for i in range(mr)]
        for i in range(mr):
            b.store(minus_inf, maxes[i])

        def scores(l0, masks):
            acc = micro(mr, lambda i, t: at(qrow[i], t), at(kp, b.mul(b.sdiv(l0, c(width)), kp_ps)), d)
            for i in range(mr):
                running = b.load(maxes[i], typ=vty)
                for j in range(NR):
                    col = b.add(l0, c(j * lanes))
                    x = b.fmul(acc[i * NR + j], scale)
                    m = masks[j] if masks else None
                    if p.mask_kind == "add":
                        x = b.fadd(x, vload(at(mrow[i], col), m))
                    elif p.mask_kind in ("select", "fill"):
                        kty = ir.VectorType(I8, lanes)
                        flag = masked_load(b, at(mrow[i], col, I8), kty, m, 1) if m is not None else \
                            b.load(at(mrow[i], col, I8), typ=kty, align=1)
                        true = b.icmp_unsigned("!=", flag, ir.Constant(kty, [0] * lanes))
                        x = b.select(true, x, fill) if p.mask_kind == "select" else b.select(true, fill, x)
                    if m is not None and p.middle == "softmax":
                        x = b.select(m, x, minus_inf)
                    if p.middle == "relu":
                        x = b.select(b.fcmp_ordered("<", x, zero), zero, x)  # NaN stays NaN, as Relu keeps it
                    vstore(x, at(srow[i], col))
                    running = _vmax(b, running, x)
                if p.middle == "softmax":
                    b.store(running, maxes[i])

        full = b.mul(b.sdiv(L, c(width)), c(width))
        _loop(b, c(0), full, c(width), lambda l0, _a: scores(l0, None) or [])
        _when(b, b.icmp_signed("<", full, L), lambda: scores(full, lane_masks(full, L)))

        # softmax without the division: exp(s - max) in place and each row's sum; SOFTMAX_ROWS rows and a column
        # block's vectors in one loop, so the sum chains run side by side without spilling the exp's temporaries
        # (all MR rows at once spilled on AVX2). A plain chain keeps the products as they are.
        padded = b.mul(b.sdiv(b.add(L, c(width - 1)), c(width)), c(width))
        none = ir.Constant(F32, 0.0 if p.nan_guard else float("nan"))
        inv = [None] * mr
        for g in range(0, mr if p.middle == "softmax" else 0, SOFTMAX_ROWS):
            chains = [(i, j) for i in range(g, min(g + SOFTMAX_ROWS, mr)) for j in range(NR)]
            mxv, masked_all = {}, {}
            raw_max = {}
            for i in range(g, min(g + SOFTMAX_ROWS, mr)):
                mx = raw_max[i] = _reduce(b, b.load(maxes[i], typ=vty), _vmax)
                masked_all[i] = b.fcmp_ordered("==", mx, ir.Constant(F32, float("-inf")))
                # a row masked everywhere: exp(-inf - 0) = 0 instead of exp(-inf + inf) = NaN in its products
                mxv[i] = broadcast(b, b.select(masked_all[i], ir.Constant(F32, 0.0), mx), lanes)

            def expsum(l0, a, chains=chains, mxv=mxv):
                out_sum = []
                for k, (i, j) in enumerate(chains):
                    ptr = at(srow[i], b.add(l0, c(j * lanes)))
                    e = vexp_nonpositive(b, b.fsub(vload(ptr), mxv[i]))
                    vstore(e, ptr)
                    out_sum.append(b.fadd(a[k], e))
                return out_sum

            vs = _loop(b, c(0), padded, c(width), expsum, [zero] * len(chains))
            for k in range(0, len(chains), NR):
                i = chains[k][0]
                row = vs[k]
                for j in range(1, NR):
                    row = b.fadd(row, vs[k + j])
                total = _reduce(b, row, lambda bb, x, y: bb.fadd(x, y))
                # the row's max and sum, after the scores' scratch: a call on one block of keys (exec.c's key
                # blocks) is merged with the others' by them
                stat = at(s, b.add(b.mul(c(MR), s_rs), b.mul(b.add(r0, c(i)), c(2))))
                b.store(raw_max[i], stat, align=4)
                b.store(total, at(stat, c(1)), align=4)
                inv[i] = broadcast(b, b.select(masked_all[i], none, b.fdiv(ir.Constant(F32, 1.0), total)), lanes)

        # out = p V, scaled by 1 / sum
        def values(c0, masks):
            acc = micro(mr, lambda i, t: at(srow[i], t), at(vp, b.mul(b.sdiv(c0, c(width)), vp_ps)), L)
            for i in range(mr):
                for j in range(NR):
                    o = acc[i * NR + j] if inv[i] is None else b.fmul(acc[i * NR + j], inv[i])
                    vstore(o, at(orow[i], b.add(c0, c(j * lanes))), masks[j] if masks else None)

        vfull = b.mul(b.sdiv(dv, c(width)), c(width))
        _loop(b, c(0), vfull, c(width), lambda c0, _a: values(c0, None) or [])
        _when(b, b.icmp_signed("<", vfull, dv), lambda: values(vfull, lane_masks(vfull, dv)))

    whole = b.mul(b.sdiv(rows, c(MR)), c(MR))
    _loop(b, c(0), whole, c(MR), lambda r0, _a: block(r0, MR) or [])
    _loop(b, whole, rows, c(1), lambda r0, _a: block(r0, 1) or [])
    b.ret_void()
    return name


def build(region, target: Target) -> tuple[bytes, AttentionKernelDesc, str]:
    """Returns (object code, the glue's description, LLVM IR text)."""
    p = region.params
    elem = dtype(p.dtype)
    if elem.memory != F32:
        raise ValueError(f"the attention kernel is written for float32 tensors, not {elem.name}")
    module = new_module(target, region.op_type)
    sym = define_attention(module, f"{region.op_type}_attn", p, target.float32_lanes)
    amx_sym, matrix = "", None
    if p.products != "float32":  # with the float32 kernel beside it, for where the tiles cannot run
        operand = {v: k for k, v in amx.PRODUCTS.items()}[p.products]
        matrix, why = amx.choose(target, operand)
        if matrix is None:
            raise ValueError(f"the attention kernel's {operand} products need AMX tiles: {why}")
        amx_sym = amx.define_attention_amx(module, f"{region.op_type}_attn_amx", p, matrix, emulating())
    ir_text = str(module)
    obj = compile_object(ir_text, target, vectorize=False)
    e = elem.onnx
    in_types = [e, e, e] + ([e if p.mask_kind == "add" else dtype("bool").onnx] if p.mask_kind != "none" else [])
    desc = AttentionKernelDesc(op_type=region.op_type, in_types=in_types, out_types=[e],
                               k_transposed=p.k_transposed, mask_kind=p.mask_kind,
                               block=vectors_per_row(p, target.float32_lanes) * target.float32_lanes,
                               rows_block=MR, min_tasks=p.min_tasks or MIN_TASKS,
                               fn=sym,
                               rank=max((len(x) for x in p.perms), default=0), perms=p.perms,
                               amx_fn=amx_sym, matrix_instruction=matrix.name if matrix else "",
                               amx_f16=p.products == "float16", amx_min_keys=amx.MIN_KEYS if amx_sym else 0,
                               amx_emulated=bool(amx_sym) and emulating(),
                               middle_softmax=p.middle == "softmax",
                               key_floats=0 if p.key_floats < 0 else p.key_floats or key_floats(MR))
    return obj, desc, ir_text
