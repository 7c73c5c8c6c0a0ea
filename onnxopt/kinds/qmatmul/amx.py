"""The int8 GEMM on AMX tiles: 16 to 64 rows of A x one packed panel of B (16 columns) a call.

Which instruction, and how the GEMM's loops go onto it, is asked of the instructions' descriptions: the GEMM is
written in the tensor language (u8 activations x s8 weights into int32), AMOS's mapper (codegen/instructions/
mapping.py) lists the valid mappings onto each matrix instruction the target has (u8 x s8 matches `tdpbusd` only:
the inspector compares dtypes and casts), and the kernel takes the first that its tile program implements: the
GEMM's rows on the tile's rows, its columns on the tile's columns, K on the reduction. Ranking several is the
schedule search's.

The tile program (codegen/instructions/tile_program.py), one configuration: C tiles (one per group of 16 rows,
zeroed), one B tile and two A tiles used in turn. Per 64 bytes of K, B's tile is its panel's next 16 packed rows (the panel's
layout [K / 4][16][4] is the tile's own, so the weights are packed once, offline, for both AMX and VNNI), and each
group's A tile is read straight from the activations, `a_rs` bytes a row apart: no packing pass. The C tiles go to a
stack buffer; then each row finishes as the VNNI tile's rows do (lower.py): the rest of K (below 64 bytes) on the
dot-product instruction, the corrections, A's zero point, the epilogue and the stores.

The same program runs in the reference interpreter (tests/kinds/test_qmatmul_amx.py), on any host; lower.py
`define_amx_tile` compiles it.
"""

from __future__ import annotations

from onnxopt.codegen.instructions import mapping, matrix_available
from onnxopt.codegen.instructions.tile_program import Dot, Load, Repeat, Store, TileProgram, Zero, affine

from .params import PANEL

ROWS = 16  # a tile's rows: one group of A's rows
MAX_GROUPS = 4  # C tiles a call: with B and two A tiles, 7 of the 8
# The GEMM as the kind computes it (u8 x s8 into int32), at a tile's extents: what the mapper matches.
_LOOPS = {"m": "row", "n": "column", "k": "depth"}


def gemm(a_dtype: str = "u8", b_dtype: str = "s8"):
    """The kind's GEMM in the tensor language: out[row, column] += a[row, depth] * b[depth, column]."""
    from onnxopt.codegen.instructions.expr import Computation, Loop, access, cast, mul

    return Computation("qmatmul", (Loop("row", ROWS), Loop("column", PANEL), Loop("depth", 64, reduce=True)),
                       access("out", "s32", "row", "column"),
                       mul("s32", cast("s32", access("a", a_dtype, "row", "depth")),
                           cast("s32", access("w", b_dtype, "depth", "column"))))


def choose(target, a_dtype: str = "u8", b_dtype: str = "s8"):
    """(instruction, mapping) for the kind's GEMM on `target`, or (None, why)."""
    if target.float32_lanes != PANEL:
        return None, "the AMX kernels finish rows on 16-lane vectors (AVX-512)"
    ins, m = mapping.implemented(gemm(a_dtype, b_dtype), matrix_available(target), _LOOPS)
    if ins is None:
        return None, (f"target {target.name} has no matrix instruction" if m == "no matrix instruction"
                      else f"the {a_dtype} x {b_dtype} GEMM: {m}")
    return ins, m


def program(ins, groups: int) -> TileProgram:
    """`groups` x 16 rows of A times one panel, K in whole chunks of 64 bytes (`chunks` of them), into the buffer
    `acc` ([16 groups][16] int32)."""
    return row_blocks_program("qmatmul", ins, groups, "a", "a_rs", "b")


def row_blocks_program(kind: str, ins, groups: int, rows: str, stride: str, panel: str) -> TileProgram:
    """The int8 kinds' tile program: `groups` x 16 rows of the A operand at pointer `rows` (from row m0, `stride`
    bytes a row, read in place) times the panel at pointer `panel` ([K / 4][16][4] bytes: one B tile a chunk of 64
    bytes of K), `chunks` chunks, into `acc` ([16 groups][16] int32). Two A tiles in turn: the next group's load
    need not wait for this group's product."""
    c_shape, a_shape, b_shape = ins.shapes_for(ROWS, PANEL, 64)
    cs = [f"c{r}" for r in range(groups)]
    body = [Load("b", panel, affine((b_shape.rows * b_shape.colsb, "chunk")), affine(const=b_shape.colsb))]
    for r in range(groups):
        a = f"a{r % 2}"
        body += [Load(a, rows, affine((1, "m0", stride), (ROWS * r, stride), (a_shape.colsb, "chunk")),
                      affine(stride)),
                 Dot(ins, cs[r], a, "b")]
    steps = [Zero(c) for c in cs] + [Repeat("chunk", affine("chunks"), tuple(body))]
    steps += [Store(c, "acc", affine(const=r * ROWS * c_shape.colsb), affine(const=c_shape.colsb))
              for r, c in enumerate(cs)]
    a_tiles = tuple((f"a{i}", a_shape) for i in range(min(groups, 2)))
    return TileProgram(f"{kind}_amx_g{groups}", tuple((c, c_shape) for c in cs) + (("b", b_shape),) + a_tiles,
                       tuple(steps), (ins,))
