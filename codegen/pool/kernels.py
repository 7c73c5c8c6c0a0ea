"""Pooling kernels (MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool) with a fused epilogue, as LLVM IR.

Windowed pools (2-D, NCHW). The C glue (codegen/glue/pool_exec.c) calls `<op>_rows(const int64 *args)` for a band
of output rows of one channel plane. The function walks strips of `lanes` output columns down the band: output row i
reads padded rows i*sh + r*dh (r < kh), and each padded row is loaded once per strip, its reduction (or, with a width
stride, its raw window) carried in registers to the output rows that share it. A row outside the image is a row of
padding (the lowest float for max, what onnxruntime starts its maximum from; zero for average). Along the width a
strip reads input columns ow*sw - pl + ... with masked loads whose masks (lanes outside the image read the pad
value) are computed once per strip: with sw = 1 one load per tap; with sw > 1 the window of vectors that holds every
tap's lanes, shuffled into taps. Averages multiply by the reciprocal of the tap count, per row times per column
(tables from the glue, counted as onnxruntime counts them). The region's elementwise program then runs on the
vector in registers and every program output is stored; the last strip of a row uses masked stores.

Global pools. `<op>_global(const int64 *args)` reduces `lanes` channels at once: one accumulator vector per channel
over H * W (a masked tail), then a shuffle tree that adds (or maxes) the channels' vectors pairwise, halving the
lanes each channel holds at each level, so the result holds one channel per lane; the epilogue runs on it and one
masked store writes `lanes` outputs.

The argument record (8-byte slots, mirrored by `pool_args` in pool_exec.c):
    0 src      windowed: the plane; global: the call's first channel
    1 stride   windowed: floats between input rows; global: H * W
    2 ow       windowed: output width
    3 n        windowed: output rows in the band; global: channels in this call (<= lanes)
    4 inv_h    average: 1 / taps per output row, from the band's first row
    5 inv_w    average: 1 / taps per output column
    6..9       outputs (at the band's first row, or the call's first channel)
    10..17     epilogue inputs: POSITION laid out like the output (same offset), CHANNEL one value for the plane
               (windowed) or one per channel (global: a vector), SCALAR one value
    18 vw, 19 pl, 20 row0, 21 vh   windowed: valid width, left pad, input row of the band's first padded row,
               valid height (rows outside [0, vh) and columns outside [0, vw) are padding)
    22 padrow  windowed: vw floats of padding
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from onnxopt.codegen.elementwise.lower import emit_body
from onnxopt.codegen.glue.contract import POOL_ARGS, POOL_MAX_EXTRA, POOL_MAX_OUT
from onnxopt.codegen.vmath.irutil import broadcast, intrinsic, masked_store, suffix
from onnxopt.codegen.vmath.irutil import while_loop as _loop
from onnxopt.codegen.vmath.isa import set_features
from onnxopt.fusion.region import EwProgram

F32 = ir.FloatType()
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()
VOID = ir.VoidType()

POSITION, CHANNEL, COLUMN, SCALAR = 0, 1, 2, 3
FLOAT_LOWEST = -3.4028234663852886e38  # -FLT_MAX: exactly a float

# pool_args: 8-byte slots (codegen/glue/contract.py, POOL_ARGS; pool_exec.c fills the struct generated from it).
MAX_OUTPUTS = POOL_MAX_OUT.value
MAX_EXTRAS = POOL_MAX_EXTRA.value
SLOT_SRC, SLOT_STRIDE, SLOT_OW, SLOT_N, SLOT_INV_H, SLOT_INV_W = (
    POOL_ARGS.index(n) for n in ("src", "stride", "ow", "n", "inv_h", "inv_w"))
SLOT_OUT, SLOT_EXTRA = POOL_ARGS.index("out"), POOL_ARGS.index("extra")
SLOT_VW, SLOT_PL, SLOT_ROW0, SLOT_VH, SLOT_PADROW = (POOL_ARGS.index(n) for n in ("vw", "pl", "row0", "vh", "padrow"))
SLOTS = POOL_ARGS.n_slots

OPS = ("max", "avg", "gmax", "gavg")


@dataclass(frozen=True)
class PoolSpec:
    """What is fixed per fused pool op."""

    op: str  # "max", "avg" (windowed 2-D) or "gmax", "gavg" (global)
    lanes: int
    epilogue: EwProgram  # inputs[0] is the pooled value; the rest are extras, in order
    extra_kinds: tuple[int, ...]
    kernel: tuple[int, int] = (1, 1)
    strides: tuple[int, int] = (1, 1)
    dilations: tuple[int, int] = (1, 1)
    dtype: str = "float32"  # or "uint8" / "int8": a windowed MaxPool only, with no epilogue (fusion/pool.py)

    @property
    def is_max(self) -> bool:
        return self.op in ("max", "gmax")

    @property
    def elem(self) -> ir.Type:
        return F32 if self.dtype == "float32" else I8

    @property
    def size(self) -> int:
        """Bytes per element: the loads' alignment."""
        return 4 if self.dtype == "float32" else 1

    @property
    def pad_value(self):
        """What a tap of padding reads: the type's lowest value for a maximum (onnxruntime's start), else zero."""
        if self.dtype == "uint8":
            return 0
        if self.dtype == "int8":
            return -128 if self.is_max else 0
        return FLOAT_LOWEST if self.is_max else 0.0


# ---- IR helpers ----
def _slot(b, args, index, ty):
    return b.load(b.gep(args, [ir.Constant(I64, index)], source_etype=I64), typ=ty)


def _i64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def _splat(lanes: int, value: float, elem: ir.Type = F32) -> ir.Constant:
    return ir.Constant(ir.VectorType(elem, lanes), [value] * lanes)


def _lane_mask(b, valid, lanes):
    """<lanes x i1>: lane l is on when l < valid (an i64)."""
    idx = ir.Constant(ir.VectorType(I32, lanes), list(range(lanes)))
    return b.icmp_signed("<", idx, broadcast(b, b.trunc(valid, I32), lanes))


def _masked_load(b, ptr, lanes, mask, passthru):
    """Lanes under `mask` from ptr, the others `passthru`'s; a whole vector when mask is None."""
    vty = passthru.type
    align = 4 if vty.element == F32 else 1
    if mask is None:
        return b.load(ptr, typ=vty, align=align)
    return intrinsic(b, f"llvm.masked.load.{suffix(vty)}.p0", vty, [ptr, ir.Constant(I32, align), mask, passthru])


def _load(b, ptr, lanes, mask=None, passthru=None):
    vty = ir.VectorType(F32, lanes)
    if mask is None:
        return b.load(ptr, typ=vty, align=4)
    return _masked_load(b, ptr, lanes, mask, passthru if passthru is not None else _splat(lanes, 0.0))


def _store(b, value, ptr, mask=None):
    align = 4 if value.type.element == F32 else 1
    if mask is None:
        b.store(value, ptr, align=align)
    else:
        masked_store(b, value, ptr, mask, align)


def _combine(b, is_max, x, y, dtype="float32"):
    """max(x, y) as x86's maxps(x, y) computes it (x when x > y, else y), or x + y; on int8 and uint8 the integer
    maximum (pmaxsb / pmaxub)."""
    if is_max:
        if dtype == "float32":
            return b.select(b.fcmp_ordered(">", x, y), x, y)
        gt = b.icmp_signed(">", x, y) if dtype == "int8" else b.icmp_unsigned(">", x, y)
        return b.select(gt, x, y)
    return b.fadd(x, y)


def _if(b, cond, then):
    fn = b.function
    then_bb = fn.append_basic_block("if.then")
    done = fn.append_basic_block("if.done")
    b.cbranch(cond, then_bb, done)
    b.position_at_end(then_bb)
    then()
    b.branch(done)
    b.position_at_end(done)


# ---- windowed pools ----
def _concat(b, vs):
    """One vector of all lanes of vs, in order (padded with undefined vectors to a power-of-two count)."""
    vs = list(vs)
    n = 1
    while n < len(vs):
        n *= 2
    while len(vs) < n:
        vs.append(ir.Constant(vs[0].type, ir.Undefined))
    while len(vs) > 1:
        width = vs[0].type.count
        mask = ir.Constant(ir.VectorType(I32, 2 * width), list(range(2 * width)))
        vs = [b.shuffle_vector(vs[i], vs[i + 1], mask) for i in range(0, len(vs), 2)]
    return vs[0]


def _epilogue_and_store(b, spec, values_in, outs, extras, scalar_extras, pos, mask, lanes=None):
    """Run the epilogue program on the pooled vector and store every output at `pos` (floats from each base)."""
    prog = spec.epilogue
    lanes = lanes or spec.lanes
    values = {prog.inputs[0].name: values_in}
    for e, kind in enumerate(spec.extra_kinds):
        name = prog.inputs[e + 1].name
        if e in scalar_extras:
            values[name] = scalar_extras[e]
        else:
            values[name] = _load(b, b.gep(extras[e], [pos], source_etype=F32), lanes, mask)
    emit_body(b, prog, values, lanes)
    for k, v in enumerate(prog.outputs):
        _store(b, values[v.name], b.gep(outs[k], [pos], source_etype=spec.elem), mask)


def _needed(p: int, kh: int, sh: int, dh: int) -> bool:
    """Is the row at offset p of an output's span read by that output or by a later one?"""
    taps = {r * dh for r in range(kh)}
    return any(p - k * sh in taps for k in range(p // sh + 1))


def define_rows_function(module: ir.Module, name: str, spec: PoolSpec) -> ir.Function:
    """void rows(const int64 *args): a band of output rows of one plane, one strip of `lanes` output columns at a time.

    Down a strip, output row i reads padded rows i*sh + r*dh (r < kh), a span of E = (kh-1)*dh + 1 rows. Each padded
    row is loaded when it enters the span, and what the next output row shares (E - sh rows) is carried in registers,
    so each row is read once per strip. A row is the input row, or a row of padding above and below the image. Along
    the width, a strip reads input columns from ow*sw - pl on with masked loads (lanes outside [0, w) read as padding;
    the masks are the strip's, computed once). With sw = 1 each tap is one load and a row is reduced along the width
    as it is loaded; with sw > 1 a row is the window of vectors that holds every tap's lanes, the rows are reduced
    first and the result is shuffled into taps once per output row."""
    kh, kw = spec.kernel
    sh, sw = spec.strides
    dh, dw = spec.dilations
    span = (kh - 1) * dh + 1
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR]), name=name)
    fn.args[0].add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    args = fn.args[0]
    x = _slot(b, args, SLOT_SRC, PTR)
    stride = _slot(b, args, SLOT_STRIDE, I64)
    ow_n = _slot(b, args, SLOT_OW, I64)
    nrows = _slot(b, args, SLOT_N, I64)
    vw = _slot(b, args, SLOT_VW, I64)
    pl = _slot(b, args, SLOT_PL, I64)
    row0 = _slot(b, args, SLOT_ROW0, I64)
    vh = _slot(b, args, SLOT_VH, I64)
    padrow = _slot(b, args, SLOT_PADROW, PTR)
    avg = spec.op == "avg"
    inv_h = _slot(b, args, SLOT_INV_H, PTR) if avg else None
    inv_w = _slot(b, args, SLOT_INV_W, PTR) if avg else None
    prog = spec.epilogue
    outs = [_slot(b, args, SLOT_OUT + k, PTR) for k in range(len(prog.outputs))]
    extras = [_slot(b, args, SLOT_EXTRA + e, PTR) for e in range(len(spec.extra_kinds))]
    # One value for the whole plane: loaded once.
    scalars = {e: b.load(extras[e], typ=F32) for e, k in enumerate(spec.extra_kinds) if k in (CHANNEL, SCALAR)}
    vw32 = b.trunc(vw, I32)

    elem = spec.elem

    def strip(ow, mask, lanes):
        """Output columns ow .. ow + lanes - 1 (those under `mask` when given) of every row of the band."""
        vty = ir.VectorType(elem, lanes)
        i32v = ir.VectorType(I32, lanes)
        pad = _splat(lanes, spec.pad_value, elem)
        scalar_extras = {e: broadcast(b, v, lanes) for e, v in scalars.items()}
        # Loads per padded row: one per tap (sw = 1), or the window of vectors that holds every tap's lanes.
        loads = [c * dw for c in range(kw)] if sw == 1 else \
            [t * lanes for t in range(-(-((lanes - 1) * sw + (kw - 1) * dw + 1) // lanes))]
        width = 1 if sw == 1 else len(loads)  # vectors kept per padded row
        carry = max(0, span - sh)
        if carry * width > (12 if spec.lanes >= 16 else 6):  # too many registers: each output loads its rows
            carry = 0
        base = b.sub(b.mul(ow, _i64(sw)), pl)
        base32 = broadcast(b, b.trunc(base, I32), lanes)
        zero32, w32 = ir.Constant(i32v, [0] * lanes), broadcast(b, vw32, lanes)
        offs, masks = [], []
        for o in loads:
            idx = b.add(base32, ir.Constant(i32v, [o + l for l in range(lanes)]))
            masks.append(b.and_(b.icmp_signed(">=", idx, zero32), b.icmp_signed("<", idx, w32)))
            offs.append(b.add(base, _i64(o)))
        iw = _load(b, b.gep(inv_w, [ow], source_etype=F32), lanes, mask) if avg else None

        def combine(vs):
            acc = vs[0]
            for v in vs[1:]:
                acc = _combine(b, spec.is_max, acc, v, spec.dtype)
            return acc

        def taps(vs):
            """sw > 1: each tap's lanes picked from the window by a shuffle."""
            cat = _concat(b, vs)
            return [b.shuffle_vector(cat, ir.Constant(cat.type, ir.Undefined),
                                     ir.Constant(i32v, [l * sw + c * dw for l in range(lanes)])) for c in range(kw)]

        def band(row_masks):
            """Every output row of the strip, its rows loaded under `row_masks` (None: whole vectors)."""

            def load_row(i, p):
                """The row's vectors: reduced along the width (sw = 1), or the raw window (sw > 1: the rows are
                reduced first, then the window is shuffled once per output row instead of once per padded row)."""
                ih = b.add(row0, b.add(b.mul(i, _i64(sh)), _i64(p)))
                inside = b.and_(b.icmp_signed(">=", ih, _i64(0)), b.icmp_signed("<", ih, vh))
                row = b.select(inside, b.gep(x, [b.mul(ih, stride)], source_etype=elem), padrow)
                vs = [_masked_load(b, b.gep(row, [o], source_etype=elem), lanes, m, pad)
                      for o, m in zip(offs, row_masks)]
                return [combine(vs)] if sw == 1 else vs

            undef = [ir.Constant(vty, ir.Undefined)] * width
            init = [v for p in range(carry) for v in (load_row(_i64(0), p) if _needed(p, kh, sh, dh) else undef)]

            def output_row(i, carried):
                rows = {p: carried[p * width:(p + 1) * width] for p in range(carry)}
                for p in range(carry, span):
                    if p not in rows and _needed(p, kh, sh, dh):
                        rows[p] = load_row(i, p)
                acc = [combine([rows[r * dh][t] for r in range(kh)]) for t in range(width)]
                acc = acc[0] if sw == 1 else combine(taps(acc))
                if avg:
                    ih = broadcast(b, b.load(b.gep(inv_h, [i], source_etype=F32), typ=F32), lanes)
                    acc = b.fmul(acc, b.fmul(ih, iw))
                _epilogue_and_store(b, spec, acc, outs, extras, scalar_extras, b.add(b.mul(i, ow_n), ow), mask, lanes)
                return [v for p in range(carry) for v in rows.get(sh + p, undef)]

            _loop(b, _i64(0), lambda i: b.icmp_signed("<", i, nrows), _i64(1), output_row, carried=init)

        if spec.dtype == "float32":
            band(masks)
        else:
            # Below AVX-512BW no instruction loads bytes under a mask: LLVM loads such a vector lane by lane (10x
            # slower). A strip whose taps are all inside the row loads whole vectors; the image's edges stay masked.
            inside = b.and_(b.icmp_signed(">=", b.add(base, _i64(loads[0])), _i64(0)),
                            b.icmp_signed("<=", b.add(base, _i64(loads[-1] + lanes)), vw))
            with b.if_else(inside) as (whole, edge):
                with whole:
                    band([None] * len(masks))
                with edge:
                    band(masks)

    lanes = spec.lanes
    ow_end, _ = _loop(b, _i64(0), lambda ow: b.icmp_signed("<=", b.add(ow, _i64(lanes)), ow_n), _i64(lanes),
                      lambda ow, _: strip(ow, None, lanes))
    rest = b.sub(ow_n, ow_end)
    half = lanes // 2
    if half >= 4:
        # The last columns: a strip of half the width when they fit in one (half the work on CPUs that split wide
        # vectors in two, such as AMD's Zen 4), else a masked full strip.
        _if(b, b.icmp_signed(">", rest, _i64(half)), lambda: strip(ow_end, _lane_mask(b, rest, lanes), lanes))
        _if(b, b.and_(b.icmp_signed(">", rest, _i64(0)), b.icmp_signed("<=", rest, _i64(half))),
            lambda: strip(ow_end, _lane_mask(b, rest, half), half))
    else:
        _if(b, b.icmp_signed(">", rest, _i64(0)), lambda: strip(ow_end, _lane_mask(b, rest, lanes), lanes))
    b.ret_void()
    return fn


# ---- global pools ----
def _reduce_tree(b, is_max, vecs: list, lanes: int):
    """vecs[c] holds channel c's partial results in every lane; returns one vector with channel c in lane c."""
    state = [(v, [c]) for c, v in enumerate(vecs)]  # (vector, channel of each group of lanes)
    size = lanes
    while size > 1:
        half = size // 2
        nxt = []
        for k in range(0, len(state), 2):
            (va, ga), (vb, gb) = state[k], state[k + 1]
            lo, hi, groups = [], [], []
            for g in range(len(ga)):
                lo += [g * size + t for t in range(half)] + [lanes + g * size + t for t in range(half)]
                hi += [g * size + half + t for t in range(half)] + [lanes + g * size + half + t for t in range(half)]
                groups += [ga[g], gb[g]]
            mty = ir.VectorType(I32, lanes)
            x = b.shuffle_vector(va, vb, ir.Constant(mty, lo))
            y = b.shuffle_vector(va, vb, ir.Constant(mty, hi))
            nxt.append((_combine(b, is_max, x, y), groups))
        state = nxt
        size = half
    v, groups = state[0]
    perm = [groups.index(c) for c in range(lanes)]
    if perm == list(range(lanes)):
        return v
    return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), ir.Constant(ir.VectorType(I32, lanes), perm))


def define_global_function(module: ir.Module, name: str, spec: PoolSpec) -> ir.Function:
    lanes = spec.lanes
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR]), name=name)
    fn.args[0].add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    args = fn.args[0]
    x = _slot(b, args, SLOT_SRC, PTR)
    hw = _slot(b, args, SLOT_STRIDE, I64)
    nch = _slot(b, args, SLOT_N, I64)
    prog = spec.epilogue
    outs = [_slot(b, args, SLOT_OUT + k, PTR) for k in range(len(prog.outputs))]
    extras = [_slot(b, args, SLOT_EXTRA + e, PTR) for e in range(len(spec.extra_kinds))]
    # Channels past the call's count read the last one (valid memory) and are never stored.
    last = b.sub(nch, _i64(1))
    chans = []
    for c in range(lanes):
        idx = b.select(b.icmp_signed("<", _i64(c), nch), _i64(c), last)
        chans.append(b.gep(x, [b.mul(idx, hw)], source_etype=F32))
    init = _splat(lanes, spec.pad_value)

    def body(i, accs):
        return [_combine(b, spec.is_max, a, _load(b, b.gep(p, [i], source_etype=F32), lanes))
                for a, p in zip(accs, chans)]

    i_end, accs = _loop(b, _i64(0), lambda i: b.icmp_signed("<=", b.add(i, _i64(lanes)), hw), _i64(lanes), body,
                        carried=[init] * lanes)
    mask = _lane_mask(b, b.sub(hw, i_end), lanes)  # all off when H * W is a multiple of the lanes
    accs = [_combine(b, spec.is_max, a, _load(b, b.gep(p, [i_end], source_etype=F32), lanes, mask, init))
            for a, p in zip(accs, chans)]
    v = _reduce_tree(b, spec.is_max, accs, lanes)
    if spec.op == "gavg":
        v = b.fdiv(v, broadcast(b, b.sitofp(hw, F32), lanes))
    out_mask = _lane_mask(b, nch, lanes)
    scalar_extras = {e: broadcast(b, b.load(extras[e], typ=F32), lanes)
                     for e, k in enumerate(spec.extra_kinds) if k == SCALAR}
    _epilogue_and_store(b, spec, v, outs, extras, scalar_extras, _i64(0), out_mask)
    b.ret_void()
    return fn


def define_pool_functions(module: ir.Module, prefix: str, spec: PoolSpec, features) -> dict[str, str]:
    """The op's functions; returns their symbols: {"rows"} or {"global"}."""
    if spec.op not in OPS:
        raise ValueError(f"unknown pool op {spec.op}")
    if spec.dtype != "float32" and spec.op != "max":
        raise ValueError(f"a {spec.dtype} pool is a windowed MaxPool only, not {spec.op}")
    set_features(module, features)
    if spec.op in ("gmax", "gavg"):
        define_global_function(module, f"{prefix}_global", spec)
        return {"global": f"{prefix}_global"}
    define_rows_function(module, f"{prefix}_rows", spec)
    return {"rows": f"{prefix}_rows"}
