"""annotate(): per-node bound and predicted time, totals, JSON, the rich table, and body graphs."""

from __future__ import annotations

import io
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console

from onnxopt.annotate import graph as graph_mod
from onnxopt.annotate.graph import annotate
from onnxopt.hardware.machine_model import Machine, MemoryLevel

F32 = TensorProto.FLOAT


def machine(peak=100e9, bw=20e9) -> Machine:
    return Machine(name="test", cores=1, isa=[], peak_flops={"float32": peak},
                   levels=[MemoryLevel("L1", 32 * 1024, 10 * bw), MemoryLevel("DRAM", None, bw)])


def small_model() -> onnx.ModelProto:
    """Conv 3x3 (8->16, bias) -> Relu -> GlobalAveragePool -> Flatten -> Gemm; batch symbolic."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in
             (("w", (16, 8, 3, 3)), ("b", (16,)), ("fw", (10, 16)), ("fb", (10,)))]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1),
    ]
    g = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", F32, ["N", 8, 16, 16])],
                          [helper.make_tensor_value_info("y", F32, ["N", 10])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_annotate_small_model():
    m = small_model()
    before = m.SerializeToString()
    ag = annotate(m, machine(), bindings={"N": 2})
    assert m.SerializeToString() == before  # the caller's model is untouched
    assert [n.name for n in ag.nodes] == ["conv", "relu", "gap", "flatten", "fc"]
    conv = ag["conv"]
    assert conv.cost.flops == 2 * 2 * 16 * 256 * 8 * 9 + 2 * 16 * 256
    assert conv.output_shape == ["N", 16, 16, 16]  # symbolic dims stay symbolic in the report
    assert ag["flatten"].cost.is_view and ag["flatten"].seconds == 0
    assert ag.total_flops == sum(n.cost.flops for n in ag.nodes)
    assert ag.total_bytes == sum(n.cost.bytes_moved for n in ag.nodes)
    assert ag.total_seconds == pytest.approx(sum(n.seconds for n in ag.nodes))
    for n in ag.nodes:
        assert n.seconds == pytest.approx(max(n.cost.flops / 100e9, n.cost.bytes_moved / 20e9))
    assert ag.top(1)[0].name == "conv"
    assert len(ag.top(3)) == 3


def test_bound_flips_with_machine_balance():
    m = small_model()
    conv_i = annotate(m, machine(), {"N": 1})["conv"].cost.intensity  # about 20 FLOP/B
    hi = annotate(m, machine(peak=100e9, bw=100e9 / (conv_i * 2)), {"N": 1})  # balance above the conv's I
    lo = annotate(m, machine(peak=100e9, bw=100e9 / (conv_i / 2)), {"N": 1})  # balance below it
    assert hi["conv"].bound == "memory"
    assert lo["conv"].bound == "compute"
    assert lo["relu"].bound == hi["relu"].bound == "memory"
    assert lo.bound_counts()["compute"] >= 1


def test_to_dict_is_json_and_table_renders():
    ag = annotate(small_model(), machine(), {"N": 1})
    d = json.loads(json.dumps(ag.to_dict(), allow_nan=False))
    assert d["totals"]["flops"] == ag.total_flops
    assert {n["name"] for n in d["nodes"]} == {"conv", "relu", "gap", "flatten", "fc"}
    assert d["nodes"][0]["output_shape"] == ["N", 16, 16, 16]
    buf = io.StringIO()
    ag.render_table(Console(file=buf, width=200, force_terminal=False))
    out = buf.getvalue()
    for col in ("node", "op", "output shape", "GFLOPs", "MB", "intensity", "bound", "predicted µs", "% of total"):
        assert col in out
    assert "conv" in out and "Gemm" in out and "memory-bound" in out
    buf = io.StringIO()
    annotate(small_model()).render_table(Console(file=buf, width=200), limit=2)  # no machine: no bound/time
    assert "relu" in buf.getvalue() or "conv" in buf.getvalue()


def test_fused_intensity_on_graph_keeps_needed_intermediates():
    ag = annotate(small_model(), machine(), {"N": 1})
    plain = ag.subgraph_intensity(["conv", "relu"])
    fused = ag.fused_intensity(["conv", "relu"])
    assert fused > plain
    # "c" is consumed only by relu: its write and read are dropped
    c_bytes = ag["conv"].cost.writes["c"]
    flops = ag["conv"].cost.flops + ag["relu"].cost.flops
    assert fused == pytest.approx(flops / (ag["conv"].cost.bytes_moved + ag["relu"].cost.bytes_moved - 2 * c_bytes))


def _if_loop_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", F32, [4, 256])
    then = helper.make_graph([helper.make_node("Exp", ["x"], ["t1"], name="exp"),
                              helper.make_node("Tanh", ["t1"], ["t2"], name="tanh")], "then", [],
                             [helper.make_tensor_value_info("t2", F32, None)])
    els = helper.make_graph([helper.make_node("Relu", ["x"], ["e1"], name="relu")], "else", [],
                            [helper.make_tensor_value_info("e1", F32, None)])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep"),
         helper.make_node("Add", ["acc_in", "x"], ["acc_out"], name="acc")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F32, [4, 256])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F32, [4, 256])])
    trip = numpy_helper.from_array(np.array(3, np.int64), "trip")
    nodes = [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=els),
             helper.make_node("Loop", ["trip", "", "y"], ["z"], name="loop", body=body)]
    g = helper.make_graph(nodes, "cf", [helper.make_tensor_value_info("c", TensorProto.BOOL, []), x],
                          [helper.make_tensor_value_info("z", F32, None)], initializer=[trip])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_control_flow_bodies_are_annotated():
    ag = annotate(_if_loop_model(), machine())
    names = {(n.graph, n.name) for n in ag.nodes}
    assert ("branch/then_branch", "exp") in names and ("branch/else_branch", "relu") in names
    assert ("loop/body", "acc") in names
    assert ag["exp"].cost.flops > 0 and ag["acc"].cost.flops == 4 * 256
    # the costlier branch (then) counts; else does not
    assert ag["exp"].counted and not ag["branch/else_branch/relu"].counted
    assert any("trip count 3" in n for n in ag["loop"].cost.notes)
    assert ag.total_flops == ag["exp"].cost.flops + ag["tanh"].cost.flops + ag["acc"].cost.flops
    json.dumps(ag.to_dict(), allow_nan=False)


def test_inference_on_stripped_copy(monkeypatch):
    """Models beyond protobuf's limit are inferred without their big initializers' data; costs are unchanged."""
    m = small_model()
    ref = annotate(m, machine(), {"N": 1})
    monkeypatch.setattr(graph_mod, "_STRIP_ABOVE", 0)
    monkeypatch.setattr(graph_mod, "_STRIP_TENSOR_ABOVE", 0)
    ag = annotate(m, machine(), {"N": 1})
    assert [n.cost.flops for n in ag.nodes] == [n.cost.flops for n in ref.nodes]
    assert [n.cost.bytes_moved for n in ag.nodes] == [n.cost.bytes_moved for n in ref.nodes]
    assert [t.raw_data for t in ag.model.graph.initializer] == [t.raw_data for t in m.graph.initializer]
    assert not ag.notes
