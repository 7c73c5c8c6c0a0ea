"""Replaceable micro-kernels: one abstract spec (C[MI x NI*lanes] += A[MI x K] . B[K x NI*lanes]), one registered
implementation per target, selected by the target's ISA row (Chimera's micro-kernel registry).

Each implementation names the features it needs and its register tile; `select` takes the one the target's row of
the ISA table (codegen/isa.py) names. The reference is numpy's matmul over the same tile, which the tests compare
every implementation with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..isa import isa_of
from ..target import Target
from .register_tile import RegisterTile, solve_register_tile


@dataclass(frozen=True)
class MicroKernel:
    name: str
    requires: tuple[str, ...]
    registers: int
    lanes: int
    masks_in_vector_registers: bool = False

    @property
    def tile(self) -> RegisterTile:
        return solve_register_tile(self.registers, self.lanes, mask_registers=self.masks_in_vector_registers)

    @property
    def packed_b_tile(self) -> RegisterTile:
        """The tile of a matmul whose B is constant and packed in zero-padded panels of whole vectors: its loads
        need no masks, so on AVX2 it has the classic 6 x 16 tile rather than 4 x 16."""
        return solve_register_tile(self.registers, self.lanes, mask_registers=False)


# Best first. The emitter (outer_product.py) is shared; what differs per target is the vector width and the number
# of vector registers, hence the register tile.
MICRO_KERNELS = (
    MicroKernel("avx512_fp32_outer_product", ("avx512f",), registers=32, lanes=16),
    MicroKernel("avx2_fp32_outer_product", ("avx2", "fma"), registers=16, lanes=8, masks_in_vector_registers=True),
    MicroKernel("sse_fp32_outer_product", (), registers=16, lanes=4, masks_in_vector_registers=True),
)


def select(target: Target) -> MicroKernel:
    """The micro-kernel of the target's ISA row (codegen/isa.py)."""
    name = isa_of(target).micro_kernel
    return next(mk for mk in MICRO_KERNELS if mk.name == name)


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What every implementation computes for one tile: C = A @ B in float64, returned as float32."""
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
