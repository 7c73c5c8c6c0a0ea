"""Tensor shapes and dtypes of a model, as the cost rules need them.

`tensor_info(model)` reads graph inputs, outputs, value_info and initializers (and, recursively, those of the body
graphs of If/Loop/Scan nodes) of a model on which shape inference already ran. Dims are kept as ONNX gives them:
an `int` for a fixed dim, the `dim_param` string for a symbolic one, `None` for an unknown one. `concrete()`
substitutes numbers for the symbolic dims when an estimate is needed; the symbolic shape itself is never changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx
from onnx import helper

# Bits per element of each dtype (numpy names, as `onnx.helper.tensor_dtype_to_np_dtype` spells them).
_BITS = {
    "float32": 32, "float16": 16, "bfloat16": 16, "float64": 64,
    "int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "int32": 32, "uint32": 32, "int64": 64, "uint64": 64,
    "bool": 8, "complex64": 64, "complex128": 128,
    "float8_e4m3fn": 8, "float8_e4m3fnuz": 8, "float8_e5m2": 8, "float8_e5m2fnuz": 8, "float8_e8m0fnu": 8,
    "int4": 4, "uint4": 4, "float4_e2m1fn": 4, "int2": 2, "uint2": 2, "float6_e2m3fn": 6, "float6_e3m2fn": 6,
    "object": 64,  # strings: a pointer per element; the characters themselves are not counted
}


@dataclass
class TensorInfo:
    """Static facts about one tensor. `shape` is None when the rank is unknown; `dtype` is a numpy dtype name."""

    shape: list | None
    dtype: str | None
    constant: bool = False  # an initializer or the output of a Constant node (weights count as reads)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)


def dtype_name(elem_type: int) -> str | None:
    """ONNX TensorProto elem_type -> numpy name ("float32"); None for UNDEFINED or unknown codes."""
    if not elem_type:
        return None
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, ValueError, TypeError):
        return None


def itemsize_bits(dtype: str | None) -> int:
    """Bits per element; 32 when the dtype is unknown (the caller notes the guess)."""
    return _BITS.get(dtype or "", 32)


def nbytes(numel_: int, dtype: str | None) -> int:
    """Bytes of `numel_` elements of `dtype` (sub-byte types are packed, rounded up)."""
    return math.ceil(numel_ * itemsize_bits(dtype) / 8)


def _shape_of(type_proto: onnx.TypeProto) -> tuple[list | None, str | None]:
    which = type_proto.WhichOneof("value")
    if which == "tensor_type" or which == "sparse_tensor_type":
        tt = getattr(type_proto, which)
        dtype = dtype_name(tt.elem_type)
        if not tt.HasField("shape"):
            return None, dtype
        dims: list = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(d.dim_param)
            else:
                dims.append(None)
        return dims, dtype
    # sequences, maps, optionals: no tensor shape to cost with
    return None, None


def _better(old: TensorInfo | None, new: TensorInfo) -> bool:
    """Prefer the entry that knows more (a shape over none, concrete dims over symbolic or unknown ones)."""
    if old is None:
        return True
    if old.shape is None:
        return new.shape is not None or (old.dtype is None and new.dtype is not None)
    if new.shape is None or len(new.shape) != len(old.shape):
        return False
    score = lambda s: sum(2 if isinstance(d, int) else 1 if isinstance(d, str) else 0 for d in s)  # noqa: E731
    return score(new.shape) > score(old.shape)


def _collect(graph: onnx.GraphProto, out: dict[str, TensorInfo]) -> None:
    def put(name: str, info: TensorInfo) -> None:
        if name and _better(out.get(name), info):
            if name in out and out[name].constant:
                info.constant = True
            out[name] = info

    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        shape, dtype = _shape_of(vi.type)
        put(vi.name, TensorInfo(shape, dtype))
    for init in graph.initializer:
        out[init.name] = TensorInfo([int(d) for d in init.dims], dtype_name(init.data_type), constant=True)
    for sp in graph.sparse_initializer:
        out[sp.values.name] = TensorInfo([int(d) for d in sp.dims], dtype_name(sp.values.data_type), constant=True)
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for o in node.output:
                if o in out:
                    out[o].constant = True
                else:
                    t = _constant_info(node)
                    if t is not None:
                        out[o] = t
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _collect(attr.g, out)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    _collect(g, out)


def _constant_info(node: onnx.NodeProto) -> TensorInfo | None:
    for attr in node.attribute:
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            return TensorInfo([int(d) for d in attr.t.dims], dtype_name(attr.t.data_type), constant=True)
    return None


def tensor_info(model: onnx.ModelProto | onnx.GraphProto) -> dict[str, TensorInfo]:
    """Name -> TensorInfo for every tensor whose type the (shape-inferred) model records, body graphs included.

    Names inside body graphs of If/Loop/Scan share the map with the main graph; ONNX requires them to be unique
    within the scopes that see them, and where two sibling bodies reuse a name the better-known entry wins.
    """
    graph = model.graph if isinstance(model, onnx.ModelProto) else model
    out: dict[str, TensorInfo] = {}
    _collect(graph, out)
    return out


def concrete(shape: list | None, bindings: dict[str, int] | None = None, default: int = 1) -> list[int] | None:
    """A shape with every symbolic dim replaced by its binding (else `default`) and every unknown dim by `default`."""
    if shape is None:
        return None
    b = bindings or {}
    res = []
    for d in shape:
        if isinstance(d, int):
            res.append(d)
        elif isinstance(d, str):
            res.append(int(b.get(d, default)))
        else:
            res.append(default)
    return res


def unbound(shape: list | None, bindings: dict[str, int] | None = None) -> list:
    """The dims of `shape` that `concrete` would have to guess (unbound symbols and unknown dims)."""
    if shape is None:
        return []
    b = bindings or {}
    return [d for d in shape if d is None or (isinstance(d, str) and d not in b)]


def numel(shape: list | None, bindings: dict[str, int] | None = None, default: int = 1) -> int | None:
    """Number of elements (1 for a scalar); symbolic dims are bound as in `concrete`. None when the rank is unknown."""
    c = concrete(shape, bindings, default)
    return None if c is None else math.prod(c)
