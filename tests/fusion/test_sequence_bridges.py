"""Lone elementwise ops between two of our kernels as regions of their own (fusion/elementwise.py
sequence_bridges): which ops the rule takes, and PP-OCRv4's squeeze-excite block written by onnxopt and loaded in a
fresh process, where the block's Mul runs inside the one sequence instead of ending it."""

from __future__ import annotations

import numpy as np
import onnx
from fresh_process import assert_written_model_runs
from onnx import TensorProto, helper
from onnx_builders import const, make_model

import onnxopt
from onnxopt.emit.sequence import expand_sequences
from onnxopt.fusion.compute import ComputeRule
from onnxopt.fusion.elementwise import ElementwiseRule

F = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def se_model(c=32, hw=8):
    """A convolution, a squeeze-excite block on its output (GlobalAveragePool -> Conv -> Relu -> Conv ->
    HardSigmoid), the Mul of the output by the block's channel scales, and the convolution that reads it."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    inits = [const("w0", w(c, 8, 3, 3)), const("w_se1", w(8, c, 1, 1)), const("w_se2", w(c, 8, 1, 1)),
             const("w1", w(16, c, 1, 1))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("Relu", ["a"], ["ar"], name="relu0"),
             helper.make_node("GlobalAveragePool", ["ar"], ["g"], name="gap"),
             helper.make_node("Conv", ["g", "w_se1"], ["s1"], name="se1"),
             helper.make_node("Relu", ["s1"], ["s1r"], name="se_relu"),
             helper.make_node("Conv", ["s1r", "w_se2"], ["s2"], name="se2"),
             helper.make_node("HardSigmoid", ["s2"], ["scale"], name="se_gate"),
             helper.make_node("Mul", ["ar", "scale"], ["excited"], name="excite"),
             helper.make_node("Conv", ["excited", "w1"], ["y"], name="conv1")]
    return make_model(nodes, [vi("x", F, [1, 8, hw, hw])], [vi("y", F, [1, 16, hw, hw])], inits)


def test_the_lone_mul_between_two_kernels_is_a_bridge():
    model = onnx.shape_inference.infer_shapes(se_model())
    plan = ComputeRule(model, 6).find_regions(set(), [])
    assert "excite" not in {n.name for r in plan for n in r.nodes}
    taken = {i for i, n in enumerate(model.graph.node) if any(n.name in r.node_names for r in plan)}
    assert ElementwiseRule(model).find_regions(exclude=taken) == []  # one op: too few for the rule alone
    bridges = ElementwiseRule(model, min_ops=1).sequence_bridges(plan)
    assert [r.node_names for r in bridges] == [["excite"]] and bridges[0].params.bridge


def test_a_longer_elementwise_region_between_two_kernels_is_marked_a_bridge():
    """The Mul and an Add after it (det's squeeze-excite output and its residual): a region of the rule's own, which
    the bridges mark in place, so that it too is judged in the whole model."""
    model = se_model()
    g = model.graph
    mul = next(n for n in g.node if n.name == "excite")
    mul.output[0] = "excited0"
    k = list(g.node).index(mul)
    g.node.insert(k + 1, helper.make_node("Add", ["excited0", "ar"], ["excited"], name="residual"))
    model = onnx.shape_inference.infer_shapes(model)
    plan = ComputeRule(model, 6).find_regions(set(), [])
    taken = {i for i, n in enumerate(model.graph.node) if any(n.name in r.node_names for r in plan)}
    chain = ElementwiseRule(model).find_regions(exclude=taken)
    assert [r.node_names for r in chain] == [["excite", "residual"]] and not chain[0].params.bridge
    assert ElementwiseRule(model, min_ops=1).sequence_bridges(plan + chain) == []  # nothing new
    assert chain[0].params.bridge


def test_no_bridge_where_an_end_is_not_a_kernel():
    """The Mul's reader left to onnxruntime (the plan without conv1), or its output a graph output: no bridge."""
    model = onnx.shape_inference.infer_shapes(se_model())
    plan = [r for r in ComputeRule(model, 6).find_regions(set(), []) if "conv1" not in r.node_names]
    assert ElementwiseRule(model, min_ops=1).sequence_bridges(plan) == []
    g = model.graph
    g.output.append(vi("excited", F, [1, 32, 8, 8]))
    plan = ComputeRule(model, 6).find_regions(set(), [])
    assert ElementwiseRule(model, min_ops=1).sequence_bridges(plan) == []


def test_a_squeeze_excite_mul_runs_in_the_sequence_of_the_written_model(tmp_path):
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    onnx.save(se_model(), src)
    res = onnxopt.optimize(src, out, threads=2, cost_cache=False, min_speedup=0.0, plan="compute-blocked",
                           skip_fusion=["afusion", "horizontal"])
    entry = next(e for e in res.report["regions"] if e["nodes"] == ["excite"])
    fused = onnx.load(out)
    assert not any(n.op_type == "Mul" for n in fused.graph.node)
    assert [n.op_type.startswith("Sequence_") for n in fused.graph.node] == [True]
    assert entry["op_type"] in [n.op_type for n in expand_sequences(fused).graph.node]
    x = np.random.default_rng(1).standard_normal((1, 8, 8, 8)).astype(np.float32)
    assert_written_model_runs(src, out, {"x": x}, entry["op_type"], tmp_path)
