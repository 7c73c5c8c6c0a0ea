"""The element types a kernel can be built for: one `DType` per numpy-style name, with what each layer needs of it.

A fusion rule reads the element type of the graph's tensor and puts its name in the region's parameters
(`ComputeParams.dtype`, `PoolParams.dtype`, each kind's params); lowering and the glue's descriptions look the
name up here: the LLVM type a value has in registers and in memory, the C type of a pointer to it, the ONNX enum the
custom op declares, the item size, the accumulator a reduction over it uses and the tolerance of the kernel check.
codegen/elementwise/types.py is a view of this table.

16-bit floats: llvmlite's `ir` has `HalfType` (IEEE float16, "half") but no bfloat type (llvmlite 0.50), so a
bfloat16 is an i16 in memory and a float in registers: widened exactly by shifting its bits into the high half of an
i32 and bitcasting to float, narrowed by rounding the float's low 16 bits away (to nearest even). C has neither type
in its standard: both are stored as uint16_t and the kernel converts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from llvmlite import ir

from onnxopt.verify import KERNEL_ATOL, KERNEL_RTOL

try:  # bfloat16's numpy type; ml_dtypes is not a dependency of onnxopt (onnx >= 1.18 brings it)
    import ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    ml_dtypes = None


@dataclass(frozen=True)
class DType:
    name: str  # numpy's name: "float32", "bfloat16", "int8", "bool", ...
    llvm: ir.Type  # a value in registers (bool: i1; bfloat16: the float that holds it exactly)
    memory: ir.Type  # an element in memory (bool: i8; bfloat16: i16)
    c: str  # the C type of an element, as the glue declares pointers to it (the 16-bit floats: uint16_t storage)
    onnx: int  # onnx.TensorProto.DataType, the same numbers as ONNXTensorElementDataType
    numpy: object  # the numpy scalar type; None for bfloat16 without ml_dtypes
    itemsize: int  # bytes per element
    is_float: bool
    is_signed: bool  # negative values representable: the floats and the intN
    rtol: float  # the kernel check against onnxruntime (driver/kernels.py): |a - b| <= atol + rtol * |b|
    atol: float
    accumulate: str  # the name of the type a sum or dot product over this type runs in

    @property
    def accumulator(self) -> DType:
        return DTYPES[self.accumulate]

    def __str__(self) -> str:
        return self.name


_I = ir.IntType
_TP = onnx.TensorProto


def _int(name: str, bits: int, signed: bool, enum: int, accumulate: str | None = None) -> DType:
    return DType(name, _I(bits), _I(bits), f"{'' if signed else 'u'}int{bits}_t", enum, getattr(np, name), bits // 8,
                 False, signed, 0.0, 0.0, accumulate or name)


# Tolerances of the 16-bit floats: the kernel computes in float32 and rounds its result once to the type, where
# onnxruntime may round at other points (its float16 kernels convert per op, or accumulate in the type): a result
# may differ by one rounding on either side, an ulp of a 10-bit (float16: 2^-10 of the value) or 7-bit (bfloat16:
# 2^-7) mantissa, so rtol is two of them. atol covers values near zero that come out of sums which cancel: they
# carry the rounding of the terms, a few ulps of values near 1 (the 16-bit floats' inputs are O(1) activations).
# Integers are exact. float32 and float64 are the project's own kernel tolerances (verify.py).
DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("float32", ir.FloatType(), ir.FloatType(), "float", _TP.FLOAT, np.float32, 4, True, True,
          KERNEL_RTOL["float32"], KERNEL_ATOL["float32"], "float32"),
    DType("float64", ir.DoubleType(), ir.DoubleType(), "double", _TP.DOUBLE, np.float64, 8, True, True,
          KERNEL_RTOL["float64"], KERNEL_ATOL["float64"], "float64"),
    DType("float16", ir.HalfType(), ir.HalfType(), "uint16_t", _TP.FLOAT16, np.float16, 2, True, True,
          2.0 ** -9, 1e-3, "float32"),
    DType("bfloat16", ir.FloatType(), _I(16), "uint16_t", _TP.BFLOAT16,
          ml_dtypes.bfloat16 if ml_dtypes is not None else None, 2, True, True, 2.0 ** -6, 1e-2, "float32"),
    _int("int8", 8, True, _TP.INT8, "int32"),
    _int("uint8", 8, False, _TP.UINT8, "int32"),
    _int("int16", 16, True, _TP.INT16),
    _int("uint16", 16, False, _TP.UINT16),
    _int("int32", 32, True, _TP.INT32),
    _int("uint32", 32, False, _TP.UINT32),
    _int("int64", 64, True, _TP.INT64),
    _int("uint64", 64, False, _TP.UINT64),
    DType("bool", _I(1), _I(8), "bool", _TP.BOOL, np.bool_, 1, False, False, 0.0, 0.0, "bool"),
)}

_BY_ENUM = {d.onnx: d for d in DTYPES.values()}


def from_onnx(enum: int) -> DType:
    """The DType of an onnx.TensorProto.DataType value."""
    d = _BY_ENUM.get(int(enum))
    if d is None:
        try:
            text = onnx.helper.tensor_dtype_to_string(int(enum))
        except (KeyError, ValueError, TypeError):
            text = str(enum)
        raise ValueError(f"no kernel element type for ONNX element type {text} ({int(enum)}); known: "
                         + ", ".join(f"{d.name} ({d.onnx})" for d in DTYPES.values()))
    return d


def dtype(key) -> DType:
    """The DType of a name ("float32"), a DType, an ONNX enum (onnx.TensorProto.FLOAT, 1) or a numpy dtype or scalar
    type (np.float32, np.dtype("int8"), ml_dtypes.bfloat16); ValueError naming the known ones for anything else."""
    if isinstance(key, DType):
        return key
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return from_onnx(int(key))
    if isinstance(key, str):
        name = key
    else:
        try:
            name = np.dtype(key).name
        except TypeError:
            name = None
    d = DTYPES.get(name) if name is not None else None
    if d is None:
        raise ValueError(f"unknown element type {key!r}: give one of {', '.join(DTYPES)}, its ONNX enum or its "
                         "numpy type")
    return d


__all__ = ["DType", "DTYPES", "dtype", "from_onnx"]
