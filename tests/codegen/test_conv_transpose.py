"""ConvTranspose kernels (output phases on the channel-vector kernel) through the real pipeline, against onnxruntime,
with the kernel library and with the function fallback (which unpacks the phase-packed weights)."""

from __future__ import annotations

import numpy as np
import pytest
from compute_harness import _const, _model, _vi, _w, check
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from onnxopt.codegen.microkernel.registry import select
from onnxopt.codegen.target import parse_target
from onnxopt.fusion.conv_transpose import (CHANNEL_VECTOR_PERM, PIXEL_VECTOR_PERM, pack_merged_weights,
                                           pack_phase_weights, phases_merged, unpack_phase_weights)

MK = select(parse_target("native"))
needs_vectors = pytest.mark.skipif(MK.lanes < 8, reason="ConvTranspose runs on the channel-vector kernel (8+ lanes)")


def _out_hw(h, w, k, s, d, pads, out_pad):
    return tuple((i - 1) * s[a] - pads[a] - pads[a + 2] + (k[a] - 1) * d[a] + 1 + out_pad[a]
                 for a, i in enumerate((h, w)))


def convt_model(n, ic, oc, h, w, k=(2, 2), s=(2, 2), d=(1, 1), pads=(0, 0, 0, 0), out_pad=(0, 0), bias=True,
                post=(), seed=0, batch_dim=None, opset=17):
    """x -> ConvTranspose [-> post ops] -> y. `post`: "relu", "sigmoid", "bn", "residual" (adds a second input),
    "hardswish" (decomposed)."""
    rng = np.random.default_rng(seed)
    inits = [_const("w", _w(rng, (ic, oc, *k), ic * k[0] * k[1] / (s[0] * s[1])))]
    ins = ["x", "w"]
    if bias:
        inits.append(_const("b", rng.standard_normal(oc) * 0.5))
        ins.append("b")
    attrs = dict(kernel_shape=list(k), strides=list(s), dilations=list(d), pads=list(pads))
    if any(out_pad):
        attrs["output_padding"] = list(out_pad)
    nodes = [helper.make_node("ConvTranspose", ins, ["t0"], **attrs)]
    oh, ow = _out_hw(h, w, k, s, d, pads, out_pad)
    nb = batch_dim or n
    inputs = [_vi("x", [nb, ic, h, w])]
    cur = "t0"
    for i, op in enumerate(post):
        nxt = f"t{i + 1}"
        if op == "relu":
            nodes.append(helper.make_node("Relu", [cur], [nxt]))
        elif op == "sigmoid":
            nodes.append(helper.make_node("Sigmoid", [cur], [nxt]))
        elif op == "bn":
            for p, v in (("g", rng.uniform(0.5, 1.5, oc)), ("beta", rng.standard_normal(oc)),
                         ("m", rng.standard_normal(oc) * 0.1), ("v", rng.uniform(0.5, 2, oc))):
                inits.append(_const(f"bn_{p}", v))
            nodes.append(helper.make_node("BatchNormalization", [cur, "bn_g", "bn_beta", "bn_m", "bn_v"], [nxt]))
        elif op == "residual":
            inputs.append(_vi("r", [nb, oc, oh, ow]))
            nodes.append(helper.make_node("Add", [cur, "r"], [nxt]))
        elif op == "hardswish":
            inits += [_const("three", 3.0), _const("six", 6.0), _const("zero", 0.0)]
            nodes += [helper.make_node("Add", [cur, "three"], [f"{nxt}_a"]),
                      helper.make_node("Clip", [f"{nxt}_a", "zero", "six"], [f"{nxt}_c"]),
                      helper.make_node("Div", [f"{nxt}_c", "six"], [f"{nxt}_d"]),
                      helper.make_node("Mul", [cur, f"{nxt}_d"], [nxt])]
        cur = nxt
    nodes[-1].output[0] = "y"  # the last node's output is `cur`
    return _model(nodes, inputs, [_vi("y", [nb, oc, oh, ow])], inits, opset=opset)


@pytest.mark.parametrize("perm,width", [(CHANNEL_VECTOR_PERM, 64), (PIXEL_VECTOR_PERM, 6)])
def test_phase_packing_round_trips(perm, width):
    rng = np.random.default_rng(0)
    for shape, strides in (((5, 19, 3, 3), (2, 2)), ((4, 7, 2, 4), (2, 3)), ((3, 33, 1, 1), (1, 1))):
        w = rng.standard_normal(shape).astype(np.float32)
        packed = pack_phase_weights(w, strides, width, perm)
        np.testing.assert_array_equal(unpack_phase_weights(packed, shape, perm), w)


def test_merged_packing():
    """Kernel = stride, no pads: rows (a, b, oc) of one matrix, MI at a time."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((5, 3, 2, 2)).astype(np.float32)
    packed = pack_merged_weights(w, 6)  # 12 rows -> 2 blocks
    assert packed.shape == (2, 5, 6)
    for ic, o, a, b in ((0, 0, 0, 0), (4, 2, 1, 1), (3, 1, 0, 1)):
        m = (a * 2 + b) * 3 + o
        assert packed[m // 6, ic, m % 6] == w[ic, o, a, b]
    assert phases_merged((2, 2), (2, 2), (0, 0, 0, 0), (0, 0))
    assert not phases_merged((2, 2), (2, 2), (0, 0, 0, 0), (1, 0))
    assert not phases_merged((4, 4), (2, 2), (1, 1, 1, 1), (0, 0))


def test_phase_blocks_hold_their_taps():
    """Channel vectors: tap (r, c) = (t * sh + a, u * sw + b) of output channel o sits in block (a, b), row
    (t, u, ic), lane o; pixel vectors: in phase block (a, b), channel block o // MI, lane o % MI."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 20, 3, 4)).astype(np.float32)
    cv = pack_phase_weights(w, (2, 3), 16, CHANNEL_VECTOR_PERM)  # [gv, sh, sw, th, tw, ic, 16]
    pv = pack_phase_weights(w, (2, 3), 6, PIXEL_VECTOR_PERM)  # [sh, sw, mb, th, tw, ic, 6]
    for ic, o, r, c in ((0, 0, 0, 0), (2, 19, 2, 3), (1, 7, 1, 2)):
        t, a, u, b = r // 2, r % 2, c // 3, c % 3
        assert cv[o // 16, a, b, t, u, ic, o % 16] == w[ic, o, r, c]
        assert pv[a, b, o // 6, t, u, ic, o % 6] == w[ic, o, r, c]


CORNERS = {
    # the upsampling necks' 2x2 / 2 (OCR detectors, UNet)
    "k2s2": dict(n=1, ic=32, oc=16, h=20, w=20),
    # DCGAN / FCN: 4x4 / 2, pads 1
    "k4s2p1": dict(n=1, ic=24, oc=20, h=9, w=11, k=(4, 4), pads=(1, 1, 1, 1)),
    # 3x3 / 2 with output_padding (the kernel is not a multiple of the stride: a zero tap per phase)
    "k3s2p1op1": dict(n=1, ic=16, oc=17, h=7, w=10, k=(3, 3), pads=(1, 1, 1, 1), out_pad=(1, 1)),
    # stride 1: a plain convolution with a flipped kernel; dilation allowed
    "k3s1d2": dict(n=1, ic=8, oc=33, h=6, w=9, k=(3, 3), s=(1, 1), d=(2, 2), pads=(1, 0, 2, 1)),
    # asymmetric kernel, strides and pads; pads that crop more than the kernel adds
    "asym": dict(n=1, ic=5, oc=3, h=5, w=8, k=(3, 2), s=(3, 2), pads=(2, 0, 1, 1), out_pad=(2, 1)),
    # kernel smaller than the stride: some output phases get no taps at all (bias only)
    "k1s3": dict(n=1, ic=6, oc=18, h=4, w=5, k=(1, 1), s=(3, 3), out_pad=(2, 1)),
    # many channels (several groups of vectors), batch 8, no bias
    "wide-batch8": dict(n=8, ic=40, oc=130, h=5, w=6, k=(2, 2), bias=False),
    # few output channels (pixel vectors): the DBNet head's last layer, a 2x2 / 2 read in place
    "oc1-k2s2": dict(n=2, ic=16, oc=1, h=21, w=37, k=(2, 2)),
    # one plane large enough to be interleaved by several tasks of rows (65,536 outputs and more)
    "oc1-k2s2-rows": dict(n=1, ic=4, oc=1, h=130, w=131, k=(2, 2)),
    # two vectors of channels still on pixel vectors (AVX-512), the phases zipped in vectors
    "oc24-k2s2": dict(n=1, ic=24, oc=24, h=10, w=40, k=(2, 2)),
    # an output narrower than the stride (2 columns, stride 3): two phases a row, not a stride of 2
    "oc2-k2s3-narrow": dict(n=1, ic=3, oc=2, h=2, w=1, k=(2, 2), s=(3, 3)),
    # phases merged into one matrix product, with a per-channel epilogue (BatchNorm) repeated per phase
    "oc7-k3s3-bn": dict(n=3, ic=9, oc=7, h=5, w=13, k=(3, 3), s=(3, 3), post=("bn", "relu")),
    # pixel vectors through the padded copy, uneven phases
    "oc3-k3s2": dict(n=1, ic=7, oc=3, h=9, w=20, k=(3, 3), pads=(1, 1, 1, 1), out_pad=(1, 0)),
    "oc16-k4s2p1": dict(n=1, ic=10, oc=16, h=6, w=35, k=(4, 4), pads=(1, 1, 1, 1)),
}


@needs_vectors
@pytest.mark.parametrize("name", sorted(CORNERS))
def test_conv_transpose_corners(name, tmp_path):
    case = CORNERS[name]
    check(convt_model(**case), tmp_path, ops=None if case.get("post") else "ConvTranspose")


@needs_vectors
@pytest.mark.parametrize("post,ops", [
    (("relu",), "ConvTranspose -> Relu"),
    (("bn", "relu"), "ConvTranspose -> BatchNormalization -> Relu"),
    (("sigmoid",), "ConvTranspose -> Sigmoid"),
    (("residual", "relu"), "ConvTranspose -> Add -> Relu"),
    (("hardswish",), "ConvTranspose -> Add -> Clip -> Div -> Mul"),
])
@pytest.mark.parametrize("oc", [40, 8])  # channel vectors; pixel vectors (channel vectors with a residual)
def test_conv_transpose_epilogues(post, ops, oc, tmp_path):
    m = convt_model(1, 16, oc, 8, 7, k=(4, 4), pads=(1, 1, 1, 1), post=post)
    check(m, tmp_path, ops=ops)


@needs_vectors
def test_conv_transpose_dynamic_batch(tmp_path):
    m = convt_model(1, 12, 20, 6, 6, post=("relu",), batch_dim="N")
    check(m, tmp_path, ops="ConvTranspose -> Relu", runs=({"N": 1}, {"N": 3}, {"N": 0}))


@needs_vectors
@pytest.mark.parametrize("opset", [11, 13, 17])
def test_conv_transpose_fallback_opsets(opset, tmp_path):
    check(convt_model(1, 8, 10, 5, 5, k=(3, 3), pads=(1, 1, 1, 1), out_pad=(1, 1), opset=opset), tmp_path,
          ops="ConvTranspose")


@st.composite
def convt_cases(draw):
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    k = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    d = tuple(draw(st.integers(1, 2)) if s[a] == 1 else 1 for a in range(2))
    pads = tuple(draw(st.integers(0, max(0, k[a % 2] - 1))) for a in range(4))
    out_pad = tuple(draw(st.integers(0, s[a] - 1)) for a in range(2))  # onnxruntime wants it below the stride
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    oh, ow = _out_hw(h, w, k, s, d, pads, out_pad)
    if oh < 1 or ow < 1:
        h, w = h + 4, w + 4
    return dict(n=draw(st.sampled_from([1, 2, 8])), ic=draw(st.integers(1, 20)), oc=draw(st.integers(1, 40)),
                h=h, w=w, k=k, s=s, d=d, pads=pads, out_pad=out_pad, bias=draw(st.booleans()),
                post=draw(st.sampled_from([(), ("relu",), ("bn",)])), seed=draw(st.integers(0, 1000)))


@needs_vectors
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=convt_cases())
def test_random_conv_transposes(case, tmp_path_factory):
    oh, ow = _out_hw(case["h"], case["w"], case["k"], case["s"], case["d"], case["pads"], case["out_pad"])
    if oh < 1 or ow < 1:
        return
    check(convt_model(**case), tmp_path_factory.mktemp("convt"))


def test_conv_transpose_left_to_ort_reasons(tmp_path):
    """Grouped and output_shape forms are left to onnxruntime with a reason in the report."""
    import onnxopt

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["y"], group=2, kernel_shape=[2, 2], strides=[2, 2])]
    m = _model(nodes, [_vi("x", [1, 4, 5, 5])], [_vi("y", [1, 6, 10, 10])], [_const("w", _w(rng, (4, 3, 2, 2), 4))])
    src = str(tmp_path / "m.onnx")
    import onnx
    onnx.save(m, src)
    res = onnxopt.optimize(src, str(tmp_path / "f.onnx"), measure=False)
    assert any("grouped ConvTranspose" in r["reason"] for r in res.report["rejected"]), res.report["rejected"]
