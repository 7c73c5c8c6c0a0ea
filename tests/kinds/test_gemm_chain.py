"""Chimera's GEMM chains as one kernel (the attention kind with the Relu, or nothing, in place of its softmax:
fusion/attention.py `_match_plain`): which chains it takes, and the kernel against onnxruntime on drawn shapes,
with and without its library; a written model run as a user runs it, in a fresh process, its kernel counted."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fresh_process import run_written
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kind_harness import fuse_kind
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.kinds.attention import KIND
from onnxopt.timing import make_session

F = TensorProto.FLOAT


def chain_model(lead, m, k, l, n, middle=None, *, constant=(), read_first=False):
    """A [*lead, m, k] @ B [*lead, k, l] [-> Relu] @ D [*lead, l, n]; the names in `constant` initializers;
    `read_first`: the first product is also a graph output."""
    rng = np.random.default_rng(0)
    shapes = {"A": [*lead, m, k], "B": [*lead, k, l], "D": [*lead, l, n]}
    inits = [numpy_helper.from_array(rng.standard_normal(shapes[x]).astype(np.float32), x) for x in constant]
    ins = [helper.make_tensor_value_info(x, F, s) for x, s in shapes.items() if x not in constant]
    nodes = [helper.make_node("MatMul", ["A", "B"], ["C"], name="first")]
    h = "C"
    if middle == "relu":
        nodes.append(helper.make_node("Relu", ["C"], ["R"], name="relu"))
        h = "R"
    nodes.append(helper.make_node("MatMul", [h, "D"], ["E"], name="second"))
    outs = [helper.make_tensor_value_info("E", F, None)] + ([helper.make_tensor_value_info("C", F, None)]
                                                            if read_first else [])
    g = helper.make_graph(nodes, "g", ins, outs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _feeds(model, seed=1):
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


def _check(model, tmp_path):
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path)
    feeds = _feeds(model)
    want = make_session(model, 1, optimization="none").run(None, feeds)[0]
    got = make_session(fused, 2, library=lib).run(None, feeds)[0]
    alone = make_session(fused, 1).run(None, feeds)[0]
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)
    np.testing.assert_allclose(alone, want, rtol=1e-4, atol=1e-5 * scale)
    return region


@pytest.mark.parametrize("middle", [None, "relu"])
@pytest.mark.parametrize("lead", [[1], [3], [2, 3]])
def test_matches_onnxruntime(tmp_path, middle, lead):
    region = _check(chain_model(lead, 37, 20, 45, 33, middle), tmp_path)
    assert region.params.middle == (middle or "none") and region.params.mask_kind == "none"
    assert [n.op_type for n in region.nodes] == ["MatMul"] + (["Relu"] if middle else []) + ["MatMul"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 4), m=st.integers(1, 40), k=st.integers(1, 40), l=st.integers(1, 70),
       n=st.integers(1, 40), middle=st.sampled_from([None, "relu"]))
def test_drawn_shapes(tmp_path, batch, m, k, l, n, middle):
    _check(chain_model([batch], m, k, l, n, middle), tmp_path)


@pytest.mark.parametrize("why,kw", [("constant weights: the compute kind's packed GEMMs", {"constant": ("B", "D")}),
                                    ("the first product is read elsewhere", {"read_first": True})])
def test_chains_left_to_the_compute_kind(why, kw):
    assert KIND.find(chain_model([2], 8, 8, 8, 8, **kw), set(), []) == [], why


def test_a_rank_2_chain_is_left_to_the_compute_kind():
    assert KIND.find(chain_model([], 8, 8, 8, 8), set(), []) == []


def test_a_written_model_runs_its_kernel_in_a_fresh_process(tmp_path):
    model = chain_model([4], 64, 32, 96, 32, "relu")
    src = tmp_path / "chain.onnx"
    onnx.save(model, str(src))
    out = tmp_path / "fused.onnx"
    result = onnxopt.optimize(str(src), str(out), threads=2, min_speedup=0.0, measure=False)
    assert [r["ops"] for r in result.report["regions"]] == ["MatMul -> Relu -> MatMul"]
    feeds = _feeds(model)
    got, loaded = run_written(out, feeds, tmp_path)
    assert any(k.startswith("attention_") for k in loaded["calls"]), loaded
    want = make_session(model, 1, optimization="none").run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
