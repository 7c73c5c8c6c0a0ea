"""The int8 convolution on AMX tiles: 16 to 64 output channels x one packed panel of 16 output pixels a call.

The convolution as a GEMM, out[channel, pixel] += w[channel, k] * x[k, pixel] (s8 weights, u8 activations), is
matched against the target's matrix instructions by AMOS's mapper through the qmatmul kind's `choose`: s8 x u8 is
`tdpbsud`'s, and the mapping puts the channels on the tile's rows, the pixels on its columns and K on the reduction.
Both operands are already in the tile's layouts: the weights are rows of K bytes (find.py `pack`), so a tile of 16
channels is read in place, `k4` bytes a row apart; exec.c's im2col panels are [K / 4][16 pixels][4] bytes, a B tile's
own layout, 64 bytes a row. The C tiles go to a stack buffer, and each group of 4 channels finishes as the vector
tile's channels do (lower.py `finish_channels`): the rest of K below 64 bytes on the dot-product instruction, the
corrections, the zero-point terms and the epilogue (the blocked int8 output writes 4 channels a word).

Only the im2col form takes it (not the implicit form's per-tap windows, nor depthwise convolutions).
"""

from __future__ import annotations

from onnxopt.codegen.instructions.tile_program import TileProgram
from onnxopt.kinds.qmatmul.amx import MAX_GROUPS, ROWS, choose, row_blocks_program  # noqa: F401 - lower.py's


def instruction(target, params):
    """The matrix instruction the region's tiles run on, or None: s8 weights x u8 activations, the im2col form."""
    if params.depthwise or params.implicit:
        return None
    ins, _ = choose(target, "s8", "u8")
    return ins


def program(ins, groups: int) -> TileProgram:
    """`groups` x 16 channels from m0 times one panel, K in whole chunks of 64 bytes (`chunks`), into `acc`
    ([16 groups][16] int32); the weights' rows are `k4` bytes apart."""
    return row_blocks_program("qconv", ins, groups, "w", "k4", "panel")
