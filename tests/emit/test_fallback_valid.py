"""The function fallback is always valid: a fused model loads and gives the original's answers in a plain
onnxruntime session without the kernel library (a host without it, or with another CPU)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.emit.model import fallback_key
from onnxopt.emit.sequence import expand_sequences
from onnxopt.errors import VerificationError
from onnxopt.fusion.region import EwProgram, Region, Value


def _upsample_concat_model(sizes=(10, 20)) -> onnx.ModelProto:
    """YOLOv8's neck in small: conv -> nearest Resize 2x -> Concat with a conv at the larger size -> conv, once per
    size. The two Resize -> Concat copies are the same kernel with different shapes in their function bodies.
    16 channels: whole vectors at both lane widths (8 on AVX2, 16 on AVX-512), so the plan is the same on either."""
    vi = helper.make_tensor_value_info
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes, ins, outs = [], [], []
    for i, h in enumerate(sizes):
        for name, cin in (("wa", 16), ("wb", 16), ("wc", 32)):
            inits.append(numpy_helper.from_array((rng.standard_normal((16, cin, 3, 3)) * 0.2).astype(np.float32),
                                                 f"{name}{i}"))
        ins += [vi(f"a{i}", TensorProto.FLOAT, [1, 16, h, h]), vi(f"b{i}", TensorProto.FLOAT, [1, 16, 2 * h, 2 * h])]
        nodes += [helper.make_node("Conv", [f"a{i}", f"wa{i}"], [f"ca{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Conv", [f"b{i}", f"wb{i}"], [f"cb{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Resize", [f"ca{i}", "", "scales"], [f"r{i}"], mode="nearest"),
                  helper.make_node("Concat", [f"r{i}", f"cb{i}"], [f"c{i}"], axis=1),
                  helper.make_node("Conv", [f"c{i}", f"wc{i}"], [f"y{i}"], pads=[1, 1, 1, 1])]
        outs.append(vi(f"y{i}", TensorProto.FLOAT, [1, 16, 2 * h, 2 * h]))
    return helper.make_model(helper.make_graph(nodes, "g", ins, outs, inits),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # the oldest ORT admitted reads 8


def _feeds(model, seed=1):
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


# The plan is the target's, not the host's: both lane widths are planned and compiled on any host (a target this CPU
# cannot run is checked through its function bodies).
TARGETS = ["x86-64-v3", "x86-64-v4"]


@pytest.mark.parametrize("target", TARGETS)
def test_copies_of_two_sizes_get_two_op_types_and_the_fallback_loads(tmp_path, target):
    model = _upsample_concat_model()
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(model, src)
    res = onnxopt.optimize(str(src), str(out), measure=False, plan="compute-blocked", target=target)
    ops = [n.op_type for n in expand_sequences(res.model).graph.node]
    copies = [o for o in ops if o.startswith("Copy_")]
    assert len(copies) == 2 and copies[0] != copies[1], ops
    assert res.report["fallback_verification"]["ok"]
    # What a host without the library runs: the function bodies, read from the written file.
    feeds = _feeds(model)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def _ew_region(nodes, inputs, outputs):
    prog = EwProgram(inputs=[Value(x, "float32") for x in inputs], consts={}, ops=[],
                     outputs=[Value(o, "float32") for o in outputs])
    return Region("Elementwise", nodes, inputs, outputs, prog, [4])


def test_fallback_key_is_the_body_up_to_names():
    """The same computation on other tensors is one function; another attribute or constant is another."""
    c = numpy_helper.from_array(np.array([2.0], np.float32), "two")
    c3 = numpy_helper.from_array(np.array([3.0], np.float32), "three")
    m = helper.make_model(helper.make_graph([], "g", [], [], [c, c3]))
    a = _ew_region([helper.make_node("Mul", ["x", "two"], ["y"], name="n1")], ["x"], ["y"])
    b = _ew_region([helper.make_node("Mul", ["p", "two"], ["q"], name="other")], ["p"], ["q"])
    other_const = _ew_region([helper.make_node("Mul", ["x", "three"], ["y"])], ["x"], ["y"])
    other_attr = _ew_region([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.2)], ["x"], ["y"])
    other_attr2 = _ew_region([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.3)], ["x"], ["y"])
    a.program.consts = b.program.consts = {"two": (2.0, "float32")}
    other_const.program.consts = {"three": (3.0, "float32")}
    assert fallback_key(a, m) == fallback_key(b, m)
    assert fallback_key(a, m) != fallback_key(other_const, m)
    assert fallback_key(other_attr, m) != fallback_key(other_attr2, m)


@pytest.mark.parametrize("target", TARGETS)
def test_a_fallback_that_differs_is_never_written(tmp_path, monkeypatch, target):
    """--verify-fallback (on by default): if the function bodies do not compute what the original does, the run
    fails and leaves nothing at the output paths."""
    import onnxopt.emit.model as emit_model

    real = emit_model._function_for

    def wrong_body(region, model):  # the body of every fused region negated: a fallback that differs
        f = real(region, model)
        out = f.output[0]
        for n in f.node:
            n.output[:] = [o + "__pre" if o == out else o for o in n.output]
            n.input[:] = [x + "__pre" if x == out else x for x in n.input]
        f.node.append(helper.make_node("Neg", [out + "__pre"], [out]))
        return f

    monkeypatch.setattr(emit_model, "_function_for", wrong_body)
    model = _upsample_concat_model(sizes=(6,))
    out = tmp_path / "f.onnx"
    with pytest.raises(VerificationError, match="without the kernel library"):
        onnxopt.optimize(model, str(out), measure=False, plan="compute-blocked", target=target)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
