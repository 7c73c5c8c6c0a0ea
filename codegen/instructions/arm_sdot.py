"""ARM sdot (aarch64 dotprod, Armv8.2+: Neoverse N1, Cortex-A76 and later), 128-bit: 4 lanes of 4 s8 x s8 products
into s32. u8 inputs go in shifted by -128 (the quantized kernels' operand preparation)."""

from .instruction import Instruction, call_intrinsic, dot4


def _emit(b, acc, a, w):
    return call_intrinsic(b, "llvm.aarch64.neon.sdot.v4i32.v16i8", acc.type, [acc, a, w])


INSTRUCTION = Instruction(
    name="arm_sdot", computation=dot4("sdot.4s", 4, "s8", "s8"), arch="aarch64", features=("neon", "dotprod"),
    how="one sdot v.4s, v.16b, v.16b", emit=_emit)
