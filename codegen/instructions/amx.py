"""Intel AMX's dot-product instructions (Sapphire Rapids: AMX-INT8, AMX-BF16; Granite Rapids adds AMX-FP16): one
16 x 16 float32 or int32 tile of C += a 16-row A tile times a B tile whose rows hold K packed 4 bytes a lane
(matrix.py). Which of them a target uses is its ISA row's (codegen/isa.py `matrix_instructions`)."""

from .matrix import MatrixInstruction, gemm_description


def _int8(mnemonic: str, a: str, b: str) -> MatrixInstruction:
    return MatrixInstruction(
        name=mnemonic, computation=gemm_description(mnemonic, a, b, "s32", 16, 16, 64), arch="x86_64",
        features=("amx-tile", "amx-int8"), intrinsic=f"llvm.x86.{mnemonic}.internal",
        how=f"{mnemonic}: {a} x {b} products, 4 a lane, summed into int32 without saturation")


def _float(mnemonic: str, src: str, feature: str) -> MatrixInstruction:
    return MatrixInstruction(
        name=mnemonic, computation=gemm_description(mnemonic, src, src, "f32", 16, 16, 32), arch="x86_64",
        features=("amx-tile", feature), intrinsic=f"llvm.x86.{mnemonic}.internal",
        how=f"{mnemonic}: {src} pairs into float32, each product added in turn (round to nearest even, DAZ/FTZ)")


TDPBUSD = _int8("tdpbusd", "u8", "s8")
TDPBSSD = _int8("tdpbssd", "s8", "s8")
TDPBSUD = _int8("tdpbsud", "s8", "u8")
TDPBUUD = _int8("tdpbuud", "u8", "u8")
TDPBF16PS = _float("tdpbf16ps", "bf16", "amx-bf16")
TDPFP16PS = _float("tdpfp16ps", "f16", "amx-fp16")

INSTRUCTIONS = (TDPBUSD, TDPBSSD, TDPBSUD, TDPBUUD, TDPBF16PS, TDPFP16PS)
