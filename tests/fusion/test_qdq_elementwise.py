"""A QDQ model's elementwise units run whole by our elementwise kernels (issue 46, item 4): a squeeze-excite Mul and a
residual Add that onnxruntime's quantizer wrapped in DequantizeLinear and QuantizeLinear read and write int8 tensors
in one kernel, their steps computed as the spec's. The written files run through the public loader in a fresh
process, their kernels counted, against the spec's result (onnxruntime without its int8 fusions)."""

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxopt
from fresh_process import run_written
from int8_models import quantized_cnn
from onnxopt.timing import make_session

def _block(folder):
    """conv -> relu, a squeeze-excite branch (global pool, 1x1 conv, HardSigmoid) multiplied back, a conv, the
    residual Add of the block's input, relu: the units of a MobileNetV3 block."""
    rng = np.random.default_rng(7)
    c = 16
    w = {name: (rng.standard_normal(shape) * 0.2).astype(np.float32)
         for name, shape in (("w1", (c, 8, 3, 3)), ("wse", (c, c, 1, 1)), ("w2", (c, c, 3, 3)))}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("GlobalAveragePool", ["r1"], ["g"]),
             helper.make_node("Conv", ["g", "wse"], ["se"]),
             helper.make_node("HardSigmoid", ["se"], ["hs"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["r1", "hs"], ["m"]),
             helper.make_node("Conv", ["m", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    return quantized_cnn(folder, nodes, w, (1, 8, 20, 24), rng)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    d = tmp_path_factory.mktemp("qdq_units")
    src = _block(str(d))
    (d / "w").mkdir()
    out = str(d / "w" / "block.onnx")
    res = onnxopt.optimize(src, out, threads=2, measure=False, cost_cache=False, tune_budget=0)
    return {"src": src, "out": out, "res": res, "dir": d}


def _units(res):
    return [e for e in res.report["regions"] if e["op_type"].startswith("Elementwise")
            and "QuantizeLinear" in e["ops"]]


def test_units_fused_whole(written):
    res = written["res"]
    units = _units(res)
    ops = [e["ops"] for e in units]
    assert any("Mul" in o for o in ops) and any("Add" in o for o in ops), ops
    for e in units:  # each reads and writes int8 tensors: its steps inside, its edges int8
        assert e["ops"].startswith("DequantizeLinear") and e["ops"].endswith("QuantizeLinear"), e["ops"]
    assert res.report["verification"]["ok"] and res.report["fallback_verification"]["ok"]
    written_model = onnx.load(written["out"])
    assert not any(n.op_type in ("Mul", "Add") for n in written_model.graph.node)  # no float unit left to onnxruntime


def test_units_run_in_a_fresh_process(written):
    x = np.random.default_rng(3).standard_normal((1, 8, 20, 24)).astype(np.float32)
    got, loader = run_written(written["out"], x, written["dir"])
    calls = loader["calls"]
    # each unit's kernel ran, alone or inside a sequence node (whose function calls its kernels' ops in order),
    # not a function body of onnxruntime nodes
    members = {f.name: {n.op_type for n in f.node} for f in onnx.load(written["out"]).functions}
    for e in _units(written["res"]):
        ran = calls.get(e["op_type"], 0) + sum(v for k, v in calls.items() if e["op_type"] in members.get(k, ()))
        assert ran >= 1, (e["op_type"], calls)
    spec = make_session(onnx.load(written["src"]), 2, optimization="none").run(None, {"x": x})[0]
    q = onnx.load(written["src"])
    inits = {t.name: t for t in q.graph.initializer}
    last_dq = next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "y")
    step = float(onnx.numpy_helper.to_array(inits[last_dq.input[1]]))
    # the int8 kernels and the units give the spec's steps; a value at a rounding midpoint may go either way
    assert np.max(np.abs(got - spec)) <= step * 1.001
    assert np.mean(got == spec) > 0.99
