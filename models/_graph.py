"""A small graph builder shared by the model definitions.

It writes graphs the way `torch.onnx.export` does: hierarchical node names (`/block.3/expand/Conv`),
outputs named `<node name>_output_<i>`, weights as initializers named like module parameters
(`blocks.3.expand.weight`), and activations decomposed into primitive elementwise ops.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxopt.errors import UsageError

IR_VERSION = 9
MIN_OPSET = 13
MAX_OPSET = 21
PRODUCER = "onnxopt.models"


def check_opset(opset: int) -> int:
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise UsageError(f"opset {opset!r} is not supported by the model builders; "
                         f"use an opset from {MIN_OPSET} to {MAX_OPSET}")
    return opset


class GraphBuilder:
    """Collects nodes and initializers; every helper returns the name of the tensor it produced."""

    def __init__(self, opset: int, seed: int, constants: str = "initializer"):
        if constants not in ("initializer", "node"):
            raise UsageError(f"constants must be 'initializer' or 'node', not {constants!r}")
        self.opset = check_opset(opset)
        self.rng = np.random.default_rng(seed)
        self.constants = constants
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._names: set[str] = set()
        self._const_cache: dict[tuple, str] = {}
        self._n_constants = 0

    # -- names ---------------------------------------------------------------------------------------
    def _unique(self, name: str) -> str:
        if name not in self._names:
            self._names.add(name)
            return name
        i = 1
        while f"{name}_{i}" in self._names:
            i += 1
        self._names.add(f"{name}_{i}")
        return f"{name}_{i}"

    # -- graph interface -------------------------------------------------------------------------------
    def input(self, name: str, elem_type: int, shape: Sequence[int | str]) -> str:
        self._names.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def output(self, tensor: str, name: str, elem_type: int, shape: Sequence[int | str]) -> str:
        """Expose `tensor` as graph output `name` (renaming the producing node's output)."""
        if tensor != name:
            for node in self.nodes:
                for i, out in enumerate(node.output):
                    if out == tensor:
                        node.output[i] = name
                for i, inp in enumerate(node.input):
                    if inp == tensor:
                        node.input[i] = name
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def weight(self, name: str, array: np.ndarray) -> str:
        name = self._unique(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, value, dtype=np.float32) -> str:
        """A constant (scalar or small array), shared between uses like exporters' folded constants."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key in self._const_cache:
            return self._const_cache[key]
        if self.constants == "node":
            name = self._unique(f"/Constant_{self._n_constants}" if self._n_constants else "/Constant")
            out = f"{name}_output_0"
            self.nodes.append(helper.make_node("Constant", [], [out], name=name, value=numpy_helper.from_array(arr)))
        else:
            out = self._unique(f"onnx::Constant_{self._n_constants}")
            self.initializers.append(numpy_helper.from_array(arr, out))
        self._n_constants += 1
        self._const_cache[key] = out
        return out

    def node(self, op: str, inputs: Sequence[str], scope: str = "", n_out: int = 1, **attrs):
        name = self._unique(f"{scope}/{op}")
        outs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    # -- random weights --------------------------------------------------------------------------------
    def normal(self, shape, std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def uniform(self, shape, low: float, high: float) -> np.ndarray:
        return self.rng.uniform(low, high, shape).astype(np.float32)

    # -- op helpers that differ between opsets ------------------------------------------------------------
    def reduce_mean(self, x: str, axes: Sequence[int], scope: str, keepdims: int = 1) -> str:
        if self.opset >= 18:
            return self.node("ReduceMean", [x, self.const(list(axes), np.int64)], scope, keepdims=keepdims)
        return self.node("ReduceMean", [x], scope, axes=list(axes), keepdims=keepdims)

    def split(self, x: str, sizes: Sequence[int], axis: int, scope: str) -> list[str]:
        return self.node("Split", [x, self.const(list(sizes), np.int64)], scope, n_out=len(sizes), axis=axis)

    def unsqueeze(self, x: str, axes: Sequence[int], scope: str) -> str:
        return self.node("Unsqueeze", [x, self.const(list(axes), np.int64)], scope)

    def reshape(self, x: str, shape: Sequence[int], scope: str) -> str:
        return self.node("Reshape", [x, self.const(list(shape), np.int64)], scope)

    def clip(self, x: str, lo: float, hi: float, scope: str) -> str:
        return self.node("Clip", [x, self.const(lo), self.const(hi)], scope)

    # -- layers -------------------------------------------------------------------------------------------
    def conv(self, x: str, c_in: int, c_out: int, k: int, scope: str, param: str, stride: int = 1,
             pad: int | None = None, groups: int = 1, bias: bool = True) -> str:
        """Conv with BatchNorm already folded into weight and bias (He-initialized)."""
        if pad is None:
            pad = k // 2
        fan_in = (c_in // groups) * k * k
        w = self.weight(f"{param}.weight", self.normal((c_out, c_in // groups, k, k), np.sqrt(2.0 / fan_in)))
        inputs = [x, w]
        if bias:
            inputs.append(self.weight(f"{param}.bias", self.normal((c_out,), 0.05)))
        return self.node("Conv", inputs, scope, dilations=[1, 1], group=groups, kernel_shape=[k, k],
                         pads=[pad] * 4, strides=[stride, stride])

    def gemm(self, x: str, c_in: int, c_out: int, scope: str, param: str, std: float | None = None) -> str:
        """`nn.Linear` exported as Gemm(transB=1)."""
        std = np.sqrt(1.0 / c_in) if std is None else std
        w = self.weight(f"{param}.weight", self.normal((c_out, c_in), std))
        b = self.weight(f"{param}.bias", self.normal((c_out,), 0.02))
        return self.node("Gemm", [x, w, b], scope, alpha=1.0, beta=1.0, transB=1)

    # -- decomposed activations -------------------------------------------------------------------------
    def hardswish(self, x: str, scope: str) -> str:
        """x * Clip(x + 3, 0, 6) / 6 -> Add, Clip, Mul, Div."""
        a = self.node("Add", [x, self.const(3.0)], scope)
        c = self.clip(a, 0.0, 6.0, scope)
        m = self.node("Mul", [x, c], scope)
        return self.node("Div", [m, self.const(6.0)], scope)

    def hardsigmoid(self, x: str, scope: str) -> str:
        """Clip(x + 3, 0, 6) / 6 -> Add, Clip, Div."""
        a = self.node("Add", [x, self.const(3.0)], scope)
        c = self.clip(a, 0.0, 6.0, scope)
        return self.node("Div", [c, self.const(6.0)], scope)

    def silu(self, x: str, scope: str) -> str:
        """x * Sigmoid(x) -> Sigmoid, Mul."""
        s = self.node("Sigmoid", [x], scope)
        return self.node("Mul", [x, s], scope)

    def gelu(self, x: str, scope: str) -> str:
        """x * 0.5 * (1 + Erf(x / sqrt(2))) -> Div, Erf, Add, Mul, Mul (torch's exact-GELU export)."""
        d = self.node("Div", [x, self.const(1.4142135381698608)], scope)
        e = self.node("Erf", [d], scope)
        a = self.node("Add", [e, self.const(1.0)], scope)
        m = self.node("Mul", [x, a], scope)
        return self.node("Mul", [m, self.const(0.5)], scope)

    # -- model ----------------------------------------------------------------------------------------
    def model(self, graph_name: str, metadata: dict[str, object] | None = None, doc: str = "") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name, self.inputs, self.outputs, self.initializers, doc_string=doc)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name=PRODUCER, producer_version="0.1.0")
        model.ir_version = IR_VERSION
        for key, value in (metadata or {}).items():
            entry = model.metadata_props.add()
            entry.key = f"onnxopt.{key}"
            entry.value = str(value)
        return model


def metadata(model: onnx.ModelProto) -> dict[str, str]:
    """The `onnxopt.*` metadata the builders record (sizes, vocabulary...), without the prefix."""
    return {p.key[len("onnxopt."):]: p.value for p in model.metadata_props if p.key.startswith("onnxopt.")}


FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
