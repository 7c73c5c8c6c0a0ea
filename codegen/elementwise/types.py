"""numpy dtype names <-> LLVM types and ONNX element-type enums."""

from __future__ import annotations

from llvmlite import ir

LLVM_SCALAR = {
    "float32": ir.FloatType(), "float64": ir.DoubleType(),
    "int8": ir.IntType(8), "uint8": ir.IntType(8), "int16": ir.IntType(16), "uint16": ir.IntType(16),
    "int32": ir.IntType(32), "uint32": ir.IntType(32), "int64": ir.IntType(64), "uint64": ir.IntType(64),
    "bool": ir.IntType(1),
}
# How an element is stored in memory (bool is one byte).
MEMORY_SCALAR = dict(LLVM_SCALAR, bool=ir.IntType(8))
ITEMSIZE = {"float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4,
            "uint32": 4, "int64": 8, "uint64": 8, "bool": 1}
# ONNXTensorElementDataType values (the same numbers as onnx.TensorProto.DataType).
ONNX_ENUM = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "bool": 9,
             "float64": 11, "uint32": 12, "uint64": 13}


def is_float(dtype: str) -> bool:
    return dtype in ("float32", "float64")


def is_signed(dtype: str) -> bool:
    return dtype.startswith("int")


def vec(dtype: str, lanes: int) -> ir.VectorType:
    return ir.VectorType(LLVM_SCALAR[dtype], lanes)
