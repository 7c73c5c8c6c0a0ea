"""AVX-VNNI vpdpbusd (the VEX form, 256-bit, on CPUs without AVX-512: Alder Lake, Zen 5 client): 8 lanes of 4
u8 x s8 products into s32, no saturation."""

from .instruction import Instruction, call_intrinsic, dot4


def _emit(b, acc, a, w):
    return call_intrinsic(b, "llvm.x86.avx512.vpdpbusd.256", acc.type, [acc, a, w])


INSTRUCTION = Instruction(
    name="avx_vnni", computation=dot4("vpdpbusd.256", 8, "u8", "s8"), arch="x86_64",
    features=("avxvnni", "avx2"), how="one {vex} vpdpbusd ymm", emit=_emit)
