"""int8 tensors passed between qconv kernels in the blocked layout [N, ceil(C / 4), H, W, 4] (kinds/qconv/layout.py):
the kernels that read and write it against exact integer arithmetic, their function fallbacks, and which tensors of
a quantized network the blocked plan passes that way."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from int8_models import (conv_attrs, conv_int, drop_shapes, qdq_conv_model, qdq_unit_operands, quantized_cnn,
                         requantized)
from kind_harness import fuse_kind
from onnx import helper

from onnxopt.codegen.instructions import available
from onnxopt.codegen.target import host_target
from onnxopt.fusion.layout import from_blocked, to_blocked
from onnxopt.kinds.qconv import KIND
from onnxopt.kinds.qconv.find import forced_form
from onnxopt.kinds.qconv.forms import FORMS
from onnxopt.kinds.qconv.layout import convert
from onnxopt.timing import make_session

pytestmark = pytest.mark.skipif(not available(host_target(), ("u8", "s8")),
                                reason="this CPU has no u8 x s8 dot-product instruction (AVX2 or VNNI)")


@settings(max_examples=14, deadline=None)
@given(cin=st.integers(1, 13), cout=st.integers(1, 19) | st.integers(65, 70), r=st.integers(1, 3),
       stride=st.integers(1, 2), pad=st.integers(0, 1), n=st.integers(1, 2), h=st.integers(1, 9),
       w=st.sampled_from([3, 7, 16, 17, 32]), seed=st.integers(0, 2**16), side=st.sampled_from(["in", "out", "both"]),
       signed_in=st.booleans(), signed_out=st.booleans(), relu=st.booleans(), form=st.sampled_from(FORMS))
@example(cin=6, cout=5, r=3, stride=1, pad=1, n=2, h=5, w=16, seed=1, side="both", signed_in=False, signed_out=False,
         relu=True, form="implicit")
@example(cin=9, cout=70, r=1, stride=1, pad=0, n=1, h=3, w=32, seed=2, side="both", signed_in=True, signed_out=True,
         relu=False, form="packed")  # 1x1: whole panels copied as words
@example(cin=10, cout=65, r=3, stride=1, pad=0, n=1, h=8, w=17, seed=625, side="in", signed_in=False, signed_out=False,
         relu=False, form="packed")  # onnxruntime's QDQ conv a step off the spec at one element; the kernel exact
def test_blocked_kernels_are_exact_on_drawn_shapes(tmp_path_factory, cin, cout, r, stride, pad, n, h, w, seed, side,
                                                   signed_in, signed_out, relu, form):
    """A QDQ unit reading and/or writing the blocked layout, odd channels (a partial last group), padding, strides,
    1x1 (a panel's words copied whole), either form where both run (forms.py; `form` forced): bit for bit
    the NCHW kernel's exact requantization, channels past C zero, and the function fallback gives the same blocked
    tensor."""
    attrs = conv_attrs(r, r, stride, pad, 1, h, w)
    if attrs is None:
        return
    rng = np.random.default_rng(seed)
    wt, sw, bias, sx, sy = qdq_unit_operands(rng, cin, cout, r)
    zy = np.int8(rng.integers(-20, 20)) if signed_out else np.uint8(rng.integers(0, 256))
    xt = np.int8 if signed_in else np.uint8
    zx = np.array(rng.integers(0, 256) - 128 * signed_in, xt)
    model = qdq_conv_model(wt, sw, bias, sx, zx, sy, zy, attrs, (n, cin, h, w), relu)
    ib, ob = side in ("in", "both"), side in ("out", "both")
    ib = ib and cin > 1  # one input channel: K runs over the taps, the input stays NCHW (layout.reads_blocked)
    if cin == 1 and cout == 1 or not (ib or ob):  # depthwise: its own tile, never blocked
        return
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info)}
    with forced_form(form):
        fused, lib, region, _ = fuse_kind(KIND, model, tmp_path_factory.mktemp("qb"),
                                          convert=lambda rg: convert(rg, ib, ob, shapes.get, 17))
    assert region.params.tensor_lanes() == 4 and region.params.blocked_io() == (ib, ob)
    drop_shapes(fused, {name for name, on in (("xq", ib), ("y", ob)) if on})
    x = (rng.integers(0, 256, (n, cin, h, w)) - 128 * signed_in).astype(xt)
    exact = conv_int(x, wt, int(zx), 0, attrs["strides"], attrs["pads"], attrs["dilations"])
    want = requantized(exact, bias, sx, sw, sy, zy, relu)
    feeds = {"xq": to_blocked(x, 4) if ib else x}
    got = make_session(fused, 2, library=lib).run(None, feeds)[0]
    if ob:
        assert got.shape == (n, -(-cout // 4), *want.shape[2:], 4)
        np.testing.assert_array_equal(got, to_blocked(from_blocked(got, cout), 4))  # channels past C are zero
        got = from_blocked(got, cout)
    np.testing.assert_array_equal(got.astype(np.int64), want)
    # The function fallback is onnxruntime's own ops on the same tensors: bit for bit what onnxruntime gives for the
    # original model, which may itself be a step off the spec where the scaled sum lies within float32's error of a
    # half (seed 625 below: 55.499977 rounds to 56 there).
    alone = make_session(fused, 1, optimization="none").run(None, feeds)[0]
    original = make_session(model, 1, optimization="none").run(None, {"xq": x})[0]
    np.testing.assert_array_equal(from_blocked(alone, cout) if ob else alone, original)


def _chain(tmp_path, seed: int, qoperator: bool = False, residual: bool = False) -> str:
    """Four convolutions quantized by quantize_static: 3x3 (10 -> 12), 1x1 (-> 7), 3x3 /2 (-> 9), 1x1 (-> 16); with
    `residual`, the first one's output also goes to an Add after the second."""
    rng = np.random.default_rng(seed)
    shapes = (("w1", (12, 10, 3, 3)), ("w2", (7 if not residual else 12, 12, 1, 1)), ("w3", (9, 7, 3, 3)),
              ("w4", (16, 9, 1, 1)))
    if residual:
        shapes = shapes[:2] + (("w3", (9, 12, 3, 3)),) + shapes[3:]
    weights = {n: (rng.standard_normal(s) * 0.3).astype(np.float32) for n, s in shapes}
    weights.update({f"b{i}": (rng.standard_normal(s[0]) * 0.1).astype(np.float32)
                    for i, (_, s) in enumerate(shapes, 1)})
    second = "c2" if not residual else "c2r"
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], [second]),
             helper.make_node("Relu", [second], ["r2"] if not residual else ["r2r"])]
    if residual:
        nodes.append(helper.make_node("Add", ["r2r", "r1"], ["r2"]))
    nodes += [helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1] * 4, strides=[2, 2]),
              helper.make_node("Conv", ["c3", "w4", "b4"], ["y"])]
    quantized_cnn(str(tmp_path), nodes, weights, (2, 10, 19, 21), rng, qoperator=qoperator)
    return str(tmp_path / "q.onnx")


@pytest.mark.parametrize("qoperator", [False, True], ids=["qdq", "qoperator"])
def test_a_quantized_chain_passes_blocked_int8_tensors(tmp_path, qoperator):
    """The blocked plan of a quantize_static chain: every tensor between two of its convolutions goes blocked, read
    by the next kernel with no DequantizeLinear or QuantizeLinear between them; the model checks out exactly, and
    so do its function fallbacks."""
    from onnxopt import optimize

    result = optimize(_chain(tmp_path, 11, qoperator), str(tmp_path / "out.onnx"), measure=False,
                      plan="compute-blocked")
    layouts = [r.get("layout") for r in result.report["regions"] if r["op_type"].startswith("qconv_")]
    assert layouts == ["nchw->blocked", "blocked->blocked", "blocked->blocked", "blocked->nchw"]
    assert result.report["verification"]["ok"] and result.report["fallback_verification"]["ok"]
    out = onnx.load(str(tmp_path / "out.onnx"))
    ops = [n.op_type for n in out.graph.node]
    assert not any(o in ("DequantizeLinear", "QuantizeLinear", "QLinearConv") for o in ops[1:-1]), ops


def test_a_tensor_read_outside_the_kernels_stays_nchw(tmp_path):
    """A convolution's output that a residual Add also reads (through its own DequantizeLinear, run by onnxruntime)
    stays NCHW; the rest of the chain is still blocked."""
    from onnxopt import optimize

    result = optimize(_chain(tmp_path, 12, residual=True), str(tmp_path / "out.onnx"), measure=False,
                      plan="compute-blocked")
    layouts = [r.get("layout") for r in result.report["regions"] if r["op_type"].startswith("qconv_")]
    assert layouts == [None, None, "nchw->blocked", "blocked->nchw"]
    assert result.report["verification"]["ok"] and result.report["fallback_verification"]["ok"]


def test_the_schedule_search_keeps_blocked_tiles_whole_groups():
    """A kernel writing blocked tensors stores groups of 4 channels a tile: only rows of 4 or 8 are searched."""
    from dataclasses import replace

    from onnxopt.kinds.qconv.params import QUANT, QConvParams
    from onnxopt.tune.int8_schedule import schedule_space

    p = QConvParams(cin=8, cout=8, kernel=(1, 1), strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), k4=8, group=1,
                    mode=QUANT, has_asum=False, has_fix=False)
    target = host_target()
    assert {s.mr for s in schedule_space(p, target, 2)} > {4}
    assert {s.mr for s in schedule_space(replace(p, out_blocked=True), target, 2)} <= {4, 8}
