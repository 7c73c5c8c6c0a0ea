"""A quantized Softmax read through a Transpose runs before it (graph/quantized_softmax.py): Transpose ->
DequantizeLinear -> Softmax -> QuantizeLinear becomes DequantizeLinear -> Softmax over the moved axis ->
QuantizeLinear -> Transpose, the same softmax over the same values; and a Transpose between equal QDQ steps runs on
the int8 tensor (graph/quantized_pools.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxopt.graph.quantized_pools import quantize_before_max_pools
from onnxopt.graph.quantized_softmax import softmax_before_transposes
from onnxopt.timing import make_session

U8 = TensorProto.UINT8


def _steps():
    return [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
            numpy_helper.from_array(np.array(120, np.uint8), "z"),
            numpy_helper.from_array(np.array(1 / 255, np.float32), "so"),
            numpy_helper.from_array(np.array(0, np.uint8), "zo")]


def _dfl(perm=(0, 2, 1, 3), axis=1, opset=17):
    """YOLOv8n's box head: x [1, 4, 16, 50] u8 -> DequantizeLinear -> Transpose(perm) -> QuantizeLinear ->
    DequantizeLinear -> Softmax(axis) -> QuantizeLinear -> y."""
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["f"]),
             helper.make_node("Transpose", ["f"], ["t"], perm=list(perm)),
             helper.make_node("QuantizeLinear", ["t", "s", "z"], ["tq"]),
             helper.make_node("DequantizeLinear", ["tq", "s", "z"], ["tf"]),
             helper.make_node("Softmax", ["tf"], ["p"], axis=axis),
             helper.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", U8, [1, 4, 16, 50])],
                          [helper.make_tensor_value_info("y", U8, None)], _steps())
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _run(m, x):
    return make_session(m, 1, optimization="none").run(None, {"x": x})[0]


@pytest.mark.parametrize("perm,axis", [((0, 2, 1, 3), 1), ((0, 3, 1, 2), -1), ((0, 2, 3, 1), 2)])
def test_the_softmax_runs_before_the_transpose(perm, axis):
    m = _dfl(perm, axis)
    out = onnx.ModelProto()
    out.CopyFrom(m)
    assert quantize_before_max_pools(out)["Transpose"] == 1  # the Transpose between equal steps: on the u8 tensor
    assert softmax_before_transposes(out) == 1
    ops = [n.op_type for n in out.graph.node]
    assert ops == ["DequantizeLinear", "Softmax", "QuantizeLinear", "Transpose"], ops
    softmax = out.graph.node[1]
    assert softmax.attribute[0].i == perm[axis]
    assert out.graph.node[0].input[0] == "x" and out.graph.node[-1].output[0] == "y"
    x = np.random.default_rng(0).integers(0, 256, (1, 4, 16, 50)).astype(np.uint8)
    want, got = _run(m, x), _run(out, x)
    assert want.shape == got.shape
    # the same softmax over the same values; its sums may add in another order (a value at a rounding midpoint)
    assert np.abs(want.astype(int) - got).max() <= 1 and np.mean(want == got) > 0.999


def test_what_is_left_as_it_was():
    # before opset 13 a Softmax flattens its axis and those after it
    m = _dfl(opset=12)
    quantize_before_max_pools(m)
    assert softmax_before_transposes(m) == 0
    # the transposed tensor read by another node too
    m = _dfl()
    quantize_before_max_pools(m)
    t = next(n for n in m.graph.node if n.op_type == "Transpose")
    m.graph.node.append(helper.make_node("Identity", [t.output[0]], ["other"]))
    m.graph.output.append(helper.make_tensor_value_info("other", U8, None))
    ops = [n.op_type for n in m.graph.node]
    assert softmax_before_transposes(m) == 0 and [n.op_type for n in m.graph.node] == ops
