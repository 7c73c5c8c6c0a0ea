"""The attention chain's two products in bfloat16 on AMX tiles (`--precision bf16` / `auto` on an AMX-BF16 target),
or in float16 (`--precision fp16` on an AMX-FP16 target: `tdpfp16ps`, the same program and kernel, every "bf16"
below read as float16).

Both products are bf16 GEMMs into float32 sums, written in the tensor language and matched against the target's
matrix instructions by AMOS's mapper (codegen/instructions/mapping.py `implemented`), as the bf16 GEMM's tile is
(codegen/compute/amx_tile.py): scores[query, key] += q[query, depth] * kT[depth, key] and
out[query, column] += p[query, key] * v[key, column] both map onto `tdpbf16ps` with the query rows on the tile's rows.

One tile program (`program`) serves both: C tiles for 16 rows x 4 column tiles (64 columns), summed over the
reduction in chunks of 32 (one A tile: 16 rows of 64 bytes; one B tile: 16 pair rows of 16 columns), a pass per 64
columns. The kernel (`define_attention_amx`) runs it twice per block of 16 query rows:

    q16 = bf16(Q rows)                       [16][dp]      dp = d rounded up to 32, zeros past d
    s   = q16 K^T           (the tiles)      [16][Lp]      float32, Lp = L rounded up to 64
    x   = scale * s (+ mask), -inf past L;   p16 = bf16(exp(x - max)), each row's sum of p16's values
    o   = p16 V             (the tiles)      [16][dvp]     float32, dvp = dv rounded up to 64
    out = o / sum                            only the block's rows, only dv columns

The operands the tiles read as B are packed by the glue once per task (exec.c `attn_pack16`): K^T as bf16 pairs of
head-dim rows, [dp / 2][Lp][2] (zeros past d and L), V as pairs of key rows, [Lk / 2][dvp][2] with Lk = L rounded up
to 32 (zeros past L and dv): the tiles' own layouts. The sum is taken over the rounded weights, so the output is a
weighted mean of V's bf16 values with weights that add up to one exactly as the products see them.

The scratch `s` holds, in this order: s [16][Lp] float32, q16 [16][dp] bf16, p16 [16][Lp] bf16, o [16][dvp] float32
(exec.c `attn_amx_scratch` sizes it the same way). The tiles are named registers (tile i in tmm<i>, all 16 x 64
bytes): the glue's task loads the one configuration (codegen/glue/matrix_engine.c `amx_tiles_configure`) before its
calls, as the bf16 GEMMs do. Where the CPU or the OS refuses the tiles at run time, the float32 kernel the library
also carries runs (lower.py). With ONNXOPT_EMULATE_TILES=1 the tile program is built as plain code, so the whole path
runs in tests on any CPU.
"""

from __future__ import annotations

from llvmlite import ir

from onnxopt.codegen.instructions import mapping, matrix_available
from onnxopt.codegen.instructions.expr import Computation, Loop, access, cast, mul
from onnxopt.codegen.instructions.tile_program import Dot, Load, Repeat, Store, TileProgram, Zero, affine
from onnxopt.codegen.microkernel.outer_product import lane_mask, round_rows_16bit, to_16bit
from onnxopt.codegen.vmath.exp import vexp_nonpositive
from onnxopt.codegen.vmath.irutil import broadcast, for_range, masked_load, masked_store, reduce_lanes

from .desc import kernel_function
from .params import AttentionParams

F32, I64, I32, I16, I8 = ir.FloatType(), ir.IntType(64), ir.IntType(32), ir.IntType(16), ir.IntType(8)
PTR = ir.PointerType()
ROWS = 16  # query rows a block: a tile's rows
COLUMN_TILES = 4  # C tiles a pass (64 columns), with one A and one B tile: 6 of the 8
K_CHUNK = 32  # bf16 elements of the reduction a tile step takes
PASS = COLUMN_TILES * 16  # columns a pass: the key and value column counts are padded to it
# The fewest keys the glue runs this kernel for; below, the float32 one (exec.c). At 32 keys the float32 kernel was
# faster (12 heads, head dim 64, 2 threads: 0.072-0.076 against 0.080-0.093 ms), at 48 the tiles (0.093-0.107
# against 0.105-0.112), at 64 1.1-1.3x (benchmarks/attention_chain.py --seqs 32,48,64, both products, twice).
MIN_KEYS = 33
_LOOPS = {"m": "row", "n": "column", "k": "depth"}


# The params' `products` for each 16-bit operand type, and back.
PRODUCTS = {"bf16": "bfloat16", "f16": "float16"}


def products(dtype: str = "bf16") -> list[Computation]:
    """The chain's two products in the tensor language, `dtype` operands (bf16, f16) widened to float32."""
    def gemm(name, a, b):
        return Computation(name, (Loop("row", ROWS), Loop("column", 16), Loop("depth", K_CHUNK, reduce=True)),
                           access("out", "f32", "row", "column"),
                           mul("f32", cast("f32", access(a, dtype, "row", "depth")),
                               cast("f32", access(b, dtype, "depth", "column"))))

    return [gemm(f"attention_scores_{dtype}", "q", "k_t"), gemm(f"attention_values_{dtype}", "p", "v")]


def choose(target, dtype: str = "bf16"):
    """(instruction, why): the matrix instruction both products map onto for `target`, or (None, why not)."""
    if target.float32_lanes != 16:
        return None, f"its {dtype} kernel finishes rows on 16-lane vectors (AVX-512)"
    available = matrix_available(target, (dtype, dtype))
    chosen = None
    for product in products(dtype):
        ins, m = mapping.implemented(product, available, _LOOPS)
        if ins is None:
            return None, (f"target {target.name} has no {dtype} matrix instruction" if m == "no matrix instruction"
                          else f"{product.name}: {m}")
        if chosen is not None and ins is not chosen:
            return None, "its two products map onto different instructions"
        chosen = ins
    return chosen, ""


def program(ins) -> TileProgram:
    """c[16][groups * 64] (float32, `c_rs` bytes a row) = a[16][chunks * 32] (bf16, `a_rs` bytes a row) times b
    (bf16 pairs: `chunks` x 16 pair rows of `groups` x 64 columns, `b_rs` bytes a pair row)."""
    c_shape, a_shape, b_shape = ins.shapes_for(ROWS, 16, K_CHUNK)
    cs = [f"c{j}" for j in range(COLUMN_TILES)]
    body = [Load("a", "a", affine((a_shape.colsb, "chunk")), affine("a_rs"))]
    for j, c in enumerate(cs):
        body += [Load("b", "b", affine((b_shape.rows, "chunk", "b_rs"), (PASS * 4, "group"), const=j * 64),
                      affine("b_rs")),
                 Dot(ins, c, "a", "b")]
    steps = (Repeat("group", affine("groups"),
                    tuple(Zero(c) for c in cs)
                    + (Repeat("chunk", affine("chunks"), tuple(body)),)
                    + tuple(Store(c, "c", affine((PASS * 4, "group"), const=j * 64), affine("c_rs"))
                            for j, c in enumerate(cs))),)
    shapes = tuple((c, c_shape) for c in cs) + (("a", a_shape), ("b", b_shape))
    return TileProgram("attention_bf16_amx", shapes, steps, (ins,))


def _round_up(b, x, to: int):
    return b.and_(b.add(x, ir.Constant(I64, to - 1)), ir.Constant(I64, -to))


def define_tiles_function(module: ir.Module, name: str, ins, emulate: bool) -> ir.Function:
    """`void name(a, b, c, chunks, groups, a_rs, b_rs, c_rs)`: `program` as a function of its own (its emulated
    tiles are stack buffers of its own frame)."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, I64, I64, I64, I64, I64]), name=name)
    a, b_, c, chunks, groups, a_rs, b_rs, c_rs = fn.args
    for x in (a, b_, c):
        x.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    prog = program(ins)
    # the glue's configuration (matrix_engine.c amx_tiles_configure): tile i in tmm<i>, each 16 rows of 64 bytes
    assert all((s.rows, s.colsb) == (16, 64) for _, s in prog.shapes), prog.shapes
    prog.emit(b, {"a": a, "b": b_, "c": c},
              {"chunks": chunks, "groups": groups, "a_rs": a_rs, "b_rs": b_rs, "c_rs": c_rs},
              emulate=emulate, fixed_registers=True)
    b.ret_void()
    return fn


def define_attention_amx(module: ir.Module, name: str, p: AttentionParams, ins, emulate: bool) -> str:
    """The kernel, with lower.py's float32 kernel's signature: kp and vp are the bf16 pairs (exec.c), kp_ps is Lp
    (keys a K^T pair row), vp_ps is dvp (columns a V pair row), s_rs is Lp."""
    tiles = define_tiles_function(module, f"{name}_tiles", ins, emulate)
    dtype = ins.source_dtypes[0]
    fn, b = kernel_function(module, name)
    q, q_rs, kp, lp, vp, dvp, mask, mask_rs, out, out_rs, rows, L, d, dv, s, _s_rs = fn.args
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    vty, hty = ir.VectorType(F32, 16), ir.VectorType(I16, 16)
    minus_inf = ir.Constant(vty, [float("-inf")] * 16)
    zero = ir.Constant(vty, [0.0] * 16)

    def at(base, i, ety=F32):
        return b.gep(base, [i], source_etype=ety)

    dp, lk = _round_up(b, d, K_CHUNK), _round_up(b, L, K_CHUNK)
    q16 = at(s, b.mul(c(ROWS), lp))  # after s [16][Lp] float32
    p16 = at(q16, b.mul(c(ROWS), dp), I16)
    o = at(p16, b.mul(c(ROWS), lp), I16)
    inv = b.alloca(F32, size=ir.Constant(I32, ROWS))  # each row's 1 / sum
    scale = ir.Constant(vty, [p.scale] * 16)
    fill = ir.Constant(vty, [p.fill] * 16)
    none = ir.Constant(F32, 0.0 if p.nan_guard else float("nan"))

    def widen(h):
        """16 values' 16-bit bits back to float32."""
        if dtype == "f16":
            return b.fpext(b.bitcast(h, ir.VectorType(ir.HalfType(), 16)), vty)
        return b.bitcast(b.shl(b.zext(h, ir.VectorType(I32, 16)), ir.Constant(ir.VectorType(I32, 16), [16] * 16)), vty)

    def softmax_row(i, r):
        """Row i of the block (query row r): the scores scaled and masked in place, their max; then p16's row and
        1 / its sum."""
        srow, prow = at(s, b.mul(i, lp)), at(p16, b.mul(i, lp), I16)
        mrow = at(mask, b.mul(r, mask_rs), F32 if p.mask_kind == "add" else I8)

        def scaled(c0, acc):
            running = list(acc)
            for j in range(4):
                col = b.add(c0, c(16 * j))
                valid = lane_mask(b, b.sub(L, col), 16)
                x = b.fmul(b.load(b.bitcast(at(srow, col), vty.as_pointer()), typ=vty, align=4), scale)
                if p.mask_kind == "add":
                    x = b.fadd(x, masked_load(b, at(mrow, col), vty, valid, 4))
                elif p.mask_kind in ("select", "fill"):
                    kty = ir.VectorType(I8, 16)
                    flag = masked_load(b, at(mrow, col, I8), kty, valid, 1)
                    true = b.icmp_unsigned("!=", flag, ir.Constant(kty, [0] * 16))
                    x = b.select(true, x, fill) if p.mask_kind == "select" else b.select(true, fill, x)
                x = b.select(valid, x, minus_inf)
                b.store(x, b.bitcast(at(srow, col), vty.as_pointer()), align=4)
                running[j] = b.select(b.fcmp_ordered(">", running[j], x), running[j], x)
            return running

        maxes = for_range(b, c(0), lp, c(PASS), scaled, [minus_inf] * 4)
        both = [b.select(b.fcmp_ordered(">", maxes[0], maxes[1]), maxes[0], maxes[1]),
                b.select(b.fcmp_ordered(">", maxes[2], maxes[3]), maxes[2], maxes[3])]
        mx = reduce_lanes(b, b.select(b.fcmp_ordered(">", both[0], both[1]), both[0], both[1]),
                          lambda bb, x, y: bb.select(bb.fcmp_ordered(">", x, y), x, y))
        masked_all = b.fcmp_ordered("==", mx, ir.Constant(F32, float("-inf")))
        # a row masked everywhere: exp(-inf - 0) = 0 instead of exp(-inf + inf) = NaN
        mxv = broadcast(b, b.select(masked_all, ir.Constant(F32, 0.0), mx), 16)

        def weights(c0, acc):
            sums = list(acc)
            for j in range(4):
                col = b.add(c0, c(16 * j))
                e = vexp_nonpositive(b, b.fsub(b.load(b.bitcast(at(srow, col), vty.as_pointer()), typ=vty, align=4),
                                               mxv))
                h = to_16bit(b, e, dtype)
                b.store(h, b.bitcast(at(prow, col, I16), hty.as_pointer()), align=2)
                rounded = widen(h)
                sums[j] = b.fadd(sums[j], rounded)
            return sums

        sums = for_range(b, c(0), lp, c(PASS), weights, [zero] * 4)
        total = reduce_lanes(b, b.fadd(b.fadd(sums[0], sums[1]), b.fadd(sums[2], sums[3])),
                             lambda bb, x, y: bb.fadd(x, y))
        b.store(b.select(masked_all, none, b.fdiv(ir.Constant(F32, 1.0), total)), at(inv, i))

    def block(r0, _):
        n = b.select(b.icmp_signed("<", b.sub(rows, r0), c(ROWS)), b.sub(rows, r0), c(ROWS))

        def q_row(i, _):
            round_rows_16bit(b, [at(q, b.mul(b.add(r0, i), q_rs))], at(q16, b.mul(i, dp), I16), d, dp, dtype)
            return []

        def zero_row(i, _):  # the last block's rows past the queries: zeros, so the tiles read no stale values
            round_rows_16bit(b, [q], at(q16, b.mul(i, dp), I16), c(0), dp)
            round_rows_16bit(b, [q], at(p16, b.mul(i, lp), I16), c(0), lp)
            return []

        for_range(b, c(0), n, c(1), q_row)
        for_range(b, n, c(ROWS), c(1), zero_row)
        b.call(tiles, [q16, kp, s, b.udiv(dp, c(K_CHUNK)), b.udiv(lp, c(PASS)), b.mul(dp, c(2)), b.mul(lp, c(4)),
                       b.mul(lp, c(4))])
        for_range(b, c(0), n, c(1), lambda i, _: softmax_row(i, b.add(r0, i)) or [])
        b.call(tiles, [p16, vp, o, b.udiv(lk, c(K_CHUNK)), b.udiv(dvp, c(PASS)), b.mul(lp, c(2)), b.mul(dvp, c(4)),
                       b.mul(dvp, c(4))])

        def out_row(i, _):
            orow, src = at(out, b.mul(b.add(r0, i), out_rs)), at(o, b.mul(i, dvp))
            factor = broadcast(b, b.load(at(inv, i), typ=F32), 16)

            def vector(c0, _):
                valid = lane_mask(b, b.sub(dv, c0), 16)
                x = b.load(b.bitcast(at(src, c0), vty.as_pointer()), typ=vty, align=4)
                masked_store(b, b.fmul(x, factor), at(orow, c0), valid, 4)
                return []

            for_range(b, c(0), dv, c(16), vector)
            return []

        for_range(b, c(0), n, c(1), out_row)
        return []

    for_range(b, c(0), rows, c(ROWS), block)
    b.ret_void()
    return name


def lower(region, target, dtype: str = "bf16") -> str | None:
    """Give the region's two products `dtype` operands on AMX tiles (`--precision bf16`/`auto`: bf16; `fp16`: f16),
    in place; or why not."""
    import dataclasses

    ins, why = choose(target, dtype)
    if ins is None:
        return f"attention: float32 ({why})"
    if region.params.dtype != "float32":
        return f"attention: {region.params.dtype} (its {dtype} kernel reads float32 tensors)"
    if region.params.middle != "softmax":
        return "attention: float32 (the tile program is written for the softmax chain)"
    region.params = dataclasses.replace(region.params, products=PRODUCTS[dtype])
    return None
