"""NVIDIA tensor cores, WMMA m16n16k16 with f16 sources and an f32 accumulator: d[i, j] += f32(a[i, k]) *
f32(b[k, j]). A description only: the CUDA backend implements it. Its fragments are opaque, so the accumulator
must be the addend register (seeded by a fill or a load), unlike VNNI's separate output."""

from .expr import Computation, Loop, access, cast, mul
from .instruction import Instruction

INSTRUCTION = Instruction(
    name="wmma_f16",
    computation=Computation(
        "wmma.m16n16k16.f32.f16", (Loop("i", 16), Loop("j", 16), Loop("k", 16, reduce=True)),
        access("d", "f32", "i", "j"), mul("f32", cast("f32", access("a", "f16", "i", "k")),
                                          cast("f32", access("b", "f16", "k", "j")))),
    arch="nvptx", features=("sm_70",), how="nvcuda::wmma::mma_sync on 16 x 16 x 16 fragments (CUDA backend)",
    accumulate_in_place=True)
