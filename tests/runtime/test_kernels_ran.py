"""Every kind of written model runs its kernels through the public loader (issue 44, point 1): each is optimized into
a folder, then loaded in a fresh process with `onnxopt.runtime.InferenceSession` and run R times; the library must be
registered, the answers must match onnxruntime on the original model, and per op type the library's own count of
Compute calls must equal the written graph's nodes of that type times R (matching answers alone prove nothing: the
function bodies give the same answers). The negative test shows the count check can fail: the same written model
without its library runs its function bodies and registers nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from attention_models import attention_model, feeds_for
from int8_models import quantized_cnn
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import const, make_model

import onnxopt

R = 3  # runs of each written model
F = TensorProto.FLOAT
vi = helper.make_tensor_value_info

# Loads the written model in a fresh process, runs it R times and prints what happened as one JSON line: the library
# registered (its real path and the name it was loaded by), the warnings, and the library's count of Compute calls
# per op type; each run's outputs go to got.npz for the test to compare.
CHILD = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import onnxruntime as ort
    import onnxopt.runtime as rt
    from onnxopt.runtime.kernel_calls import kernel_calls

    model, feeds_file, got_file, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    probe = sys.argv[5] if len(sys.argv) > 5 else None
    feeds = dict(np.load(feeds_file))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = rt.InferenceSession(model, so)
    got = {}
    for r in range(runs):
        for i, y in enumerate(sess.run(None, feeds)):
            got[f"{r}_{i}"] = y
    np.savez(got_file, **got)
    loadable = rt.registered_library(sess, loadable=True)
    out = {"library": rt.registered_library(sess), "loadable": loadable,
           "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
           "calls": kernel_calls(loadable) if loadable else None,
           # A library no session registered, read in this process: what the count check sees when the loader
           # did not pick the library up.
           "probe_calls": kernel_calls(probe) if probe else None}
    print("RESULT " + json.dumps(out))
""")


@dataclass
class Case:
    build: object  # (folder) -> (the input model's path, its feeds, tolerances)
    expect: tuple  # op-type prefixes the written graph must have (domain onnxopt)
    options: dict = field(default_factory=dict)
    may_skip: bool = False  # an int8 kind: skipped, with the report's reason, where this host's target cannot take it


def _save(model, folder, name="m.onnx", **kw) -> str:
    path = os.path.join(folder, name)
    onnx.save(model, path, **kw)
    return path


def _rng(seed=0):
    return np.random.default_rng(seed)


def _elementwise(folder):
    """x + b -> SiLU: one elementwise chain."""
    rng = _rng(1)
    m = make_model([helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Sigmoid", ["a"], ["s"]),
                    helper.make_node("Mul", ["a", "s"], ["y"])], [vi("x", F, [4, 256])], [vi("y", F, [4, 256])],
                   [const("b", rng.standard_normal(256))], ir_version=8)
    return _save(m, folder), {}


def _conv(folder):
    """Conv with its bias and Relu epilogue (the compute kind)."""
    rng = _rng(2)
    m = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4),
                    helper.make_node("Relu", ["c"], ["y"])], [vi("x", F, [1, 16, 12, 12])], [vi("y", F, None)],
                   [const("w", rng.standard_normal((16, 16, 3, 3)) * 0.2), const("b", rng.standard_normal(16))],
                   ir_version=8)
    return _save(m, folder), {}


def _projection(seed=3, shape=(1, 16, 64), n=64):
    """A transformer projection: MatMul with a constant B (packed by the compute kind) and its bias Add."""
    rng = _rng(seed)
    k = shape[-1]
    return make_model([helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["y"])],
                      [vi("x", F, list(shape))], [vi("y", F, None)],
                      [const("w", rng.standard_normal((k, n)) / np.sqrt(k)), const("b", rng.standard_normal(n))],
                      ir_version=8)


def _matmul(folder):
    return _save(_projection(), folder), {}


def _maxpool(folder):
    m = make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)],
                   [vi("x", F, [1, 16, 16, 16])], [vi("y", F, None)], ir_version=8)
    return _save(m, folder), {}


def _upsample_concat(folder):
    """YOLOv8's neck in small (tests/emit/test_fallback_valid.py): conv -> nearest Resize 2x -> Concat with a conv
    at the larger size -> conv; 16 channels, whole vectors at 8 and 16 lanes. Under the compute-blocked plan the
    Resize -> Concat is a Copy kernel between blocked convolutions."""
    rng, h = _rng(4), 6
    inits = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    inits += [const(name, rng.standard_normal((16, cin, 3, 3)) * 0.2) for name, cin in (("wa", 16), ("wb", 16),
                                                                                         ("wc", 32))]
    nodes = [helper.make_node("Conv", ["a", "wa"], ["ca"], pads=[1] * 4),
             helper.make_node("Conv", ["b", "wb"], ["cb"], pads=[1] * 4),
             helper.make_node("Resize", ["ca", "", "scales"], ["r"], mode="nearest"),
             helper.make_node("Concat", ["r", "cb"], ["c"], axis=1),
             helper.make_node("Conv", ["c", "wc"], ["y"], pads=[1] * 4)]
    m = make_model(nodes, [vi("a", F, [1, 16, h, h]), vi("b", F, [1, 16, 2 * h, 2 * h])],
                   [vi("y", F, [1, 16, 2 * h, 2 * h])], inits, ir_version=8)
    return _save(m, folder), {}


def _softmax(folder):
    m = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [vi("x", F, [2, 4, 32, 48])],
                   [vi("y", F, [2, 4, 32, 48])], opset=18, ir_version=8)
    return _save(m, folder), {}


def _attention(folder):
    return _save(attention_model("sdpa", 1, 4, 48, 48, 32, "add", True), folder), {"rtol": 2e-4, "atol": 2e-5}


def _layernorm(folder):
    """The residual Add and its LayerNormalization: one row kernel."""
    rng = _rng(5)
    m = make_model([helper.make_node("Add", ["x", "res"], ["s"]),
                    helper.make_node("LayerNormalization", ["s", "g", "beta"], ["y"], axis=-1, epsilon=1e-5)],
                   [vi("x", F, [1, 16, 64]), vi("res", F, [1, 16, 64])], [vi("y", F, None)],
                   [const("g", 1 + 0.1 * rng.standard_normal(64)), const("beta", 0.1 * rng.standard_normal(64))],
                   opset=18, ir_version=8)
    return _save(m, folder), {}


def _qmatmul(folder):
    """onnxruntime's quantize_dynamic of a projection: DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul -> Add,
    the qmatmul kind. The kernel's int32 sums are exact, as MatMulInteger's; the float tail rounds alike. 7-bit
    weights (reduce_range) keep the reference's u8 x s8 pair sums within 16 bits, where onnxruntime's AVX2 kernel
    would saturate them (full-range weights on these inputs reach 30,393 of 32,767)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    f32 = _save(_projection(seed=6, shape=(2, 16, 64), n=48), folder, "f32.onnx")
    path = os.path.join(folder, "m.onnx")
    quantize_dynamic(f32, path, weight_type=QuantType.QInt8, reduce_range=True)
    assert "MatMulInteger" in [n.op_type for n in onnx.load(path).graph.node]
    return path, {"rtol": 1e-4, "atol": 1e-4, "scaled": 1e-4}


def _qconv(folder):
    """quantize_static (QDQ, u8 activations, per-channel s8 weights) of Conv -> Relu: the qconv kind. The reference
    runs the QDQ nodes as float ops, the kernel in exact integers: a value on a rounding edge may land one output
    step apart, so the tolerance is one step of the output's scale."""
    rng, sub = _rng(7), os.path.join(folder, "quantize")  # quantized_cnn writes f.onnx (the float model) too
    os.mkdir(sub)
    weights = {"w1": (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32),
               "b1": (rng.standard_normal(16) * 0.1).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4), helper.make_node("Relu", ["c1"], ["y"])]
    path = quantized_cnn(sub, nodes, weights, (1, 8, 12, 12), rng)
    q = onnx.load(path)
    assert "Conv" in [n.op_type for n in q.graph.node]
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    (last,) = [n for n in q.graph.node if n.output[0] == "y"]
    assert last.op_type == "DequantizeLinear"
    return path, {"rtol": 0.0, "atol": 1.01 * float(np.max(inits[last.input[1]]))}


def _external(folder):
    """The projection saved with its weights in m.onnx.data: the written model keeps external data (f.onnx.data)."""
    path = _save(_projection(seed=8), folder, save_as_external_data=True, all_tensors_to_one_file=True,
                 location="m.onnx.data", size_threshold=0)
    assert os.path.exists(path + ".data")
    return path, {}


def _cnn(folder):
    """Conv+Relu, Conv+Relu, MaxPool, Conv+Sigmoid: four regions in a run, packed into one Sequence_ node by
    default; with sequences=False one node per region (two of them the same Conv op type)."""
    rng = _rng(9)
    inits = []
    for i in (1, 2, 3):
        inits += [const(f"w{i}", rng.standard_normal((16, 16, 3, 3)) * 0.2), const(f"b{i}", rng.standard_normal(16))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w3", "b3"], ["c3"], pads=[1] * 4),
             helper.make_node("Sigmoid", ["c3"], ["y"])]
    m = make_model(nodes, [vi("x", F, [1, 16, 16, 16])], [vi("y", F, None)], inits, ir_version=8)
    return _save(m, folder), {}


CASES = {
    "elementwise": Case(_elementwise, ("Elementwise_",)),
    "conv_epilogue": Case(_conv, ("Conv_",)),
    "matmul_packed": Case(_matmul, ("MatMul_",)),
    "maxpool": Case(_maxpool, ("MaxPool_",)),
    "blocked_concat_copy": Case(_upsample_concat, ("Conv_", "Copy_"), {"plan": "compute-blocked", "sequences": False}),
    "blocked_concat_sequence": Case(_upsample_concat, ("Sequence_",), {"plan": "compute-blocked"}),
    "softmax": Case(_softmax, ("softmax_",)),
    "attention": Case(_attention, ("attention_",)),
    "residual_layernorm": Case(_layernorm, ("layernorm_",)),
    "qmatmul_dynamic": Case(_qmatmul, ("qmatmul_",), may_skip=True),
    "qconv_static_qdq": Case(_qconv, ("qconv_",), may_skip=True),
    "external_data": Case(_external, ("MatMul_",)),
    "sequences_on": Case(_cnn, ("Sequence_",)),
    "sequences_off": Case(_cnn, ("Conv_", "MaxPool_"), {"sequences": False}),
}


@dataclass
class Written:
    folder: str
    src: str
    out: str
    report: dict
    feeds: dict
    want: list
    tol: dict
    custom: Counter  # op type -> top-level nodes of domain onnxopt in the written graph


def _build(name: str, folder: str) -> Written:
    case = CASES[name]
    src, tol = case.build(folder)
    out = os.path.join(folder, "f.onnx")
    res = onnxopt.optimize(src, out, measure=False, threads=2, **case.options)
    report = res.report
    why = report.get("kernels_not_run")
    if why:  # a target this CPU cannot run: nothing to load here
        pytest.skip(f"{name}: {why}")
    written = onnx.load(out, load_external_data=False)
    custom = Counter(n.op_type for n in written.graph.node if n.domain == "onnxopt")
    missing = [p for p in case.expect if not any(op.startswith(p) for op in custom)]
    if missing:
        reasons = "; ".join(r.get("reason", "") for r in report.get("rejected", [])) or "no reason reported"
        if case.may_skip:
            pytest.skip(f"{name}: {', '.join(missing)} not fused on this host: {reasons}")
        pytest.fail(f"{name}: the written graph lacks {missing}: {dict(custom)}; rejected: {reasons}")
    assert report["fused_regions"] > 0, report
    model = onnx.load(src)
    feeds = feeds_for(model, seed=11)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    want = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.savez(os.path.join(folder, "feeds.npz"), **feeds)
    return Written(folder, src, out, report, feeds, want, tol, custom)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each case's model, optimized once for the module (the negative test reuses one)."""
    built: dict[str, Written] = {}

    def get(name: str) -> Written:
        if name not in built:
            built[name] = _build(name, str(tmp_path_factory.mktemp(name)))
        return built[name]

    return get


def _run_fresh(model: str, folder: str, probe: str | None = None) -> dict:
    args = [sys.executable, "-c", CHILD, model, os.path.join(folder, "feeds.npz"), os.path.join(folder, "got.npz"),
            str(R)] + ([probe] if probe else [])
    p = subprocess.run(args, check=False, capture_output=True, text=True, cwd=folder, timeout=120)
    assert p.returncode == 0, p.stderr[-4000:]
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def _check_answers(w: Written, folder: str):
    got = np.load(os.path.join(folder, "got.npz"))
    assert len(got.files) == R * len(w.want)
    rtol, atol = w.tol.get("rtol", 1e-4), w.tol.get("atol", 1e-4)
    for r in range(R):
        for i, want in enumerate(w.want):
            y = got[f"{r}_{i}"]
            assert y.shape == want.shape and y.dtype == want.dtype
            scaled = w.tol.get("scaled", 0.0) * float(np.max(np.abs(want))) if want.size else 0.0
            np.testing.assert_allclose(y, want, rtol=rtol, atol=max(atol, scaled), err_msg=f"run {r}, output {i}")


@pytest.mark.parametrize("name", list(CASES))
def test_the_written_model_runs_its_kernels(written, name):
    w = written(name)
    if name == "external_data":
        assert os.path.exists(w.out + ".data"), os.listdir(w.folder)
    if name == "matmul_packed":
        assert any("__packed_b" in x for r in w.report["regions"] for x in r["inputs"]), w.report["regions"]
    if name == "sequences_off":
        assert not any(op.startswith("Sequence_") for op in w.custom) and max(w.custom.values()) >= 2, w.custom
    result = _run_fresh(w.out, w.folder)
    assert not result["warnings"], result["warnings"]
    assert result["library"] == os.path.realpath(w.out + ".so"), result
    _check_answers(w, w.folder)
    calls = result["calls"]
    assert calls is not None
    want = {op: n * R for op, n in w.custom.items()}
    assert {op: calls.get(op) for op in want} == want, (calls, dict(w.custom))
    assert sum(calls[op] for op in want) > 0
    # Every call is one of the written graph's nodes: no op of the library ran that the top level does not name.
    assert not {op: n for op, n in calls.items() if n and op not in want}, calls


def test_without_its_library_nothing_is_registered_and_the_count_check_fails(written, tmp_path):
    """The written model, its .so removed: the function bodies give the same answers, the loader registers nothing,
    and the library's counts (read directly) stay 0, so the check above would fail."""
    w = written("sequences_off")
    folder = str(tmp_path)
    for f in os.listdir(w.folder):
        if f.startswith("f.onnx") or f == "feeds.npz":
            shutil.copy(os.path.join(w.folder, f), folder)
    os.remove(os.path.join(folder, "f.onnx.so"))
    result = _run_fresh(os.path.join(folder, "f.onnx"), folder, probe=w.out + ".so")
    assert result["library"] is None and result["loadable"] is None and result["calls"] is None, result
    assert any("LibraryNotUsedWarning" in m and "not found" in m for m in result["warnings"]), result["warnings"]
    _check_answers(w, folder)
    probe = result["probe_calls"]
    assert set(w.custom) <= set(probe) and not any(probe.values()), probe
    assert {op: probe[op] for op in w.custom} != {op: n * R for op, n in w.custom.items()}
