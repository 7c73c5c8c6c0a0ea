"""numpy dtype names <-> LLVM types and ONNX element-type enums: a view of onnxopt/dtypes.py's table.

The tables have every DType (float16 and bfloat16 too); which dtypes the elementwise kernels are built for is
fusion/elementwise_ops.py's SUPPORTED, not these keys.
"""

from __future__ import annotations

from llvmlite import ir

from onnxopt.dtypes import DTYPES

LLVM_SCALAR = {name: d.llvm for name, d in DTYPES.items()}
# How an element is stored in memory (bool is one byte, bfloat16 an i16).
MEMORY_SCALAR = {name: d.memory for name, d in DTYPES.items()}
ITEMSIZE = {name: d.itemsize for name, d in DTYPES.items()}
# ONNXTensorElementDataType values (the same numbers as onnx.TensorProto.DataType).
ONNX_ENUM = {name: d.onnx for name, d in DTYPES.items()}


def is_float(dtype: str) -> bool:
    d = DTYPES.get(dtype)
    return d is not None and d.is_float


def is_signed(dtype: str) -> bool:
    """A signed integer (the floats are not: their ops are chosen by is_float)."""
    d = DTYPES.get(dtype)
    return d is not None and d.is_signed and not d.is_float


def vec(dtype: str, lanes: int) -> ir.VectorType:
    return ir.VectorType(LLVM_SCALAR[dtype], lanes)
