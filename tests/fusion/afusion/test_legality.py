"""AFUSION legality (OptiFX §2): legal regions, and each refusal with its reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxopt.fusion.afusion import FusionGraph, afusion_region, check_afusion, check_horizontal, rop_geometry

F32 = TensorProto.FLOAT


class Net:
    """A tiny graph builder: convs with constant weights, elementwise ops, named nodes."""

    def __init__(self, dtype=F32):
        self.nodes, self.inits, self.inputs, self.dtype = [], [], [], dtype
        self.np_dtype = np.float16 if dtype == TensorProto.FLOAT16 else np.float32

    def input(self, name, shape):
        self.inputs.append(helper.make_tensor_value_info(name, self.dtype, shape))
        return name

    def conv(self, name, x, cin, cout, k=1, stride=1, pad=None, group=1, **attrs):
        w = numpy_helper.from_array(np.zeros((cout, cin // group, k, k), self.np_dtype), f"{name}.w")
        self.inits.append(w)
        pad = k // 2 if pad is None else pad
        self.nodes.append(helper.make_node("Conv", [x, w.name], [f"{name}.y"], name=name, kernel_shape=[k, k],
                                           strides=[stride, stride], pads=[pad] * 4, group=group, **attrs))
        return f"{name}.y"

    def op(self, op_type, name, inputs, **attrs):
        self.nodes.append(helper.make_node(op_type, list(inputs), [f"{name}.y"], name=name, **attrs))
        return f"{name}.y"

    def model(self, *outputs):
        outs = [helper.make_tensor_value_info(o, self.dtype, None) for o in outputs]
        g = helper.make_graph(self.nodes, "g", self.inputs, outs, initializer=self.inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def siso(h=16, graph_output_intermediate=False):
    n = Net()
    x = n.input("x", [1, 8, h, h])
    r = n.op("Relu", "r1", [n.conv("c1", x, 8, 16, 1)])
    y = n.op("Relu", "r2", [n.conv("c2", r, 16, 8, 3)])
    return n.model(y, r) if graph_output_intermediate else n.model(y)


def test_legal_siso_region():
    g = FusionGraph.of(siso())
    assert check_afusion(g, "c1", ["c2"]) is None
    region = afusion_region(g, "c1", ["c2"])
    assert region.pattern == "SISO"
    assert region.names == ["c1", "r1", "c2", "r2"]  # the Relus fold into the epilogues
    assert region.intermediates == ("c1.y", "r1.y", "c2.y")  # c2.y only feeds its Relu epilogue
    # A ModelProto works as well as a FusionGraph; NodeProtos and ids as well as names.
    model = siso()
    assert check_afusion(model, model.graph.node[0], [2]) is None


def test_refuses_intermediate_graph_output():
    reason = check_afusion(siso(graph_output_intermediate=True), "c1", ["c2"])
    assert reason == "intermediate 'r1.y' is a graph output; would need to be written"


def test_refuses_intermediate_read_elsewhere():
    n = Net()
    x = n.input("x", [1, 8, 16, 16])
    r = n.op("Relu", "r1", [n.conv("c1", x, 8, 16, 1)])
    y = n.conv("c2", r, 16, 8, 3)
    z = n.op("MaxPool", "side", [r], kernel_shape=[2, 2], strides=[2, 2])
    reason = check_afusion(n.model(y, z), "c1", ["c2"])
    assert reason == "intermediate 'r1.y' also read by side (MaxPool); would need to be written"


def test_refuses_indirect_path():
    # A -> r -> Add -> B, and A -> r -> X -> Add: contracting {A, Add, B} would make a cycle with X.
    n = Net()
    x = n.input("x", [1, 8, 16, 16])
    r = n.op("Relu", "r1", [n.conv("A", x, 8, 8, 1)])
    side = n.conv("X", r, 8, 8, 3)
    y = n.conv("B", n.op("Add", "add", [r, side]), 8, 8, 3)
    reason = check_afusion(n.model(y), "A", ["B"])
    assert reason.startswith("indirect path: the region reaches X (Conv)")
    assert "cycle" in reason


def test_refuses_dynamic_shape():
    n = Net()
    x = n.input("x", ["N", 8, 16, 16])
    y = n.conv("c2", n.op("Relu", "r1", [n.conv("c1", x, 8, 16, 1)]), 16, 8, 3)
    reason = check_afusion(n.model(y), "c1", ["c2"])
    assert "is not static" in reason and "AFusion needs static shapes" in reason


def test_refuses_more_than_three_rops():
    n = Net()
    h = n.input("x", [1, 8, 16, 16])
    for i in range(4):
        h = n.op("Relu", f"r{i}", [n.conv(f"c{i}", h, 8, 8, 3)])
    model = n.model(h)
    assert check_afusion(model, "c0", ["c1", "c2"]) is None
    reason = check_afusion(model, "c0", ["c1", "c2", "c3"])
    assert reason == "4 ROPs (c0, c1, c2, c3); AFusion fuses at most 3"


def test_simo_and_miso_regions():
    n = Net()
    x = n.input("x", [1, 96, 55, 55])
    s = n.op("Relu", "sr", [n.conv("squeeze", x, 96, 16, 1)])
    e1 = n.op("Relu", "e1r", [n.conv("e1", s, 16, 64, 1)])
    e3 = n.op("Relu", "e3r", [n.conv("e3", s, 16, 64, 3)])
    cat = n.op("Concat", "cat", [e1, e3], axis=1)
    a = n.conv("a", cat, 128, 32, 1)
    b = n.conv("b", n.input("x2", [1, 64, 55, 55]), 64, 32, 1)
    y = n.op("Relu", "mr", [n.op("Add", "add", [a, b])])
    out = n.conv("after", y, 32, 8, 3)
    g = FusionGraph.of(n.model(out))
    simo = afusion_region(g, "squeeze", ["e1", "e3"])
    assert simo.pattern == "SIMO"
    assert set(simo.names) == {"squeeze", "sr", "e1", "e1r", "e3", "e3r"}
    # Only one of the expands: the squeezed tensor is still read by the other.
    assert check_afusion(g, "squeeze", ["e1"]) == "intermediate 'sr.y' also read by e3 (Conv); would need to be written"
    miso = afusion_region(g, ["a", "b"], [])
    assert miso.pattern == "MISO" and set(miso.names) == {"a", "b", "add", "mr"}
    miso3 = afusion_region(g, ["a", "b"], ["after"])
    assert miso3.pattern == "MISO" and miso3.intermediates == ("a.y", "b.y", "add.y", "mr.y")
    # e3 is no producer of cat's reader: no direct edge (a Concat is not elementwise).
    assert check_afusion(g, "e3", ["a"]).startswith("no direct edge into a (Conv): it reads 'cat.y' from cat (Concat)")
    assert check_horizontal(g, ["e1", "e3"]) is None
    assert check_horizontal(g, ["e1", "a"]).startswith("the convs read different inputs")


def test_pools_only_last_and_global_pools_refused():
    n = Net()
    x = n.input("x", [1, 8, 16, 16])
    r = n.op("Relu", "r", [n.conv("c", x, 8, 8, 3)])
    p = n.op("MaxPool", "pool", [r], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = n.conv("after", p, 8, 8, 1)
    gp = n.op("GlobalAveragePool", "gap", [y])
    g = FusionGraph.of(n.model(gp))
    assert check_afusion(g, "c", ["pool"]) is None  # conv -> pool
    assert check_afusion(g, "c", ["pool", "after"]) == \
        "pool (MaxPool) feeds another ROP of the region; pools are fused only as the last op"
    assert check_afusion(g, "pool", ["after"]) == \
        "pool (MaxPool) cannot produce an intermediate: pools are fused only as the last op (conv -> pool)"
    assert check_afusion(g, "after", ["gap"]) == "gap (GlobalAveragePool) reduces the whole image; a band kernel " \
                                                  "cannot fuse it"


def test_refuses_float16_and_ceil_mode():
    n = Net(TensorProto.FLOAT16)
    x = n.input("x", [1, 8, 16, 16])
    y = n.conv("c2", n.op("Relu", "r1", [n.conv("c1", x, 8, 16, 1)]), 16, 8, 3)
    assert "float32 only" in check_afusion(n.model(y), "c1", ["c2"])
    n = Net()
    x = n.input("x", [1, 8, 16, 16])
    p = n.op("MaxPool", "pool", [n.conv("c", x, 8, 8, 3)], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    assert "ceil_mode=1 changes the output size" in check_afusion(n.model(p), "c", ["pool"])


def test_auto_pad_resolved_from_static_shapes():
    n = Net()
    x = n.input("x", [1, 8, 15, 15])
    w = numpy_helper.from_array(np.zeros((8, 8, 3, 3), np.float32), "w")
    n.inits.append(w)
    n.nodes.append(helper.make_node("Conv", [x, "w"], ["c.y"], name="c", auto_pad="SAME_UPPER", strides=[2, 2]))
    y = n.conv("d", n.op("Relu", "r", ["c.y"]), 8, 8, 3)
    g = FusionGraph.of(n.model(y))
    geo = rop_geometry(g, g.resolve("c"))
    assert geo.pads == (1, 1, 1, 1) and geo.stride == (2, 2)  # 15 -> 8: total padding 2
    assert check_afusion(g, "c", ["d"]) is None


def test_scratch_limit():
    # A 1-row band of the 3x3 consumer needs 3 rows of the 16-channel, 12-wide intermediate: 3 * 16 * 12 * 4 B.
    n = Net()
    x = n.input("x", [1, 64, 10, 12])
    y = n.conv("c2", n.op("Relu", "r1", [n.conv("c1", x, 64, 16, 1)]), 16, 8, 3)
    g = FusionGraph.of(n.model(y))
    assert afusion_region(g, "c1", ["c2"]).scratch_bytes(1) == 2304
    assert check_afusion(g, "c1", ["c2"], scratch_limit=2304) is None
    assert check_afusion(g, "c1", ["c2"], scratch_limit=2303) == \
        "the intermediate tiles of a 1-row band take 2304 bytes; the scratch limit is 2303 bytes"
    assert afusion_region(g, "c1", ["c2"]).scratch_bytes(4) == 6 * 16 * 12 * 4


def test_bad_arguments():
    g = FusionGraph.of(siso())
    assert check_afusion(g, "nope", ["c2"]) == "no node named 'nope'"
    assert check_afusion(g, "c1", ["c1"]) == "a node is listed twice among c1, c1"
    assert check_afusion(g, "r1", ["c2"]) == "r1 (Relu) is not a conv; AFusion producers are convs"
    assert check_afusion(g, "c1", []).startswith("only one ROP")
    with pytest.raises(TypeError):
        FusionGraph.of(42)


def test_classification():
    g = FusionGraph.of(siso())
    assert [g.kinds[g.resolve(x)] for x in ("c1", "r1", "c2", "r2")] == ["rop", "eop", "rop", "eop"]
    assert g.epilogue(g.resolve("c1")) == [g.resolve("r1")]
    assert isinstance(g.model, onnx.ModelProto)
