"""One-dimensional convolutions rewritten as two-dimensional ones of height 1 (onnxopt/graph/conv1d.py): the rewritten
graph gives onnxruntime's answers of the original on hypothesis-drawn convolutions, the elementwise ops with scalar
constants follow onto the 4-D view (no Squeeze between two convolutions), what is left alone, and the whole
optimizer running the convolutions as its kernels in a written model loaded in a fresh process."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.graph.conv1d import conv1d_as_conv2d
from onnxopt.graph.infer import infer, static_shapes

F32 = TensorProto.FLOAT
n = helper.make_node


def _whisper_front(c_in=8, mid=16, length=40, opset=17, k=3, s2=2, bias=True, out_transpose=True, seed=0):
    """Whisper's front end as exported: Conv1d -> GELU (Div, Erf, Add, Mul, Mul) -> Conv1d (stride 2) -> GELU ->
    Transpose."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def conv(x, out, ci, co, stride):
        w = (rng.standard_normal((co, ci, k)) / math.sqrt(ci * k)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"{out}_w"))
        ins = [x, f"{out}_w"]
        if bias:
            inits.append(numpy_helper.from_array(rng.standard_normal(co).astype(np.float32), f"{out}_b"))
            ins.append(f"{out}_b")
        nodes.append(n("Conv", ins, [out], name=out, kernel_shape=[k], strides=[stride], pads=[k // 2, k // 2],
                       dilations=[1], group=1))

    def gelu(x, out):
        nodes.extend([
            n("Constant", [], [f"{out}_sqrt2"], value=numpy_helper.from_array(np.float32(math.sqrt(2)), "s")),
            n("Div", [x, f"{out}_sqrt2"], [f"{out}_d"]), n("Erf", [f"{out}_d"], [f"{out}_e"]),
            n("Constant", [], [f"{out}_one"], value=numpy_helper.from_array(np.float32(1), "o")),
            n("Add", [f"{out}_e", f"{out}_one"], [f"{out}_a"]), n("Mul", [x, f"{out}_a"], [f"{out}_m"]),
            n("Constant", [], [f"{out}_half"], value=numpy_helper.from_array(np.float32(0.5), "h")),
            n("Mul", [f"{out}_m", f"{out}_half"], [out])])

    conv("x", "c1", c_in, mid, 1)
    gelu("c1", "g1")
    conv("g1", "c2", mid, mid, s2)
    gelu("c2", "g2")
    out = "y"
    if out_transpose:
        nodes.append(n("Transpose", ["g2"], ["y"], perm=[0, 2, 1]))
    else:
        out = "g2"
    g = helper.make_graph(nodes, "front", [helper.make_tensor_value_info("x", F32, [1, c_in, length])],
                          [helper.make_tensor_value_info(out, F32, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    feeds = {"x": rng.standard_normal((1, c_in, length)).astype(np.float32)}
    return m, feeds


def _run(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _rewritten(model):
    work = onnx.ModelProto()
    work.CopyFrom(model)
    count = conv1d_as_conv2d(work, static_shapes(infer(work)))
    return work, count


@pytest.mark.parametrize("opset", [11, 17])
def test_the_front_end_keeps_its_answers_and_its_gelus_follow_the_view(opset):
    model, feeds = _whisper_front(opset=opset)
    work, count = _rewritten(model)
    assert count == 2
    ops = [nd.op_type for nd in work.graph.node]
    # one Unsqueeze at the input, one Squeeze before the Transpose, none between the convolutions
    assert ops.count("Unsqueeze") == 1 and ops.count("Squeeze") == 1, ops
    assert ops.index("Squeeze") > max(i for i, o in enumerate(ops) if o == "Conv")
    convs = [nd for nd in work.graph.node if nd.op_type == "Conv"]
    assert all(list(helper.get_attribute_value(a)) == [1, 3] for c in convs for a in c.attribute
               if a.name == "kernel_shape")
    assert not any(t.name in ("c1_w", "c2_w") for t in work.graph.initializer)  # the 3-D weights are gone
    np.testing.assert_allclose(_run(work, feeds)[0], _run(model, feeds)[0], rtol=1e-6, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(c_in=st.integers(1, 12), co=st.integers(1, 12), length=st.integers(1, 30), k=st.integers(1, 5),
       stride=st.integers(1, 3), dil=st.integers(1, 2), p0=st.integers(0, 2), p1=st.integers(0, 2),
       group=st.sampled_from([1, 2]), bias=st.booleans())
def test_drawn_convolutions_keep_their_answers(c_in, co, length, k, stride, dil, p0, p1, group, bias):
    c_in, co = c_in * group, co * group
    if length + p0 + p1 < dil * (k - 1) + 1:
        return
    rng = np.random.default_rng(c_in * 7 + co)
    inits = [numpy_helper.from_array(rng.standard_normal((co, c_in // group, k)).astype(np.float32), "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(co).astype(np.float32), "b"))
        ins.append("b")
    g = helper.make_graph([n("Conv", ins, ["y"], kernel_shape=[k], strides=[stride], dilations=[dil],
                             pads=[p0, p1], group=group), n("Relu", ["y"], ["z"])], "g",
                          [helper.make_tensor_value_info("x", F32, [2, c_in, length])],
                          [helper.make_tensor_value_info(o, F32, None) for o in ("z", "y")], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    feeds = {"x": rng.standard_normal((2, c_in, length)).astype(np.float32)}
    work, count = _rewritten(model)
    assert count == 1
    # both outputs returned under their names: the convolution's and the Relu's, each squeezed back
    assert [o.name for o in work.graph.output] == ["z", "y"]
    for got, want in zip(_run(work, feeds), _run(model, feeds)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_left_alone():
    """Computed weights, a symbolic length and 2-D convolutions are not rewritten."""
    w = numpy_helper.from_array(np.ones((4, 4, 3), np.float32), "w")
    computed = helper.make_graph([n("Identity", ["w"], ["wi"]), n("Conv", ["x", "wi"], ["y"], kernel_shape=[3])],
                                 "g", [helper.make_tensor_value_info("x", F32, [1, 4, 9])],
                                 [helper.make_tensor_value_info("y", F32, None)], [w])
    symbolic = helper.make_graph([n("Conv", ["x", "w"], ["y"], kernel_shape=[3])], "g",
                                 [helper.make_tensor_value_info("x", F32, [1, 4, "L"])],
                                 [helper.make_tensor_value_info("y", F32, None)], [w])
    w2 = numpy_helper.from_array(np.ones((4, 4, 3, 3), np.float32), "w")
    two_d = helper.make_graph([n("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3])], "g",
                              [helper.make_tensor_value_info("x", F32, [1, 4, 9, 9])],
                              [helper.make_tensor_value_info("y", F32, None)], [w2])
    # a one-element constant of rank 4 would make the original's Add 4-D: the Add stays on the 3-D tensor
    four = numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "four")
    rank4 = helper.make_graph([n("Conv", ["x", "w"], ["y"], kernel_shape=[3]), n("Add", ["y", "four"], ["z"])], "g",
                              [helper.make_tensor_value_info("x", F32, [1, 4, 9])],
                              [helper.make_tensor_value_info("z", F32, None)], [w, four])
    m = helper.make_model(rank4, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    work, count = _rewritten(m)
    assert count == 1 and [nd.op_type for nd in work.graph.node][-2:] == ["Squeeze", "Add"]
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 4, 9)).astype(np.float32)}
    got, want = _run(work, feeds)[0], _run(m, feeds)[0]
    assert got.shape == want.shape == (1, 1, 4, 7)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for g in (computed, symbolic, two_d):
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
        assert _rewritten(m)[1] == 0


def test_the_optimizer_runs_them_as_its_kernels(tmp_path):
    """The written model gives the original's answer in a fresh process through the public loader, with its
    convolution kernels run there, and its function bodies alone give it too."""
    from fresh_process import assert_written_model_runs

    model, feeds = _whisper_front(c_in=16, mid=32, length=64)
    src = tmp_path / "src.onnx"
    onnx.save(model, str(src))
    res = onnxopt.optimize(str(src), str(tmp_path / "f.onnx"), measure=False)
    assert res.report["rewrites"]["conv1d_as_conv2d"] == 2
    ours = [nd.op_type for nd in res.model.graph.node if nd.domain == "onnxopt"]
    assert ours, [nd.op_type for nd in res.model.graph.node]
    assert_written_model_runs(src, tmp_path / "f.onnx", feeds, ours[0], tmp_path)
