"""Concat and nearest Resize of blocked tensors as one copy kernel (fusion/blocked_copy.py, codegen/glue/copy_exec.c):
the kernel against numpy over drawn shapes and factors, and a decoder up-block through the whole pipeline, with and
without the library."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx_builders import const, make_model
from onnxopt.codegen.copy.build import build_copy
from onnxopt.codegen.glue.library import link_library
from onnxopt.codegen.target import host_target

import onnxopt
from onnxopt.emit.sequence import expand_sequences
from onnxopt.fusion.blocked_copy import CopyParams
from onnxopt.fusion.params import RelayoutParams
from onnxopt.fusion.region import EwProgram, Region, Value
from onnxopt.driver.policy import passthroughs_kept

F = TensorProto.FLOAT
vi = helper.make_tensor_value_info
LANES = host_target().float32_lanes


def _copy_library(tmp_path, factors, name="Copy_test"):
    region = Region("Copy", [], [f"x{i}" for i in range(len(factors))], ["y"],
                    EwProgram(inputs=[Value(f"x{i}", "float32") for i in range(len(factors))], consts={}, ops=[],
                              outputs=[]), [])
    region.params = CopyParams(lanes=LANES, factors=list(factors))
    region.op_type = name
    obj, desc, _ = build_copy(region, host_target())
    lib = str(tmp_path / "copy.so")
    link_library([desc], [obj], host_target(), lib)
    node = helper.make_node(name, region.inputs, ["y"], domain="onnxopt")
    model = helper.make_model(helper.make_graph([node], "g", [vi(x, F, None) for x in region.inputs], [vi("y", F, None)]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("onnxopt", 1)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.register_custom_ops_library(lib)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _expected(xs, factors):
    return np.concatenate([x.repeat(fh, axis=2).repeat(fw, axis=3) for x, (fh, fw) in zip(xs, factors)], axis=1)


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_kernel_matches_numpy(tmp_path_factory, data):
    k = data.draw(st.integers(1, 3))
    factors = [data.draw(st.sampled_from([(1, 1), (2, 2), (2, 1), (1, 3), (3, 2)])) for _ in range(k)]
    # One output size that every input's factors divide.
    n = data.draw(st.integers(1, 2))
    h = data.draw(st.integers(1, 5)) * 6
    w = data.draw(st.integers(1, 5)) * 6
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    xs = [rng.standard_normal((n, data.draw(st.integers(1, 3)), h // fh, w // fw, LANES)).astype(np.float32)
          for fh, fw in factors]
    sess = _copy_library(tmp_path_factory.mktemp("copy"), factors)
    got = sess.run(None, {f"x{i}": x for i, x in enumerate(xs)})[0]
    np.testing.assert_array_equal(got, _expected(xs, factors))


def test_kernel_refuses_inputs_that_do_not_agree(tmp_path):
    sess = _copy_library(tmp_path, [(2, 2), (1, 1)])
    a = np.zeros((1, 1, 4, 4, LANES), np.float32)
    b = np.zeros((1, 1, 9, 8, LANES), np.float32)  # 4 * 2 rows != 9
    with pytest.raises(Exception, match="one output size"):
        sess.run(None, {"x0": a, "x1": b})


def up_block_model(c_low=32, c_skip=16, hw=14, batch=1, opset=17):
    """conv (low) -> Resize nearest 2x -> Concat(., skip conv) -> conv: a UNet decoder step, all in blocked chains."""
    rng = np.random.default_rng(0)

    def w(*s):
        return rng.standard_normal(s).astype(np.float32) * 0.2

    inits = [const("w_low", w(c_low, 8, 3, 3)), const("w_skip", w(c_skip, 8, 3, 3)),
             const("w_out", w(16, c_low + c_skip, 3, 3)), const("scales", [1.0, 1.0, 2.0, 2.0])]
    nodes = [helper.make_node("Conv", ["lo", "w_low"], ["a"], pads=[1, 1, 1, 1], name="conv_low"),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Resize", ["ar", "", "scales"], ["up"], mode="nearest", name="up"),
             helper.make_node("Conv", ["hi", "w_skip"], ["s"], pads=[1, 1, 1, 1], name="conv_skip"),
             helper.make_node("Relu", ["s"], ["sr"]),
             helper.make_node("Concat", ["up", "sr"], ["cat"], axis=1, name="cat"),
             helper.make_node("Conv", ["cat", "w_out"], ["y"], pads=[1, 1, 1, 1], name="conv_out")]
    return make_model(nodes, [vi("lo", F, [batch, 8, hw, hw]), vi("hi", F, [batch, 8, 2 * hw, 2 * hw])],
                      [vi("y", F, [batch, 16, 2 * hw, 2 * hw])], inits, opset=opset)


@pytest.mark.skipif(LANES < 8, reason="blocked chains need 8 or 16 float lanes")
@pytest.mark.parametrize("batch", [1, 2])
def test_up_block_becomes_one_copy_kernel(tmp_path, batch):
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    onnx.save(up_block_model(batch=batch), src)
    res = onnxopt.optimize(src, out, threads=2, cost_cache=False, min_speedup=0.0, plan="compute-blocked",
                           skip_fusion=["afusion", "horizontal"])
    fused = expand_sequences(onnx.load(out))
    copies = [n for n in fused.graph.node if n.op_type.startswith("Copy_")]
    entry = next(e for e in res.report["regions"] if e["op_type"].startswith("Copy_"))
    assert entry["ops"] == "Resize -> Concat" and len(copies) == 1
    assert not any(n.op_type in ("Resize", "Expand", "Concat") for n in fused.graph.node)
    rng = np.random.default_rng(1)
    feeds = {"lo": rng.standard_normal((batch, 8, 14, 14)).astype(np.float32),
             "hi": rng.standard_normal((batch, 8, 28, 28)).astype(np.float32)}
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    so = ort.SessionOptions()
    so.register_custom_ops_library(out + ".so")
    got = ort.InferenceSession(out, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    fallback = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(fallback, want, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(LANES < 8, reason="blocked chains need 8 or 16 float lanes")
def test_skip_fusion_copy_keeps_the_passthrough_nodes(tmp_path):
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    onnx.save(up_block_model(), src)
    onnxopt.optimize(src, out, threads=2, cost_cache=False, min_speedup=0.0, plan="compute-blocked",
                     skip_fusion=["afusion", "horizontal", "copy"])
    ops = [n.op_type for n in onnx.load(out).graph.node]
    assert not any(o.startswith("Copy_") for o in ops) and "Concat" in ops and "Expand" in ops


@pytest.mark.parametrize("factors", [[(1, 1), (1, 1), (1, 1)], [(1, 1)]])
def test_blocked_concat_without_repeats_copies_contiguous_spans(tmp_path, factors):
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((2, 1 + i, 40, 33, LANES)).astype(np.float32) for i in range(len(factors))]
    sess = _copy_library(tmp_path, factors)
    got = sess.run(None, {f"x{i}": x for i, x in enumerate(xs)})[0]
    np.testing.assert_array_equal(got, np.concatenate(xs, axis=1))



def test_a_rejected_copy_kernel_gives_the_chain_its_passthrough_nodes_back():
    """The passthrough regions a copy kernel replaces join the plan only when the kernel was not accepted."""
    def relayout(name):
        node = helper.make_node("Identity", [f"{name}_in"], [name], name=name)
        return Region("relayout", [node], [f"{name}_in"], [name], None, [], params=RelayoutParams([node]))

    up, cat, other = relayout("up"), relayout("cat"), relayout("other")
    copy = Region("Copy", [up.nodes[0], cat.nodes[0]], ["up_in"], ["cat"], EwProgram([], {}, [], []), [])
    copy.params = CopyParams(lanes=LANES, factors=[(2, 2)], fallback=[up, cat])
    regions = [up, cat, other, copy]
    assert passthroughs_kept([copy], regions) == [other]
    assert passthroughs_kept([], regions) == [up, cat, other]
