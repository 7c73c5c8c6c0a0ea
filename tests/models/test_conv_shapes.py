"""The seed papers' benchmark shapes: the tables as printed, and the single-op / chain builders (valid ONNX that runs
in onnxruntime with the expected shapes and values)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxopt.models import conv_shapes as cs
from onnxopt.models import random_inputs

from onnxopt.errors import UsageError

FUSED_OPS = {"HardSwish", "HardSigmoid", "Gelu", "Silu", "Swish", "Relu6", "FusedConv", "FusedMatMul"}


def check(model: onnx.ModelProto):
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 9
    assert not FUSED_OPS & {n.op_type for n in model.graph.node}


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def run(model: onnx.ModelProto, feeds: dict | None = None, **kw) -> np.ndarray:
    feeds = random_inputs(model, **kw) if feeds is None else feeds
    (y,) = session(model).run(None, feeds)
    return y


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


# --- the tables ---------------------------------------------------------------------------------------------------

def test_table_sizes():
    assert len(cs.UNIT_CONVS) == 16 and list(cs.UNIT_CONVS) == [f"U{i}" for i in range(1, 17)]
    assert len(cs.CHIMERA_CONV_CHAINS) == 8 and len(cs.CHIMERA_CONVS) == 16
    assert len(cs.CHIMERA_GEMM_CHAINS) == 12 and len(cs.CHIMERA_MATMULS) == 24
    assert len(cs.OPTIFX_SUBGRAPHS) == 7 and len(cs.OPTIFX_CONVS) == 16
    assert len(cs.HERON_C2D_LADDER) == 6 and len(cs.HERON_TABLE9_CONVS) == 5
    assert len(cs.ALL_CONVS) == 16 + 16 + 16 + 6 + 5 and len(cs.ALL_MATMULS) == 24
    assert "chimera/C1.conv2" in cs.ALL_CONVS and "chimera/G12.gemm2" in cs.ALL_MATMULS
    assert all(key.endswith("/" + s.name) for key, s in cs.ALL_CONVS.items())


def test_unit_table1_output_size_formula():
    for i, (name, s) in enumerate(cs.UNIT_CONVS.items()):
        assert (s.c_in, s.height, s.c_out, s.kernel, s.stride) == (
            cs.UNIT_C[i], cs.UNIT_IHW[i], cs.UNIT_K[i], cs.UNIT_RS[i], cs.UNIT_STRIDE[i]), name
        assert s.pad == 0 and s.batch == 1 and s.height == s.width
        expected = (s.height - s.kernel) // s.stride + 1
        assert s.out_hw == (expected, expected) == (cs.UNIT_OHW[i], cs.UNIT_OHW[i]), name
    u1 = cs.UNIT_CONVS["U1"]
    assert (u1.c_in, u1.height, u1.c_out, u1.kernel, u1.stride, u1.out_hw) == (288, 35, 384, 3, 2, (17, 17))


def test_chimera_conv_chains():
    c1 = cs.CHIMERA_CONV_CHAINS["C1"]
    assert c1.conv1 == cs.ConvShape("C1.conv1", 64, 112, 112, 192, 3, 2, 1)
    assert c1.conv2 == cs.ConvShape("C1.conv2", 192, 56, 56, 128, 1, 1, 0)
    c6 = cs.CHIMERA_CONV_CHAINS["C6"]
    assert (c6.conv1.kernel, c6.conv1.pad, c6.conv2.kernel, c6.conv2.pad) == (1, 0, 3, 1)
    for chain in cs.CHIMERA_CONV_CHAINS.values():
        a, b = chain.conv1, chain.conv2
        assert (b.c_in, b.height, b.width) == (a.c_out, *a.out_hw)
        assert a.pad == chain.k1 // 2 and b.pad == chain.k2 // 2 and a.batch == b.batch == 1
    # pads k // 2 (Chimera's artifact): C2 and C5 keep one more row than floor(H / st1)
    assert cs.CHIMERA_CONV_CHAINS["C2"].conv1.out_hw == (74, 74)
    assert cs.CHIMERA_CONV_CHAINS["C5"].conv1.out_hw == (57, 57)


def test_chimera_gemm_chains():
    g1 = cs.CHIMERA_GEMM_CHAINS["G1"]
    assert cs.CHIMERA_MATMULS["G1.gemm1"] == g1.gemm1 == cs.MatMulShape("G1.gemm1", 8, 512, 64, 512)
    assert cs.CHIMERA_MATMULS["G1.gemm2"] == g1.gemm2 == cs.MatMulShape("G1.gemm2", 8, 512, 512, 64)
    g6 = cs.CHIMERA_GEMM_CHAINS["G6"]
    assert (g6.batch, g6.m, g6.n, g6.k, g6.l) == (16, 256, 80, 80, 256)
    assert g6.gemm1.a_shape() == [16, 256, 80] and g6.gemm2.output_shape() == [16, 256, 80]
    g12 = cs.CHIMERA_GEMM_CHAINS["G12"]
    assert g12.gemm1.a_shape() == [1, 1024, 64] and g12.gemm2.b_shape() == [1, 512, 64]


def test_optifx_member_convs_reproduce_the_paper_intensity():
    """OptiFX Eq. 3 summed over a sub-graph's convs: pads 0 for G1 and 1 for the 3x3 convs of G3/G4 reproduce it."""
    for name, digits in (("G1", 157.09), ("G3", 22.93), ("G4", 3.27)):
        sub = cs.OPTIFX_SUBGRAPHS[name]
        flops = sum(c.flops() for c in sub.convs)
        moved = sum(c.bytes() for c in sub.convs)
        assert flops / moved == pytest.approx(digits, abs=0.01), name
        assert sub.intensity[0] == digits
    g4 = cs.OPTIFX_SUBGRAPHS["G4"].convs
    assert g4[0].groups == 144 and g4[0].out_hw == (28, 28) and g4[1].height == 28
    assert [c.c_in for c in cs.OPTIFX_SUBGRAPHS["G5"].convs] == [128, 16, 16]  # as printed
    assert {g.pattern for g in cs.OPTIFX_SUBGRAPHS.values()} == {"SISO", "SIMO", "MISO"}


def test_heron_shapes():
    assert all(s.batch == 16 for s in cs.HERON_C2D_LADDER.values())
    assert [(s.height, s.c_in, s.c_out, s.kernel, s.stride) for s in cs.HERON_C2D_LADDER.values()] == [
        (56, 64, 64, 3, 1), (56, 64, 64, 1, 1), (28, 128, 128, 3, 1), (28, 128, 256, 1, 2), (14, 256, 256, 3, 1),
        (14, 256, 512, 1, 2)]
    c2, c4 = cs.HERON_TABLE9_CONVS["C2"], cs.HERON_TABLE9_CONVS["C4"]
    assert (c2.batch, c2.c_in, c2.c_out, c2.kernel, c2.pad, c2.out_hw) == (8, 512, 128, 1, 1, (30, 30))
    assert (c4.batch, c4.out_hw) == (32, (5, 5))


# --- builders: every shape ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", list(cs.ALL_CONVS))
def test_conv_model_every_shape(key):
    s = cs.ALL_CONVS[key]
    m = cs.conv_model(s)
    check(m)
    assert ops(m) == ["Conv"]
    w, b = m.graph.initializer
    assert list(w.dims) == s.weight_shape() and list(b.dims) == [s.c_out]
    std = onnx.numpy_helper.to_array(w).std()
    assert std == pytest.approx(1 / math.sqrt(w.dims[1] * w.dims[2] * w.dims[3]), rel=0.2)
    y = run(m)
    assert list(y.shape) == s.output_shape() and np.isfinite(y).all()


@pytest.mark.parametrize("key", list(cs.ALL_MATMULS))
def test_matmul_model_every_shape(key):
    s = cs.ALL_MATMULS[key]
    m = cs.matmul_model(s)
    check(m)
    assert ops(m) == ["MatMul"] and not m.graph.initializer
    assert [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in m.graph.input] == [s.a_shape(), s.b_shape()]
    feeds = random_inputs(m)
    y = run(m, feeds)
    assert list(y.shape) == s.output_shape()
    np.testing.assert_allclose(y, feeds["A"] @ feeds["B"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(cs.CHIMERA_CONV_CHAINS))
def test_conv_chain_model(name):
    chain = cs.CHIMERA_CONV_CHAINS[name]
    m = cs.conv_chain_model(chain)
    check(m)
    assert ops(m) == ["Conv", "Relu", "Conv"]
    y = run(m)
    assert list(y.shape) == chain.conv2.output_shape() and np.isfinite(y).all()


def test_conv_chain_without_relu_equals_two_convs():
    chain = cs.CHIMERA_CONV_CHAINS["C7"]._replace(h=14, w=14)
    m = cs.conv_chain_model(chain, relu=False, seed=5)
    assert ops(m) == ["Conv", "Conv"]
    feeds = random_inputs(m)
    y = run(m, feeds)
    w = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    x = feeds["input"]
    for conv in ("conv1", "conv2"):  # both 1x1: channel mixing
        x = np.einsum("nchw,kc->nkhw", x, w[f"{conv}.weight"][:, :, 0, 0]) + w[f"{conv}.bias"][None, :, None, None]
    np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(cs.CHIMERA_GEMM_CHAINS))
def test_gemm_chain_model(name):
    chain = cs.CHIMERA_GEMM_CHAINS[name]
    m = cs.gemm_chain_model(chain)
    check(m)
    assert ops(m) == ["MatMul", "MatMul"] and [i.name for i in m.graph.input] == ["A", "B", "D"]
    feeds = random_inputs(m)
    y = run(m, feeds)
    assert list(y.shape) == [chain.batch, chain.m, chain.n]
    np.testing.assert_allclose(y, feeds["A"] @ feeds["B"] @ feeds["D"], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("middle", ["relu", "softmax"])
def test_gemm_chain_middle_op(middle):
    chain = cs.CHIMERA_GEMM_CHAINS["G10"]
    m = cs.gemm_chain_model(chain, middle=middle)
    check(m)
    assert ops(m) == ["MatMul", "Relu" if middle == "relu" else "Softmax", "MatMul"]
    feeds = random_inputs(m)
    feeds["A"] -= 0.5  # mixed signs, so Relu matters
    c = feeds["A"] @ feeds["B"]
    c = np.maximum(c, 0) if middle == "relu" else np.exp(c - c.max(-1, keepdims=True))
    if middle == "softmax":
        c /= c.sum(-1, keepdims=True)
    np.testing.assert_allclose(run(m, feeds), c @ feeds["D"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(cs.OPTIFX_SUBGRAPHS))
def test_optifx_model(name):
    sub = cs.OPTIFX_SUBGRAPHS[name]
    m = cs.optifx_model(name)
    check(m)
    counts = {op: ops(m).count(op) for op in set(ops(m))}
    assert counts["Conv"] == len(sub.convs)
    y = run(m)
    last = sub.convs[-1]
    channels = sum(c.c_out for c in sub.convs[1:]) if sub.pattern == "SIMO" else last.c_out
    assert y.shape == (1, channels, *last.out_hw) and (y >= 0).all()
    if sub.pattern == "MISO":
        assert [i.name for i in m.graph.input] == ["input", "input2"] and counts["Add"] == 1


# --- epilogues -------------------------------------------------------------------------------------------------------

def _reference(name: str, x: np.ndarray, feeds: dict, i: int = 0) -> np.ndarray:
    erf = np.vectorize(math.erf)
    suffix = str(i) if i else ""
    return {
        "relu": lambda: np.maximum(x, 0),
        "hardswish": lambda: x * np.clip(x + 3, 0, 6) / 6,
        "silu": lambda: x / (1 + np.exp(-x)),
        "gelu": lambda: 0.5 * x * (1 + erf(x / np.sqrt(2))),
        "clip6": lambda: np.clip(x, 0, 6),
        "leakyrelu": lambda: np.where(x >= 0, x, 0.01 * x),
        "residual": lambda: np.maximum(x + feeds.get(f"residual{suffix}", 0), 0),
        "se": lambda: x * feeds.get(f"scale{suffix}", 1),
    }[name]().astype(np.float32)


@pytest.mark.parametrize("epilogue", cs.EPILOGUES)
def test_conv_epilogue_matches_numpy(epilogue):
    shape = cs.ConvShape("t", 8, 9, 9, 16, 3, 1, 1)
    plain = cs.conv_model(shape, seed=2)
    m = cs.conv_model(shape, seed=2, epilogue=epilogue)
    check(m)
    assert ops(m)[0] == "Conv" and len(ops(m)) > 1
    feeds = random_inputs(m)
    feeds["input"] = feeds["input"] * 4 - 2  # both signs after the conv, values past the clip points
    x = run(plain, {"input": feeds["input"]})
    y = run(m, feeds)
    assert y.shape == (1, 16, 9, 9)
    np.testing.assert_allclose(y, _reference(epilogue, x, feeds), rtol=1e-5, atol=1e-5)
    extra = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in m.graph.input[1:]}
    assert extra == {"residual": {"residual": [1, 16, 9, 9]}, "se": {"scale": [1, 16, 1, 1]}}.get(epilogue, {})


def test_epilogue_patterns_are_decomposed():
    shape = cs.UNIT_CONVS["U3"]
    assert ops(cs.conv_model(shape, epilogue="hardswish")) == ["Conv", "Add", "Clip", "Mul", "Div"]
    assert ops(cs.conv_model(shape, epilogue="silu")) == ["Conv", "Sigmoid", "Mul"]
    assert ops(cs.conv_model(shape, epilogue="gelu")) == ["Conv", "Div", "Erf", "Add", "Mul", "Mul"]
    assert ops(cs.conv_model(shape, epilogue="residual")) == ["Conv", "Add", "Relu"]
    assert ops(cs.conv_model(shape, epilogue="clip6", bias=False)) == ["Conv", "Clip"]
    assert len(cs.conv_model(shape, bias=False).graph.node[0].input) == 2


def test_epilogue_chain():
    shape = cs.ConvShape("t", 4, 6, 6, 8, 1)
    m = cs.conv_model(shape, epilogue=["se", "hardswish", "residual"], seed=1)
    check(m)
    assert [i.name for i in m.graph.input] == ["input", "scale", "residual2"]
    feeds = random_inputs(m)
    x = run(cs.conv_model(shape, seed=1), {"input": feeds["input"]})
    for i, e in enumerate(("se", "hardswish", "residual")):
        x = _reference(e, x, feeds, i)
    np.testing.assert_allclose(run(m, feeds), x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("epilogue", ["gelu", "se", "residual"])
def test_matmul_epilogue_and_bias(epilogue):
    shape = cs.CHIMERA_MATMULS["G10.gemm2"]
    m = cs.matmul_model(shape, bias=True, epilogue=epilogue, seed=3)
    check(m)
    assert ops(m)[:2] == ["MatMul", "Add"]
    feeds = random_inputs(m)
    feeds["A"] -= 0.5
    bias = onnx.numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "matmul.bias"))
    x = feeds["A"] @ feeds["B"] + bias
    np.testing.assert_allclose(run(m, feeds), _reference(epilogue, x, feeds), rtol=1e-4, atol=1e-4)
    if epilogue == "se":
        assert [d.dim_value for d in m.graph.input[2].type.tensor_type.shape.dim] == [1, 1, shape.n]


# --- dynamic batch, batch override, errors ---------------------------------------------------------------------------

@pytest.mark.parametrize("build", [
    lambda: cs.conv_model(cs.UNIT_CONVS["U15"], dynamic=True, epilogue=["residual", "se"]),
    lambda: cs.matmul_model(cs.CHIMERA_MATMULS["G11.gemm1"], dynamic=True, epilogue="se"),
    lambda: cs.conv_chain_model(cs.CHIMERA_CONV_CHAINS["C4"], dynamic=True),
    lambda: cs.gemm_chain_model(cs.CHIMERA_GEMM_CHAINS["G12"], dynamic=True, middle="softmax"),
    lambda: cs.optifx_model("G6", dynamic=True),
], ids=["conv", "matmul", "conv_chain", "gemm_chain", "optifx"])
def test_dynamic_batch(build):
    m = build()
    check(m)
    assert all(i.type.tensor_type.shape.dim[0].dim_param == "batch" for i in m.graph.input)
    assert m.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    sess = session(m)
    for batch in (1, 3):
        (y,) = sess.run(None, random_inputs(m, batch=batch))
        assert y.shape[0] == batch and np.isfinite(y).all()


def test_batch_override_and_heron_batch():
    s = cs.HERON_C2D_LADDER["L6"]
    m = cs.conv_model(s)
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [16, 256, 14, 14]
    m = cs.conv_model(s, batch=2, opset=13)
    check(m)
    assert run(m).shape == (2, 512, 7, 7)
    assert cs.matmul_model(cs.CHIMERA_MATMULS["G10.gemm1"], batch=4).graph.input[0].type.tensor_type.shape.dim[
        0].dim_value == 4


def test_deterministic_weights():
    s = cs.UNIT_CONVS["U2"]
    a = cs.conv_model(s, seed=7).SerializeToString()
    assert a == cs.conv_model(s, seed=7).SerializeToString() != cs.conv_model(s, seed=8).SerializeToString()


def test_errors():
    s = cs.UNIT_CONVS["U1"]
    with pytest.raises(UsageError, match="unknown epilogue"):
        cs.conv_model(s, epilogue="swish")
    with pytest.raises(UsageError, match="ConvShape"):
        cs.conv_model(cs.CHIMERA_MATMULS["G1.gemm1"])
    with pytest.raises(UsageError, match="MatMulShape"):
        cs.matmul_model(s)
    with pytest.raises(UsageError, match="batch"):
        cs.conv_model(s, batch=0)
    with pytest.raises(UsageError, match="opset"):
        cs.conv_model(s, opset=7)
    with pytest.raises(UsageError, match="groups"):
        cs.conv_model(s._replace(groups=5))
    with pytest.raises(UsageError, match="empty"):
        cs.conv_model(s._replace(height=2, width=2))
    with pytest.raises(UsageError, match="middle"):
        cs.gemm_chain_model(cs.CHIMERA_GEMM_CHAINS["G1"], middle="gelu")
    with pytest.raises(UsageError, match="unknown OptiFX"):
        cs.optifx_model("G9")
