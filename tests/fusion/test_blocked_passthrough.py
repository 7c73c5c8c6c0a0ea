"""onnxruntime's ops on blocked tensors (fusion/blocked_passthrough.py): each rewrite computes in onnxruntime what
the original node computes, blocked chains run through Concat, Split, pools and Resize without a reorder, and the
fused model gives the original's answers with and without the library."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxopt.emit.sequence import expand_sequences
from onnxopt.fusion import blocked_passthrough as bp
from onnxopt.fusion.layout import blocked_inputs, blocked_outputs

from onnx_builders import make_model  # noqa: E402
from test_layout import LANES, Chain, check_answers, needs_vectors, optimize_blocked, regions_of

F32 = TensorProto.FLOAT
vi = helper.make_tensor_value_info
n = helper.make_node


def one_node(node, in_shapes, opset, consts=()):
    """A model of one node, its shapes inferred: (model, shape_of, const_of)."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts]
    g = helper.make_graph([node], "g", [vi(x, F32, s) for x, s in in_shapes],
                          [vi(o, F32, None) for o in node.output if o], initializer=inits)
    m = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input)}
    values = dict(consts)
    return m, (lambda t: tuple(shapes[t]) if t in shapes else None), (
        lambda t: np.asarray(values[t]) if t in values else None)


def forms_that_pass(node, in_shapes, opset, consts=(), ir_version=8):
    m, shape_of, const_of = one_node(node, in_shapes, opset, consts)
    assert bp.admit(node, shape_of, const_of, LANES, opset) is None
    return [[x.op_type for x in form] for form in bp.rewrites(node, shape_of, const_of, LANES, opset)
            if bp.check(node, form, shape_of, const_of, LANES, opset, ir_version)]


L = 16  # shapes below are written for 16 lanes; on 8 lanes they are multiples too


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_concat_and_split_of_channels(opset):
    cat = n("Concat", ["a", "b", "c"], ["y"], axis=1)
    assert forms_that_pass(cat, [("a", [1, L, 5, 7]), ("b", [1, 2 * L, 5, 7]), ("c", [1, 5, 5, 7])], opset)
    cat = n("Concat", ["a", "b"], ["y"], axis=-3)
    assert forms_that_pass(cat, [("a", [2, L, 3, 3]), ("b", [2, L, 3, 3])], opset)
    if opset >= 13:
        split = n("Split", ["x", "sizes"], ["p", "q"], axis=1)
        consts = [("sizes", np.array([L, 3], np.int64))]
    else:
        split, consts = n("Split", ["x"], ["p", "q"], axis=1, split=[L, 3]), []
    assert forms_that_pass(split, [("x", [1, L + 3, 6, 4])], opset, consts)
    if opset >= 18:
        even = n("Split", ["x"], ["p", "q"], axis=1, num_outputs=2)
        assert forms_that_pass(even, [("x", [1, 2 * L, 6, 4])], opset)


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2]),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 1], ceil_mode=1),
    dict(kernel_shape=[2, 3], dilations=[2, 1]),
    dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2]),
])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pools_as_3d_pools(op, attrs):
    if op == "AveragePool" and "dilations" in attrs:
        attrs = {k: v for k, v in attrs.items() if k != "dilations"}
    if op == "AveragePool":
        attrs = dict(attrs, count_include_pad=1)
    assert forms_that_pass(n(op, ["x"], ["y"], **attrs), [("x", [1, L + 5, 9, 11])], 13) == [[op]]


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools_as_reductions(op, opset):
    forms = forms_that_pass(n(op, ["x"], ["y"]), [("x", [2, L + 3, 5, 6])], opset)
    assert len(forms) == 1 and forms[0][-1] == bp.GLOBAL_POOLS[op]


@pytest.mark.parametrize("mode, nearest", [("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"),
                                           ("align_corners", "round_prefer_ceil")])
def test_nearest_resize(mode, nearest):
    node = n("Resize", ["x", "", "scales"], ["y"], mode="nearest", coordinate_transformation_mode=mode,
             nearest_mode=nearest)
    forms = forms_that_pass(node, [("x", [1, L, 5, 7])], 13, [("scales", np.array([1, 1, 2, 2], np.float32))])
    assert forms  # whichever form onnxruntime agrees with; the broadcast one first where it does
    if mode == "asymmetric":
        assert forms[0] == ["Constant", "Constant", "Reshape", "Expand", "Constant", "Reshape"]
    # A scale that is not an integer goes through the 4-D Resize.
    forms = forms_that_pass(node, [("x", [1, L, 6, 6])], 13, [("scales", np.array([1, 1, 1.5, 2.5], np.float32))])
    assert len(forms) == 1 and "Resize" in forms[0]  # one form: the broadcast one does not apply


def test_check_runs_for_ir3_models():
    """The model zoo's `light` graphs are IR 3 (initializers listed as inputs): the check still runs."""
    node = n("Resize", ["x", "scales"], ["y"], mode="nearest")  # opset 10: no roi, no coordinate modes
    consts = [("scales", np.array([1, 1, 2, 2], np.float32))]
    assert len(forms_that_pass(node, [("x", [1, L, 3, 4])], 10, consts, ir_version=3)) == 2
    assert forms_that_pass(n("MaxPool", ["x"], ["y"], kernel_shape=[3, 3]), [("x", [1, L, 5, 5])], 8,
                           ir_version=3) == [["MaxPool"]]


def test_admit_reasons():
    def reason(node, in_shapes, opset=13, consts=()):
        m, shape_of, const_of = one_node(node, in_shapes, opset, consts)
        return bp.admit(node, shape_of, const_of, L, opset)

    assert "multiple" in reason(n("Concat", ["a", "b"], ["y"], axis=1), [("a", [1, 5, 4, 4]), ("b", [1, L, 4, 4])])
    assert "channels" in reason(n("Concat", ["a", "b"], ["y"], axis=2), [("a", [1, L, 4, 4]), ("b", [1, L, 4, 4])])
    assert "multiple" in reason(n("Split", ["x"], ["p", "q"], axis=1, split=[3, L]), [("x", [1, L + 3, 4, 4])], 11)
    scales = [("scales", np.array([1, 1, 2, 2], np.float32))]
    linear = n("Resize", ["x", "", "scales"], ["y"], mode="linear")
    assert "nearest" in reason(linear, [("x", [1, L, 4, 4])], consts=scales)
    chan = n("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    assert "keep N and C" in reason(chan, [("x", [1, L, 4, 4])], consts=[("scales", np.array([1, 2, 2, 2],
                                                                                             np.float32))])
    assert "Indices" in reason(n("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2]), [("x", [1, L, 4, 4])])
    assert "static" in reason(n("MaxPool", ["x"], ["y"], kernel_shape=[2, 2]), [("x", [1, L, 4])])
    assert reason(n("Sigmoid", ["x"], ["y"]), [("x", [1, L, 4, 4])]) is not None  # sigmoid(0) = 0.5
    # onnx infers 4 columns, onnxruntime computes 3 (SAME padding from the undilated kernel): the chain's reorders
    # would be built for the wrong size.
    same_dilated = n("MaxPool", ["x"], ["y"], kernel_shape=[1, 2], dilations=[1, 2], auto_pad="SAME_UPPER")
    assert "disagree" in reason(same_dilated, [("x", [1, L, 4, 4])])
    ceil_past = n("MaxPool", ["x"], ["y"], kernel_shape=[1, 1], strides=[2, 2], ceil_mode=1)
    assert "disagree" in reason(ceil_past, [("x", [1, L, 10, 10])])
    lo1 = [("lo", np.array(1.0, np.float32)), ("hi", np.array(6.0, np.float32))]
    assert "leaves out 0" in reason(n("Clip", ["x", "lo", "hi"], ["y"]), [("x", [1, L, 4, 4])], consts=lo1)
    assert "no constant" in reason(n("Add", ["x", "c"], ["y"]), [("x", [1, L, 4, 4])],
                                   consts=[("c", np.ones((1, L, 4, 4), np.float32))])
    assert "no broadcast" in reason(n("Mul", ["x", "s"], ["y"]), [("x", [1, L, 4, 4]), ("s", [1, L, 1, 1])])


@pytest.mark.parametrize("node, consts", [
    (n("Relu", ["x"], ["y"]), []),
    (n("LeakyRelu", ["x"], ["y"], alpha=0.2), []),
    (n("Clip", ["x", "lo", "hi"], ["y"]), [("lo", np.array(0.0, np.float32)), ("hi", np.array(6.0, np.float32))]),
    (n("Clip", ["x", "", "hi"], ["y"]), [("hi", np.array(0.5, np.float32))]),
    (n("Add", ["x", "z"], ["y"]), []),
    (n("Mul", ["x", "z"], ["y"]), []),
    (n("Max", ["x", "z"], ["y"]), []),
])
def test_elementwise_ops_unchanged_on_blocked_tensors(node, consts):
    shapes = [("x", [2, L + 5, 6, 7])] + ([("z", [2, L + 5, 6, 7])] if "z" in node.input else [])
    assert forms_that_pass(node, shapes, 13, consts) == [[node.op_type]]


# ---- in the blocked plan ----
def csp_block(ch, batch=1):
    """A YOLO-style block: conv, Split of channels, a bottleneck on one half, Concat, SPPF-style MaxPools and
    Concat, nearest Resize, and convolutions reading each."""
    a = ch.conv("x", "a", 2 * L, k=1, p=0, act="Sigmoid")
    ch.inits.append(numpy_helper.from_array(np.array([L, L], np.int64), "halves"))
    ch.nodes.append(n("Split", [a, "halves"], ["s0", "s1"], name="split", axis=1))
    ch.c["s0"] = ch.c["s1"] = L
    b = ch.conv("s1", "b", L)
    c = ch.conv(b, "c", L, act=None)
    d = ch.add(c, "s1", "d", relu=False)  # the residual is a Split output
    ch.nodes.append(n("Concat", ["s0", "s1", d], ["cat"], name="cat", axis=1))
    ch.c["cat"] = 3 * L
    e = ch.conv("cat", "e", L, k=1, p=0)
    pools = [e]
    for i in range(2):
        pools.append(f"pool{i}")
        ch.nodes.append(n("MaxPool", [pools[-2]], [pools[-1]], name=pools[-1], kernel_shape=[5, 5],
                          pads=[2, 2, 2, 2]))
        ch.c[pools[-1]] = L
    ch.nodes.append(n("Concat", pools, ["spp"], name="spp", axis=1))
    ch.c["spp"] = 3 * L
    f = ch.conv("spp", "f", L + 8, k=1, p=0)
    ch.inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up_scales"))
    ch.nodes.append(n("Resize", [f, "", "up_scales"], ["up"], name="up", mode="nearest",
                      coordinate_transformation_mode="asymmetric", nearest_mode="floor"))
    ch.c["up"] = L + 8
    return ch.conv("up", "g", 12)


def test_assignment_runs_through_passthrough_nodes():
    ch = Chain(8, 12, 10)
    csp_block(ch)
    model = onnx.shape_inference.infer_shapes(ch.model(["g"]))
    from onnxopt.fusion.compute import ComputeRule
    from onnxopt.fusion.layout import assign_blocked_layouts
    from test_layout import MK, NI

    rule = ComputeRule(model, MK.tile.mi)
    regions = rule.find_regions(set(), [])
    ew = rule.ew
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    passthrough = {i: bp.rewrites(nd, ew.shape_of, consts.get, LANES, ew.opset)[0]
                   for i, nd in enumerate(rule.index.nodes)
                   if bp.admit(nd, ew.shape_of, consts.get, LANES, ew.opset) is None}
    blocked = assign_blocked_layouts(regions, rule.index, ew.shape_of, LANES, NI, ew.opset, passthrough)
    relayouts = {r.outputs[0] for r in blocked if r.relayout is not None}
    assert relayouts == {"s0", "cat", "pool0", "pool1", "spp", "up"}  # Split is named by its first output
    by_out = {r.outputs[0]: r for r in regions}
    assert blocked_outputs(by_out["a"]) == {"a"}
    assert blocked_inputs(by_out["d"]) == {"b", "s1"}  # the residual comes blocked from the Split
    assert blocked_inputs(by_out["g"]) == {"up"} and blocked_outputs(by_out["g"]) == set()  # a graph output


def test_assignment_drops_a_passthrough_with_an_nchw_reader():
    """A Concat that also feeds an op left to onnxruntime stays NCHW, and so do the tensors it reads."""
    ch = Chain(8, 6, 6)
    a = ch.conv("x", "a", L)
    b = ch.conv("x", "b", L)
    ch.nodes.append(n("Concat", [a, b], ["cat"], name="cat", axis=1))
    ch.nodes.append(n("Sigmoid", ["cat"], ["sig"], name="sig"))
    ch.c["cat"] = 2 * L
    ch.conv("cat", "c", L)
    model = onnx.shape_inference.infer_shapes(ch.model(["c", "sig"]))
    regions, count = regions_of(model)
    assert count == 0
    assert not any(blocked_outputs(r) for r in regions.values())


@needs_vectors
@pytest.mark.parametrize("batch,copies", [(1, True), (2, True), (1, False)])
def test_blocked_chain_through_split_concat_pools_and_resize(tmp_path, batch, copies):
    ch = Chain(8, 12, 10, batch=batch, seed=batch)
    csp_block(ch)
    model = ch.model(["g"])
    res = optimize_blocked(model, tmp_path, skip_fusion=[] if copies else ["copy"])
    ops = [nd.op_type for nd in expand_sequences(res.model).graph.node if nd.domain != "onnxopt"]
    # No reorder anywhere: only the fused kernels (the MaxPools too: our blocked pool kernel; the Concats, the
    # Resize and the Split: our copy kernel, fusion/blocked_copy.py, unless skipped) and onnxruntime's ops rewritten
    # for blocked tensors.
    assert "Transpose" not in ops
    producer = {o: nd for nd in expand_sequences(res.model).graph.node for o in nd.output}
    assert producer["pool0"].domain == producer["pool1"].domain == "onnxopt"
    if copies:
        assert not res.report.get("blocked_passthrough")
        assert all(producer[t].op_type.startswith("Copy_") for t in ("s0", "s1", "cat", "spp", "up"))
        assert ops.count("MaxPool") == ops.count("Concat") == ops.count("Expand") == ops.count("Split") == 0
    else:
        assert sorted(res.report["blocked_passthrough"]) == sorted(["split", "cat", "spp", "up"])
        assert ops.count("MaxPool") == 0 and ops.count("Split") == 1 and ops.count("Concat") == 2
    assert res.report["fused_regions"] == len([nd for nd in expand_sequences(res.model).graph.node if nd.domain == "onnxopt"])
    check_answers(res, model, ch.feeds)


@needs_vectors
def test_pre_activation_relu_and_add_keep_the_chain_blocked(tmp_path):
    """NASNet's pattern: a cell's branches start with a Relu of a tensor other ops read too (here a Concat's, also
    read by a 1x1), then a depthwise 5x5 and a 1x1, and an Add joins two branches. With Relu and Add run on
    blocked tensors, the depthwise convolution reads channel vectors (its NCHW kernel has one output channel per
    group) and nothing is reordered. The Relu is our elementwise kernel on the blocked tensor
    (fusion/blocked_elementwise.py), so no onnxruntime node is left in the chain."""
    ch = Chain(8, 15, 13, batch=2)
    a = ch.conv("x", "a", L, k=1, p=0)
    b = ch.conv("x", "b", L + 4, k=3)
    ch.nodes.append(n("Concat", [a, b], ["cat"], name="cat", axis=1))
    ch.nodes.append(n("Relu", ["cat"], ["pre"], name="pre"))
    ch.c["cat"] = ch.c["pre"] = 2 * L + 4
    d = ch.conv("pre", "d", 2 * L + 4, k=5, p=2, group=2 * L + 4, act=None)
    e = ch.conv(d, "e", 12, k=1, p=0, act=None)
    g = ch.conv("cat", "g", 12, k=1, p=0, act=None)
    ch.nodes.append(n("Add", [e, g], ["comb"], name="comb"))
    ch.c["comb"] = 12
    out = ch.conv("comb", "out", 8, k=3)
    model = ch.model([out])
    res = optimize_blocked(model, tmp_path)
    assert "blocked_passthrough" not in res.report
    assert next(r for r in res.report["regions"] if r["nodes"] == ["pre"])["layout"] == "blocked->blocked"
    producer = {o: nd for nd in expand_sequences(res.model).graph.node for o in nd.output}
    assert producer["d"].domain == "onnxopt" and producer["cat"].op_type.startswith("Copy_")
    assert producer["pre"].domain == "onnxopt"
    ops = [nd.op_type for nd in expand_sequences(res.model).graph.node if nd.domain != "onnxopt"]
    assert ops == [], ops
    check_answers(res, model, ch.feeds)


@needs_vectors
def test_global_pool_ends_a_chain_for_a_classifier(tmp_path):
    """A classifier's tail: the last convolution writes blocked, the global pool reads it blocked and gives NCHW to
    Flatten, which onnxruntime runs. The pool is our blocked kernel (its exit form, onnxruntime's reduction and the
    reorder, the function fallback), so no onnxruntime node is left between the convolutions and the Flatten."""
    ch = Chain(8, 9, 7, batch=2)
    a = ch.conv("x", "a", L + 4)
    b = ch.conv(a, "b", 2 * L + 3)
    ch.nodes.append(n("GlobalAveragePool", [b], ["gap"], name="gap"))
    ch.nodes.append(n("Flatten", ["gap"], ["flat"], name="flat", axis=1))
    model = ch.model(["flat"])
    res = optimize_blocked(model, tmp_path)
    assert "blocked_passthrough" not in res.report
    producer = {o: nd for nd in expand_sequences(res.model).graph.node for o in nd.output}
    assert producer["b"].domain == "onnxopt" and producer["gap"].domain == "onnxopt"
    assert next(r for r in res.report["regions"] if r["nodes"] == ["gap"])["layout"] == "blocked->nchw"
    assert [nd.op_type for nd in res.model.graph.node if nd.domain != "onnxopt"] == ["Flatten"]
    check_answers(res, model, ch.feeds)
