"""AVX-512 VNNI vpdpbusd (512-bit): 16 lanes, each the sum of 4 u8 x s8 products added to an s32, no saturation."""

from .instruction import Instruction, call_intrinsic, dot4


def _emit(b, acc, a, w):
    return call_intrinsic(b, "llvm.x86.avx512.vpdpbusd.512", acc.type, [acc, a, w])


INSTRUCTION = Instruction(
    name="avx512_vnni", computation=dot4("vpdpbusd.512", 16, "u8", "s8"), arch="x86_64",
    features=("avx512vnni", "avx512f", "avx512bw"), how="one vpdpbusd zmm", emit=_emit)
