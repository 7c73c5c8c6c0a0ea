"""An instruction as its description (expr.Computation) plus its implementation on one architecture (UNIT §2).

The description names the accumulator `d` (the output) and the two sources `a` and `b` (the body's leaves, in
order); `emit` writes the instruction for LLVM vectors: acc `<lanes x i32>`, a and b `<lanes * depth x i8>`, laid
out as the description's indices say (element 4i + j of a feeds lane i for VNNI). `emit` is None for an instruction
described for a later backend (WMMA).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from llvmlite import ir

from .expr import Computation


@dataclass(frozen=True)
class Instruction:
    name: str
    computation: Computation
    arch: str  # "x86_64", "aarch64" or "nvptx"
    features: tuple[str, ...]  # the LLVM features it needs (any one group of them: see `needs`)
    how: str  # how it is implemented, in a line (the sequence, the saturation rule)
    emit: Callable | None = None  # (builder, acc, a, b) -> acc
    accumulate_in_place: bool = False  # the accumulator must be the addend register (WMMA's opaque fragments)
    # its pairs of products share a saturating 16-bit sum (AVX2's vpmaddubsw): weights are split for it (split_pairs)
    pair_sums_saturate: bool = False

    @property
    def lanes(self) -> int:
        """Elements of the accumulator: the product of the parallel loops' extents."""
        return math.prod(lp.extent for lp in self.computation.loops if not lp.reduce)

    @property
    def depth(self) -> int:
        """Products summed into each accumulator lane: the product of the reduction loops' extents."""
        return math.prod(lp.extent for lp in self.computation.loops if lp.reduce)

    @property
    def source_dtypes(self) -> tuple[str, str]:
        a, b = self.computation.accesses()
        return a.dtype, b.dtype

    def available(self, target) -> bool:
        """Whether `target` (codegen.target.Target) may use it: its architecture and every feature."""
        arch = target.triple.split("-")[0]
        return self.emit is not None and arch == self.arch and all(target.has(f) for f in self.features)

    def vector_types(self) -> tuple[ir.VectorType, ir.VectorType]:
        """(accumulator, source) LLVM vector types of `emit`."""
        width = 32 if self.computation.output.dtype in ("s32", "f32") else 16
        src_bits = 8 if self.source_dtypes[0] in ("u8", "s8") else 16
        return ir.VectorType(ir.IntType(width), self.lanes), ir.VectorType(ir.IntType(src_bits), self.lanes * self.depth)


def dot4(name: str, lanes: int, a_dtype: str, b_dtype: str) -> Computation:
    """d[i] += sum over j < 4 of s32(a[4i + j]) * s32(b[4i + j]), i < lanes: VNNI, sdot/udot, the AVX2 sequence."""
    from .expr import Loop, access, cast, mul

    return Computation(
        name, (Loop("i", lanes), Loop("j", 4, reduce=True)), access("d", "s32", "i"),
        mul("s32", cast("s32", access("a", a_dtype, "4*i+j")), cast("s32", access("b", b_dtype, "4*i+j"))))


def call_intrinsic(b: ir.IRBuilder, name: str, ret: ir.Type, args: list) -> ir.Value:
    module = b.module
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, [a.type for a in args]), name=name)
    return b.call(fn, args)
