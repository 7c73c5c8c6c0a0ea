"""The recurrent kind's parameters: the cell, its sizes and which optional inputs and outputs it has."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from onnxopt.fusion.params import KindParams

BLOCK = 16  # hidden units a packed block holds (one AVX-512 vector, two AVX2 ones): the packing's unit on every target
SLOTS = 4  # bias slots a block, and gate slots of the projection's output (gx), for every cell


@dataclass(frozen=True)
class RecurrentParams(KindParams):
    family: ClassVar[str] = "recurrent"
    cell: str  # "lstm" or "gru" (find.py CELLS)
    directions: int  # 1 (forward or reverse) or 2 (bidirectional)
    reverse: bool  # a single direction run from the last step to the first
    hidden: int  # hidden_size
    input_size: int  # the last dim of X
    has_h0: bool  # initial_h is an input (else zeros)
    has_c0: bool  # an LSTM's initial_c is an input (else zeros)
    outputs: tuple[bool, bool, bool]  # which of Y, Y_h, Y_c (an LSTM's) the op writes
    # The schedule: the steps run the blocks in alternating order (exec.c), so the blocks of R one step read last,
    # still in L2, are the next step's first; False: always in ascending order.
    serpentine: bool = True
    # "bfloat16": the packed W and R stored as bfloat16 (precision.py), widened in the kernel; the op's inputs 1 and 2
    # are then of `weight_type` (BFLOAT16, or UINT16 before opset 13: the same bits)
    weights: str = "float32"
    weight_type: int = 1
    body: tuple = field(default=(), compare=False, hash=False)  # the function fallback's nodes (find.py)

    @property
    def gates(self) -> int:
        return 4 if self.cell == "lstm" else 3

    @property
    def blocks(self) -> int:
        return -(-self.hidden // BLOCK)

    def key(self) -> list:
        return [self.cell, self.directions, self.reverse, self.hidden, self.input_size, self.has_h0, self.has_c0,
                list(self.outputs)] + ([] if self.serpentine else ["ascending"]) + \
            ([self.weights, self.weight_type] if self.weights != "float32" else [])

    def fallback_body(self) -> list:
        return list(self.body)
