"""A packed-B matmul tile in bfloat16 on AMX tiles (`tdpbf16ps`; `--precision bf16`, issue 46 item 5).

The GEMM with bfloat16 operands and float32 sums is written in the tensor language and matched against the target's
matrix instructions by AMOS's mapper (codegen/instructions/mapping.py `implemented`): bf16 x bf16 into float32 is
`tdpbf16ps`'s (AMX-BF16), the tile program below implements the mapping rows -> the tile's rows, columns -> its
columns, K -> its reduction.

Both operands reach the tiles from memory in the tile's layouts:
- B is the weights' bfloat16 pairs, [K / 2][panel][2] per panel (fusion/compute.py `bfloat16_pairs`): 16 pairs of
  rows of one 16-column slice are a B tile as they lie, `panel * 4` bytes a row. Where the target has AMX-BF16 the
  packing pads K to a multiple of 32 with zero rows (driver/precision.py), so every tile load stays inside the
  weights; the glue runs these tiles only on such panels.
- A (float32 activations) is rounded to bfloat16 (round to nearest even, vcvtneps2bf16, as the vdpbf16ps tile
  does) by the set's rounding function into a buffer [rows][K rounded up to 32, zero-padded]: once for the whole op
  where its panels are split over several tasks (compute_exec.c `ct_round_a`), else once per task's chunk of rows.
  Every panel then reads that copy (rounding it per panel, or per panel task, cost a fifth of BERT's GEMMs).

One call computes 16 x `groups` rows (1 or 2 groups) of `nv` 16-column vectors over one block of K: the C tiles
start from `cin` (the partial sums of the blocks before, `acc`, or zeros), a Repeat over the block's 32-wide chunks,
then C goes to `acc` (not the last block) or to a stack buffer whose rows take the epilogue as the register tiles'
do (tile.py `emit_row_epilogue`). With two row groups the columns go two at a time (4 C, 2 A and 1 B tile of the 8).
The glue walks K in blocks of 256 so that a row block's A (16 KiB) stays in L1 while it meets every panel of the
task (with the whole K, A and B both came from L2 at every tile step). The tiles are named registers, with no
`ldtilecfg` of their own: the glue's task loads one configuration for all its calls (matrix_engine.c
`amx_tiles_configure`); LLVM's configuration at every call took 9% of the function. 128 x 768 x 3072 + bias, 2
threads, on a Sapphire Rapids: 475-484 -> 405-408 µs; 512 x 768 x 3072: 1,583-1,654 -> 1,307-1,400 µs.

The glue (compute_exec.c `ct_run_amx`) calls them on row blocks of 32 where the CPU has AMX-BF16 and the OS granted
the tile state (matrix_engine.c), else the register tiles. The program runs in the reference interpreter on any
host, and a library built with ONNXOPT_EMULATE_TILES=1 runs the same steps as plain code, so the whole path is tested
without AMX (tests/codegen/test_amx_bf16.py).
"""

from __future__ import annotations

from llvmlite import ir

from onnxopt.codegen.instructions import MATRIX_INSTRUCTIONS, mapping, matrix_available
from onnxopt.codegen.instructions.expr import Computation, Loop, access, cast, mul
from onnxopt.codegen.instructions.tile_program import Dot, Load, Repeat, Store, TileProgram, Zero, affine
from onnxopt.codegen.vmath.irutil import for_range

from ..microkernel.outer_product import F32, I16, I64, PTR, lane_mask, round_rows_16bit, to_16bit
from ..glue.contract import CT_TILE
from .tile import (SLOT_A, SLOT_A_MS, SLOT_B, SLOT_COFF, SLOT_EXTRA, SLOT_K, SLOT_LANES, SLOT_LDC, SLOT_M0, SLOT_OUT,
                   TileSpec, _slot, emit_row_epilogue)

SLOT_A16, SLOT_A16_ROWS, SLOT_A16_RS = CT_TILE.index("a16"), CT_TILE.index("a16_rows"), CT_TILE.index("a16_rs")
SLOT_ACC, SLOT_PHASE = CT_TILE.index("acc"), CT_TILE.index("phase")

ROWS = 16  # a tile's rows: one group of A's rows
MAX_GROUPS = 2  # row groups a call: with two, C tiles 2 x 2 per pass, two A tiles and one B tile
K_CHUNK = 32  # bf16 elements of K a tile step takes (64 bytes of an A row, 16 pair rows of B)
_LOOPS = {"m": "row", "n": "column", "k": "depth"}


def gemm(dtype: str = "bf16") -> Computation:
    """The packed-B tile's GEMM in the tensor language: out[row, column] += a[row, depth] * w[depth, column], bf16
    (or f16) operands widened to float32."""
    return Computation(f"compute_{dtype}", (Loop("row", ROWS), Loop("column", 16), Loop("depth", K_CHUNK, reduce=True)),
                       access("out", "f32", "row", "column"),
                       mul("f32", cast("f32", access("a", dtype, "row", "depth")),
                           cast("f32", access("w", dtype, "depth", "column"))))


def choose(target, lanes: int, dtype: str = "bf16"):
    """(instruction, mapping) the 16-bit tile (`dtype` "bf16" or "f16") runs on for `target`, or (None, why)."""
    if lanes != 16:
        return None, "the AMX tiles finish rows on 16-lane vectors (AVX-512)"
    ins, m = mapping.implemented(gemm(dtype), matrix_available(target, (dtype, dtype)), _LOOPS)
    if ins is None:
        return None, f"target {target.name} has no {dtype} matrix instruction" if m == "no matrix instruction" else m
    return ins, m


def program(ins, groups: int, nv: int, panel: int) -> TileProgram:
    """16 x `groups` rows of the bfloat16 A buffer (pointer `a16`, `a_rs` bytes a row) times `nv` 16-column slices
    of a B panel `panel` columns wide (pointer `b`), `chunks` chunks of 32 of K: the float32 sums [16 groups]
    [nv * 16] start from `cin` (the sums of the K blocks before, or zeros), stay in the C tiles over the block and
    are stored to `cout`."""
    _, a_shape, b_shape = ins.shapes_for(ROWS, 16, K_CHUNK)
    return passes(f"compute_bf16_amx_g{groups}v{nv}", ins, groups, nv, (("chunk", affine("chunks")),),
                  lambda g: Load(f"a{g}", "a16", affine((ROWS * g, "a_rs"), (a_shape.colsb, "chunk")), affine("a_rs")),
                  lambda j: Load("b", "b", affine((b_shape.rows * panel * 4, "chunk"), const=j * 64),
                                 affine(const=panel * 4)), start="cin")


def passes(name: str, ins, groups: int, nv: int, loops, load_a, load_b, start: str | None = None) -> TileProgram:
    """The tile program both bf16 kernels run: C tiles for 16 x `groups` rows and `nv` 16-column vectors, zeroed,
    summed over the K loops `loops` ((variable, count), outermost first) by `load_a(g)` (A tile `a{g}`) and
    `load_b(j)` (B tile `b`, vector j) and tdpbf16ps, then stored to `cout` [16 groups][nv * 16] float32. They
    start at zero, or from pointer `start` laid out as `cout`. With two row groups the vectors go two at a time (4 C,
    2 A and 1 B tile of the engine's 8)."""
    c_shape, a_shape, b_shape = ins.shapes_for(ROWS, 16, K_CHUNK)
    c_row = nv * 64  # bytes of a row of the sums
    step = 2 if groups == 2 else nv  # columns a pass: the tiles a pass holds fit the engine's 8
    steps = []
    for j0 in range(0, nv, step):
        cols = range(j0, min(j0 + step, nv))
        cs = {(g, j): f"c{g}{j - j0}" for g in range(groups) for j in cols}
        steps += [Zero(t) if start is None else
                  Load(t, start, affine(const=g * ROWS * c_row + j * 64), affine(const=c_row))
                  for (g, j), t in cs.items()]
        body = [load_a(g) for g in range(groups)]
        for j in cols:
            body.append(load_b(j))
            body += [Dot(ins, cs[(g, j)], f"a{g}", "b") for g in range(groups)]
        body = tuple(body)
        for var, count in reversed(loops):
            body = (Repeat(var, count, body),)
        steps += body
        steps += [Store(t, "cout", affine(const=g * ROWS * c_row + j * 64), affine(const=c_row))
                  for (g, j), t in cs.items()]
    c_tiles = [f"c{g}{j}" for g in range(groups) for j in range(min(step, nv))]
    shapes = [(c, c_shape) for c in c_tiles] + [(f"a{g}", a_shape) for g in range(groups)] + [("b", b_shape)]
    return TileProgram(name, tuple(shapes), tuple(steps), (ins,))


def define_amx_tile_function(module: ir.Module, name: str, spec: TileSpec, ins, groups: int, nv: int,
                             emulate: bool, out16: bool = False) -> ir.Function:
    """`void name(const int64 *tile)`: a ct_tile record as the register tiles get it, for 16 x `groups` rows; with
    `out16` the output is written in bfloat16 (`has_out16`)."""
    rows, lanes, panel = ROWS * groups, spec.tile.lanes, spec.packed_b
    vty = ir.VectorType(F32, lanes)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), name=name)
    fn.args[0].add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    t = fn.args[0]
    a16, bp = _slot(b, t, SLOT_A16, PTR), _slot(b, t, SLOT_B, PTR)
    k_count, ldc, m0 = _slot(b, t, SLOT_K, I64), _slot(b, t, SLOT_LDC, I64), _slot(b, t, SLOT_M0, I64)
    coff = [_slot(b, t, SLOT_COFF + j, I64) for j in range(nv)]
    masks = [lane_mask(b, _slot(b, t, SLOT_LANES + j, I64), lanes) for j in range(nv)]
    outs = [_slot(b, t, SLOT_OUT + k, PTR) for k in range(len(spec.epilogue.outputs))]
    extras = [_slot(b, t, SLOT_EXTRA + e, PTR) for e in range(len(spec.epilogue.inputs) - 1)]

    a_rs = _slot(b, t, SLOT_A16_RS, I64)  # elements between A's bfloat16 rows (amx_round's)
    phase = _slot(b, t, SLOT_PHASE, I64)
    acc = _slot(b, t, SLOT_ACC, PTR)
    # The sums: from the K blocks before (phase bit 1) or zeros; to the next block (bit 0) or the row epilogue.
    sums = b.alloca(F32, size=ir.Constant(I64, rows * nv * 16))
    first = b.icmp_unsigned("==", b.and_(phase, ir.Constant(I64, 2)), ir.Constant(I64, 0))
    last = b.icmp_unsigned("==", b.and_(phase, ir.Constant(I64, 1)), ir.Constant(I64, 0))
    cin = b.select(first, b.bitcast(_zeros(module), PTR), acc)
    cout = b.select(last, sums, acc)

    def vector_at(offset):
        return b.bitcast(b.gep(sums, [offset], source_etype=F32), vty.as_pointer())

    prog = program(ins, groups, nv, panel)
    # the glue's configuration (matrix_engine.c amx_tiles_configure): tile i in tmm<i>, each 16 rows of 64 bytes
    assert all((s.rows, s.colsb) == (16, 64) for _, s in prog.shapes), prog.shapes
    assert rows * nv * 16 <= ROWS * MAX_GROUPS * 64, (rows, nv)  # the first block's sums fit the zeros (_zeros)
    prog.emit(b, {"a16": a16, "b": bp, "cin": cin, "cout": cout},
              {"a_rs": b.mul(a_rs, ir.Constant(I64, 2)), "chunks": b.udiv(_padded_k(b, k_count),
                                                                        ir.Constant(I64, K_CHUNK))},
              emulate=emulate, fixed_registers=True)

    def row(r, _):
        vecs = [b.load(vector_at(b.add(b.mul(r, ir.Constant(I64, nv * 16)), ir.Constant(I64, j * 16))), typ=vty,
                       align=4) for j in range(nv)]
        emit_row_epilogue(b, spec, b.add(m0, r), vecs, ldc, coff, masks, outs, extras, out16)
        return []

    with b.if_then(last):
        for_range(b, ir.Constant(I64, 0), ir.Constant(I64, rows), ir.Constant(I64, 1), row)
    b.ret_void()
    return fn


def _zeros(module: ir.Module) -> ir.GlobalVariable:
    """The sums of no K block: a [32][64] float32 block of zeros the first block's C tiles load."""
    name = "onnxopt_amx_zero_sums"
    if name in module.globals:
        return module.globals[name]
    ty = ir.ArrayType(F32, ROWS * MAX_GROUPS * 64)
    g = ir.GlobalVariable(module, ty, name=name)
    g.initializer = ir.Constant(ty, None)
    g.global_constant = True
    g.linkage = "internal"
    g.align = 64
    return g


def _padded_k(b: ir.IRBuilder, k_count):
    """K rounded up to whole tile steps: the elements between A's bfloat16 rows."""
    return b.and_(b.add(k_count, ir.Constant(I64, K_CHUNK - 1)), ir.Constant(I64, -K_CHUNK))


def define_amx_round_function(module: ir.Module, name: str, dtype: str = "bf16") -> ir.Function:
    """`void name(const int64 *tile)`: rows `a16_rows` of A (float32 at `a`, `a_ms` apart, `k` of them) rounded to
    bfloat16 (vcvtneps2bf16: round to nearest even; float16 by vcvtps2ph where `dtype` is "f16") into `a16`, rows
    K-rounded-up-to-32 apart, zero-padded: whole vectors with plain loads and stores (masked ones cost the GEMM 4-12%
    here), the rest masked. The glue calls it once per chunk of rows, and every panel's tiles read the copy."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), name=name)
    fn.args[0].add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    t = fn.args[0]
    a, a_ms, k_count = _slot(b, t, SLOT_A, PTR), _slot(b, t, SLOT_A_MS, I64), _slot(b, t, SLOT_K, I64)
    a16, rows = _slot(b, t, SLOT_A16, PTR), _slot(b, t, SLOT_A16_ROWS, I64)
    kp = _padded_k(b, k_count)

    vty, hty = ir.VectorType(F32, 16), ir.VectorType(I16, 16)
    whole = b.and_(k_count, ir.Constant(I64, -16))  # K in whole vectors: plain loads and stores

    def row(r, _):
        src = b.gep(a, [b.mul(r, a_ms)], source_etype=F32)
        dst = b.gep(a16, [b.mul(r, kp)], source_etype=I16)

        def step(k, _):
            x = b.load(b.bitcast(b.gep(src, [k], source_etype=F32), vty.as_pointer()), typ=vty, align=4)
            h = to_16bit(b, x, dtype)
            b.store(h, b.bitcast(b.gep(dst, [k], source_etype=I16), hty.as_pointer()), align=2)
            return []

        for_range(b, ir.Constant(I64, 0), whole, ir.Constant(I64, 16), step)
        # the rest of K and the zeros up to the padded row, masked
        round_rows_16bit(b, [b.gep(src, [whole], source_etype=F32)], b.gep(dst, [whole], source_etype=I16),
                         b.sub(k_count, whole), b.sub(kp, whole), dtype)
        return []

    for_range(b, ir.Constant(I64, 0), rows, ir.Constant(I64, 1), row)
    b.ret_void()
    return fn


def has_out16(spec: TileSpec, ins_name: str) -> bool:
    """Whether the set also has variants writing their one output in bfloat16: a bf16 GEMM whose output a sequence
    may keep in bf16 for the next bf16 GEMM's A (sequence_exec.c), rounded as that GEMM would round it."""
    return ins_name == "tdpbf16ps" and len(spec.epilogue.outputs) == 1 and spec.tile.lanes == 16


def define_amx_tile_functions(module: ir.Module, prefix: str, spec: TileSpec, ins_name: str,
                              emulate: bool) -> list[list[str]]:
    """Every (groups, nv) variant, then the rounding function, then (has_out16) the variants writing bfloat16;
    returns their names as [groups - 1][nv - 1], a row [round], and [groups - 1][nv - 1] again (suffix "h")."""
    ins = next(i for i in MATRIX_INSTRUCTIONS if i.name == ins_name)
    define_amx_round_function(module, f"{prefix}_round", ins.source_dtypes[0])
    names = define_variants(module, prefix, spec, ins_name, emulate, define_amx_tile_function) + [[f"{prefix}_round"]]
    if has_out16(spec, ins_name):
        names += [[f"{n}h" for n in row] for row in names[:MAX_GROUPS]]
        for groups, row in enumerate(names[-MAX_GROUPS:], 1):
            for nv, name in enumerate(row, 1):
                define_amx_tile_function(module, name, spec, ins, groups, nv, emulate, out16=True)
    return names


def define_variants(module: ir.Module, prefix: str, spec: TileSpec, ins_name: str, emulate: bool,
                    define) -> list[list[str]]:
    """define(module, name, spec, instruction, groups, nv, emulate) for every (groups, nv) variant; returns their
    names as [groups - 1][nv - 1]."""
    ins = next(i for i in MATRIX_INSTRUCTIONS if i.name == ins_name)
    names = []
    for groups in range(1, MAX_GROUPS + 1):
        names.append([f"{prefix}_x{groups}v{nv}" for nv in range(1, spec.tile.ni + 1)])
        for nv, name in enumerate(names[-1], 1):
            define(module, name, spec, ins, groups, nv, emulate)
    return names
