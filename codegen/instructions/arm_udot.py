"""ARM udot (aarch64 dotprod), 128-bit: 4 lanes of 4 u8 x u8 products into u32 (s32 here: the sums of 4 fit)."""

from .instruction import Instruction, call_intrinsic, dot4


def _emit(b, acc, a, w):
    return call_intrinsic(b, "llvm.aarch64.neon.udot.v4i32.v16i8", acc.type, [acc, a, w])


INSTRUCTION = Instruction(
    name="arm_udot", computation=dot4("udot.4s", 4, "u8", "u8"), arch="aarch64", features=("neon", "dotprod"),
    how="one udot v.4s, v.16b, v.16b", emit=_emit)
