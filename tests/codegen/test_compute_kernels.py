"""Compute kernels (Conv / MatMul / Gemm with fused epilogues) through the real pipeline.

Every test optimizes a model with `onnxopt.optimize` (kernels compiled for this machine, checked, linked), then runs
the written fused.onnx twice: with `onnxopt.runtime.InferenceSession` (the kernel library registered) and with a
plain `onnxruntime.InferenceSession` (no library: the model-local function bodies, which unpack the packed weights).
Both must match the original model run by onnxruntime, and the report must show a compute region, so the kernel
really ran (a kernel that fails the pipeline's own check is left out and would fail the test here).
"""

from __future__ import annotations

import os
import platform
import tempfile

import numpy as np
import pytest
from compute_harness import (
    _compute_regions,
    _const,
    _feeds,
    _model,
    _optimize,
    _run_all,
    _vi,
    _w,
    check,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper
from onnxopt.models.conv_shapes import (
    ALL_CONVS,
    CHIMERA_CONV_CHAINS,
    CHIMERA_CONVS,
    HERON_C2D_LADDER,
    HERON_TABLE9_CONVS,
    OPTIFX_CONVS,
    OPTIFX_SUBGRAPHS,
    UNIT_CONVS,
    ConvShape,
    GemmChain,
    MatMulShape,
    conv_chain_model,
    conv_model,
    gemm_chain_model,
    matmul_model,
    optifx_model,
)

# ---- the papers' conv shapes ------------------------------------------------------------------------------------


def test_shape_tables_are_all_covered():
    tables = {**{f"unit/{k}": v for k, v in UNIT_CONVS.items()},
              **{f"chimera/{k}": v for k, v in CHIMERA_CONVS.items()},
              **{f"optifx/{k}": v for k, v in OPTIFX_CONVS.items()},
              **{f"heron_ladder/{k}": v for k, v in HERON_C2D_LADDER.items()},
              **{f"heron_table9/{k}": v for k, v in HERON_TABLE9_CONVS.items()}}
    assert set(tables) <= set(ALL_CONVS)


@pytest.mark.parametrize("key", sorted(ALL_CONVS))
def test_paper_conv_shapes_batch1(key, tmp_path):
    check(conv_model(ALL_CONVS[key], batch=1), tmp_path, ops="Conv")


BATCH8 = ["unit/U2", "unit/U3", "unit/U15", "chimera/C5.conv1", "chimera/C5.conv2", "optifx/G3.conv2",
          "optifx/G4.conv1", "optifx/G7.conv1", "heron_table9/C2", "heron_table9/C4", "heron_ladder/L6"]


def test_batch8_subset_is_diverse():
    shapes = [ALL_CONVS[k] for k in BATCH8]
    assert len(shapes) >= 8
    assert {s.kernel for s in shapes} >= {1, 3}
    assert {s.stride for s in shapes} >= {1, 2, 4}
    assert any(s.groups > 1 for s in shapes)
    assert any(s.kernel == 1 and s.pad > 0 for s in shapes)  # a 1x1 that is not a plain matmul


@pytest.mark.parametrize("key", BATCH8)
def test_paper_conv_shapes_batch8(key, tmp_path):
    check(conv_model(ALL_CONVS[key], batch=8), tmp_path, ops="Conv")


# ---- random convolutions ----------------------------------------------------------------------------------------


@st.composite
def conv_cases(draw):
    groups_kind = draw(st.sampled_from(["one", "grouped", "depthwise"]))
    if groups_kind == "one":
        groups = 1
        ic_g = draw(st.integers(1, 40))
        oc_g = draw(st.integers(1, 40))
    elif groups_kind == "grouped":
        groups = draw(st.integers(2, 5))
        ic_g = draw(st.integers(1, 40 // groups))
        oc_g = draw(st.integers(1, 40 // groups))
    else:
        groups = draw(st.integers(1, 40))
        ic_g = 1
        oc_g = draw(st.integers(1, max(1, 40 // groups)))
    h = draw(st.integers(0, 11)) * 2 + 1
    w = draw(st.integers(0, 11)) * 2 + 1
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    # onnxruntime rejects dilations with SAME_* auto padding.
    dil = [1, 1] if auto_pad.startswith("SAME") else [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    pads = [draw(st.integers(0, 3)) for _ in range(4)] if auto_pad == "NOTSET" else [0, 0, 0, 0]
    kernel = []
    for axis, size in enumerate((h, w)):
        k = draw(st.integers(1, 5))
        if auto_pad != "SAME_UPPER" and auto_pad != "SAME_LOWER":
            room = size + pads[axis] + pads[axis + 2]
            k = min(k, (room - 1) // dil[axis] + 1)  # the output keeps at least one pixel
        kernel.append(k)
    batch = draw(st.integers(1, 3))
    bias = draw(st.booleans())
    epilogue = draw(st.sampled_from([None, "Relu", "Sigmoid", "residual", "se"]))
    return dict(groups=groups, ic=groups * ic_g, oc=groups * oc_g, h=h, w=w, kernel=kernel, strides=strides,
                dil=dil, pads=pads, auto_pad=auto_pad, batch=batch, bias=bias, epilogue=epilogue)


def _conv_case_model(c, seed=0):
    rng = np.random.default_rng(seed)
    ic_g = c["ic"] // c["groups"]
    w = _w(rng, [c["oc"], ic_g, *c["kernel"]], ic_g * c["kernel"][0] * c["kernel"][1])
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if c["bias"]:
        inits.append(_const("b", rng.standard_normal(c["oc"]) * 0.1))
        ins.append("b")
    attrs = dict(kernel_shape=c["kernel"], strides=c["strides"], dilations=c["dil"], group=c["groups"])
    if c["auto_pad"] == "NOTSET":
        attrs["pads"] = c["pads"]
    else:
        attrs["auto_pad"] = c["auto_pad"]
    conv_out = "y" if c["epilogue"] is None else "c"
    nodes = [helper.make_node("Conv", ins, [conv_out], **attrs)]
    inputs = [_vi("x", [c["batch"], c["ic"], c["h"], c["w"]])]
    out = [c["batch"], c["oc"], *_conv_out_hw(c)]
    if c["epilogue"] == "residual":
        inputs.append(_vi("r", out))
        nodes.append(helper.make_node("Add", ["c", "r"], ["y"]))
    elif c["epilogue"] == "se":
        inputs.append(_vi("s", [c["batch"], c["oc"], 1, 1]))
        nodes.append(helper.make_node("Mul", ["s", "c"], ["y"]))
    elif c["epilogue"]:
        nodes.append(helper.make_node(c["epilogue"], ["c"], ["y"]))
    return _model(nodes, inputs, [_vi("y", out)], inits)


def _conv_out_hw(c):
    hw = []
    for axis, size in enumerate((c["h"], c["w"])):
        s, k_eff = c["strides"][axis], (c["kernel"][axis] - 1) * c["dil"][axis] + 1
        if c["auto_pad"].startswith("SAME"):
            hw.append(-(-size // s))
        else:
            hw.append((size + c["pads"][axis] + c["pads"][axis + 2] - k_eff) // s + 1)
    return hw


def _case_ops(c):
    e = c["epilogue"]
    return "Conv" if e is None else "Conv -> " + {"residual": "Add", "se": "Mul"}.get(e, e)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(conv_cases())
def test_random_convs(case):
    model = _conv_case_model(case)
    with tempfile.TemporaryDirectory() as d:
        check(model, d, ops=_case_ops(case))


# A few of the corners the draws above may miss, always run.
CORNERS = {
    "1x1-input-5x5-kernel-pads": dict(groups=1, ic=3, oc=7, h=1, w=1, kernel=[5, 5], strides=[1, 1], dil=[1, 1],
                                      pads=[2, 2, 2, 2], auto_pad="NOTSET", batch=2, bias=True, epilogue=None),
    "asymmetric-pads-stride3-dil2": dict(groups=1, ic=5, oc=13, h=23, w=17, kernel=[3, 2], strides=[3, 2],
                                         dil=[2, 1], pads=[0, 3, 2, 1], auto_pad="NOTSET", batch=3, bias=True,
                                         epilogue="Relu"),
    "same-lower-stride2": dict(groups=2, ic=8, oc=14, h=9, w=11, kernel=[4, 4], strides=[2, 2], dil=[1, 1],
                               pads=[0, 0, 0, 0], auto_pad="SAME_LOWER", batch=1, bias=False, epilogue=None),
    "same-upper-stride3": dict(groups=1, ic=3, oc=6, h=7, w=13, kernel=[2, 5], strides=[3, 1], dil=[1, 1],
                               pads=[0, 0, 0, 0], auto_pad="SAME_UPPER", batch=2, bias=True, epilogue="Sigmoid"),
    "valid-dilated": dict(groups=1, ic=4, oc=9, h=15, w=15, kernel=[3, 3], strides=[1, 2], dil=[2, 2],
                          pads=[0, 0, 0, 0], auto_pad="VALID", batch=1, bias=True, epilogue=None),
    "depthwise-40": dict(groups=40, ic=40, oc=40, h=21, w=19, kernel=[5, 5], strides=[2, 2], dil=[1, 1],
                         pads=[2, 2, 2, 2], auto_pad="NOTSET", batch=2, bias=True, epilogue="Relu"),
    "depthwise-residual": dict(groups=24, ic=24, oc=24, h=15, w=15, kernel=[3, 3], strides=[1, 1], dil=[1, 1],
                               pads=[1, 1, 1, 1], auto_pad="NOTSET", batch=3, bias=True, epilogue="residual"),
    "grouped-se": dict(groups=4, ic=12, oc=28, h=9, w=13, kernel=[3, 1], strides=[2, 1], dil=[1, 1],
                       pads=[1, 0, 1, 0], auto_pad="NOTSET", batch=3, bias=True, epilogue="se"),
    "grouped-residual-same": dict(groups=3, ic=9, oc=15, h=11, w=7, kernel=[3, 3], strides=[2, 2], dil=[1, 1],
                                  pads=[0, 0, 0, 0], auto_pad="SAME_UPPER", batch=2, bias=False,
                                  epilogue="residual"),
    "depthwise-multiplier-3": dict(groups=13, ic=13, oc=39, h=5, w=7, kernel=[3, 3], strides=[1, 1], dil=[1, 1],
                                   pads=[1, 1, 1, 1], auto_pad="NOTSET", batch=3, bias=False, epilogue=None),
    "one-channel": dict(groups=1, ic=1, oc=1, h=3, w=3, kernel=[1, 1], strides=[1, 1], dil=[1, 1],
                        pads=[0, 0, 0, 0], auto_pad="NOTSET", batch=1, bias=False, epilogue=None),
    "pads-larger-than-kernel": dict(groups=1, ic=2, oc=7, h=5, w=5, kernel=[1, 1], strides=[2, 2], dil=[1, 1],
                                    pads=[3, 0, 0, 3], auto_pad="NOTSET", batch=1, bias=True, epilogue=None),
}


@pytest.mark.parametrize("name", sorted(CORNERS))
def test_conv_corners(name, tmp_path):
    c = CORNERS[name]
    check(_conv_case_model(c), tmp_path, ops=_case_ops(c))


# ---- epilogues --------------------------------------------------------------------------------------------------

N, IC, OC, H, W = 2, 8, 21, 13, 11  # OC not a multiple of MI, W not of the lanes: every tail runs
OUT = [N, OC, H, W]


def _conv_head(rng, bias=True, out="c"):
    inits = [numpy_helper.from_array(_w(rng, [OC, IC, 3, 3], IC * 9), "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(_const("b", rng.standard_normal(OC) * 0.1))
        ins.append("b")
    node = helper.make_node("Conv", ins, [out], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv")
    return [node], inits


def _epilogue_model(kind, seed=0):
    rng = np.random.default_rng(seed)
    nodes, inits = _conv_head(rng)
    inputs = [_vi("x", [N, IC, H, W])]
    outputs = [_vi("y", OUT)]
    n = helper.make_node
    if kind == "relu":
        nodes += [n("Relu", ["c"], ["y"])]
        ops = "Conv -> Relu"
    elif kind == "clip":
        inits += [_const("lo", -0.5), _const("hi", 0.75)]
        nodes += [n("Clip", ["c", "lo", "hi"], ["y"])]
        ops = "Conv -> Clip"
    elif kind == "hardsigmoid":
        nodes += [n("HardSigmoid", ["c"], ["y"], alpha=0.3, beta=0.4)]
        ops = "Conv -> HardSigmoid"
    elif kind == "hardswish":
        inits += [_const("three", 3.0), _const("zero", 0.0), _const("six", 6.0)]
        nodes += [n("Add", ["c", "three"], ["a"]), n("Clip", ["a", "zero", "six"], ["cl"]),
                  n("Mul", ["c", "cl"], ["m"]), n("Div", ["m", "six"], ["y"])]
        ops = "Conv -> Add -> Clip -> Mul -> Div"
    elif kind == "silu":
        nodes += [n("Sigmoid", ["c"], ["s"]), n("Mul", ["c", "s"], ["y"])]
        ops = "Conv -> Sigmoid -> Mul"
    elif kind == "gelu":
        inits += [_const("sqrt2", np.sqrt(2.0)), _const("one", 1.0), _const("half", 0.5)]
        nodes += [n("Div", ["c", "sqrt2"], ["d"]), n("Erf", ["d"], ["e"]), n("Add", ["e", "one"], ["p"]),
                  n("Mul", ["c", "p"], ["q"]), n("Mul", ["q", "half"], ["y"])]
        ops = "Conv -> Div -> Erf -> Add -> Mul -> Mul"
    elif kind == "leakyrelu":
        nodes += [n("LeakyRelu", ["c"], ["y"], alpha=0.07)]
        ops = "Conv -> LeakyRelu"
    elif kind == "residual":
        inputs.append(_vi("r", OUT))
        nodes += [n("Add", ["c", "r"], ["a"]), n("Relu", ["a"], ["y"])]
        ops = "Conv -> Add -> Relu"
    elif kind == "residual-shared":  # a residual without the batch dim: the same for every item
        inputs.append(_vi("r", OUT[1:]))
        nodes += [n("Add", ["r", "c"], ["y"])]
        ops = "Conv -> Add"
    elif kind == "se":
        inputs.append(_vi("s", [N, OC, 1, 1]))
        nodes += [n("Mul", ["c", "s"], ["y"])]
        ops = "Conv -> Mul"
    elif kind == "se-sigmoid":  # the SE gate as exported: Sigmoid of a per-channel tensor, then Mul
        inputs.append(_vi("s", [N, OC, 1, 1]))
        nodes += [n("Sigmoid", ["s"], ["g"]), n("Mul", ["c", "g"], ["y"])]
        ops = None  # the Sigmoid of the gate is outside the conv's chain
    elif kind == "channel-const":  # a per-channel constant scale [OC, 1, 1], as a folded BN would leave
        inits += [_const("k", rng.standard_normal((OC, 1, 1)))]
        nodes += [n("Mul", ["c", "k"], ["y"])]
        ops = "Conv -> Mul"
    elif kind == "scalar-input":  # a runtime scalar
        inputs.append(_vi("s", []))
        nodes += [n("Mul", ["c", "s"], ["y"])]
        ops = "Conv -> Mul"
    elif kind == "batchnorm":
        nodes, inits = _conv_head(rng, bias=True, out="c")
        inits += [_const("bn_s", rng.uniform(0.5, 1.5, OC)), _const("bn_b", rng.standard_normal(OC) * 0.1),
                  _const("bn_m", rng.standard_normal(OC) * 0.1), _const("bn_v", rng.uniform(0.5, 2.0, OC))]
        nodes += [n("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], epsilon=1e-3),
                  n("Relu", ["bn"], ["y"])]
        ops = "Conv -> BatchNormalization -> Relu"
    elif kind == "batchnorm-nobias":
        nodes, inits = _conv_head(rng, bias=False, out="c")
        inits += [_const("bn_s", rng.uniform(0.5, 1.5, OC)), _const("bn_b", rng.standard_normal(OC) * 0.1),
                  _const("bn_m", rng.standard_normal(OC) * 0.1), _const("bn_v", rng.uniform(0.5, 2.0, OC))]
        nodes += [n("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["y"])]
        ops = "Conv -> BatchNormalization"
    elif kind == "two-outputs":
        inits += [_const("three", 3.0), _const("zero", 0.0), _const("six", 6.0)]
        nodes += [n("Add", ["c", "three"], ["a"]), n("Clip", ["a", "zero", "six"], ["cl"]),
                  n("Mul", ["c", "cl"], ["y"])]
        outputs.append(_vi("cl", OUT))
        ops = "Conv -> Add -> Clip -> Mul"
    elif kind == "conv-output-too":  # the conv's own output is a graph output as well
        nodes += [n("Relu", ["c"], ["y"])]
        outputs.append(_vi("c", OUT))
        ops = "Conv -> Relu"
    elif kind == "long-chain":
        inputs += [_vi("r", OUT), _vi("s", [N, OC, 1, 1])]
        inits += [_const("three", 3.0), _const("zero", 0.0), _const("six", 6.0)]
        nodes += [n("Add", ["c", "r"], ["a1"]), n("Add", ["a1", "three"], ["a"]),
                  n("Clip", ["a", "zero", "six"], ["cl"]), n("Mul", ["a1", "cl"], ["m"]),
                  n("Div", ["m", "six"], ["hs"]), n("Mul", ["hs", "s"], ["y"])]
        ops = "Conv -> Add -> Add -> Clip -> Mul -> Div -> Mul"
    else:
        raise AssertionError(kind)
    return _model(nodes, inputs, outputs, inits), ops


EPILOGUE_KINDS = ["relu", "clip", "hardsigmoid", "hardswish", "silu", "gelu", "leakyrelu", "residual",
                  "residual-shared", "se", "se-sigmoid", "channel-const", "scalar-input", "batchnorm",
                  "batchnorm-nobias", "two-outputs", "conv-output-too", "long-chain"]


@pytest.mark.parametrize("kind", EPILOGUE_KINDS)
def test_conv_epilogues(kind, tmp_path):
    model, ops = _epilogue_model(kind)
    res, fused = check(model, tmp_path, ops=ops)
    if kind in ("two-outputs", "conv-output-too"):
        (region,) = _compute_regions(res.report)
        assert len(region["outputs"]) == 2
    if kind.startswith("batchnorm"):
        # Folded: no BatchNormalization left in the graph, nor in the fallback body.
        assert "BatchNormalization" not in [nd.op_type for nd in fused.graph.node]
        assert all("BatchNormalization" not in [nd.op_type for nd in f.node] for f in fused.functions)


@pytest.mark.parametrize("epilogue", ["relu", "hardswish", "silu", "gelu", "clip6", "leakyrelu", "residual", "se",
                                      ["se", "residual"]])
def test_conv_builder_epilogues(epilogue, tmp_path):
    shape = ConvShape("t", 16, 15, 15, 30, 3, 2, 1)
    check(conv_model(shape, batch=2, epilogue=epilogue), tmp_path)


# ---- MatMul / Gemm ----------------------------------------------------------------------------------------------


def _matmul(a_shape, b_shape, *, b_const=False, a_const=False, seed=0, post=(), inits=(), inputs=()):
    rng = np.random.default_rng(seed)
    inputs, inits = list(inputs), list(inits)
    if a_const:
        inits.append(numpy_helper.from_array(_w(rng, a_shape, a_shape[-1]), "A"))
    else:
        inputs.append(_vi("A", a_shape))
    if b_const:
        inits.append(numpy_helper.from_array(_w(rng, b_shape, b_shape[-2]), "B"))
    else:
        inputs.append(_vi("B", b_shape))
    nodes = [helper.make_node("MatMul", ["A", "B"], ["y" if not post else "mm"])]
    nodes += list(post)
    return _model(nodes, inputs, [_vi("y", None)], inits)


@pytest.mark.parametrize("a_shape,b_shape,b_const", [
    ([3, 7, 33], [3, 33, 65], False),  # batched 3-D x 3-D
    ([3, 17, 40], [40, 70], True),  # 3-D x 2-D constant weight
    ([3, 17, 40], [40, 70], False),  # 3-D x 2-D runtime
    ([2, 1, 9, 20], [1, 3, 20, 37], False),  # batch broadcast both ways
    ([2, 3, 9, 20], [20, 37], True),
    ([5, 16], [1, 16, 24], False),  # 2-D x 3-D: A shared over B's batch
    ([1, 4, 11, 5], [2, 1, 5, 18], False),
    ([64, 64], [64, 64], True),
    ([2, 3, 4, 6, 8], [8, 17], True),  # rank 5
])
def test_matmul_shapes(a_shape, b_shape, b_const, tmp_path):
    check(_matmul(a_shape, b_shape, b_const=b_const), tmp_path, ops="MatMul")


ODD = (1, 7, 63, 65, 130)


def _odd_cases():
    for i, m in enumerate(ODD):
        for j, n in enumerate(ODD):
            yield m, ODD[(i + j) % len(ODD)], n
    for k in ODD:
        yield 65, k, 7


@pytest.mark.parametrize("m,k,n", sorted(set(_odd_cases())))
def test_matmul_odd_sizes(m, k, n, tmp_path):
    check(_matmul([m, k], [k, n], b_const=True, seed=m * 1000 + k * 10 + n), tmp_path, ops="MatMul")


def test_matmul_bias_gelu_chain(tmp_path):
    rng = np.random.default_rng(3)
    n = helper.make_node
    post = [n("Add", ["mm", "bias"], ["a"]), n("Div", ["a", "sqrt2"], ["d"]), n("Erf", ["d"], ["e"]),
            n("Add", ["e", "one"], ["p"]), n("Mul", ["a", "p"], ["q"]), n("Mul", ["q", "half"], ["y"])]
    m = _matmul([2, 13, 48], [48, 96], b_const=True, post=post,
                inits=[_const("bias", rng.standard_normal(96) * 0.1), _const("sqrt2", np.sqrt(2.0)),
                       _const("one", 1.0), _const("half", 0.5)])
    check(m, tmp_path, ops="MatMul -> Add -> Div -> Erf -> Add -> Mul -> Mul")


@pytest.mark.parametrize("epilogue", ["relu", "gelu", "se", "residual"])
def test_matmul_builder_epilogues(epilogue, tmp_path):
    check(matmul_model(MatMulShape("t", 3, 37, 29, 70), bias=True, epilogue=epilogue), tmp_path)


def _gemm(m, k, n, *, trans_a=0, trans_b=0, alpha=1.0, beta=1.0, c_shape=None, c_const=True, b_const=True,
          seed=0, post=()):
    rng = np.random.default_rng(seed)
    a_shape = [k, m] if trans_a else [m, k]
    b_shape = [n, k] if trans_b else [k, n]
    inputs = [_vi("A", a_shape)]
    inits = []
    if b_const:
        inits.append(numpy_helper.from_array(_w(rng, b_shape, k), "B"))
    else:
        inputs.append(_vi("B", b_shape))
    ins = ["A", "B"]
    if c_shape is not None:
        if c_const:
            inits.append(_const("C", rng.standard_normal(c_shape)))
        else:
            inputs.append(_vi("C", c_shape))
        ins.append("C")
    attrs = {}
    if trans_a:
        attrs["transA"] = 1
    if trans_b:
        attrs["transB"] = 1
    if alpha != 1.0:
        attrs["alpha"] = alpha
    if beta != 1.0:
        attrs["beta"] = beta
    nodes = [helper.make_node("Gemm", ins, ["y" if not post else "g"], **attrs)] + list(post)
    return _model(nodes, inputs, [_vi("y", [m, n])], inits)



GEMMS = {
    "plain": dict(m=19, k=37, n=70),
    "transA": dict(m=19, k=37, n=70, trans_a=1),
    "transB": dict(m=19, k=37, n=70, trans_b=1),
    "transA-transB": dict(m=23, k=9, n=33, trans_a=1, trans_b=1, c_shape=[23, 1]),
    "alpha": dict(m=19, k=37, n=70, alpha=0.37),
    "alpha-transB": dict(m=19, k=37, n=70, alpha=-1.5, trans_b=1, c_shape=[19, 70]),
    "C[M,N]": dict(m=19, k=37, n=70, c_shape=[19, 70]),
    "beta-C[M,N]": dict(m=19, k=37, n=70, beta=2.5, c_shape=[19, 70]),
    "C[M,1]": dict(m=19, k=37, n=70, c_shape=[19, 1]),
    "beta-C[M,1]": dict(m=19, k=37, n=70, beta=-0.25, c_shape=[19, 1]),
    "C-scalar": dict(m=19, k=37, n=70, c_shape=[]),
    "C[1]": dict(m=19, k=37, n=70, c_shape=[1]),
    "C[1,1]": dict(m=19, k=37, n=70, c_shape=[1, 1]),
    "beta-C-scalar": dict(m=19, k=37, n=70, beta=3.0, c_shape=[]),
    "runtime-C[M,N]": dict(m=19, k=37, n=70, c_shape=[19, 70], c_const=False),
    "runtime-C[M,1]": dict(m=19, k=37, n=70, c_shape=[19, 1], c_const=False),
    "runtime-B": dict(m=19, k=37, n=70, b_const=False, c_shape=[19, 1]),
    "runtime-B-transA": dict(m=19, k=37, n=70, b_const=False, trans_a=1),
    "all": dict(m=7, k=130, n=63, trans_a=1, trans_b=1, alpha=0.5, beta=-2.0, c_shape=[7, 63]),
    "M=1": dict(m=1, k=64, n=33, trans_b=1, c_shape=[1, 33]),
    # C as a row: nn.Linear exported as Gemm. All hit the same classification bug.
    "C[N]": dict(m=19, k=37, n=70, c_shape=[70]),
    "C[1,N]": dict(m=19, k=37, n=70, c_shape=[1, 70]),
    "beta-C[N]": dict(m=19, k=37, n=70, beta=0.5, c_shape=[70]),
    "runtime-C[N]": dict(m=19, k=37, n=70, c_shape=[70], c_const=False),
    "linear-transB-C[N]": dict(m=8, k=64, n=48, trans_b=1, c_shape=[48]),
}
ROW_C = {"C[N]", "C[1,N]", "beta-C[N]", "runtime-C[N]", "linear-transB-C[N]"}


@pytest.mark.parametrize("name", list(GEMMS))
def test_gemm(name, tmp_path):
    check(_gemm(**GEMMS[name]), tmp_path, ops="Gemm")


def test_gemm_relu(tmp_path):
    m = _gemm(33, 40, 50, trans_b=1, c_shape=[33, 50], post=[helper.make_node("Relu", ["g"], ["y"])])
    check(m, tmp_path, ops="Gemm -> Relu")


def test_matmul_2d_with_row_bias(tmp_path):
    """x [M, K] @ W + b[N]: the Linear layer of most exported MLPs."""
    rng = np.random.default_rng(4)
    m = _matmul([19, 37], [37, 70], b_const=True, post=[helper.make_node("Add", ["mm", "bias"], ["y"])],
                inits=[_const("bias", rng.standard_normal(70))])
    check(m, tmp_path, ops="MatMul -> Add")


# ---- a constant B packed in panels (transformer projections) ------------------------------------------------------
# The kernel runs K in blocks of 256 columns of A on AVX2 (128 on AVX-512) once K passes 1.5 blocks, keeping the
# partial sums between blocks; these shapes take one, two and several blocks, with M and N off the tile's edges. The
# last one splits into tasks over both panels and rows, with more panels per task than one group (compute_exec.c,
# ct_plan_packed and ct_packed_group).


@pytest.mark.parametrize("m,k,n", [(7, 385, 33), (13, 700, 70), (1, 1000, 16), (65, 513, 130), (6, 384, 17),
                                   (203, 520, 600)])
def test_matmul_packed_b_over_k_blocks(m, k, n, tmp_path):
    """x [2, M, K] @ W + b + residual: the sums of every K block reach the epilogue once, on every row and column."""
    rng = np.random.default_rng(m + k + n)
    post = [helper.make_node("Add", ["mm", "bias"], ["a"]), helper.make_node("Add", ["a", "R"], ["y"])]
    model = _matmul([2, m, k], [k, n], b_const=True, post=post, inits=[_const("bias", rng.standard_normal(n))],
                    inputs=[_vi("R", [2, m, n])])
    check(model, tmp_path, ops="MatMul -> Add -> Add")


@pytest.mark.parametrize("form", ["tanh", "sigmoid"])
def test_packed_b_with_the_other_gelu_forms(form, tmp_path):
    """GELU as GPT-2 writes it (0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))) and its sigmoid approximation
    (x sigmoid(1.702 x)), fused after the bias into one kernel with a K of two blocks."""
    rng = np.random.default_rng(11)
    n = helper.make_node
    if form == "tanh":
        post = [n("Add", ["mm", "bias"], ["a"]), n("Pow", ["a", "three"], ["c"]), n("Mul", ["c", "k1"], ["c1"]),
                n("Add", ["a", "c1"], ["i"]), n("Mul", ["i", "k2"], ["i2"]), n("Tanh", ["i2"], ["t"]),
                n("Add", ["t", "one"], ["p"]), n("Mul", ["a", "half"], ["h"]), n("Mul", ["h", "p"], ["y"])]
        consts = [_const("three", 3.0), _const("k1", 0.044715), _const("k2", np.sqrt(2 / np.pi)), _const("one", 1.0),
                  _const("half", 0.5)]
        ops = "MatMul -> Add -> Pow -> Mul -> Add -> Mul -> Tanh -> Add -> Mul -> Mul"
    else:
        post = [n("Add", ["mm", "bias"], ["a"]), n("Mul", ["a", "k"], ["ak"]), n("Sigmoid", ["ak"], ["s"]),
                n("Mul", ["a", "s"], ["y"])]
        consts = [_const("k", 1.702)]
        ops = "MatMul -> Add -> Mul -> Sigmoid -> Mul"
    model = _matmul([1, 21, 500], [500, 72], b_const=True, post=post,
                    inits=[_const("bias", rng.standard_normal(72) * 0.1)] + consts)
    check(model, tmp_path, ops=ops)


def test_packed_b_with_an_empty_k(tmp_path):
    """K = 0: an empty sum; the epilogue still runs (the output is the bias)."""
    rng = np.random.default_rng(2)
    model = _matmul([2, 3, 0], [0, 20], b_const=True, post=[helper.make_node("Add", ["mm", "bias"], ["y"])],
                    inits=[_const("bias", rng.standard_normal(20))])
    check(model, tmp_path, ops="MatMul -> Add")


def test_packed_b_layout_and_fallback(tmp_path):
    """B is stored as [ceil(N / P)][K][P], zero past N; the function fallback unpacks it (Transpose, Reshape, Slice)
    and multiplies, so the model runs without the library (check() runs it both ways)."""
    from onnxopt.codegen.microkernel.registry import select
    from onnxopt.codegen.target import host_target

    tile = select(host_target()).packed_b_tile
    panel = tile.ni * tile.lanes
    k, n = 40, panel + 5
    model = _matmul([3, 9, k], [k, n], b_const=True)
    _, fused = check(model, tmp_path, ops="MatMul")
    packed = [numpy_helper.to_array(t) for t in fused.graph.initializer if t.name.endswith("__packed_b")]
    assert len(packed) == 1 and packed[0].shape == (2, k, panel)
    b = numpy_helper.to_array(model.graph.initializer[0])
    assert np.array_equal(packed[0][0], b[:, :panel]) and np.array_equal(packed[0][1][:, :5], b[:, panel:])
    assert not packed[0][1][:, 5:].any()
    assert {"Transpose", "Reshape", "Slice", "MatMul"} <= {nd.op_type for nd in fused.functions[0].node}


def test_packed_b_with_a_symbolic_sequence(tmp_path):
    """Tokens known only at run time: one fused model serves every sequence length, with GELU (erf) fused."""
    rng = np.random.default_rng(5)
    n = helper.make_node
    post = [n("Add", ["mm", "bias"], ["a"]), n("Div", ["a", "sqrt2"], ["d"]), n("Erf", ["d"], ["e"]),
            n("Add", ["e", "one"], ["p"]), n("Mul", ["a", "p"], ["q"]), n("Mul", ["q", "half"], ["y"])]
    model = _matmul([1, "seq", 64], [64, 96], b_const=True, post=post,
                    inits=[_const("bias", rng.standard_normal(96) * 0.1), _const("sqrt2", np.sqrt(2.0)),
                           _const("one", 1.0), _const("half", 0.5)])
    check(model, tmp_path, ops="MatMul -> Add -> Div -> Erf -> Add -> Mul -> Mul",
          runs=tuple({"seq": s} for s in (1, 7, 32, 128, 384, 512)))


@pytest.mark.parametrize("bias_shape", [[19, 1], [19, 70], [1, 1], []])
def test_matmul_2d_with_other_epilogue_inputs(bias_shape, tmp_path):
    rng = np.random.default_rng(4)
    m = _matmul([19, 37], [37, 70], b_const=True, post=[helper.make_node("Add", ["mm", "bias"], ["y"])],
                inits=[_const("bias", rng.standard_normal(bias_shape))])
    check(m, tmp_path, ops="MatMul -> Add")




def test_conv_plus_its_own_input(tmp_path):
    """x + DWConv(x): conditional position encodings (PVT, Twins) and many residual depthwise blocks."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(_w(rng, [16, 1, 3, 3], 9), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=16, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["y"])]
    check(_model(nodes, [_vi("x", [2, 16, 9, 9])], [_vi("y", [2, 16, 9, 9])], [w]), tmp_path, ops="Conv -> Add")


def test_matmul_plus_its_own_input(tmp_path):
    m = _matmul([3, 24, 24], [24, 24], b_const=True, post=[helper.make_node("Add", ["mm", "A"], ["y"])])
    check(m, tmp_path, ops="MatMul -> Add")


# ---- several compute ops in one model ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["G3", "G4", "G5", "G6", "G7"])
def test_optifx_subgraphs(name, tmp_path):
    check(optifx_model(name), tmp_path, n_compute=len(OPTIFX_SUBGRAPHS[name].convs))


def test_conv_chain(tmp_path):
    res, _ = check(conv_chain_model(CHIMERA_CONV_CHAINS["C7"], batch=2), tmp_path, n_compute=2)
    assert sorted(r["ops"] for r in _compute_regions(res.report)) == ["Conv", "Conv -> Relu"]


@pytest.mark.parametrize("middle", [None, "relu"])
def test_gemm_chain(tmp_path, middle):
    """Chimera's batched GEMM chain (B and D computed at run time) is one kernel, the attention kind's with the Relu
    or nothing in place of its softmax: the first product never leaves the block's scratch."""
    model = gemm_chain_model(GemmChain("t", 2, 48, 40, 33, 70), middle=middle)
    src, out, res = _optimize(model, str(tmp_path))
    regions = res.report["regions"]
    assert [r["ops"] for r in regions] == ["MatMul -> Relu -> MatMul" if middle else "MatMul -> MatMul"], regions
    assert regions[0]["op_type"].startswith("attention_")
    _run_all(src, out, _feeds(model, np.random.default_rng(0)), {regions[0]["op_type"]})


# ---- dynamic batch ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("epilogue", [None, "residual", "se", ["hardswish", "se"]])
def test_dynamic_batch_conv(epilogue, tmp_path):
    shape = ConvShape("dyn", 12, 17, 17, 20, 3, 1, 1)
    model = conv_model(shape, epilogue=epilogue, dynamic=True)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    _, fused = check(model, tmp_path, runs=({"batch": 1}, {"batch": 3}, {"batch": 0}))
    assert fused.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_dynamic_batch_matmul(tmp_path):
    model = matmul_model(MatMulShape("dyn", 1, 21, 30, 40), bias=True, epilogue="relu", dynamic=True)
    check(model, tmp_path, runs=({"batch": 1}, {"batch": 3}))


# ---- the other micro-kernels (AVX2, SSE) in the real glue -------------------------------------------------------


def _target_models():
    yield "conv3x3-residual", lambda: conv_model(ConvShape("t", 16, 15, 33, 30, 3, 1, 1), batch=2, epilogue="residual")
    yield "conv1x1-se", lambda: conv_model(ConvShape("t", 16, 15, 15, 13, 1, 1, 0), batch=2, epilogue="se")
    yield "conv-s2-small", lambda: conv_model(ConvShape("t", 8, 14, 14, 13, 3, 2, 1), epilogue="relu")
    yield "depthwise-hardswish", lambda: conv_model(ConvShape("t", 12, 14, 14, 12, 3, 1, 1, groups=12),
                                                    epilogue="hardswish")
    yield "matmul-bias-gelu", lambda: matmul_model(MatMulShape("t", 3, 37, 29, 70), bias=True, epilogue="gelu")
    yield "gemm-transA", lambda: _gemm(19, 37, 70, trans_a=1, c_shape=[19, 1])


@pytest.mark.parametrize("name,build", list(_target_models()), ids=[n for n, _ in _target_models()])
@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64"])
def test_other_targets(target, name, build, tmp_path):
    from onnxopt.codegen.target import missing_cpu_flags, parse_target

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 level targets")
    t = parse_target(target)
    missing = missing_cpu_flags(t.required_cpu_flags)
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(missing)} for {target}")
    res, _ = check(build(), tmp_path, target=target)
    assert res.report["target"]["name"] == target


# ---- packaging --------------------------------------------------------------------------------------------------


def test_compute_packages_are_listed_for_installation():
    """pyproject.toml lists the packages explicitly: new sub-packages must be listed or a wheel lacks them."""
    tomllib = pytest.importorskip("tomllib")

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    codegen = os.path.join(root, "codegen")
    subpackages = {f"onnxopt.codegen.{d}" for d in os.listdir(codegen)
                   if os.path.exists(os.path.join(codegen, d, "__init__.py"))}
    assert {"onnxopt.codegen.compute", "onnxopt.codegen.microkernel"} <= subpackages
    missing = sorted(subpackages - listed)
    assert not missing, f"not in pyproject.toml's packages: {missing}"
