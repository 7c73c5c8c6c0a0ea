"""A requantizing convolution's elementwise tail (DequantizeLinear -> BatchNormalization / HardSwish / a SiLU ... ->
QuantizeLinear) run through the kernel's tables (kinds/qconv/lookup.py): bit for bit what onnxruntime's own nodes
give on the exact convolution's values, and the tails that cannot be a table stay onnxruntime's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from int8_models import conv_attrs, conv_int, qdq_conv_model, qdq_tail, qdq_unit_operands, quantized_cnn, requantized
from kind_harness import fuse_kind
from onnx import TensorProto, helper, numpy_helper

from onnxopt.codegen.instructions import available
from onnxopt.codegen.target import host_target
from onnxopt.fusion.graph_index import GraphIndex
from onnxopt.kinds.qconv import KIND
from onnxopt.kinds.qconv.lookup import tail_after
from onnxopt.timing import make_session

pytestmark = pytest.mark.skipif(not available(host_target(), ("u8", "s8")),
                                reason="this CPU has no u8 x s8 dot-product instruction (AVX2 or VNNI)")


@settings(max_examples=8, deadline=None)
@given(cin=st.integers(2, 12), cout=st.integers(1, 19), r=st.integers(1, 3), pad=st.integers(0, 1),
       h=st.integers(2, 8), w=st.integers(2, 18), seed=st.integers(0, 2**16), signed_out=st.booleans(),
       kind=st.sampled_from(["bn_hardswish", "silu"]), relu=st.booleans())
def test_a_tail_runs_through_the_tables(tmp_path_factory, cin, cout, r, pad, h, w, seed, signed_out, kind, relu):
    attrs = conv_attrs(r, r, 1, pad, 1, h, w)
    if attrs is None:
        return
    rng = np.random.default_rng(seed)
    wt, sw, bias, sx, sy = qdq_unit_operands(rng, cin, cout, r)
    zy, zx = np.uint8(rng.integers(0, 256)), np.array(rng.integers(0, 256), np.uint8)
    model = qdq_conv_model(wt, sw, bias, sx, zx, sy, zy, attrs, (2, cin, h, w), relu)
    tail, inits = qdq_tail(kind, cout, rng, signed_out)
    g = model.graph
    g.node.extend(tail)
    g.initializer.extend(inits)
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("z", TensorProto.INT8 if signed_out else TensorProto.UINT8, None))
    model = onnx.shape_inference.infer_shapes(model)
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path_factory.mktemp("qt"))
    assert region.params.lut and region.outputs == ["z"]
    assert {n.output[0] for n in tail} <= {n.output[0] for n in region.nodes}
    x = rng.integers(0, 256, (2, cin, h, w)).astype(np.uint8)
    exact = conv_int(x, wt, int(zx), 0, attrs["strides"], attrs["pads"], attrs["dilations"])
    q = requantized(exact, bias, sx, sw, sy, zy, relu).astype(np.uint8)
    want = _tail_reference(tail, inits, g.output[0], q, sy, zy)
    got = make_session(fused, 2, library=lib).run(None, {"xq": x})[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    alone = make_session(fused, 1, optimization="none").run(None, {"xq": x})[0]  # the function fallback
    plain = make_session(model, 1, optimization="none").run(None, {"xq": x})[0]
    np.testing.assert_array_equal(alone, plain)


def _tail_reference(tail, inits, output, q, sy, zy) -> np.ndarray:
    """onnxruntime's own tail nodes on the exact convolution's requantized values `q`, optimized as the tables'
    are."""
    tg = helper.make_graph(tail, "t", [helper.make_tensor_value_info("y", TensorProto.UINT8, list(q.shape))],
                           [output], inits + [numpy_helper.from_array(np.float32(sy), "sy"),
                                              numpy_helper.from_array(zy, "zy")])
    return make_session(helper.make_model(tg, opset_imports=[helper.make_opsetid("", 17)]), 1).run(None, {"y": q})[0]


def test_tails_that_are_not_a_function_of_the_value_stay_onnxruntimes():
    """A tail read elsewhere half way, or with a constant that varies over the pixels, is not a table."""
    rng = np.random.default_rng(4)
    attrs = conv_attrs(1, 1, 1, 0, 1, 4, 4)
    model = qdq_conv_model(rng.integers(-9, 9, (6, 5, 1, 1)).astype(np.int8), np.full(6, 0.01, np.float32),
                           np.zeros(6, np.int32), np.float32(0.02), np.array(3, np.uint8), np.float32(0.1),
                           np.uint8(5), attrs, (1, 5, 4, 4), False)
    tail, inits = qdq_tail("silu", 6, rng, False)
    g = model.graph
    g.node.extend(tail)
    g.initializer.extend(inits)
    g.initializer.append(numpy_helper.from_array(rng.standard_normal((1, 6, 4, 4)).astype(np.float32), "pix"))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("z", TensorProto.UINT8, None))
    def const_shape(name):
        t = next((i for i in g.initializer if i.name == name), None)
        return None if t is None else list(t.dims)

    def dtype_of(name):
        return "uint8"

    index = GraphIndex(g)
    members, end = tail_after(index, "y", set(), const_shape, dtype_of, 6)
    assert end == "z" and len(members) == 6
    g.output.append(helper.make_tensor_value_info("t1", TensorProto.FLOAT, None))  # the Sigmoid read outside
    index = GraphIndex(g)
    assert tail_after(index, "y", set(), const_shape, dtype_of, 6) is None
    del g.output[-1]
    g.node[-2].input[1] = "pix"  # the Mul by a constant that varies over the pixels: t2 left out, and then t3
    index = GraphIndex(g)
    assert tail_after(index, "y", set(), const_shape, dtype_of, 6) is None


def test_a_quantize_static_hardswish_network_is_fused_with_its_tails(tmp_path):
    """quantize_static's own QDQ model of Conv -> HardSwish -> Conv -> Sigmoid * x: each convolution takes its tail,
    and the whole model checks out."""
    from onnxopt import optimize

    rng = np.random.default_rng(6)
    weights = {n: (rng.standard_normal(s) * 0.3).astype(np.float32)
               for n, s in (("w1", (8, 6, 3, 3)), ("b1", (8,)), ("w2", (12, 8, 1, 1)), ("b2", (12,)))}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
             helper.make_node("HardSwish", ["c1"], ["h1"]),
             helper.make_node("Conv", ["h1", "w2", "b2"], ["c2"]),
             helper.make_node("Sigmoid", ["c2"], ["s2"]), helper.make_node("Mul", ["c2", "s2"], ["y"])]
    quantized_cnn(str(tmp_path), nodes, weights, (1, 6, 14, 15), rng)
    result = optimize(str(tmp_path / "q.onnx"), str(tmp_path / "out.onnx"), measure=False)
    qconvs = [r for r in result.report["regions"] if r["op_type"].startswith("qconv_")]
    assert len(qconvs) == 2 and all(len(r["nodes"]) > 4 for r in qconvs), [r["nodes"] for r in qconvs]
    assert result.report["verification"]["ok"] and result.report["fallback_verification"]["ok"]


# Each way the tile reads its tables (codegen/isa.py TABLE_LOOKUPS), on a target that has it and this CPU runs.
LOOKUP_TARGETS = {"permute_bytes": "cpu=x86-64-v4,+avx512vbmi", "gather_dwords": "x86-64-v3", "lanes": "x86-64-v2"}
LOOKUP_IR = {"permute_bytes": "llvm.x86.avx512.vpermi2var.qi.512", "gather_dwords": "llvm.x86.avx2.gather.d.d.256"}


@pytest.mark.parametrize("method", list(LOOKUP_TARGETS))
@pytest.mark.parametrize("w, stride, r", [(13, 1, 3), (30, 1, 3), (57, 1, 3), (70, 2, 3), (40, 1, 5)])
def test_a_depthwise_tail_reads_its_tables_by_each_method(tmp_path, method, w, stride, r):
    """The depthwise tile (panels of 1, 2 or 4 vectors as the row's width asks) with a HardSwish tail, exact against
    onnxruntime's nodes on the exact convolution, by each lookup method."""
    from onnxopt.codegen.isa import isa_of
    from onnxopt.codegen.target import missing_cpu_flags, parse_target

    target = parse_target(LOOKUP_TARGETS[method])
    missing = missing_cpu_flags(target.required_cpu_flags)
    if missing:
        pytest.skip(f"this CPU cannot run {method}'s target (no {', '.join(missing)})")
    assert isa_of(target).table_lookup == method
    rng = np.random.default_rng(w * 10 + stride)
    c, h = 6, 5
    wt = rng.integers(-127, 128, (c, 1, r, r)).astype(np.int8)
    sw = (rng.uniform(0.5, 2.0, c) * 0.01).astype(np.float32)
    bias = rng.integers(-3000, 3000, c).astype(np.int32)
    sx, sy = np.float32(0.02), np.float32(0.05 * r)
    zy, zx = np.uint8(rng.integers(0, 256)), np.array(rng.integers(0, 256), np.uint8)
    attrs = conv_attrs(r, r, stride, r // 2, 1, h, w, group=c)
    model = qdq_conv_model(wt, sw, bias, sx, zx, sy, zy, attrs, (1, c, h, w), False)
    tail, inits = qdq_tail("bn_hardswish", c, rng, False)
    g = model.graph
    g.node.extend(tail)
    g.initializer.extend(inits)
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("z", TensorProto.UINT8, None))
    model = onnx.shape_inference.infer_shapes(model)
    fused, lib, region, ir_text = fuse_kind(KIND, model, tmp_path, target=target)
    assert region.params.depthwise and region.params.lut
    for name, intrinsic in LOOKUP_IR.items():
        assert (intrinsic in ir_text) == (name == method)
    x = rng.integers(0, 256, (1, c, h, w)).astype(np.uint8)
    exact = conv_int(x, wt, int(zx), 0, attrs["strides"], attrs["pads"], attrs["dilations"], group=c)
    q = requantized(exact, bias, sx, sw, sy, zy, False).astype(np.uint8)
    want = _tail_reference(tail, inits, g.output[0], q, sy, zy)
    got = make_session(fused, 2, library=lib).run(None, {"xq": x})[0]
    np.testing.assert_array_equal(got, want)
