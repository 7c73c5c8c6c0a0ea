"""The OptiFX paper's CNNs: valid, runnable, the published structure, and the paper's G1..G7 patterns in place."""

from __future__ import annotations

import collections
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxopt.models import (
    MODELS,
    build_model,
    densenet_bc,
    inception_v3,
    mobilenetv2,
    nasnet_a,
    random_inputs,
    squeezenet,
    unet16,
)
from onnxopt.models import __main__ as models_cli

from onnxopt.errors import UsageError

NETWORKS = {  # name -> (builder, output shape at batch 1 and the default size)
    "inception_v3": (inception_v3.build, (1, 1000)),
    "densenet_bc": (densenet_bc.build, (1, 10)),
    "mobilenetv2": (mobilenetv2.build, (1, 1000)),
    "squeezenet": (squeezenet.build, (1, 1000)),
    "nasnet_a": (nasnet_a.build, (1, 1000)),
    "unet16": (unet16.build, (1, 1, 112, 112)),
}
FUSED_OPS = {"HardSwish", "HardSigmoid", "Gelu", "LayerNormalization", "Silu", "Swish", "FusedConv", "Relu6"}
EOPS = ("Relu", "Clip")


class Net:
    """A model with shapes inferred, and producer/consumer/weight indices."""

    def __init__(self, model: onnx.ModelProto):
        self.model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        graph = self.model.graph
        self.nodes = list(graph.node)
        self.ops = collections.Counter(n.op_type for n in self.nodes)
        self.producer = {o: n for n in self.nodes for o in n.output}
        self.consumers = collections.defaultdict(list)
        for n in self.nodes:
            for i in n.input:
                self.consumers[i].append(n)
        self.weights = {t.name: tuple(t.dims) for t in graph.initializer}
        self.shapes = {}
        for vi in [*graph.input, *graph.value_info, *graph.output]:
            dims = vi.type.tensor_type.shape.dim
            assert all(d.HasField("dim_value") for d in dims), vi.name  # static shapes everywhere
            self.shapes[vi.name] = tuple(d.dim_value for d in dims)

    def of(self, op):
        return [n for n in self.nodes if n.op_type == op]

    def convs(self, w_shape, group=1):
        return [n for n in self.of("Conv") if self.weights.get(n.input[1]) == tuple(w_shape)
                and attrs(n).get("group", 1) == group]

    def hw(self, tensor):
        return self.shapes[tensor][2:]

    def through_eops(self, tensor):
        """The tensor after a chain of single-consumer activations (the fusible epilogue)."""
        while len(self.consumers[tensor]) == 1 and self.consumers[tensor][0].op_type in EOPS:
            tensor = self.consumers[tensor][0].output[0]
        return tensor

    def conv_consumers(self, node):
        return [c for c in self.consumers[self.through_eops(node.output[0])] if c.op_type == "Conv"]


def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def session(model):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def nets():
    """Each network built once at batch 1 and its default size (inception_v3 299, squeezenet 227, unet16 112...)."""
    return {name: builder() for name, (builder, _) in NETWORKS.items()}


# --- validity ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(NETWORKS))
def test_valid_static_and_runs(nets, name):
    model = nets[name]
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 9 and model.opset_import[0].version == 17
    assert not FUSED_OPS & {n.op_type for n in model.graph.node}
    assert [i.name for i in model.graph.input] == ["input"] and [o.name for o in model.graph.output] == ["output"]
    net = Net(model)
    expected = NETWORKS[name][1]
    assert net.shapes["output"] == expected
    assert all(len(n.input) >= 2 and n.input[1] in net.weights for n in net.of("Conv"))
    (y,) = session(model).run(None, random_inputs(model))
    assert y.shape == expected and y.dtype == np.float32
    assert np.isfinite(y).all() and np.abs(y).max() > 0


@pytest.mark.parametrize("name", list(NETWORKS))
def test_batch_8_static_shapes(name):
    builder, expected = NETWORKS[name]
    net = Net(builder(batch=8))
    assert net.shapes["input"][0] == 8
    assert net.shapes["output"] == (8, *expected[1:])
    assert all(shape[0] == 8 for t, shape in net.shapes.items() if len(shape) == 4)


def test_reduced_sizes_run():
    for builder, size, out in ((inception_v3.build, 75, (2, 1000)), (squeezenet.build, 29, (2, 1000)),
                               (nasnet_a.build, 32, (2, 1000)), (unet16.build, 32, (2, 1, 32, 32)),
                               (mobilenetv2.build, 32, (2, 1000)), (densenet_bc.build, 16, (2, 10))):
        model = builder(batch=2, image_size=size)
        onnx.checker.check_model(model, full_check=True)
        (y,) = session(model).run(None, random_inputs(model))
        assert y.shape == out and np.isfinite(y).all()


# --- structure ----------------------------------------------------------------------------------------------------

def test_inception_v3_structure(nets):
    net = Net(nets["inception_v3"])
    assert net.ops["Conv"] == 94 and net.ops["Relu"] == 94
    assert net.ops["Concat"] == 11 + 4  # mixed blocks, plus the split 1x3/3x1 branches of Mixed_7b/7c
    assert net.ops["MaxPool"] == 4 and net.ops["AveragePool"] == 9 and net.ops["Gemm"] == 1
    assert all(len(n.input) == 3 for n in net.of("Conv"))  # BN folded into the bias
    mixed = [n for n in net.of("Concat") if net.consumers[n.output[0]][0].op_type != "Concat"
             and len(n.input) > 2]
    widths = [net.shapes[n.output[0]][1] for n in mixed]
    assert widths == [256, 288, 288, 768, 768, 768, 768, 768, 1280, 2048, 2048]
    asym = collections.Counter(tuple(attrs(n)["kernel_shape"]) for n in net.of("Conv"))
    assert asym[(1, 7)] == asym[(7, 1)] == 4 * 3 + 1 and asym[(1, 3)] == asym[(3, 1)] == 2 * 2
    assert net.shapes[net.of("Gemm")[0].input[0]] == (1, 2048)


def test_densenet_bc_structure(nets):
    net = Net(nets["densenet_bc"])
    per_size = collections.Counter(net.hw(n.output[0]) for n in net.of("Concat"))
    assert per_size == {(32, 32): 16, (16, 16): 16, (8, 8): 16}  # 16 bottleneck layers per block at L = 100
    growth = net.convs((12, 48, 3, 3))
    assert len(growth) == 48 and all(len(n.input) == 2 for n in growth)  # 3x3 to k, no bias
    bottleneck = [n for n in net.of("Conv") if net.weights[n.input[1]][0] == 48
                  and net.weights[n.input[1]][2:] == (1, 1)]
    assert len(bottleneck) == 48 and all(len(n.input) == 3 for n in bottleneck)  # bn2 folded into the bias
    assert net.ops["Conv"] == 1 + 2 * 48 + 2 and net.ops["BatchNormalization"] == 48 + 2 + 1
    assert [net.shapes[n.output[0]][1] for n in net.of("AveragePool")] == [108, 150]
    assert net.shapes[net.of("Gemm")[0].input[0]] == (1, 342)
    assert densenet_bc.build(depth=40).graph.node  # n = 6
    assert Net(densenet_bc.build(depth=40)).ops["Concat"] == 18
    with pytest.raises(UsageError, match="depth"):
        densenet_bc.build(depth=99)


def test_mobilenetv2_structure(nets):
    net = Net(nets["mobilenetv2"])
    assert net.ops["Conv"] == 52 and net.ops["Add"] == 10 and net.ops["Clip"] == 35
    dw = [n for n in net.of("Conv") if attrs(n)["group"] > 1]
    assert len(dw) == 17 and all(attrs(n)["group"] == net.weights[n.input[1]][0] for n in dw)
    assert sorted(attrs(n)["strides"][0] for n in dw).count(2) == 4
    for add in net.of("Add"):  # residual: both operands have the same shape, one is the block input
        assert net.shapes[add.input[0]] == net.shapes[add.input[1]]
    for clip in net.of("Clip"):
        lo, hi = (onnx.numpy_helper.to_array(t) for t in net.model.graph.initializer if t.name in clip.input[1:])
        assert {float(lo), float(hi)} == {0.0, 6.0}
    assert net.shapes[net.of("Gemm")[0].input[0]] == (1, 1280)


def test_squeezenet_structure(nets):
    net = Net(nets["squeezenet"])
    assert net.ops["Conv"] == 26 and net.ops["Relu"] == 26 and net.ops["Concat"] == 8
    pools = net.of("MaxPool")
    assert len(pools) == 3 and all(attrs(p)["ceil_mode"] == 1 for p in pools)
    assert [net.hw(p.output[0]) for p in pools] == [(55, 55), (27, 27), (13, 13)]
    fires = []
    for cat in net.of("Concat"):  # fire: squeeze -> Relu -> {expand1x1, expand3x3} -> Relu -> Concat
        e1, e3 = (net.producer[net.producer[i].input[0]] for i in cat.input)
        assert net.weights[e1.input[1]][2:] == (1, 1) and net.weights[e3.input[1]][2:] == (3, 3)
        assert net.producer[e1.input[0]] is net.producer[e3.input[0]]  # the same Relu'd squeeze
        squeeze = net.producer[net.producer[e1.input[0]].input[0]]
        fires.append((net.weights[squeeze.input[1]][0], net.weights[e1.input[1]][0]))
    assert fires == list(squeezenet.FIRES)
    assert not net.ops["Dropout"] and net.ops["GlobalAveragePool"] == 1


def test_nasnet_a_structure(nets):
    net = Net(nets["nasnet_a"])
    n_cells, r_cells = 6, 3  # 3 stages x N = 2 normal cells; stem + 2 reduction cells
    assert net.ops["Add"] == 5 * (n_cells + r_cells)
    assert net.ops["Concat"] == n_cells + r_cells + 3  # + the factorized reductions' two paths
    assert net.ops["BatchNormalization"] == 3 and net.ops["Pad"] == net.ops["Slice"] == 3
    cat_width = collections.Counter((net.shapes[n.output[0]][1], net.hw(n.output[0])) for n in net.of("Concat")
                                    if len(n.input) > 2)
    f = 16
    assert cat_width == {(2 * f, (56, 56)): 1, (6 * f, (56, 56)): 2, (8 * f, (28, 28)): 1, (12 * f, (28, 28)): 2,
                         (16 * f, (14, 14)): 1, (24 * f, (14, 14)): 2}
    dw = [n for n in net.of("Conv") if attrs(n)["group"] > 1]
    # each depthwise conv pairs with a pointwise one; the rest: conv0, 9 conv_1x1, 5 conv_prev_1x1, 3 x 2 path convs
    assert 2 * len(dw) + 1 + 9 + 5 + 6 == net.ops["Conv"]
    assert {tuple(attrs(n)["kernel_shape"]) for n in dw} == {(3, 3), (5, 5), (7, 7)}
    assert net.shapes[net.of("Gemm")[0].input[0]] == (1, 24 * f)


def test_unet16_structure(nets):
    net = Net(nets["unet16"])
    assert net.ops["Conv"] == 26 and net.ops["Add"] == 4 and net.ops["Resize"] == 4 and net.ops["Concat"] == 4
    for r in net.of("Resize"):
        assert attrs(r)["mode"] == b"nearest"
        assert net.shapes[r.output[0]][2] == 2 * net.shapes[r.input[0]][2]
    strided = [n for n in net.of("Conv") if attrs(n)["strides"] == [2, 2]]
    assert [(net.shapes[n.output[0]][1], net.hw(n.output[0])) for n in strided] == [
        (16, (56, 56)), (16, (28, 28)), (32, (14, 14)), (64, (7, 7))]
    assert [net.shapes[n.output[0]][1] for n in net.of("Concat")] == [128 + 64, 64 + 32, 32 + 16, 16 + 16]
    with pytest.raises(UsageError, match="multiple of 16"):
        unet16.build(image_size=100)


# --- the OptiFX sub-graphs (Table 3) -------------------------------------------------------------------------------

def _siso(net, w1, w2, group1=1):
    """Pairs conv1 (weights w1) -> [activation] -> conv2 (weights w2) where conv2 is conv1's only consumer."""
    pairs = []
    for c1 in net.convs(w1, group1):
        consumers = net.conv_consumers(c1)
        if len(consumers) == 1 and net.weights[consumers[0].input[1]] == tuple(w2):
            pairs.append((c1, consumers[0]))
    return pairs


def test_g1_inception_stem_pair(nets):
    net = Net(nets["inception_v3"])
    (pair,) = _siso(net, (80, 64, 1, 1), (192, 80, 3, 3))
    assert net.hw(pair[0].input[0]) == (73, 73) and net.hw(pair[0].output[0]) == (73, 73)
    assert attrs(pair[1])["pads"] == [0, 0, 0, 0] and net.hw(pair[1].output[0]) == (71, 71)


def test_g3_densenet_layer4(nets):
    net = Net(nets["densenet_bc"])
    (pair,) = _siso(net, (48, 60, 1, 1), (12, 48, 3, 3))
    assert net.hw(pair[0].input[0]) == (32, 32) and net.hw(pair[1].output[0]) == (32, 32)
    assert attrs(pair[1])["pads"] == [1] * 4
    assert "block1.layer.3." in pair[0].input[1]  # layer 4 of block 1


def test_g4_mobilenetv2_depthwise_projection(nets):
    net = Net(nets["mobilenetv2"])
    (pair,) = _siso(net, (144, 1, 3, 3), (32, 144, 1, 1), group1=144)
    dw, pw = pair
    assert attrs(dw)["strides"] == [2, 2] and attrs(dw)["pads"] == [1] * 4
    assert net.shapes[dw.input[0]] == (1, 144, 56, 56) and net.shapes[pw.output[0]] == (1, 32, 28, 28)
    assert net.producer[dw.input[0]].op_type == "Clip"  # Relu6 of the 24 -> 144 expansion


def test_g5_squeezenet_fire2(nets):
    net = Net(nets["squeezenet"])
    (squeeze,) = net.convs((16, 96, 1, 1))
    assert net.shapes[squeeze.input[0]] == (1, 96, 55, 55)
    expands = net.conv_consumers(squeeze)
    assert sorted(net.weights[c.input[1]] for c in expands) == [(64, 16, 1, 1), (64, 16, 3, 3)]
    assert all(net.hw(c.output[0]) == (55, 55) for c in expands)
    # every fire is a SIMO squeeze -> {1x1, 3x3}
    simo = [c for c in net.of("Conv") if len(net.conv_consumers(c)) == 2]
    assert len(simo) == 8


def _miso_adds(net, w):
    """Adds whose two operands are the outputs of two distinct 1x1 convs with weights `w`."""
    found = []
    for add in net.of("Add"):
        srcs = [net.producer.get(i) for i in add.input]
        if all(s is not None and s.op_type == "Conv" and net.weights[s.input[1]] == tuple(w)
               and attrs(s)["group"] == 1 for s in srcs) and srcs[0] is not srcs[1]:
            found.append(add)
    return found


def test_g6_nasnet_miso(nets):
    net = Net(nets["nasnet_a"])  # default F = 16: stage-1 normal cells' c0 and c1 at 56x56
    adds = [a for a in _miso_adds(net, (16, 16, 1, 1)) if net.hw(a.output[0]) == (56, 56)]
    assert len(adds) == 2 * 2  # c0, c1 of both stage-1 normal cells
    assert all(len(net.consumers[a.input[0]]) == 1 and len(net.consumers[a.input[1]]) == 1 for a in adds)
    net = Net(nasnet_a.build(filters=128, cells=1))  # the paper's G6: 2 x (128 -> 128 1x1) + Add at 56x56
    adds = [a for a in _miso_adds(net, (128, 128, 1, 1)) if net.hw(a.output[0]) == (56, 56)]
    assert len(adds) == 2
    for add in adds:
        assert all(net.shapes[net.producer[i].input[0]] == (1, 128, 56, 56) for i in add.input)


def test_g7_unet_simo(nets):
    net = Net(nets["unet16"])
    (down,) = [c for c in net.convs((16, 16, 3, 3)) if attrs(c)["strides"] == [2, 2]
               and net.hw(c.input[0]) == (56, 56)]
    assert attrs(down)["pads"] == [1] * 4 and net.shapes[down.output[0]] == (1, 16, 28, 28)
    consumers = net.conv_consumers(down)
    assert sorted(net.weights[c.input[1]] for c in consumers) == [(32, 16, 1, 1), (32, 16, 3, 3)]
    assert len(net.consumers[net.through_eops(down.output[0])]) == 2  # exactly the two branches (SIMO)
    assert all(net.hw(c.output[0]) == (28, 28) for c in consumers)


# --- registry, CLI, arguments -------------------------------------------------------------------------------------

def test_registry_and_determinism():
    assert set(NETWORKS) | {"resnet50"} <= set(MODELS)
    a = build_model("unet16", image_size=32, seed=3).SerializeToString()
    assert a == build_model("unet16", image_size=32, seed=3).SerializeToString()
    assert a != build_model("unet16", image_size=32, seed=4).SerializeToString()
    for name in NETWORKS:
        with pytest.raises(UsageError):
            build_model(name, batch=0)
    with pytest.raises(UsageError, match="bad arguments"):
        build_model("squeezenet", seq_len=8)
    with pytest.raises(UsageError, match="filters"):
        nasnet_a.build(filters=15)
    with pytest.raises(UsageError, match="opset"):
        squeezenet.build(opset=11)


def test_cli(tmp_path, capsys):
    out = tmp_path / "sq.onnx"
    assert models_cli.main(["squeezenet", "-o", str(out), "--batch", "8", "--image-size", "64"]) == 0
    assert "Conv 26" in capsys.readouterr().out
    assert [d.dim_value for d in onnx.load(out).graph.input[0].type.tensor_type.shape.dim] == [8, 3, 64, 64]
    assert models_cli.main(["unet16", "-o", str(out), "--variant", "small"]) == 2
    out = tmp_path / "u.onnx"
    proc = subprocess.run([sys.executable, "-m", "onnxopt.models", "unet16", "-o", str(out), "--image-size", "32",
                           "-q"], check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [1, 1, 32, 32]
