"""Crops, zero pads and 1x1 pools before a 1x1 convolution folded into its stride and pads
(onnxopt/graph/subsample_conv.py): NASNet's factorized reduction, hypothesis-drawn chains checked against
onnxruntime on the original graph, and the chains that must be left alone."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxopt.graph.subsample_conv import fold_subsampling_into_convs

F32 = TensorProto.FLOAT
n = helper.make_node


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _model(nodes, inits, x_shape, outputs=("y",), opset=17, c_out=5):
    rng = np.random.default_rng(1)
    c = x_shape[1]
    inits = list(inits) + [numpy_helper.from_array(rng.standard_normal((c_out, c, 1, 1)).astype(np.float32), "w"),
                           numpy_helper.from_array(rng.standard_normal(c_out).astype(np.float32), "b")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, x_shape)],
                          [helper.make_tensor_value_info(o, F32, None) for o in outputs], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _shapes(model):
    inferred = onnx.shape_inference.infer_shapes(model)
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(inferred.graph.input) + list(inferred.graph.value_info)}


def _run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


def _rewrite_and_compare(model, x_shape):
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    want = _run(model, x)
    removed = fold_subsampling_into_convs(model, _shapes(model))
    got = _run(model, x)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    return removed


def _factorized_reduction(h, c_in=3):
    """NASNet's two paths: AvgPool 1x1/2 -> Conv, and Pad(bottom, right) -> Slice[1:, 1:] -> AvgPool 1x1/2 -> Conv."""
    nodes = [n("AveragePool", ["x"], ["p1"], kernel_shape=[1, 1], strides=[2, 2]),
             n("Conv", ["p1", "w", "b"], ["y1"], kernel_shape=[1, 1]),
             n("Pad", ["x", "pads"], ["padded"], mode="constant"),
             n("Slice", ["padded", "starts", "ends", "axes"], ["shifted"]),
             n("AveragePool", ["shifted"], ["p2"], kernel_shape=[1, 1], strides=[2, 2], count_include_pad=0),
             n("Conv", ["p2", "w", "b"], ["y2"], kernel_shape=[1, 1]),
             n("Concat", ["y1", "y2"], ["y"], axis=1)]
    inits = [_i64("pads", [0, 0, 0, 0, 0, 0, 1, 1]), _i64("starts", [1, 1]), _i64("ends", [2**62, 2**62]),
             _i64("axes", [2, 3])]
    return _model(nodes, inits, [1, c_in, h, h])


def test_factorized_reduction_odd_size_keeps_the_zero_row_as_conv_padding():
    """At 11x11 the shifted path's last row and column read the Pad's zeros: they become the conv's end pads.
    The conv widens 3 -> 5 channels, so the shift is a cut of its input."""
    model = _factorized_reduction(11)
    assert _rewrite_and_compare(model, [1, 3, 11, 11]) == 3  # two pools, the Pad and the Slice go; a Slice comes
    ops = [m.op_type for m in model.graph.node]
    assert ops.count("AveragePool") == 0 and ops.count("Pad") == 0 and ops.count("Slice") == 1
    convs = [m for m in model.graph.node if m.op_type == "Conv"]
    attrs = [{a.name: list(a.ints) for a in c.attribute if a.name in ("strides", "pads")} for c in convs]
    assert attrs[0] == {"strides": [2, 2], "pads": [0, 0, 0, 0]}  # path 1: the stride is the pool's
    assert attrs[1] == {"strides": [1, 1], "pads": [0, 0, 1, 1]}  # path 2: a Slice at 1 step 2, then the zero row
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    cut = next(m for m in model.graph.node if m.op_type == "Slice")
    assert [inits[x].tolist() for x in cut.input[1:]] == [[1, 1], [10, 10], [2, 3], [2, 2]]
    assert "pads" not in inits and "starts" not in inits  # the old chain's constants are gone


def test_a_narrowing_conv_is_shifted_and_its_output_cropped():
    """8 -> 5 channels: the shifted path is the convolution with stride 2 and one row and column of padding in
    front, its first output row and column cropped (a quarter of the input cut would be 8/5 as many values)."""
    model = _factorized_reduction(11, c_in=8)
    assert _rewrite_and_compare(model, [1, 8, 11, 11]) == 3
    ops = [m.op_type for m in model.graph.node]
    assert ops == ["Conv", "Conv", "Slice", "Concat"]
    path2 = model.graph.node[1]
    assert {a.name: list(a.ints) for a in path2.attribute if a.name != "kernel_shape"} == \
        {"strides": [2, 2], "pads": [1, 1, 1, 1]}
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    crop = model.graph.node[2]
    assert crop.input[0] == path2.output[0] and crop.output[0] == "y2"
    assert [inits[x].tolist() for x in crop.input[1:]] == [[1, 1], [7, 7], [2, 3], [1, 1]]


def test_factorized_reduction_even_size_never_reads_the_padding():
    model = _factorized_reduction(10)
    _rewrite_and_compare(model, [1, 3, 10, 10])
    path2 = [m for m in model.graph.node if m.op_type == "Conv"][1]
    assert {a.name: list(a.ints) for a in path2.attribute}["pads"] == [0, 0, 0, 0]


def test_a_strided_read_at_offset_zero_needs_no_slice():
    """Pad at the top and left -> Slice step 3 -> 1x1 pool -> Conv: all of it is the convolution's stride and pads.
    (onnxruntime itself refuses a Pad right before a MaxPool whose pads would then exceed its kernel.)"""
    nodes = [n("Pad", ["x", "pads"], ["padded"]),
             n("Slice", ["padded", "s", "e", "a", "st"], ["sliced"]),
             n("MaxPool", ["sliced"], ["p"], kernel_shape=[1, 1], strides=[1, 1]),
             n("Conv", ["p", "w", "b"], ["y"], kernel_shape=[1, 1], strides=[1, 2], pads=[0, 1, 2, 0])]
    inits = [_i64("pads", [0, 0, 2, 1, 0, 0, 0, 0]), _i64("s", [0, 0]), _i64("e", [2**62, 2**62]),
             _i64("a", [2, 3]), _i64("st", [3, 3])]
    model = _model(nodes, inits, [2, 4, 13, 9])
    assert _rewrite_and_compare(model, [2, 4, 13, 9]) == 3
    assert [m.op_type for m in model.graph.node] == ["Conv"]


@st.composite
def _chains(draw):
    h, w = draw(st.integers(3, 14)), draw(st.integers(3, 14))
    nodes, inits, cur = [], [], "x"
    for i in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["Pad", "Slice", "AveragePool", "MaxPool"]))
        out = f"t{i}"
        if kind == "Pad":
            pads = [draw(st.integers(0, 2)) for _ in range(4)]
            inits.append(_i64(f"pads{i}", [0, 0, pads[0], pads[1], 0, 0, pads[2], pads[3]]))
            nodes.append(n("Pad", [cur, f"pads{i}"], [out], mode="constant"))
        elif kind == "Slice":
            starts = [draw(st.integers(-3, 3)) for _ in range(2)]
            ends = [draw(st.sampled_from([2**62, -1, -2, 9, 12])) for _ in range(2)]
            steps = [draw(st.integers(1, 3)) for _ in range(2)]
            inits += [_i64(f"s{i}", starts), _i64(f"e{i}", ends), _i64(f"a{i}", [2, 3]), _i64(f"st{i}", steps)]
            nodes.append(n("Slice", [cur, f"s{i}", f"e{i}", f"a{i}", f"st{i}"], [out]))
        else:
            nodes.append(n(kind, [cur], [out], kernel_shape=[1, 1],
                           strides=[draw(st.integers(1, 3)), draw(st.integers(1, 3))]))
        cur = out
    conv_strides = [draw(st.integers(1, 3)) for _ in range(2)]
    conv_pads = [draw(st.integers(0, 2)) for _ in range(4)]
    nodes.append(n("Conv", [cur, "w", "b"], ["y"], kernel_shape=[1, 1], strides=conv_strides, pads=conv_pads))
    batch = draw(st.integers(1, 2))
    return nodes, inits, [batch, draw(st.sampled_from([3, 8])), h, w]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_chains())
def test_drawn_chains_compute_what_onnxruntime_computes(chain):
    nodes, inits, shape = chain
    model = _model(nodes, inits, shape)
    try:  # some drawn chains are empty somewhere (a slice past the end): onnxruntime refuses those graphs too
        _run(model, np.zeros(shape, np.float32))
    except Exception:  # noqa: BLE001
        return
    removed = _rewrite_and_compare(model, shape)
    left = [m.op_type for m in model.graph.node]
    if removed:
        assert not {"Pad", "AveragePool", "MaxPool"} & set(left)
        assert left.count("Slice") <= 2 and len(left) == len(nodes) - removed  # a cut before, a crop after


def test_chains_that_are_left_alone():
    cases = {
        "a Pad with a nonzero value": ([n("Pad", ["x", "pads", "v"], ["t"]), n("Conv", ["t", "w", "b"], ["y"])],
                                       [_i64("pads", [0, 0, 1, 1, 0, 0, 1, 1]),
                                        numpy_helper.from_array(np.array(1.0, np.float32), "v")], ("y",)),
        "a reflect Pad": ([n("Pad", ["x", "pads"], ["t"], mode="reflect"), n("Conv", ["t", "w", "b"], ["y"])],
                          [_i64("pads", [0, 0, 1, 1, 0, 0, 1, 1])], ("y",)),
        "a 3x3 pool": ([n("AveragePool", ["x"], ["t"], kernel_shape=[3, 3], strides=[2, 2]),
                        n("Conv", ["t", "w", "b"], ["y"])], [], ("y",)),
        "a pool output read twice": ([n("AveragePool", ["x"], ["t"], kernel_shape=[1, 1], strides=[2, 2]),
                                      n("Conv", ["t", "w", "b"], ["y"]), n("Relu", ["t"], ["z"])], [], ("y", "z")),
        "a pool output that is a graph output": ([n("AveragePool", ["x"], ["t"], kernel_shape=[1, 1],
                                                    strides=[2, 2]), n("Conv", ["t", "w", "b"], ["y"])], [],
                                                 ("y", "t")),
        "a channel slice": ([n("Slice", ["x", "s", "e", "a"], ["t"]), n("Conv", ["t", "w2", "b"], ["y"])],
                            [_i64("s", [1]), _i64("e", [3]), _i64("a", [1]),
                             numpy_helper.from_array(np.ones((5, 2, 1, 1), np.float32), "w2")], ("y",)),
    }
    for why, (nodes, inits, outs) in cases.items():
        model = _model(nodes, inits, [1, 3, 8, 8], outputs=outs)
        before = model.SerializeToString()
        assert fold_subsampling_into_convs(model, _shapes(model)) == 0, why
        assert model.SerializeToString() == before, why
