"""The model builders: valid ONNX, runnable in onnxruntime, and shaped like torch exports (decomposed activations)."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxopt.models import (
    MODELS,
    bert,
    build_model,
    mobilenetv3,
    ocr_detector,
    random_inputs,
    resnet50,
    save_model,
    yolo,
)
from onnxopt.models import __main__ as models_cli

from onnxopt.errors import UsageError

FUSED_OPS = {"HardSwish", "HardSigmoid", "Gelu", "LayerNormalization", "Silu", "Swish"}


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def run(model, **kw):
    sess = session(model)
    feeds = random_inputs(model, **kw)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


class Graph:
    """Producer/consumer index over a model's nodes."""

    def __init__(self, model: onnx.ModelProto):
        self.nodes = list(model.graph.node)
        self.producer = {o: n for n in self.nodes for o in n.output}
        self.consumers = collections.defaultdict(list)
        for n in self.nodes:
            for i in n.input:
                self.consumers[i].append(n)
        self.consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
        for n in self.nodes:
            if n.op_type == "Constant":
                self.consts[n.output[0]] = onnx.numpy_helper.to_array(n.attribute[0].t)
        self.ops = collections.Counter(n.op_type for n in self.nodes)

    def of(self, op):
        return [n for n in self.nodes if n.op_type == op]

    def prod(self, name):
        return self.producer.get(name)

    def is_const(self, name, value):
        return name in self.consts and self.consts[name].size == 1 and float(self.consts[name]) == value

    def only_consumer(self, name, op):
        cs = self.consumers[name]
        return cs[0] if len(cs) == 1 and cs[0].op_type == op else None


def node_attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def count_hardswish(g: Graph) -> int:
    """Add(x, 3) -> Clip(0, 6) -> Mul(x, .) -> Div(6)."""
    n = 0
    for clip in g.of("Clip"):
        add = g.prod(clip.input[0])
        if len(clip.input) != 3 or not (g.is_const(clip.input[1], 0.0) and g.is_const(clip.input[2], 6.0)):
            continue
        if add is None or add.op_type != "Add" or not g.is_const(add.input[1], 3.0):
            continue
        x = add.input[0]
        mul = g.only_consumer(clip.output[0], "Mul")
        if mul is None or set(mul.input) != {x, clip.output[0]}:
            continue
        div = g.only_consumer(mul.output[0], "Div")
        if div is not None and g.is_const(div.input[1], 6.0):
            n += 1
    return n


def count_hardsigmoid_gate(g: Graph) -> int:
    """Add(z, 3) -> Clip(0, 6) -> Div(6) -> Mul(., block tensor)."""
    n = 0
    for clip in g.of("Clip"):
        add = g.prod(clip.input[0])
        if add is None or add.op_type != "Add" or not g.is_const(add.input[1], 3.0):
            continue
        div = g.only_consumer(clip.output[0], "Div")
        if div is None or not g.is_const(div.input[1], 6.0):
            continue
        mul = g.only_consumer(div.output[0], "Mul")
        if mul is not None and g.prod(add.input[0]).op_type == "Conv":
            n += 1
    return n


def count_silu(g: Graph) -> int:
    """Conv -> Sigmoid, and a Mul consuming both the conv output and its sigmoid."""
    n = 0
    for sig in g.of("Sigmoid"):
        x = sig.input[0]
        src = g.prod(x)
        if src is None or src.op_type != "Conv":
            continue
        muls = [m for m in g.consumers[sig.output[0]] if m.op_type == "Mul" and set(m.input) == {x, sig.output[0]}]
        n += len(muls) == 1
    return n


def count_layernorm(g: Graph) -> int:
    """ReduceMean -> Sub -> Pow(2) -> ReduceMean -> Add(eps) -> Sqrt -> Div -> Mul(gamma) -> Add(beta)."""
    n = 0
    for sub in g.of("Sub"):
        mean = g.prod(sub.input[1])
        if mean is None or mean.op_type != "ReduceMean" or mean.input[0] != sub.input[0]:
            continue
        pow_ = next((c for c in g.consumers[sub.output[0]] if c.op_type == "Pow"), None)
        div = next((c for c in g.consumers[sub.output[0]] if c.op_type == "Div"), None)
        if pow_ is None or div is None or not g.is_const(pow_.input[1], 2.0):
            continue
        chain = [g.only_consumer(pow_.output[0], "ReduceMean")]
        for op in ("Add", "Sqrt"):
            chain.append(chain[-1] and g.only_consumer(chain[-1].output[0], op))
        if chain[-1] is None or div.input[1] != chain[-1].output[0]:
            continue
        mul = g.only_consumer(div.output[0], "Mul")
        add = mul and g.only_consumer(mul.output[0], "Add")
        if add is not None:
            n += 1
    return n


def count_gelu(g: Graph) -> int:
    """Div(x, sqrt 2) -> Erf -> Add(1) -> Mul(x, .) -> Mul(0.5)."""
    n = 0
    for erf in g.of("Erf"):
        div = g.prod(erf.input[0])
        if div is None or div.op_type != "Div" or not g.is_const(div.input[1], pytest.approx(np.sqrt(2), rel=1e-6)):
            continue
        add = g.only_consumer(erf.output[0], "Add")
        mul = add and g.only_consumer(add.output[0], "Mul")
        if mul is None or set(mul.input) != {div.input[0], add.output[0]}:
            continue
        mul2 = g.only_consumer(mul.output[0], "Mul")
        if mul2 is not None and g.is_const(mul2.input[1], 0.5):
            n += 1
    return n


def check(model: onnx.ModelProto):
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 9
    assert not FUSED_OPS & {n.op_type for n in model.graph.node}
    assert len(model.graph.initializer) > 0


def assert_finite(outs):
    for name, arr in outs.items():
        assert np.isfinite(arr).all(), name


# --- MobileNetV3 ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["small", "large"])
def test_mobilenetv3_valid_and_runs(variant):
    width = 1.0 if variant == "small" else 0.5
    for batch in (1, 2):
        m = mobilenetv3.build(batch=batch, image_size=64, variant=variant, width_mult=width, num_classes=10)
        check(m)
        outs = run(m)
        assert outs["output"].shape == (batch, 10)
        assert_finite(outs)


def test_mobilenetv3_decomposed_patterns():
    m = mobilenetv3.build(image_size=64)
    g = Graph(m)
    table = mobilenetv3.layer_table("small")
    hs_blocks = [b for b in table if b.act == "HS"]
    expected_hs = 3 + sum(1 + (b.expanded != b.c_in) for b in hs_blocks)  # stem, last conv, classifier
    expected_se = sum(b.se for b in table)
    assert count_hardswish(g) == expected_hs == 19
    assert count_hardsigmoid_gate(g) == expected_se == 9
    assert g.ops["Clip"] == expected_hs + expected_se
    assert g.ops["GlobalAveragePool"] == expected_se + 1
    assert g.ops["Gemm"] == 2 and g.ops["Flatten"] == 1
    assert not g.ops["BatchNormalization"]
    assert all(len(n.input) == 3 for n in g.of("Conv"))  # conv + folded BN bias
    residual = sum(b.stride == 1 and b.c_in == b.c_out for b in table)
    assert g.ops["Add"] == residual + expected_hs + expected_se


def test_mobilenetv3_dynamic_batch_and_constant_nodes():
    m = mobilenetv3.build(image_size=64, dynamic=True, constants="node")
    check(m)
    assert Graph(m).ops["Constant"] > 0
    assert count_hardswish(Graph(m)) == 19
    sess = session(m)
    for batch in (1, 3):
        (y,) = sess.run(None, random_inputs(m, batch=batch))
        assert y.shape == (batch, 1000) and np.isfinite(y).all()


# --- YOLO -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["v8", "v5"])
def test_yolo_valid_and_runs(version):
    size, nc = 64, 80
    anchors = sum((size // s) ** 2 for s in (8, 16, 32))
    for batch in (1, 2):
        m = yolo.build(batch=batch, image_size=size, version=version)
        check(m)
        out = run(m)["output0"]
        expected = (batch, 4 + nc, anchors) if version == "v8" else (batch, 3 * anchors, 5 + nc)
        assert out.shape == expected
        assert np.isfinite(out).all()


@pytest.mark.parametrize("version", ["v8", "v5"])
def test_yolo_decomposed_patterns(version):
    g = Graph(yolo.build(image_size=64, version=version))
    plain_convs = 7 if version == "v8" else 3  # head output convs (+ the DFL conv) have no activation
    silu = count_silu(g)
    assert silu == g.ops["Conv"] - plain_convs and silu > 40
    assert g.ops["Sigmoid"] == silu + (1 if version == "v8" else 3)  # + sigmoid of the class / all outputs
    assert g.ops["MaxPool"] == 3 and g.ops["Resize"] == 2
    for r in g.of("Resize"):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in r.attribute}
        assert attrs["mode"] == b"nearest"
        assert list(g.consts[r.input[2]]) == [1, 1, 2, 2]
    if version == "v8":
        assert g.ops["Split"] >= 2 and g.ops["Softmax"] == 1 and g.ops["Sub"] == 2
    else:
        assert g.ops["Pow"] == 3  # wh = (2 * y) ** 2 * anchor_grid


def test_yolo_dynamic_batch():
    m = yolo.build(image_size=64, dynamic=True)
    check(m)
    sess = session(m)
    for batch in (1, 2):
        (y,) = sess.run(None, random_inputs(m, batch=batch))
        assert y.shape == (batch, 84, 84) and np.isfinite(y).all()


def test_yolo_rejects_bad_image_size():
    with pytest.raises(UsageError, match="multiple of 32"):
        yolo.build(image_size=100)


# --- BERT -----------------------------------------------------------------------------------------------------

def test_bert_valid_symbolic_and_two_sequence_lengths():
    m = bert.build()
    check(m)
    dims = [[d.dim_param for d in i.type.tensor_type.shape.dim] for i in m.graph.input]
    assert dims == [["batch", "sequence"]] * 3
    assert [i.name for i in m.graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert m.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT64
    sess = session(m)
    for batch, seq in ((1, 16), (2, 37)):
        feeds = random_inputs(m, batch=batch, seq_len=seq)
        hidden, pooled = sess.run(None, feeds)
        assert hidden.shape == (batch, seq, 128) and pooled.shape == (batch, 128)
        assert np.isfinite(hidden).all() and np.isfinite(pooled).all()


def test_bert_mask_changes_the_output():
    m = bert.build(layers=1)
    sess = session(m)
    feeds = random_inputs(m, batch=2, seq_len=8)
    masked = sess.run(None, feeds)[0]
    feeds["attention_mask"][:] = 1
    unmasked = sess.run(None, feeds)[0]
    assert not np.allclose(masked[0], unmasked[0])  # row 0 had masked tokens
    np.testing.assert_allclose(masked[1], unmasked[1], rtol=1e-5, atol=1e-5)


def test_bert_decomposed_patterns():
    layers = 2
    g = Graph(bert.build(layers=layers))
    assert g.ops["Erf"] == layers and count_gelu(g) == layers
    n_ln = 2 * layers + 1
    assert count_layernorm(g) == n_ln
    assert g.ops["ReduceMean"] == 2 * n_ln and g.ops["Pow"] == n_ln and g.ops["Sqrt"] == n_ln
    assert g.ops["Softmax"] == layers
    # HF's int mask: Unsqueeze, Unsqueeze, Cast, Sub(1, m), Mul(finfo.min)
    assert g.ops["Cast"] == 1
    for r in g.of("Reshape"):
        target = list(g.consts[r.input[1]])
        assert target[0] == 0 and (target[1] == 0 or -1 in target[1:])


@pytest.mark.parametrize("kw", [{"mask": "float", "opset": 18}, {"mask": "none", "token_types": False, "pooler": False,
                                                                   "constants": "node", "opset": 21}])
def test_bert_variants(kw):
    m = bert.build(**kw)
    check(m)
    outs = run(m, batch=2, seq_len=5)
    assert outs["last_hidden_state"].shape == (2, 5, 128)
    assert_finite(outs)
    assert count_layernorm(Graph(m)) == 5


def test_bert_static_shapes():
    m = bert.build(batch=2, seq_len=12, dynamic=False)
    check(m)
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [2, 12]
    outs = run(m)
    assert outs["last_hidden_state"].shape == (2, 12, 128)


def test_bert_bench_preset():
    m = bert.build(size="bench")
    g = Graph(m)
    assert g.ops["Erf"] == 4
    word = next(t for t in m.graph.initializer if t.name.endswith("word_embeddings.weight"))
    assert list(word.dims) == [8192, 256]


# --- ResNet-50 ------------------------------------------------------------------------------------------------

def test_resnet50_valid_and_runs():
    for batch in (1, 2):
        m = resnet50.build(batch=batch, image_size=64)
        check(m)
        outs = run(m)
        assert outs["output"].shape == (batch, 1000)
        assert_finite(outs)


def test_resnet50_structure():
    m = resnet50.build(image_size=64)
    g = Graph(m)
    assert dict(g.ops) == {"Conv": 53, "Relu": 49, "Add": 16, "MaxPool": 1, "GlobalAveragePool": 1, "Flatten": 1,
                           "Gemm": 1}
    assert all(len(n.input) == 3 for n in g.of("Conv"))  # conv + folded BN bias
    for add in g.of("Add"):  # residual Add, then Relu
        assert g.only_consumer(add.output[0], "Relu") is not None
    (pool,) = g.of("MaxPool")
    pool = node_attrs(pool)
    assert pool["kernel_shape"] == [3, 3] and pool["strides"] == [2, 2] and pool["pads"] == [1] * 4
    convs = [node_attrs(n) for n in g.of("Conv")]
    strided = collections.Counter(a["kernel_shape"][0] for a in convs if a["strides"] == [2, 2])
    assert strided == {7: 1, 3: 3, 1: 3}  # stem, the 3x3 conv of stages 2-4 (v1.5) and their downsample convs
    assert g.prod(g.of("Gemm")[0].input[0]).op_type == "Flatten"
    shapes = {t.name: list(t.dims) for t in m.graph.initializer}
    assert shapes["fc.weight"] == [1000, 2048] and shapes["layer4.2.conv3.weight"] == [2048, 512, 1, 1]
    assert sum(int(np.prod(s)) for s in shapes.values()) == 25_530_472  # torchvision's 25.56M less BN statistics


def test_resnet50_default_size_and_dynamic_batch():
    m = resnet50.build()
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 224, 224]
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    assert [d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim] == [1, 1000]
    m = resnet50.build(image_size=64, dynamic=True, num_classes=10)
    check(m)
    sess = session(m)
    for batch in (1, 3):
        (y,) = sess.run(None, random_inputs(m, batch=batch))
        assert y.shape == (batch, 10) and np.isfinite(y).all()


def test_resnet50_rejects_bad_arguments():
    with pytest.raises(UsageError, match="image_size"):
        resnet50.build(image_size=16)
    with pytest.raises(UsageError, match="batch"):
        resnet50.build(batch=0)


# --- OCR detector -----------------------------------------------------------------------------------------------

def test_ocr_detector_valid_and_runs():
    for batch, size in ((1, 320), (2, 64)):
        m = ocr_detector.build(batch=batch, image_size=size)
        check(m)
        maps = run(m)["maps"]
        assert maps.shape == (batch, 1, size, size)
        assert np.isfinite(maps).all() and (maps > 0).all() and (maps < 1).all()


def test_ocr_detector_patterns():
    g = Graph(ocr_detector.build(image_size=64))
    blocks = [b for stage in ocr_detector.STAGES for b in stage]
    expected_hs = 1 + 2 * sum(b.act == "HS" for b in blocks)  # stem, expand and depthwise activations
    assert count_hardswish(g) == expected_hs == 13 and g.ops["Clip"] == expected_hs
    depthwise = [n for n in g.of("Conv") if node_attrs(n)["group"] > 1]
    assert len(depthwise) == len(blocks)
    for n in depthwise:
        a = node_attrs(n)
        assert a["group"] == g.consts[n.input[1]].shape[0] and a["kernel_shape"] == [3, 3]
    assert sorted(node_attrs(n)["strides"][0] for n in depthwise) == [1, 1, 1, 1, 2, 2, 2, 2]
    scales = sorted(int(g.consts[r.input[2]][-1]) for r in g.of("Resize"))
    assert scales == [2, 2, 2, 2, 4, 8]  # top-down path, then p3..p5 up to 1/4
    assert all(node_attrs(r)["mode"] == b"nearest" for r in g.of("Resize"))
    (cat,) = g.of("Concat")
    assert len(cat.input) == 4
    tconvs = g.of("ConvTranspose")
    assert len(tconvs) == 2
    assert all(node_attrs(n)["strides"] == [2, 2] and node_attrs(n)["kernel_shape"] == [2, 2] for n in tconvs)
    assert g.only_consumer(tconvs[0].output[0], "Relu") is not None
    assert g.only_consumer(tconvs[1].output[0], "Sigmoid") is not None
    residual = sum(b.stride == 1 and b.c_in == b.c_out for b in blocks)
    assert g.ops["Add"] == residual + 3 + expected_hs  # blocks, FPN top-down adds, hardswish "+3"


def test_ocr_detector_dynamic_batch():
    m = ocr_detector.build(image_size=64, dynamic=True)
    check(m)
    sess = session(m)
    for batch in (1, 3):
        (y,) = sess.run(None, random_inputs(m, batch=batch))
        assert y.shape == (batch, 1, 64, 64) and np.isfinite(y).all()


def test_ocr_detector_rejects_bad_arguments():
    with pytest.raises(UsageError, match="multiple of 32"):
        ocr_detector.build(image_size=100)
    with pytest.raises(UsageError, match="neck_channels"):
        ocr_detector.build(neck_channels=30)


# --- registry, saving, CLI -------------------------------------------------------------------------------------

def test_registry():
    assert {"mobilenetv3", "yolo", "bert", "resnet50", "ocr_detector"} <= set(MODELS)
    m = build_model("yolo", image_size=64, version="v5")
    assert m.graph.input[0].name == "images"
    assert build_model("resnet50", image_size=32, num_classes=10).graph.input[0].name == "input"
    assert build_model("ocr_detector", image_size=32).graph.output[0].name == "maps"
    with pytest.raises(UsageError, match="known models: .*bert, .*mobilenetv3, .*resnet50, .*yolo"):
        build_model("resnet")
    with pytest.raises(UsageError):
        build_model("bert", image_size=64)


def test_deterministic_weights():
    a = mobilenetv3.build(image_size=32, seed=3).SerializeToString()
    assert a == mobilenetv3.build(image_size=32, seed=3).SerializeToString()
    assert a != mobilenetv3.build(image_size=32, seed=4).SerializeToString()


def test_save_and_cli(tmp_path, capsys):
    path = save_model(bert.build(layers=1), tmp_path / "b.onnx")
    assert onnx.load(path).graph.output[0].name == "last_hidden_state"
    out = tmp_path / "m.onnx"
    assert models_cli.main(["mobilenetv3", "-o", str(out), "--batch", "2", "--image-size", "64"]) == 0
    m = onnx.load(out)
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [2, 3, 64, 64]
    assert models_cli.main(["bert", "-o", str(out), "--image-size", "64"]) == 2
    assert models_cli.main(["resnet50", "-o", str(out), "--image-size", "32", "--dynamic", "-q"]) == 0
    assert onnx.load(out).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert models_cli.main(["ocr_detector", "-o", str(out), "--batch", "2", "--image-size", "64", "-q"]) == 0
    assert [d.dim_value for d in onnx.load(out).graph.output[0].type.tensor_type.shape.dim] == [2, 1, 64, 64]
    assert models_cli.main(["ocr_detector", "-o", str(out), "--seq-len", "8"]) == 2
    assert models_cli.main(["nope", "-o", str(out)]) == 2
    assert "known models" in capsys.readouterr().err
    with pytest.raises(UsageError, match="does not exist"):
        save_model(m, tmp_path / "missing" / "x.onnx")
