"""ComputeRule: which nodes a Conv / MatMul / Gemm region absorbs, how its epilogue inputs are classified, the packed
weights and folded BatchNorm, the fused model's function fallback, and `skip_fusion=["compute"]`."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.fusion.compute import ACC, CHANNEL, COLUMN, MAX_OUTPUTS, POSITION, SCALAR, ComputeRule

from onnx_builders import const, make_model  # noqa: E402

F32 = TensorProto.FLOAT
vi = helper.make_tensor_value_info
n = helper.make_node


def infer(m):
    return onnx.shape_inference.infer_shapes(m, data_prop=True)


def find(m, mi=6, claimed=None):
    rejected: list[dict] = []
    rule = ComputeRule(infer(m), mi=mi)
    regions = rule.find_regions(set() if claimed is None else claimed, rejected)
    return regions, rejected


def names(region):
    return [nd.name or nd.output[0] for nd in region.nodes]


def weight(shape, seed=0, name="w"):
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def conv(x, w, out, name, b=None, **attrs):
    attrs.setdefault("pads", [1, 1, 1, 1])
    return n("Conv", [x, w] + ([b] if b else []), [out], name=name, **attrs)


def two_conv_model():
    """conv1 -> Add(bias-like constant) -> Relu -> conv2 -> Sigmoid -> Mul(residual) -> y."""
    nodes = [
        conv("x", "w1", "c1", "conv1", b="b1"),
        n("Relu", ["c1"], ["r1"], name="relu1"),
        n("Neg", ["r1"], ["g1"], name="neg1"),
        conv("g1", "w2", "c2", "conv2"),
        n("Sigmoid", ["c2"], ["s2"], name="sig2"),
        n("Mul", ["s2", "res"], ["y"], name="mul2"),
    ]
    return make_model(nodes, [vi("x", F32, [2, 4, 9, 9]), vi("res", F32, [2, 6, 9, 9])], [vi("y", F32, [2, 6, 9, 9])],
                      [weight([8, 4, 3, 3], 0, "w1"), const("b1", np.arange(8)), weight([6, 8, 3, 3], 1, "w2")])


# ---- what a region absorbs --------------------------------------------------------------------------------------


def test_conv_absorbs_its_chain_up_to_the_next_conv():
    regions, rejected = find(two_conv_model())
    assert not rejected
    assert [names(r) for r in regions] == [["conv1", "relu1", "neg1"], ["conv2", "sig2", "mul2"]]
    r1, r2 = regions
    assert r1.label == "Conv" and r1.compute.op == "conv"
    assert r1.inputs == ["x", "c1__packed_w", "c1__bias"] and r1.outputs == ["g1"]
    assert r2.inputs == ["g1", "c2__packed_w", "res"] and r2.outputs == ["y"]
    assert r1.compute.extra_kinds == [CHANNEL] and r1.compute.extra_nstride == [0]
    assert r2.compute.extra_kinds == [POSITION] and r2.compute.extra_nstride == [1]
    # The epilogue program starts from the accumulator: bias add first, then the chain.
    assert r1.program.inputs[0].name == ACC
    assert [op.op for op in r1.program.ops] == ["Add", "Relu", "Neg"]
    assert [op.op for op in r2.program.ops] == ["Identity", "Sigmoid", "Mul"]
    assert r1.shape == [2, 8, 9, 9]


def test_claimed_nodes_are_left_alone():
    claimed = {0}  # conv1 belongs to someone else already
    regions, _ = find(two_conv_model(), claimed=claimed)
    assert [names(r) for r in regions] == [["conv2", "sig2", "mul2"]]
    assert claimed == {0, 3, 4, 5}


def test_conv_feeding_a_conv_is_alone():
    nodes = [conv("x", "w1", "c1", "conv1"), conv("c1", "w2", "y", "conv2")]
    m = make_model(nodes, [vi("x", F32, [1, 3, 8, 8])], [vi("y", F32, [1, 5, 8, 8])],
                   [weight([4, 3, 3, 3], 0, "w1"), weight([5, 4, 3, 3], 1, "w2")])
    regions, _ = find(m)
    assert [names(r) for r in regions] == [["conv1"], ["conv2"]]
    assert regions[0].outputs == ["c1"]


def test_non_elementwise_branch_stops_the_chain_and_its_input_becomes_an_output():
    """relu feeds a MaxPool (not elementwise) and a Neg: Neg joins, MaxPool does not, relu's value is written."""
    nodes = [
        conv("x", "w", "c", "conv"),
        n("Relu", ["c"], ["r"], name="relu"),
        n("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        n("Neg", ["r"], ["y"], name="neg"),
    ]
    m = make_model(nodes, [vi("x", F32, [1, 3, 8, 8])], [vi("y", F32, [1, 4, 8, 8]), vi("p", F32, [1, 4, 4, 4])],
                   [weight([4, 3, 3, 3])])
    (r,), _ = find(m)
    assert names(r) == ["conv", "relu", "neg"]
    assert r.outputs == ["r", "y"]


def test_no_cycle_through_an_outside_node():
    """Add(relu, pool(relu)): absorbing the Add would make the region both feed and read the MaxPool."""
    nodes = [
        conv("x", "w", "c", "conv"),
        n("Relu", ["c"], ["r"], name="relu"),
        n("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("Add", ["r", "p"], ["y"], name="add"),
    ]
    m = make_model(nodes, [vi("x", F32, [1, 3, 8, 8])], [vi("y", F32, [1, 4, 8, 8])], [weight([4, 3, 3, 3])])
    (r,), _ = find(m)
    assert names(r) == ["conv", "relu"]
    assert r.outputs == ["r"]


def test_intermediate_graph_output_becomes_an_extra_output():
    nodes = [
        conv("x", "w", "c", "conv"),
        n("Add", ["c", "three"], ["a"], name="add"),
        n("Clip", ["a", "zero", "six"], ["cl"], name="clip"),
        n("Mul", ["c", "cl"], ["y"], name="mul"),
    ]
    m = make_model(nodes, [vi("x", F32, [1, 3, 8, 8])], [vi("y", F32, [1, 4, 8, 8]), vi("a", F32, [1, 4, 8, 8])],
                   [weight([4, 3, 3, 3]), const("three", 3.0), const("zero", 0.0), const("six", 6.0)])
    (r,), _ = find(m)
    assert names(r) == ["conv", "add", "clip", "mul"]
    assert r.outputs == ["a", "y"]
    # The scalar constants are folded into the code, not epilogue inputs.
    assert r.inputs == ["x", "c__packed_w"]
    assert sorted(r.program.consts) == ["six", "three", "zero"]


def test_conv_output_used_by_another_conv_is_written():
    nodes = [conv("x", "w1", "c", "conv1"), n("Relu", ["c"], ["y"], name="relu"), conv("c", "w2", "z", "conv2")]
    m = make_model(nodes, [vi("x", F32, [1, 3, 8, 8])], [vi("y", F32, [1, 4, 8, 8]), vi("z", F32, [1, 2, 8, 8])],
                   [weight([4, 3, 3, 3], 0, "w1"), weight([2, 4, 3, 3], 1, "w2")])
    regions, _ = find(m)
    assert [names(r) for r in regions] == [["conv1", "relu"], ["conv2"]]
    assert regions[0].outputs == ["c", "y"]


def test_consumer_with_a_different_shape_stops_the_chain():
    """An Add whose other operand makes the result larger than the conv's output is not absorbed."""
    nodes = [conv("x", "w", "c", "conv"), n("Add", ["c", "big"], ["y"], name="add")]
    m = make_model(nodes, [vi("x", F32, [1, 3, 8, 8]), vi("big", F32, [2, 4, 8, 8])], [vi("y", F32, [2, 4, 8, 8])],
                   [weight([4, 3, 3, 3])])
    (r,), _ = find(m)
    assert names(r) == ["conv"]


def test_unclassifiable_epilogue_input_stops_the_chain():
    """A [1, 1, 8, 8] map (broadcast over channels) is neither per-position nor per-channel."""
    nodes = [conv("x", "w", "c", "conv"), n("Relu", ["c"], ["r"], name="relu"), n("Mul", ["r", "m"], ["y"], name="mul")]
    m = make_model(nodes, [vi("x", F32, [1, 3, 8, 8]), vi("m", F32, [1, 1, 8, 8])], [vi("y", F32, [1, 4, 8, 8])],
                   [weight([4, 3, 3, 3])])
    (r,), _ = find(m)
    assert names(r) == ["conv", "relu"]


def test_more_outputs_than_the_kernel_writes_are_rejected():
    outs = [f"y{i}" for i in range(MAX_OUTPUTS + 1)]
    nodes = [conv("x", "w", "c", "conv")]
    prev = "c"
    for i, o in enumerate(outs):
        nodes.append(n(["Relu", "Neg", "Abs", "Sigmoid", "Tanh"][i], [prev], [o], name=f"op{i}"))
        prev = o
    m = make_model(nodes, [vi("x", F32, [1, 3, 8, 8])], [vi(o, F32, [1, 4, 8, 8]) for o in outs],
                   [weight([4, 3, 3, 3])])
    regions, rejected = find(m)
    assert regions == []
    assert rejected == [{"nodes": ["conv"], "reason": f"more than {MAX_OUTPUTS} outputs"}]


def test_epilogue_inputs_are_limited():
    """Each Add brings a new residual; the bias takes one of the 8 slots, so 7 residuals join and the 8th stops."""
    shape = [1, 4, 8, 8]
    nodes = [conv("x", "w", "c0", "conv", b="b")]
    for i in range(9):
        nodes.append(n("Add", [f"c{i}", f"r{i}"], [f"c{i + 1}"], name=f"add{i}"))
    m = make_model(nodes, [vi("x", F32, [1, 3, 8, 8])] + [vi(f"r{i}", F32, shape) for i in range(9)],
                   [vi("c9", F32, shape)], [weight([4, 3, 3, 3]), const("b", np.zeros(4))])
    (r,), _ = find(m)
    assert names(r) == ["conv"] + [f"add{i}" for i in range(7)]
    assert len(r.compute.extra_kinds) == 8
    assert r.outputs == ["c7"]


# ---- epilogue input kinds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,kind,nstride", [
    ([2, 4, 8, 8], POSITION, 1),  # a residual
    ([1, 4, 8, 8], POSITION, 0),  # a residual shared by the batch
    ([4, 8, 8], POSITION, 0),
    ([2, 4, 1, 1], CHANNEL, 1),  # an SE gate
    ([1, 4, 1, 1], CHANNEL, 0),
    ([4, 1, 1], CHANNEL, 0),  # a per-channel scale
    ([], SCALAR, 0),  # a runtime scalar
    ([1, 1, 1, 1], SCALAR, 0),
])
def test_conv_epilogue_input_kinds(shape, kind, nstride):
    nodes = [conv("x", "w", "c", "conv"), n("Mul", ["c", "e"], ["y"], name="mul")]
    m = make_model(nodes, [vi("x", F32, [2, 3, 8, 8]), vi("e", F32, shape)], [vi("y", F32, [2, 4, 8, 8])],
                   [weight([4, 3, 3, 3])])
    (r,), _ = find(m)
    assert names(r) == ["conv", "mul"]
    assert r.compute.extra_kinds == [kind] and r.compute.extra_nstride == [nstride]
    assert r.inputs == ["x", "c__packed_w", "e"]


@pytest.mark.parametrize("a_shape,e_shape,kind,nstride", [
    ([3, 5, 7], [3, 5, 9], POSITION, 1),
    ([3, 5, 7], [5, 9], POSITION, 0),
    ([3, 5, 7], [9], COLUMN, 0),  # a Linear's bias
    ([3, 5, 7], [1, 1, 9], COLUMN, 0),
    ([3, 5, 7], [5, 1], CHANNEL, 0),  # one value per row
    ([3, 5, 7], [], SCALAR, 0),
    ([2, 3, 5, 7], [2, 3, 5, 9], POSITION, 1),
    ([5, 7], [5, 9], POSITION, 0),
    ([5, 7], [5, 1], CHANNEL, 0),
    ([5, 7], [9], COLUMN, 0),  # a rank-2 output has no batch dim: a [N] row is a column bias
    ([5, 7], [1, 9], COLUMN, 0),
])
def test_matmul_epilogue_input_kinds(a_shape, e_shape, kind, nstride):
    nodes = [n("MatMul", ["a", "w"], ["mm"], name="mm"), n("Add", ["mm", "e"], ["y"], name="add")]
    out = a_shape[:-1] + [9]
    m = make_model(nodes, [vi("a", F32, a_shape), vi("e", F32, e_shape)], [vi("y", F32, out)], [weight([7, 9])])
    (r,), _ = find(m)
    assert names(r) == ["mm", "add"]
    assert r.label == "MatMul" and r.compute.op == "matmul"
    assert r.compute.extra_kinds == [kind] and r.compute.extra_nstride == [nstride]
    assert r.compute.initializers == []  # MatMul's B is read as it is
    assert r.inputs == ["a", "w", "e"]


def test_partial_batch_broadcast_stops_the_chain_but_keeps_the_matmul():
    nodes = [n("MatMul", ["a", "w"], ["mm"], name="mm"), n("Add", ["mm", "e"], ["y"], name="add")]
    m = make_model(nodes, [vi("a", F32, [2, 3, 5, 7]), vi("e", F32, [1, 3, 5, 9])], [vi("y", F32, [2, 3, 5, 9])],
                   [weight([7, 9])])
    regions, rejected = find(m)
    assert [names(r) for r in regions] == [["mm"]], rejected


# ---- the compute node -------------------------------------------------------------------------------------------


def _single(op_node, inputs, outputs, inits=()):
    return make_model([op_node], inputs, outputs, list(inits))


def _custom(m):
    m.opset_import.append(helper.make_opsetid("custom", 1))
    return m


@pytest.mark.parametrize("model,reason", [
    (lambda: _single(n("Conv", ["x", "w"], ["y"]), [vi("x", F32, [1, 3, 8, 8]), vi("w", F32, [4, 3, 3, 3])],
                     [vi("y", F32, [1, 4, 6, 6])]), "not a 2-D convolution with constant weights"),
    (lambda: _single(n("Conv", ["x", "w"], ["y"]), [vi("x", F32, [1, 3, 8])], [vi("y", F32, [1, 4, 6])],
                     [weight([4, 3, 3])]), "not a 2-D convolution with constant weights"),
    (lambda: _single(n("Conv", ["x", "w", "b"], ["y"]), [vi("x", F32, [1, 3, 8, 8]), vi("b", F32, [4])],
                     [vi("y", F32, [1, 4, 6, 6])], [weight([4, 3, 3, 3])]), "bias is not constant"),
    (lambda: _single(n("MatMul", ["a", "b"], ["y"]), [vi("a", TensorProto.INT32, [3, 4]),
                                                      vi("b", TensorProto.INT32, [4, 5])],
                     [vi("y", TensorProto.INT32, [3, 5])]), "not float32"),
    (lambda: _single(n("MatMul", ["a", "b"], ["y"]), [vi("a", F32, [4]), vi("b", F32, [4, 5])],
                     [vi("y", F32, [5])]), "operands are not matrices (rank >= 2)"),
    (lambda: _single(n("Gemm", ["a", "b"], ["y"], transB=1), [vi("a", F32, [3, 4]), vi("b", F32, [5, 4])],
                     [vi("y", F32, [3, 5])]), "Gemm transB with a runtime B"),
    (lambda: _single(n("Gemm", ["a", "b"], ["y"], alpha=2.0), [vi("a", F32, [3, 4]), vi("b", F32, [4, 5])],
                     [vi("y", F32, [3, 5])]), "Gemm alpha with a runtime B"),
    (lambda: _single(n("Gemm", ["a", "b", "c"], ["y"], beta=2.0), [vi("a", F32, [3, 4]), vi("c", F32, [3, 5])],
                     [vi("y", F32, [3, 5])], [weight([4, 5], 0, "b")]), "Gemm beta with a runtime C"),
    (lambda: _custom(_single(n("Conv", ["x", "w"], ["y"], domain="custom"), [vi("x", F32, [1, 3, 8, 8])],
                             [vi("y", F32, [1, 4, 6, 6])], [weight([4, 3, 3, 3])])), "custom domain"),
])
def test_admits(model, reason):
    m = infer(model())
    rule = ComputeRule(m, mi=6)
    assert rule.admits(m.graph.node[0]) == reason
    assert rule.find_regions(set(), []) == []


def test_weights_that_a_feed_can_override_are_not_constants():
    m = make_model([conv("x", "w", "y", "conv")], [vi("x", F32, [1, 3, 8, 8]), vi("w", F32, [4, 3, 3, 3])],
                   [vi("y", F32, [1, 4, 8, 8])], [weight([4, 3, 3, 3])])
    assert find(m)[0] == []


# ---- packed weights ---------------------------------------------------------------------------------------------


def _unpack(packed, oc, ic_g, kh, kw):
    g, mb, k, mi = packed.shape
    w = packed.transpose(0, 1, 3, 2).reshape(g, mb * mi, k)
    return w[:, :oc // g, :].reshape(oc, ic_g, kh, kw), w[:, oc // g:, :]


@pytest.mark.parametrize("oc,ic,groups,kh,kw,mi", [
    (14, 6, 2, 3, 2, 6), (6, 3, 1, 1, 1, 6), (5, 8, 1, 3, 3, 6), (13, 13, 13, 3, 3, 6), (40, 10, 5, 1, 5, 6),
    (14, 6, 2, 3, 2, 8), (7, 2, 1, 2, 2, 1),
])
def test_packed_weight_layout(oc, ic, groups, kh, kw, mi):
    ic_g = ic // groups
    w = weight([oc, ic_g, kh, kw], 3)
    m = make_model([n("Conv", ["x", "w"], ["y"], name="conv", group=groups, kernel_shape=[kh, kw])],
                   [vi("x", F32, [1, ic, 9, 9])], [vi("y", F32, [1, oc, 10 - kh, 10 - kw])], [w])
    (r,), _ = find(m, mi=mi)
    (packed_t,) = r.compute.initializers
    assert packed_t.name == "y__packed_w"
    packed = numpy_helper.to_array(packed_t)
    oc_g = oc // groups
    assert packed.shape == (groups, -(-oc_g // mi), ic_g * kh * kw, mi)
    unpacked, padding = _unpack(packed, oc, ic_g, kh, kw)
    np.testing.assert_array_equal(unpacked, numpy_helper.to_array(w))
    assert (padding == 0).all()
    a = r.compute.attrs
    assert (a.oc, a.groups, a.ic_g, a.kernel) == (oc, groups, ic_g, (kh, kw))
    assert a.packed_shape == packed.shape


def _bn_model(conv_bias=True, extra_consumer=False):
    rng = np.random.default_rng(5)
    inits = [weight([6, 3, 3, 3]), const("s", rng.uniform(0.5, 1.5, 6)), const("bb", rng.standard_normal(6)),
             const("mu", rng.standard_normal(6)), const("var", rng.uniform(0.5, 2, 6))]
    if conv_bias:
        inits.append(const("b", rng.standard_normal(6)))
    nodes = [conv("x", "w", "c", "conv", b="b" if conv_bias else None),
             n("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["bn"], name="bn", epsilon=1e-3),
             n("Relu", ["bn"], ["y"], name="relu")]
    outputs = [vi("y", F32, [2, 6, 8, 8])]
    if extra_consumer:
        nodes.append(n("Neg", ["c"], ["z"], name="neg"))
        outputs.append(vi("z", F32, [2, 6, 8, 8]))
    return make_model(nodes, [vi("x", F32, [2, 3, 8, 8])], outputs, inits)


@pytest.mark.parametrize("conv_bias", [True, False])
def test_batchnorm_is_folded_into_weights_and_bias(conv_bias):
    m = _bn_model(conv_bias)
    (r,), _ = find(m)
    assert names(r) == ["conv", "bn", "relu"]
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    s = inits["s"] / np.sqrt(inits["var"] + 1e-3)
    packed = {t.name: numpy_helper.to_array(t) for t in r.compute.initializers}
    w, _ = _unpack(packed["c__packed_w"], 6, 3, 3, 3)
    np.testing.assert_allclose(w, inits["w"] * s[:, None, None, None], rtol=1e-6)
    b0 = inits["b"] if conv_bias else 0.0
    np.testing.assert_allclose(packed["c__bias"], (b0 - inits["mu"]) * s + inits["bb"], rtol=1e-5, atol=1e-6)
    assert r.compute.extra_kinds == [CHANNEL]
    assert "BatchNormalization" not in [nd.op_type for nd in r.compute.body]
    # The epilogue: bias add into the BatchNorm's output, then Relu.
    assert [(op.op, op.out) for op in r.program.ops] == [("Add", "bn"), ("Relu", "y")]


def test_batchnorm_not_folded_when_the_conv_output_is_used_elsewhere():
    (r,), _ = find(_bn_model(extra_consumer=True))
    assert "bn" not in names(r)
    assert names(r) == ["conv", "neg"]


# ---- Gemm -------------------------------------------------------------------------------------------------------


def test_gemm_folds_alpha_beta_and_transposes_b():
    rng = np.random.default_rng(7)
    b = rng.standard_normal((5, 4)).astype(np.float32)  # [N, K], transB
    c = rng.standard_normal((3, 5)).astype(np.float32)
    m = make_model([n("Gemm", ["a", "B", "C"], ["y"], name="gemm", transA=1, transB=1, alpha=0.5, beta=-2.0)],
                   [vi("a", F32, [4, 3])], [vi("y", F32, [3, 5])],
                   [numpy_helper.from_array(b, "B"), numpy_helper.from_array(c, "C")])
    (r,), _ = find(m)
    assert r.label == "MatMul" and names(r) == ["gemm"]
    inits = {t.name: numpy_helper.to_array(t) for t in r.compute.initializers}
    np.testing.assert_allclose(inits["y__b"], b.T * 0.5, rtol=1e-6)
    np.testing.assert_allclose(inits["y__c"], c * -2.0, rtol=1e-6)
    assert r.inputs == ["a", "y__b", "y__c"]
    assert r.compute.attrs.trans_a == 1
    assert r.compute.extra_kinds == [POSITION] and r.compute.extra_nstride == [0]
    # The fallback: one Gemm on the folded operands, transA kept.
    (g,) = r.compute.body
    assert g.op_type == "Gemm" and list(g.input) == ["a", "y__b", "y__c"]
    attrs = {a.name: helper.get_attribute_value(a) for a in g.attribute}
    assert attrs == {"transA": 1}


def test_gemm_c_kinds():
    cases = {(3, 1): CHANNEL, (): SCALAR, (3, 5): POSITION}
    for shape, kind in cases.items():
        m = make_model([n("Gemm", ["a", "B", "C"], ["y"], name="gemm")], [vi("a", F32, [3, 4])],
                       [vi("y", F32, [3, 5])], [weight([4, 5], 0, "B"), const("C", np.ones(shape))])
        (r,), _ = find(m)
        assert r.compute.extra_kinds == [kind], shape


# ---- the fused model --------------------------------------------------------------------------------------------


def _optimized(tmp_path, model, **kw):
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "fused.onnx")
    onnx.save(model, src)
    res = onnxopt.optimize(src, out, measure=False, **kw)
    return src, out, res


def test_fused_model_function_unpacks_the_weights(tmp_path):
    m = make_model([conv("x", "w", "c", "conv", b="b", group=2), n("Relu", ["c"], ["y"], name="relu")],
                   [vi("x", F32, [1, 4, 8, 8])], [vi("y", F32, [1, 10, 8, 8])],
                   [weight([10, 2, 3, 3]), const("b", np.arange(10) * 0.1)])
    src, out, res = _optimized(tmp_path, m)
    assert [r["ops"] for r in res.report["regions"]] == ["Conv -> Relu"]
    fused = onnx.load(out)
    onnx.checker.check_model(fused, full_check=True)
    (node,) = fused.graph.node
    assert node.domain == "onnxopt" and node.op_type.startswith("Conv_")
    assert list(node.input) == ["x", "c__packed_w", "c__bias"]
    (f,) = fused.functions
    assert (f.domain, f.name) == ("onnxopt", node.op_type)
    ops = [nd.op_type for nd in f.node]
    for op in ("Transpose", "Reshape", "Slice", "Conv", "Relu"):
        assert op in ops, ops
    conv_node = next(nd for nd in f.node if nd.op_type == "Conv")
    assert {a.name: helper.get_attribute_value(a) for a in conv_node.attribute}["group"] == 2
    # Only the packed weights are stored; the original ones are gone.
    names_ = {t.name for t in fused.graph.initializer}
    assert names_ == {"c__packed_w", "c__bias"}
    mi = _mi()
    packed = numpy_helper.to_array(next(t for t in fused.graph.initializer if t.name == "c__packed_w"))
    assert list(packed.shape) == [2, -(-5 // mi), 2 * 3 * 3, mi]
    # The function body computes the original model without the library.
    x = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _mi():
    from onnxopt.codegen.microkernel.registry import select
    from onnxopt.codegen.target import host_target

    return select(host_target()).tile.mi


def test_fused_gemm_model_passes_the_checker(tmp_path):
    m = make_model([n("Gemm", ["a", "B", "C"], ["g"], name="gemm", transB=1, alpha=2.0),
                    n("Relu", ["g"], ["y"], name="relu")],
                   [vi("a", F32, [3, 4])], [vi("y", F32, [3, 5])], [weight([5, 4], 0, "B"), const("C", np.ones((3, 1)))])
    _, out, res = _optimized(tmp_path, m)
    assert [r["ops"] for r in res.report["regions"]] == ["Gemm -> Relu"]
    fused = onnx.load(out)
    onnx.checker.check_model(fused, full_check=True)
    # The fallback unpacks B from the kernel's panels (zero-padded to whole vectors), then runs the Gemm.
    ops = [nd.op_type for nd in fused.functions[0].node]
    assert ops[-2:] == ["Gemm", "Relu"] and "Transpose" in ops and "Slice" in ops


def test_skip_compute_fusion(tmp_path):
    _, out, res = _optimized(tmp_path, two_conv_model(), skip_fusion=["compute"])
    assert not [r for r in res.report["regions"] if r["ops"].split(" -> ")[0] in ("Conv", "MatMul", "Gemm")]
    fused = onnx.load(out)
    assert [nd.op_type for nd in fused.graph.node].count("Conv") == 2
    # The elementwise chains are still fused on their own.
    assert {r["ops"] for r in res.report["regions"]} <= {"Relu -> Neg", "Sigmoid -> Mul"}
    assert not any(t.name.endswith("__packed_w") for t in fused.graph.initializer)


def test_compute_fusion_by_default(tmp_path):
    _, out, res = _optimized(tmp_path, two_conv_model())
    assert sorted(r["ops"] for r in res.report["regions"]) == ["Conv -> Relu -> Neg", "Conv -> Sigmoid -> Mul"]
    fused = onnx.load(out)
    onnx.checker.check_model(fused, full_check=True)
    assert all(nd.domain == "onnxopt" for nd in fused.graph.node)
