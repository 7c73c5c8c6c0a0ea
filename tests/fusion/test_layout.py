"""Blocked layouts across fused convolutions (fusion/layout.py, codegen/compute/blocked_tile.py, ct_conv_blocked):
which tensors become blocked, the fused model's structure (no reorder between two fused convolutions), its
answers against onnxruntime with the library and through the function fallbacks, and the numpy/ONNX reorders."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.codegen.microkernel.registry import select
from onnxopt.codegen.target import parse_target
from onnxopt.emit.sequence import expand_sequences
from onnxopt.fusion.compute import ComputeRule
from onnxopt.fusion.layout import (assign_blocked_layouts, block_nodes, blocked_inputs, blocked_outputs,
                                   from_blocked, pack_blocked_weights, to_blocked, unblock_nodes)

from onnx_builders import make_model  # noqa: E402

F32 = TensorProto.FLOAT
vi = helper.make_tensor_value_info
n = helper.make_node
TARGET = parse_target(None)
MK = select(TARGET)
LANES, NI = MK.lanes, MK.tile.ni
needs_vectors = pytest.mark.skipif(LANES < 8, reason="blocked layouts need AVX2 or AVX-512")


def conv_node(x, out, w, b, k=3, s=1, p=1, d=1, group=1, pads=None, kw=None):
    kw = k if kw is None else kw
    return n("Conv", [x, w, b], [out], name=out, kernel_shape=[k, kw], strides=[s, s], dilations=[d, d],
             pads=pads or [p, p, p, p], group=group)


class Chain:
    """Builds a model of convolutions with initializers; shapes come from onnx's inference."""

    def __init__(self, c_in, h, w, batch=1, seed=0):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []
        self.c = {"x": c_in}
        self.inputs = [vi("x", F32, [batch, c_in, h, w])]
        self.feeds = {"x": self.rng.standard_normal((batch, c_in, h, w)).astype(np.float32)}

    def conv(self, x, out, oc, k=3, s=1, p=1, d=1, group=1, pads=None, act="Relu", kw=None):
        """A k x kw kernel (kw defaults to k)."""
        icg = self.c[x] // group
        kw = k if kw is None else kw
        w = (self.rng.standard_normal((oc, icg, k, kw)) / np.sqrt(icg * k * kw)).astype(np.float32)
        b = self.rng.standard_normal(oc).astype(np.float32) * 0.1
        self.inits += [numpy_helper.from_array(w, f"{out}_w"), numpy_helper.from_array(b, f"{out}_b")]
        head = out if act is None else f"{out}_pre"
        self.nodes.append(conv_node(x, head, f"{out}_w", f"{out}_b", k, s, p, d, group, pads, kw))
        if act:
            self.nodes.append(n(act, [head], [out], name=f"{out}_act"))
        self.c[out] = oc
        return out

    def add(self, a, b, out, relu=True):
        self.nodes.append(n("Add", [a, b], [f"{out}_sum" if relu else out], name=f"{out}_add"))
        if relu:
            self.nodes.append(n("Relu", [f"{out}_sum"], [out], name=f"{out}_relu"))
        self.c[out] = self.c[a]
        return out

    def model(self, outputs):
        m = make_model(self.nodes, self.inputs, [vi(o, F32, None) for o in outputs], self.inits)
        m = onnx.shape_inference.infer_shapes(m)
        outs = {v.name: v for v in list(m.graph.value_info) + list(m.graph.output)}
        outs = [outs[o] for o in outputs]
        assert all(v.type.tensor_type.HasField("shape") for v in outs)  # the checker wants output shapes
        del m.graph.output[:]
        m.graph.output.extend(outs)
        del m.graph.value_info[:]
        return m


def reference(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def run_fused(result, feeds, library=True):
    so = ort.SessionOptions()
    if library and result.library is None:
        # A measured build may keep the original model when no kernel beat onnxruntime on this host.
        assert not fused_nodes(result.model), "fused nodes were written without a library"
    elif library:
        so.register_custom_ops_library(result.library)
    return ort.InferenceSession(result.model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None,
                                                                                                            feeds)


def optimize_blocked(model, tmp_path, name="fused.onnx", **kw):
    return onnxopt.optimize(model, str(tmp_path / name), plan="compute-blocked", measure=False, **kw)


def fused_nodes(model):
    """The fused regions' nodes, each on its own (sequence ops, emit/sequence.py, expanded into theirs)."""
    return [nd for nd in expand_sequences(model).graph.node if nd.domain == "onnxopt"]


def function_of(model, op_type):
    return next(f for f in model.functions if f.name == op_type)


def check_answers(result, model, feeds, rtol=1e-4, atol=1e-4):
    want = reference(model, feeds)
    for lib in (True, False):
        got = run_fused(result, feeds, library=lib)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * max(1.0, float(np.abs(w).max())))


# ---- numpy and ONNX reorders ----
@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 40), st.integers(1, 6), st.integers(1, 6), st.sampled_from([8, 16]))
def test_to_blocked_round_trip_and_zero_padding(batch, c, h, w, lanes):
    a = np.random.default_rng(c).standard_normal((batch, c, h, w)).astype(np.float32)
    b = to_blocked(a, lanes)
    assert b.shape == (batch, -(-c // lanes), h, w, lanes)
    assert np.array_equal(from_blocked(b, c), a)
    flat = b.transpose(0, 1, 4, 2, 3).reshape(batch, -1, h, w)
    assert not flat[:, c:].any()
    assert b[0, 0, 0, 0, 0] == a[0, 0, 0, 0] and b[0, (c - 1) // lanes, h - 1, w - 1, (c - 1) % lanes] == a[0, c - 1,
                                                                                                           h - 1, w - 1]


@pytest.mark.parametrize("opset", [9, 13, 17])
@pytest.mark.parametrize("c", [16, 24, 5])
def test_onnx_reorders_match_numpy_at_any_batch_and_image_size(opset, c):
    """The fallback's Pad/Reshape/Transpose/Slice nodes compute the same as to_blocked/from_blocked, for other batch
    and image sizes than the ones they were made with: one function serves every node of an op type, and a kernel
    every image size (DenseNet-BC's blocks)."""
    nodes = block_nodes("x", "xb", c, 16, opset) + unblock_nodes("xb", "y", c, 16, opset)
    m = make_model(nodes, [vi("x", F32, ["N", c, "H", "W"])], [vi("xb", F32, None), vi("y", F32, ["N", c, "H", "W"])],
                   opset=opset, ir_version=7 if opset < 13 else 8)
    for o in m.graph.output:  # the checker wants shapes on outputs
        if not o.type.tensor_type.HasField("shape"):
            o.type.tensor_type.shape.SetInParent()
    for n, h, w in ((2, 3, 5), (1, 7, 4)):
        x = np.random.default_rng(n).standard_normal((n, c, h, w)).astype(np.float32)
        xb, y = reference(m, {"x": x})
        assert np.array_equal(xb, to_blocked(x, 16))
        assert np.array_equal(y, x)


def test_packed_blocked_weights_layout():
    w = np.random.default_rng(0).standard_normal((40, 3, 3, 3)).astype(np.float32)
    p = pack_blocked_weights(w, 16, 4)
    assert p.shape == (1, 27, 64)
    assert np.array_equal(p[0, :, :40], w.reshape(40, 27).T) and not p[0, :, 40:].any()
    p = pack_blocked_weights(w, 8, 2)
    assert p.shape == (3, 27, 16)
    assert np.array_equal(p[2, :, :8], w[32:40].reshape(8, 27).T) and not p[2, :, 8:].any()


# ---- which tensors are blocked ----
def regions_of(model):
    model = onnx.shape_inference.infer_shapes(model)
    rule = ComputeRule(model, MK.tile.mi)
    regions = rule.find_regions(set(), [])
    count = len(assign_blocked_layouts(regions, rule.index, rule.ew.shape_of, LANES, NI, rule.ew.opset))
    return {r.outputs[0]: r for r in regions}, count


def test_assignment_with_a_two_output_epilogue():
    """A conv whose epilogue gives its output and its Relu (both read outside: the Relu by a depthwise conv, the raw
    output by an Add after it): its own Relu reading the output is not an outside reader, so the chain is blocked
    end to end."""
    ch = Chain(8, 15, 13, batch=2)
    a = ch.conv("x", "a", LANES + 4, k=1, p=0, act=None)
    ch.nodes.append(n("Relu", [a], ["pre"], name="pre"))
    ch.c["pre"] = LANES + 4
    d = ch.conv("pre", "d", LANES + 4, k=5, p=2, group=LANES + 4, act=None)
    e = ch.conv(d, "e", LANES + 4, k=1, p=0, act=None)
    ch.nodes.append(n("Add", [e, a], ["comb"], name="comb"))
    ch.c["comb"] = LANES + 4
    f = ch.conv("comb", "f", 12, k=3)
    regions, count = regions_of(ch.model([f]))
    assert regions["a"].outputs == ["a", "pre"]
    assert count == 3 and regions["d"].compute.attrs.in_blocked == 1 and regions["f"].compute.attrs.in_blocked


def test_assignment_chain_ends_and_graph_outputs():
    ch = Chain(8, 10, 10)
    a = ch.conv("x", "a", 32)
    b = ch.conv(a, "b", 24, k=1, p=0)
    ch.conv(b, "c", 16)
    regions, count = regions_of(ch.model(["c"]))
    assert count == 2
    assert blocked_outputs(regions["a"]) == {"a"} and blocked_inputs(regions["a"]) == set()
    assert blocked_outputs(regions["b"]) == {"b"} and blocked_inputs(regions["b"]) == {"a"}
    # The last convolution writes a graph output: NCHW, reading its blocked input through its padded copy.
    assert blocked_outputs(regions["c"]) == set() and blocked_inputs(regions["c"]) == {"b"}


@needs_vectors
def test_chain_exit_computes_on_channel_vectors():
    """A chain's last convolution (blocked in, NCHW out) runs the channel-vector kernel into a blocked buffer, with
    fewer output channels than a vector too (an output head: the NCHW kernel would copy its blocked input into
    planes first)."""
    for oc, vectors in ((LANES + 3, 1), (LANES - 5, 1), (1, 1)):
        ch = Chain(8, 10, 10)
        a = ch.conv("x", "a", 32)
        ch.conv(a, "b", oc)
        regions, _ = regions_of(ch.model(["b"]))
        attrs = regions["b"].compute.attrs
        assert (attrs.in_blocked, attrs.out_blocked, attrs.channel_vectors) == (1, 0, vectors)


@needs_vectors
def test_one_channel_output_head_matches_onnxruntime(tmp_path):
    ch = Chain(8, 11, 9, batch=2)
    a = ch.conv("x", "a", 16)
    model = ch.model([ch.conv(a, "head", 1, k=1, p=0, act=None)])
    check_answers(optimize_blocked(model, tmp_path), model, ch.feeds)


def test_assignment_stops_at_ops_left_to_onnxruntime():
    ch = Chain(8, 10, 10)
    a = ch.conv("x", "a", 16)
    ch.nodes.append(n("MaxPool", [a], ["p"], kernel_shape=[2, 2], strides=[2, 2]))
    ch.c["p"] = 16
    ch.conv("p", "c", 16)
    b = ch.conv(a, "b", 16)
    regions, count = regions_of(ch.model(["c", "b"]))
    assert count == 0  # `a` is read by a MaxPool too: it stays NCHW
    assert not any(blocked_inputs(r) or blocked_outputs(r) for r in regions.values())
    assert b in regions


def test_assignment_residual_needs_a_blocked_consumer():
    """A residual read as a per-pixel epilogue input is blocked only when the reading convolution is blocked."""
    ch = Chain(16, 8, 8)
    a = ch.conv("x", "a", 32)
    b = ch.conv(a, "b", 32)
    c = ch.conv(b, "c", 32, act=None)
    ch.add(c, a, "d")
    ch.conv("d", "e", 16)
    regions, _ = regions_of(ch.model(["e"]))
    rc = regions["d"]  # conv c with the residual add and relu fused
    assert blocked_outputs(rc) == {"d"} and blocked_inputs(rc) == {"b", "a"}
    # Same graph, but the residual block's output is a graph output: c cannot be blocked, so neither can `a`
    # (read by c's epilogue, which is then NCHW).
    regions, _ = regions_of(ch.model(["d"]))
    assert blocked_outputs(regions["d"]) == set()
    assert blocked_outputs(regions["a"]) == set()
    assert blocked_outputs(regions["b"]) == {"b"}


# ---- end to end ----
@needs_vectors
def test_blocked_tensor_passes_between_fused_convolutions_without_reorder(tmp_path):
    ch = Chain(3, 17, 19, batch=2)
    a = ch.conv("x", "a", 24)
    b = ch.conv(a, "b", 40, k=1, p=0, act="Sigmoid")
    ch.conv(b, "c", 8, s=2)
    model = ch.model(["c"])
    res = optimize_blocked(model, tmp_path)
    nodes = fused_nodes(res.model)
    graph = expand_sequences(res.model).graph
    assert len(nodes) == 3 and len(graph.node) == 3  # nothing between them
    producer = {o: nd for nd in graph.node for o in nd.output}
    assert producer["a"].domain == "onnxopt" and producer["b"].domain == "onnxopt"
    assert producer[producer["c"].input[0]].output[0] == "b"
    # The layout is in each op's signature and in its fallback: a and b end with the reorder to blocked.
    body_a = function_of(res.model, producer["a"].op_type).node
    assert body_a[-1].op_type == "Transpose" and list(body_a[-1].attribute[0].ints) == [0, 3, 1, 2, 4]
    body_c = function_of(res.model, producer["c"].op_type).node
    assert body_c[0].op_type == "Transpose" and list(body_c[0].attribute[0].ints) == [0, 2, 3, 1, 4]
    assert len({nd.op_type for nd in nodes}) == 3
    check_answers(res, model, ch.feeds)
    # The blocked tensor itself: through the library it is [N, C/L, H, W, L] with zero padding.
    m = expand_sequences(res.model)  # b is inside a sequence there
    m.graph.output.append(vi("b", F32, None))
    m.graph.output[-1].type.tensor_type.shape.SetInParent()
    so = ort.SessionOptions()
    so.register_custom_ops_library(res.library)
    got = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(["b"], ch.feeds)[0]
    assert got.shape == (2, -(-40 // LANES), 17, 19, LANES)
    assert np.array_equal(to_blocked(from_blocked(got, 40), LANES), got)


@needs_vectors
def test_residual_blocks_and_depthwise_reader(tmp_path):
    """ResNet-style blocks (residual add in the epilogue, a strided projection), then a depthwise convolution that
    reads the blocked tensor and ends the chain (its channel-vector tiles, reordered to NCHW at the end); batch 8."""
    ch = Chain(16, 12, 12, batch=8, seed=3)
    a = ch.conv("x", "a", 32)
    b = ch.conv(a, "b", 32)
    c = ch.conv(b, "c", 32, act=None)
    d = ch.add(c, a, "d")
    proj = ch.conv(d, "proj", 48, k=1, p=0, s=2, act=None)
    e = ch.conv(d, "e", 48, s=2)
    f = ch.conv(e, "f", 48, act=None)
    g = ch.add(f, proj, "g")
    ch.conv(g, "dw", 48, group=48, act="Relu")
    model = ch.model(["dw"])
    res = optimize_blocked(model, tmp_path)
    assert len(expand_sequences(res.model).graph.node) == len(fused_nodes(res.model)) == 7
    check_answers(res, model, ch.feeds)


@needs_vectors
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c_in=st.integers(1, 35), c_mid=st.integers(1, 70), c_out=st.integers(1, 40), h=st.integers(3, 15),
       w=st.integers(3, 23), k=st.sampled_from([1, 3, 5]), s=st.integers(1, 3), d=st.integers(1, 2),
       pads=st.tuples(*[st.integers(0, 2)] * 4), batch=st.sampled_from([1, 3]))
def test_blocked_chain_hypothesis(tmp_path_factory, c_in, c_mid, c_out, h, w, k, s, d, pads, batch):
    """Odd channel counts (padding channels), kernels, strides, dilations and asymmetric pads, at both ends of a
    blocked tensor: a blocked conv writes it, a blocked conv reads it and writes another, an NCHW conv reads that."""
    span = (k - 1) * d + 1
    h1, w1 = h + pads[0] + pads[2] - span + 1, w + pads[1] + pads[3] - span + 1  # conv a, stride 1
    assume(h1 >= 1 and w1 >= 1 and h1 + pads[0] + pads[2] >= span and w1 + pads[1] + pads[3] >= span)
    ch = Chain(c_in, h, w, batch=batch, seed=c_mid)
    a = ch.conv("x", "a", c_mid, k=k, s=1, d=d, pads=list(pads), act="Relu")
    b = ch.conv(a, "b", c_out, k=k, s=s, d=d, pads=list(pads), act="Tanh")
    ch.conv(b, "c", 5, k=1, p=0, act=None)
    model = ch.model(["c"])
    res = optimize_blocked(model, tmp_path_factory.mktemp("h"))
    assert len(fused_nodes(res.model)) == 3
    check_answers(res, model, ch.feeds)


@needs_vectors
def test_blocked_tile_ir_uses_full_width_fmas():
    from onnxopt.codegen.compute.build import build_compute, compute_ir

    ch = Chain(16, 8, 8)
    a = ch.conv("x", "a", 64)
    ch.conv(a, "b", 16)
    regions, _ = regions_of(ch.model(["b"]))
    r = regions["a"]
    r.compute_op_type("test")
    _, desc = build_compute(r, TARGET)
    ir_text = compute_ir(r, TARGET)
    assert desc.out_blocked == 1 and desc.tiles[0][0].endswith("_b1v1")
    assert f"llvm.fma.v{LANES}f32" in ir_text
    # The weights are whole vectors: the K loop's loads of B are plain vector loads (no masks).
    body = ir_text.split("k.body:")[1].split("k.done:")[0]
    assert "masked.load" not in body and f"load <{LANES} x float>" in body


@needs_vectors
def test_plan_option_rejects_unknown_plan(tmp_path):
    ch = Chain(4, 5, 5)
    ch.conv("x", "a", 8)
    with pytest.raises(onnxopt.errors.UsageError, match="known plans"):
        onnxopt.optimize(ch.model(["a"]), str(tmp_path / "f.onnx"), plan="fastest")


def test_rejected_region_takes_its_blocked_chain_along():
    """If one kernel of a blocked chain fails its check, the regions that read or write its blocked tensors go too
    (onnxruntime's ops cannot take their layout); an NCHW region elsewhere stays."""
    from onnxopt.driver.policy import _consistent_layouts

    ch = Chain(8, 10, 10)
    a = ch.conv("x", "a", 16)
    b = ch.conv(a, "b", 16)
    c = ch.conv(b, "c", 16)
    ch.conv("x", "lone", 8)
    regions, _ = regions_of(ch.model([c, "lone"]))
    kept = _consistent_layouts([regions[k] for k in ("a", "c", "lone")])  # b rejected
    assert [r.outputs[0] for r in kept] == ["lone"]
    kept = _consistent_layouts([regions[k] for k in ("a", "b", "lone")])  # c rejected: b's output has no reader
    assert [r.outputs[0] for r in kept] == ["lone"]
    assert len(_consistent_layouts(list(regions.values()))) == 4
