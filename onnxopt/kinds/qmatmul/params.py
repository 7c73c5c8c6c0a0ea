"""The qmatmul kind's parameters: the int8 GEMM's shape, its packing and its epilogue inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from onnxopt.fusion.params import KindParams

PANEL = 16  # columns of B per packed panel: two AVX2 vectors of 8 s32 lanes, one AVX-512 vector of 16
POSITION, CHANNEL, COLUMN, SCALAR = 0, 1, 2, 3  # how an epilogue input broadcasts (fusion/compute.py's kinds)
FLOAT, QUANT = 0, 1  # the epilogue: a float program (MatMulInteger -> Cast -> ...) or a requantization


@dataclass(frozen=True)
class QMatMulParams(KindParams):
    family: ClassVar[str] = "qmatmul"
    k: int  # the reduction length (a multiple of 4)
    n: int  # output columns
    has_azp: bool  # input 1 is A's zero point (a u8 scalar); else it is 0
    extra_kinds: tuple[int, ...]  # per float epilogue input, POSITION / CHANNEL / COLUMN / SCALAR
    has_fix: bool  # B has corrections (pairs split so that none saturates: find.py); their tables are inputs
    mode: int = FLOAT  # QUANT: a QLinearMatMul or a QDQ unit, requantized per column (scale input) to u8 / s8
    out_signed: bool = False  # QUANT: an s8 output (else u8)
    out_zero: int = 0  # QUANT: the output's zero point
    has_bias: bool = False  # QUANT: an int32 bias per column (a Gemm's or QGemm's C) is added to the sums
    relu: bool = False  # QUANT: a Relu before the QuantizeLinear: the result is clamped below at the zero point
    # QUANT: u8 weights whose B - zw does not fit s8, stored as s8 B - 128: the tile adds (128 - zw) per column times
    # the row's sum of (a - za), which the executor computes per call
    has_asum: bool = False
    mr: int = 4  # the schedule (onnxopt/tune/int8_schedule.py): rows of A a tile (the unrolled rows)
    tasks: int = 16  # the schedule: most tasks a call is split into (the parallel extent)
    body: tuple = field(default=(), compare=False, hash=False)  # the function fallback's nodes (find.py)

    def key(self) -> list:
        return [self.k, self.n, self.has_azp, list(self.extra_kinds), self.has_fix, self.mode, self.out_signed,
                self.out_zero, self.has_bias, self.relu, self.has_asum, self.mr, self.tasks]

    def fallback_body(self) -> list:
        return list(self.body)
