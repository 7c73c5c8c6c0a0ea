"""The qconv kind: int8 convolutions, onnxruntime's dynamically quantized ConvInteger -> Cast -> scale -> bias and
static QDQ units DequantizeLinear -> Conv -> [Relu] -> QuantizeLinear, on the target's dot-product instruction, exact
in int32 and checked against exact integer arithmetic (numpy) and onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from int8_models import (conv_attrs, conv_int, conv_integer_model, conv_integer_operands, drop_shapes, grouping,
                         qdq_conv_model, quantized_cnn)
from kind_harness import avx512_vnni_target, fuse_kind
from onnx import TensorProto, helper, numpy_helper

from onnxopt.codegen.instructions import available
from onnxopt.codegen.instructions.avx2_u8s8 import pairs_cannot_saturate
from onnxopt.codegen.target import host_target
from onnxopt.kinds import KINDS
from onnxopt.kinds.qconv import KIND
from onnxopt.kinds.qconv.find import TAP_SHIFT, find_regions, forced_form, pack
from onnxopt.measure import exact_integer_reference
from onnxopt.timing import make_session
from onnxopt.verify import STEP_BAND

pytestmark = pytest.mark.skipif(not available(host_target(), ("u8", "s8")),
                                reason="this CPU has no u8 x s8 dot-product instruction (AVX2 or VNNI)")


_GEOMETRY = dict(cin=st.integers(1, 24), cout=st.integers(1, 21), r=st.integers(1, 3), s=st.integers(1, 3),
                 stride=st.integers(1, 2), pad=st.integers(0, 2), dil=st.integers(1, 2), n=st.integers(1, 3),
                 h=st.integers(1, 11), w=st.integers(1, 20), seed=st.integers(0, 2**16),
                 groups=st.sampled_from(["one", "one", "depthwise", "depthwise_x2", "two"]))


def test_the_kind_is_registered_first():
    assert KIND in KINDS and KIND.first


@settings(max_examples=12, deadline=None)
@given(**_GEOMETRY, unsigned=st.booleans(), extreme=st.booleans(), zx=st.integers(0, 255), signed_in=st.booleans())
def test_conv_integer_is_exact_on_drawn_shapes(tmp_path_factory, cin, cout, r, s, stride, pad, dil, n, h, w, seed,
                                               groups, unsigned, extreme, zx, signed_in):
    """ConvInteger with u8 weights (and their zero point) or s8 ones, u8 or s8 activations, odd channels, groups
    (depthwise too), padding, strides, dilations and batches against exact integer arithmetic, then the same float
    rescaling."""
    cin, cout, group = grouping(groups, cin, cout)
    attrs = conv_attrs(r, s, stride, pad, dil, h, w, group)
    if attrs is None:
        return
    rng = np.random.default_rng(seed)
    wshape = (cout, cin // group, r, s)
    wt, wz, x = conv_integer_operands(rng, wshape, (n, cin, h, w), unsigned, extreme)
    xt = np.int8 if signed_in else np.uint8
    x, zx = (x.astype(np.int16) - 128).astype(np.int8) if signed_in else x, np.array(zx - 128 * signed_in, xt)
    model = conv_integer_model(wt, wz, attrs, (n, cin, h, w), helper.np_dtype_to_tensor_dtype(np.dtype(xt)))
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path_factory.mktemp("qc"))
    assert [nd.op_type[:6] for nd in fused.graph.node] == ["qconv_"]
    feeds = {"x": x, "zx": zx, "scale": np.array(0.01, np.float32)}
    assert region.params.group == group and region.params.depthwise == (cin == group == cout)
    exact = conv_int(x, wt, zx, wz, attrs["strides"], attrs["pads"], attrs["dilations"], group)
    want = exact.astype(np.int32).astype(np.float32) * np.float32(0.01) + \
        np.linspace(-1, 1, cout).astype(np.float32).reshape(cout, 1, 1)
    got = make_session(fused, 2, library=lib).run(None, feeds)[0]
    np.testing.assert_array_equal(got, want)
    reference = make_session(exact_integer_reference(model), 1, optimization="none").run(None, feeds)[0]
    np.testing.assert_array_equal(reference, want)  # the driver's kernel check sums exactly too
    alone = make_session(fused, 1).run(None, feeds)[0]  # the fallback: onnxruntime's ConvInteger, rebuilt weights
    np.testing.assert_allclose(alone, make_session(model, 1, optimization="none").run(None, feeds)[0], rtol=1e-6)


@settings(max_examples=12, deadline=None)
@given(**_GEOMETRY, signed_out=st.booleans(), relu=st.booleans(), per_channel=st.booleans(), zx=st.integers(0, 255),
       signed_in=st.booleans())
def test_qdq_unit_requantizes_as_qlinearconv_on_drawn_shapes(tmp_path_factory, cin, cout, r, s, stride, pad, dil, n,
                                                             h, w, seed, groups, signed_out, relu, per_channel, zx,
                                                             signed_in):
    """A QDQ unit against the spec's exact sum requantized as onnxruntime's QLinearConv does (float(S + bias) *
    (x_scale * w_scale / y_scale), rounded half to even, plus the zero point, saturated), bit for bit; and against
    the float reference in quantization steps, as the driver checks it."""
    cin, cout, group = grouping(groups, cin, cout)
    attrs = conv_attrs(r, s, stride, pad, dil, h, w, group)
    if attrs is None:
        return
    rng = np.random.default_rng(seed)
    wt = rng.integers(-127, 128, (cout, cin // group, r, s)).astype(np.int8)
    sw = (rng.uniform(0.5, 2.0, cout if per_channel else 1) * 0.01).astype(np.float32)
    sw = np.broadcast_to(sw, (cout,)).astype(np.float32)
    bias = rng.integers(-5000, 5000, cout).astype(np.int32)
    sx, sy = np.float32(0.02), np.float32(0.05 * np.sqrt(cin // group * r * s))
    zy = np.int8(rng.integers(-20, 20)) if signed_out else np.uint8(rng.integers(0, 256))
    xt = np.int8 if signed_in else np.uint8
    zx = np.array(zx - 128 * signed_in, xt)
    model = qdq_conv_model(wt, sw, bias, sx, zx, sy, zy, attrs, (n, cin, h, w), relu)
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path_factory.mktemp("qd"))
    assert [nd.op_type[:6] for nd in fused.graph.node] == ["qconv_"]
    x = (rng.integers(0, 256, (n, cin, h, w)) - 128 * signed_in).astype(xt)
    feeds = {"xq": x}
    exact = conv_int(x, wt, int(zx), 0, attrs["strides"], attrs["pads"], attrs["dilations"], group)
    scale = (sx * sw / sy).astype(np.float32).reshape(1, -1, 1, 1)
    lo, hi = (-128, 127) if signed_out else (0, 255)
    q = np.rint((exact + bias.reshape(1, -1, 1, 1)).astype(np.int32).astype(np.float32) * scale).astype(np.int64)
    q = q + int(zy)
    if relu:
        q = np.maximum(q, int(zy))
    want = np.clip(q, lo, hi)
    got = make_session(fused, 2, library=lib).run(None, feeds)[0]
    assert got.dtype == (np.int8 if signed_out else np.uint8)
    np.testing.assert_array_equal(got.astype(np.int64), want)
    steps = make_session(exact_integer_reference(model), 1, optimization="none").run(None, feeds)[0]
    assert steps.dtype == np.float32 and np.all(np.abs(got - steps.astype(np.float64)) <= 0.5 + STEP_BAND)
    alone = make_session(fused, 1, optimization="none").run(None, feeds)[0]  # the fallback's DQ -> Conv -> Q
    plain = make_session(model, 1, optimization="none").run(None, feeds)[0]
    np.testing.assert_array_equal(alone, plain)


def test_unit_of_unknown_shape_is_refused_with_a_reason(tmp_path):
    """A QDQ convolution whose input's shape inference cannot give (a recognizer's neck reshapes by computed shapes)
    has no feeds to be checked and timed with: refused with a reason, not a crash of the optimizer."""
    from onnxopt.kinds.qconv.find import find_regions

    rng = np.random.default_rng(8)
    weights = {"w": (rng.standard_normal((8, 4, 3, 3)) * 0.1).astype(np.float32)}
    quantized_cnn(str(tmp_path), [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], weights,
                  (1, 4, 10, 10), rng)
    q = onnx.load(tmp_path / "q.onnx")
    del q.graph.value_info[:]
    drop_shapes(q, {"x", "y"})
    rejected: list[dict] = []
    assert find_regions(q, set(), rejected) == []
    assert any("shape is unknown" in r["reason"] for r in rejected), rejected


def test_quantize_static_model_is_fused_and_close_to_onnxruntime(tmp_path):
    """onnxruntime's own quantizer's QDQ model (per-channel s8 weights, u8 activations): one qconv kernel for the
    unit, within one step of the float reference everywhere, and of onnxruntime's QLinearConv but where that
    saturates its 16-bit pair sums."""
    rng = np.random.default_rng(5)
    weights = {"w": (rng.standard_normal((24, 16, 3, 3)) * 0.1).astype(np.float32),
               "b": (rng.standard_normal(24) * 0.1).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    quantized_cnn(str(tmp_path), nodes, weights, (1, 16, 12, 12), rng)
    q = onnx.shape_inference.infer_shapes(onnx.load(tmp_path / "q.onnx"))
    fused, lib, region, _ = fuse_kind(KIND, q, tmp_path)
    assert sum(nd.op_type.startswith("qconv_") for nd in fused.graph.node) == 1
    feeds = {"x": rng.standard_normal((1, 16, 12, 12)).astype(np.float32)}
    got = make_session(fused, 2, library=lib).run(None, feeds)[0]
    float_path = make_session(q, 1, optimization="none").run(None, feeds)[0]
    # One step of the output: the scale of the DequantizeLinear that gives the model's output
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    (last,) = [n for n in q.graph.node if n.output[0] == q.graph.output[0].name]
    assert last.op_type == "DequantizeLinear"
    step = float(inits[last.input[1]])
    assert 0 < step and np.abs(got - float_path).max() <= step * 1.001


def test_packing_round_trips_and_no_pair_can_saturate():
    rng = np.random.default_rng(3)
    cases = [(rng.integers(-128, 128, (9, 5, 3, 3)).astype(np.int8), np.zeros((), np.int8)),
             (rng.integers(0, 256, (9, 5, 3, 3)).astype(np.uint8), np.array(77, np.uint8))]
    for (w, zw), group_major in [(c, g) for c in cases for g in (False, True)]:
        t = pack(w, zw, group_major)
        assert t["packed"].shape == (9, 72) and pairs_cannot_saturate(t["packed"])  # 9 taps x 8 channels
        back = t["packed"].astype(np.int32)
        back[t["fix_index"][:, 0], t["fix_index"][:, 1]] += t["fix_update"]
        shift = 128 if w.dtype == np.uint8 else 0
        # k = tap * 8 + channel, or (channel group * 9 + tap) * 4 + channel % 4
        by_tap = back.reshape(9, 2, 3, 3, 4).transpose(0, 2, 3, 1, 4) if group_major else back
        by_tap = by_tap.reshape(9, 3, 3, 8)
        np.testing.assert_array_equal(by_tap[..., :5].transpose(0, 3, 1, 2) + shift, w)
        assert np.all(by_tap[..., 5:] == 0)
        v = w.reshape(9, -1).astype(np.int32) - int(zw)
        np.testing.assert_array_equal(t["vsum"], v.sum(axis=1))
        np.testing.assert_array_equal(t["dvec"], np.full(9, shift - int(zw)))
        assert t["fix_offsets"][0] == 0 and t["fix_offsets"][-1] == len(t["fix_entries"])
        ends = np.searchsorted(t["fix_index"][:, 0], np.arange(10))
        for r in range(9):  # each channel's groups of 4 k with residuals, in order, and their s8 quads
            lo, hi = t["fix_offsets"][r], t["fix_offsets"][r + 1]
            k = t["fix_index"][ends[r]:ends[r + 1], 1]
            assert np.all(np.diff(k) > 0) and np.all(t["fix_index"][ends[r]:ends[r + 1], 0] == r)
            groups = np.unique(k // 4)
            assert hi - lo == len(groups)
            quads = np.ascontiguousarray(t["fix_entries"][lo:hi, 1]).view(np.int8).reshape(-1, 4).astype(np.int32)
            want = np.zeros_like(quads)
            want[np.searchsorted(groups, k // 4), k % 4] = t["fix_update"][ends[r]:ends[r + 1]]
            np.testing.assert_array_equal(quads, want)
            assert np.all(np.abs(quads[:, 0::2]) + np.abs(quads[:, 1::2]) <= 128)  # a quad cannot saturate
            # the kernel's k, a group's first: group-major ones name the tap apart
            first = (groups % 9) << TAP_SHIFT | (groups // 9) * 4 if group_major else groups * 4
            np.testing.assert_array_equal(t["fix_entries"][lo:hi, 0], first)


def test_refusals_say_why():
    w = np.ones((4, 6, 3, 3), np.int8)
    attrs = dict(kernel_shape=[3, 3], group=2)
    rejected = []
    bad = conv_integer_model(np.ones((4, 3, 3, 3), np.int8), np.zeros((), np.int8), attrs, (1, 6, 5, 5))
    bad.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 5  # 5 input channels in 2 groups of 3
    assert find_regions(bad, set(), rejected) == []
    assert "group 2 does not divide" in rejected[0]["reason"]
    rejected = []
    big = conv_integer_model(np.ones((4, 1, 9, 9), np.int8), np.zeros((), np.int8), dict(kernel_shape=[9, 9], group=4),
                             (1, 4, 12, 12))
    assert find_regions(big, set(), rejected) == [] and "more than 64 taps" in rejected[0]["reason"]
    m = conv_integer_model(w, np.zeros((), np.int8), dict(kernel_shape=[3, 3]), (1, 6, 5, 5))
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.INT16
    rejected = []
    assert find_regions(m, set(), rejected) == [] and "not u8 or s8" in rejected[0]["reason"]
    m = conv_integer_model(w, np.array(3, np.int8), dict(kernel_shape=[3, 3]), (1, 6, 5, 5))
    rejected = []
    assert find_regions(m, set(), rejected) == [] and "zero point" in rejected[0]["reason"]
    # A QDQ unit whose input's DequantizeLinear another node reads too (the pipeline copies it for the unit first:
    # graph/quantized.py dedicate_unit_dequantizers)
    m = qdq_conv_model(w, np.full(4, 0.01, np.float32), np.zeros(4, np.int32), np.float32(0.1), np.array(3, np.uint8),
                   np.float32(0.2), np.uint8(9), dict(kernel_shape=[3, 3]), (1, 6, 5, 5), False)
    m.graph.output.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, None))
    rejected = []
    assert find_regions(m, set(), rejected) == [] and "feeds another node" in rejected[0]["reason"]


@pytest.mark.parametrize("spec,mnemonic,reg", [("cpu=x86-64-v4,+avx512vnni", "vpdpbusd", "zmm"),
                                               ("cpu=x86-64-v3,+avxvnni", "{vex}\tvpdpbusd", "ymm"),
                                               ("x86-64-v3", "vpmaddubsw", "ymm")])
def test_the_tile_compiles_to_each_targets_instruction(spec, mnemonic, reg):
    """The tiles of every x86 target, whether or not this CPU can run them: the target's best u8 x s8 instruction,
    one per accumulator and K group, the weights' 4 bytes broadcast."""
    from onnxopt.codegen.compile import compile_assembly, new_module
    from onnxopt.codegen.target import parse_target
    from onnxopt.kinds.qconv.lower import define_tile
    from onnxopt.kinds.qmatmul.lower import instruction_for

    target = parse_target(spec)
    model = conv_integer_model(np.ones((8, 4, 3, 3), np.int8), np.zeros((), np.int8), dict(kernel_shape=[3, 3]),
                                (1, 4, 6, 6))
    (region,) = find_regions(model, set(), [])
    ins = instruction_for(target)
    module = new_module(target, "q")
    define_tile(module, "tile", region.params, region.program, ins.emit, ins.lanes, region.params.mr)
    asm = compile_assembly(str(module), target)
    assert asm.count(mnemonic) >= region.params.mr * (16 // ins.lanes) and f"%{reg}" in asm and "vpbroadcastd" in asm


@pytest.mark.parametrize("cin,cout,k,pad,dil,n,h,w,signed_in", [(5, 7, 3, 1, 1, 2, 5, 16, False),
                                                                 (8, 9, 2, 0, 1, 1, 3, 30, True),
                                                                 (3, 16, 3, 2, 2, 1, 9, 14, False),
                                                                 (13, 4, 5, 2, 1, 3, 6, 45, True),
                                                                 (6, 5, 3, 1, 1, 1, 4, 40, False)])
def test_implicit_form_reads_the_grouped_input_exactly(tmp_path, cin, cout, k, pad, dil, n, h, w, signed_in):
    """Stride 1 with output rows that fill panels of 16 pixels: the tile reads the channel-grouped input per tap
    (no im2col), the last panel of each row partial, with saturating pairs corrected and s8 activations."""
    rng = np.random.default_rng(cin * w)
    wt = rng.choice(np.array([-128, 127, 90, -3], np.int8), (cout, cin, k, k))
    attrs = dict(kernel_shape=[k, k], pads=[pad] * 4, dilations=[dil, dil])
    xt = np.int8 if signed_in else np.uint8
    model = conv_integer_model(wt, np.zeros((), np.int8), attrs, (n, cin, h, w),
                                helper.np_dtype_to_tensor_dtype(np.dtype(xt)))
    with forced_form("implicit"):  # whichever AMOS's model would pick on this host (test_qconv_forms.py)
        fused, lib, region, _ = fuse_kind(KIND, model, tmp_path)
    assert region.params.implicit and region.params.has_fix
    x = (rng.integers(0, 256, (n, cin, h, w)) - 128 * signed_in).astype(xt)
    zx = np.array(7 - 128 * signed_in, xt)
    exact = conv_int(x, wt, int(zx), 0, [1, 1], [pad] * 4, [dil, dil])
    want = exact.astype(np.int32).astype(np.float32) * np.float32(0.01) + \
        np.linspace(-1, 1, cout).astype(np.float32).reshape(cout, 1, 1)
    got = make_session(fused, 2, library=lib).run(None, {"x": x, "zx": zx, "scale": np.array(0.01, np.float32)})[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("cin,cout,k,stride,pad,n,h,w,half", [(3, 16, 3, 2, 1, 2, 40, 40, False),
                                                               (20, 9, 3, 1, 0, 1, 9, 9, True),
                                                               (7, 6, 1, 2, 0, 1, 13, 13, True),
                                                               (4, 10, 3, 2, 1, 1, 30, 33, False)])
def test_short_panels_and_strided_rows_are_exact(tmp_path, cin, cout, k, stride, pad, n, h, w, half):
    """A plane whose last panel holds 8 pixels or fewer (7 x 7: 49 = 3 x 16 + 1) runs it on the half tiles, one
    vector of pixels; stride-2 rows (a stem's 3 channels) are gathered 16 at a time by the packing's fast path.
    Exact either way, with saturating pairs corrected."""
    from onnxopt.codegen.target import host_target
    from onnxopt.kinds.qconv.lower import build
    from onnxopt.kinds.qmatmul.lower import instruction_for

    rng = np.random.default_rng(cin * h + w)
    wt = rng.choice(np.array([-128, 127, 90, -3, 0, 41], np.int8), (cout, cin, k, k))
    attrs = dict(kernel_shape=[k, k], pads=[pad] * 4, strides=[stride, stride])
    model = conv_integer_model(wt, np.zeros((), np.int8), attrs, (n, cin, h, w))
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path)
    _, desc, _ = build(region, host_target())
    lanes = instruction_for(host_target()).lanes  # 16 on AVX-512: a panel is one vector, no half tiles
    assert bool(desc.half_tiles) == (half and lanes == 8) and desc.half_cols == (8 if desc.half_tiles else 0)
    x = rng.integers(0, 256, (n, cin, h, w)).astype(np.uint8)
    zx = np.array(7, np.uint8)
    exact = conv_int(x, wt, int(zx), 0, [stride, stride], [pad] * 4, [1, 1])
    want = exact.astype(np.int32).astype(np.float32) * np.float32(0.01) + \
        np.linspace(-1, 1, cout).astype(np.float32).reshape(cout, 1, 1)
    got = make_session(fused, 2, library=lib).run(None, {"x": x, "zx": zx, "scale": np.array(0.01, np.float32)})[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("cin,cout,k,stride,pad,n,h,w,group", [(24, 13, 3, 2, 1, 2, 35, 35, 1),
                                                                (16, 40, 1, 2, 0, 1, 28, 28, 1),
                                                                (12, 12, 3, 1, 1, 3, 9, 20, 2)])
def test_wide_tiles_are_exact(tmp_path, cin, cout, k, stride, pad, n, h, w, group):
    """On a 16-lane target the packed form's tile takes 4 panels (64 consecutive pixels of one image) by up to 6
    channels (lower.py wide_shape), exec.c only where a task's group of panels holds 4 of one image: images whose
    pixels end inside a group (18 x 18 = 324 = 5 groups of 64 + 4), several images, channel groups; weights at the
    corners of their range, so the corrections of split pairs run on the wide tiles too. Exact."""
    target = avx512_vnni_target()
    rng = np.random.default_rng(cin * h + w)
    wt = rng.choice(np.array([-128, 127, 90, -3, 0, 41], np.int8), (cout, cin // group, k, k))
    attrs = dict(kernel_shape=[k, k], pads=[pad] * 4, strides=[stride, stride], group=group)
    model = conv_integer_model(wt, np.zeros((), np.int8), attrs, (n, cin, h, w))
    fused, lib, region, ir_text = fuse_kind(KIND, model, tmp_path, target=target)
    assert not region.params.implicit and f"{region.op_type}_w1" in ir_text
    x = rng.integers(0, 256, (n, cin, h, w)).astype(np.uint8)
    zx = np.array(7, np.uint8)
    exact = conv_int(x, wt, int(zx), 0, [stride, stride], [pad] * 4, [1, 1], group)
    want = exact.astype(np.int32).astype(np.float32) * np.float32(0.01) + \
        np.linspace(-1, 1, cout).astype(np.float32).reshape(cout, 1, 1)
    for threads in (1, 2):
        got = make_session(fused, threads, library=lib).run(None, {"x": x, "zx": zx,
                                                                   "scale": np.array(0.01, np.float32)})[0]
        np.testing.assert_array_equal(got, want)


def test_an_int32_bias_before_the_cast_is_added_to_the_sums(tmp_path):
    """ConvInteger -> Add(int32 bias per channel) -> Cast -> Mul: quantize_dynamic's form with a bias (ddddocr's,
    where the bias is computed per call from the input's scale), added exactly in int32 before the rescaling."""
    rng = np.random.default_rng(11)
    wt = rng.integers(-128, 128, (6, 5, 3, 3)).astype(np.int8)
    model = conv_integer_model(wt, np.zeros((), np.int8), dict(kernel_shape=[3, 3], pads=[1] * 4), (2, 5, 7, 9))
    bias = rng.integers(-30000, 30000, (6, 1, 1)).astype(np.int32)
    g = model.graph
    g.initializer.append(numpy_helper.from_array(bias, "ibias"))
    conv = g.node[0]
    conv.output[0] = "acc0"
    g.node.insert(1, helper.make_node("Add", ["acc0", "ibias"], ["acc"]))
    del g.value_info[:]
    model = onnx.shape_inference.infer_shapes(model)
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path)
    assert region.params.int_bias and [n.op_type for n in region.nodes][:3] == ["ConvInteger", "Add", "Cast"]
    x = rng.integers(0, 256, (2, 5, 7, 9)).astype(np.uint8)
    feeds = {"x": x, "zx": np.array(131, np.uint8), "scale": np.array(0.01, np.float32)}
    exact = conv_int(x, wt, 131, 0, [1, 1], [1] * 4, [1, 1]) + bias.reshape(1, 6, 1, 1)
    want = exact.astype(np.int32).astype(np.float32) * np.float32(0.01) + \
        np.linspace(-1, 1, 6).astype(np.float32).reshape(6, 1, 1)
    np.testing.assert_array_equal(make_session(fused, 2, library=lib).run(None, feeds)[0], want)
    np.testing.assert_array_equal(make_session(fused, 1).run(None, feeds)[0], want)  # the fallback


def _qlinear_conv_model(w, sw, bias, sx, zx, sy, zy, attrs, xshape):
    """One QLinearConv (the QOperator format), x given as u8 or s8."""
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(sw, "sw"),
             numpy_helper.from_array(np.zeros(w.shape[0], np.int8), "wz"), numpy_helper.from_array(bias, "B"),
             numpy_helper.from_array(np.float32(sx), "sx"), numpy_helper.from_array(zx, "zx"),
             numpy_helper.from_array(np.float32(sy), "sy"), numpy_helper.from_array(zy, "zy")]
    node = helper.make_node("QLinearConv", ["xq", "sx", "zx", "W", "sw", "wz", "sy", "zy", "B"], ["y"], **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("xq", helper.np_dtype_to_tensor_dtype(zx.dtype),
                                                                      list(xshape))],
                          [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(zy.dtype), None)],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


@pytest.mark.parametrize("cin,cout,k,stride,pad,signed_in,signed_out", [
    (5, 7, 3, 1, 1, False, False), (16, 70, 3, 2, 1, True, True), (24, 9, 1, 1, 0, False, False)])
def test_qlinearconv_requantizes_exactly(tmp_path, cin, cout, k, stride, pad, signed_in, signed_out):
    """The QOperator format's QLinearConv: the same kernel and requantization as a QDQ unit, clamped to the output
    type's range, bit for bit against exact integer arithmetic; the fallback is the QLinearConv on rebuilt weights."""
    rng = np.random.default_rng(cin * cout)
    wt = rng.integers(-127, 128, (cout, cin, k, k)).astype(np.int8)
    sw = (rng.uniform(0.5, 2.0, cout) * 0.01).astype(np.float32)
    bias = rng.integers(-5000, 5000, cout).astype(np.int32)
    sx, sy = np.float32(0.02), np.float32(0.04 * np.sqrt(cin * k * k))
    xt = np.int8 if signed_in else np.uint8
    zx = np.array(9 - 128 * signed_in, xt)
    zy = np.array(-3 if signed_out else 120, np.int8 if signed_out else np.uint8)
    attrs = dict(kernel_shape=[k, k], strides=[stride] * 2, pads=[pad] * 4)
    model = _qlinear_conv_model(wt, sw, bias, sx, zx, sy, zy, attrs, (2, cin, 9, 11))
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path)
    assert [nd.op_type[:6] for nd in fused.graph.node] == ["qconv_"]
    x = (rng.integers(0, 256, (2, cin, 9, 11)) - 128 * signed_in).astype(xt)
    exact = conv_int(x, wt, int(zx), 0, attrs["strides"], attrs["pads"], [1, 1])
    scale = (sx * sw / sy).astype(np.float32).reshape(1, -1, 1, 1)
    q = np.rint((exact + bias.reshape(1, -1, 1, 1)).astype(np.int32).astype(np.float32) * scale) + int(zy)
    want = np.clip(q, *((-128, 127) if signed_out else (0, 255))).astype(zy.dtype)
    got = make_session(fused, 2, library=lib).run(None, {"xq": x})[0]
    np.testing.assert_array_equal(got, want)
    alone = make_session(fused, 1, optimization="none").run(None, {"xq": x})[0]
    np.testing.assert_array_equal(alone, make_session(model, 1, optimization="none").run(None, {"xq": x})[0])


def test_a_qoperator_model_is_fused_whole(tmp_path):
    """quantize_static in the QOperator format (QLinearConv, and QLinearAdd, a contrib op whose output shape only
    the graph's shape twins give: graph/infer.py): every QLinearConv becomes a kernel, the model checks out."""
    from onnxopt import optimize

    rng = np.random.default_rng(8)
    weights = {n: (rng.standard_normal(s) * 0.2).astype(np.float32)
               for n, s in (("w1", (8, 8, 3, 3)), ("b1", (8,)), ("w2", (8, 8, 1, 1)), ("b2", (8,)))}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"]), helper.make_node("Add", ["r1", "x"], ["s"]),
             helper.make_node("Conv", ["s", "w2", "b2"], ["y"])]
    quantized_cnn(str(tmp_path), nodes, weights, (1, 8, 16, 16), rng, qoperator=True)
    ops = [n.op_type for n in onnx.load(tmp_path / "q.onnx").graph.node]
    assert ops.count("QLinearConv") == 2 and "QLinearAdd" in ops
    result = optimize(str(tmp_path / "q.onnx"), str(tmp_path / "out.onnx"), measure=False)
    assert sum(r["op_type"].startswith("qconv_") for r in result.report["regions"]) == 2
    assert result.report["verification"]["ok"] and result.report["fallback_verification"]["ok"]


@pytest.mark.parametrize("spec,split", [("x86-64-v3", True), ("cpu=x86-64-v4,+avx512vnni", False),
                                        ("aarch64-dotprod", False), (None, True)])
def test_weight_pairs_are_split_only_for_an_instruction_that_saturates(spec, split):
    """AVX2's vpmaddubsw sums pairs in 16 saturating bits, so its weights carry corrections; VNNI's, AMX's and
    sdot's sums do not saturate, so their kernels get the weights whole and run no corrections; with no target the
    tables are the split ones, exact on every instruction. The same for the int8 GEMMs."""
    from onnxopt.codegen.target import parse_target
    from onnxopt.kinds.qmatmul.find import find_regions as find_matmul_regions

    target = parse_target(spec) if spec else None
    wt = np.random.default_rng(1).choice(np.array([-128, 127, 90, -3], np.int8), (8, 4, 3, 3))
    model = conv_integer_model(wt, np.zeros((), np.int8), dict(kernel_shape=[3, 3]), (1, 4, 6, 6))
    (region,) = find_regions(model, set(), [], target=target)
    assert region.params.has_fix == split
    tables = {t.name.split("__qc")[-1]: numpy_helper.to_array(t) for t in region.initializers}
    assert ("fix_entries" in tables) == split
    if not split:  # the packed weights are W's, by tap then channel (padded to 4)
        by_tap = np.zeros((8, 3, 3, 4), np.int8)
        by_tap[...] = wt.transpose(0, 2, 3, 1)
        np.testing.assert_array_equal(tables["packed"].reshape(8, -1), by_tap.reshape(8, -1))
    from int8_models import matmul_integer_model

    mm = matmul_integer_model(64, 16, np.random.default_rng(2).choice(np.array([-128, 127], np.int8), (64, 16)),
                              [3])
    (mregion,) = find_matmul_regions(mm, set(), [], target=target)
    assert mregion.params.has_fix == split


def test_unsplit_weights_are_exact_on_vnni(tmp_path):
    """The VNNI target's kernel on weights whose pairs would saturate AVX2's sums, taken whole: exact."""
    target = avx512_vnni_target()
    rng = np.random.default_rng(5)
    wt = rng.choice(np.array([-128, 127, 90, -3], np.int8), (9, 8, 3, 3))
    model = conv_integer_model(wt, np.zeros((), np.int8), dict(kernel_shape=[3, 3], pads=[1] * 4), (1, 8, 7, 20))
    regions = find_regions(model, set(), [], target=target)
    assert len(regions) == 1 and not regions[0].params.has_fix
    fused, lib, region, _ = fuse_kind(_TargetKind(target), model, tmp_path, target=target)
    x = rng.integers(0, 256, (1, 8, 7, 20)).astype(np.uint8)
    zx = np.array(7, np.uint8)
    exact = conv_int(x, wt, 7, 0, [1, 1], [1] * 4, [1, 1])
    want = exact.astype(np.int32).astype(np.float32) * np.float32(0.01) + \
        np.linspace(-1, 1, 9).astype(np.float32).reshape(9, 1, 1)
    got = make_session(fused, 2, library=lib).run(None, {"x": x, "zx": zx, "scale": np.array(0.01, np.float32)})[0]
    np.testing.assert_array_equal(got, want)


class _TargetKind:
    """The qconv kind, its regions found for `target` (fuse_kind asks a kind's find without one)."""

    def __init__(self, target):
        self.name, self.target = KIND.name, target

    def find(self, model, claimed, rejected):
        return find_regions(model, claimed, rejected, target=self.target)

    def build(self, region, target):
        return KIND.build(region, target)
