"""Shapes a model can run at (graph/bindings.py, driver/outputs.py `_choose_bindings`): -1 dims are symbolic, symbolic
dims are checked at sizes models are served at (images 224/320/640, batch 1, sequences 128) or that the model
implies, and a model that runs at none needs input shapes or data, with the flags to give. Real onnxruntime; the
models are built here."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.errors import InputError
from onnxopt.graph.bindings import NEEDS_INPUT, candidates, implied_bindings, input_symbols, name_dynamic_dims
from onnxopt.graph.load import load_model
from onnxopt.verify import make_inputs

from onnx_builders import vad_model as vad_like

F = TensorProto.FLOAT
QUICK = dict(threads=1, tune_budget=0, search_budget=5, min_speedup=0, cost_cache=False, measure=False)


def _model(nodes, inputs, outputs, inits=(), opset=17, metadata=None):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    for k, v in (metadata or {}).items():
        m.metadata_props.add(key=k, value=v)
    return m


def paddle_classifier():
    """As Paddle2ONNX writes a PP-OCR classifier's head: x [-1, 64], every dynamic dim -1."""
    inits = [numpy_helper.from_array(np.linspace(-1, 1, 64, dtype=np.float32), "b"),
             numpy_helper.from_array(np.full((64,), 2.0, np.float32), "c")]
    nodes = [helper.make_node("Add", ["x", "b"], ["t1"]), helper.make_node("Relu", ["t1"], ["t2"]),
             helper.make_node("Mul", ["t2", "c"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [-1, 64])],
                  [helper.make_tensor_value_info("y", F, [-1, 64])], inits)


def yolo_like(channels=4):
    """x [N, 3, H, W]: five stride-2 3x3 convolutions, the last map upsampled x2 (Resize) and concatenated with the
    fourth: it runs only where H and W are multiples of 32 (at 2 and 3 the maps are 1x1 and the Concat fails)."""
    rng = np.random.default_rng(0)
    inits, nodes, prev, cin, maps = [], [], "x", 3, []
    for i in range(5):
        w = numpy_helper.from_array(rng.standard_normal((channels, cin, 3, 3)).astype(np.float32) * 0.3, f"w{i}")
        inits.append(w)
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], strides=[2, 2], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        prev, cin = f"r{i}", channels
        maps.append(prev)
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    nodes.append(helper.make_node("Resize", [maps[4], "", "scales"], ["up"], mode="nearest"))
    nodes.append(helper.make_node("Concat", ["up", maps[3]], ["y"], axis=1))
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 3, "H", "W"])],
                  [helper.make_tensor_value_info("y", F, None)], inits)


def tokens_of_1024():
    """x [1, 3, H, W] -> Reshape [1, 3, -1, 1024] -> Relu -> * 2: H * W must be a multiple of 1024."""
    inits = [numpy_helper.from_array(np.array([1, 3, -1, 1024], np.int64), "shape"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["t"]),
             helper.make_node("Mul", ["t", "two"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, 3, "H", "W"])],
                  [helper.make_tensor_value_info("y", F, None)], inits)


def first_that_runs(model):
    """What _choose_bindings keeps: the first candidate onnxruntime runs (and the labels of those before it)."""
    so = ort.SessionOptions()
    so.log_severity_level = 4
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    failed = []
    for label, b in candidates(model):
        try:
            sess.run(None, make_inputs(model, b))
            return b, failed
        except Exception:  # noqa: BLE001
            failed.append(label)
    return None, failed


def test_minus_one_dims_get_a_symbol_and_the_declared_model_is_kept(tmp_path):
    m = paddle_classifier()
    path = tmp_path / "cls.onnx"
    onnx.save(m, path)
    loaded = load_model(str(path))
    dims = loaded.model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param.startswith("dyn__") and not dims[0].HasField("dim_value") and dims[1].dim_value == 64
    assert not loaded.model.graph.output[0].type.tensor_type.shape.dim[0].HasField("dim_value")
    assert input_symbols(loaded.model) == [dims[0].dim_param]
    back = onnx.ModelProto()
    back.CopyFrom(loaded.model)
    loaded.restore_given(back)
    assert back.SerializeToString() == m.SerializeToString()  # written unchanged: the model as given


def test_a_name_taken_already_is_not_reused():
    m = paddle_classifier()
    m.graph.input.append(helper.make_tensor_value_info("z", F, ["dyn__x_0", 2]))
    assert name_dynamic_dims(m)
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "dyn__x_0_"


def test_minus_one_batch_is_optimized_and_stays_symbolic(tmp_path):
    path = tmp_path / "cls.onnx"
    onnx.save(paddle_classifier(), path)
    res = onnxopt.optimize(str(path), str(tmp_path / "f.onnx"), **QUICK)
    sym = res.model.graph.input[0].type.tensor_type.shape.dim[0]
    assert sym.dim_param and not sym.HasField("dim_value")
    assert res.report["check_bindings"] == {sym.dim_param: 1}
    assert res.report["regions"]  # fused, not refused as "the model's shapes are invalid"
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_image_dims_are_tried_at_224_not_2_and_3():
    b, failed = first_that_runs(yolo_like())
    assert b == {"N": 1, "H": 224, "W": 224} and failed == []
    # the old small values would not have run
    so = ort.SessionOptions()
    so.log_severity_level = 4
    sess = ort.InferenceSession(yolo_like().SerializeToString(), so, providers=["CPUExecutionProvider"])
    with pytest.raises(Exception):
        sess.run(None, make_inputs(yolo_like(), {"N": 2, "H": 3, "W": 4}))


def test_a_model_needing_more_than_224_gets_320_or_640():
    m = tokens_of_1024()
    m.graph.node[0].input[1] = "shape2"
    m.graph.initializer.append(numpy_helper.from_array(np.array([1, 3, -1, 4096], np.int64), "shape2"))
    b, failed = first_that_runs(m)  # 224 * 224 is 49 * 1024, not a multiple of 4096; 320 * 320 is 25 * 4096
    assert b == {"H": 320, "W": 320} and failed and failed[0].startswith("typical (image 224")


def test_the_optimizer_checks_an_image_model_at_a_size_it_runs(tmp_path):
    res = onnxopt.optimize(tokens_of_1024(), str(tmp_path / "f.onnx"), **QUICK)
    assert res.report["check_bindings"] in ({"H": s, "W": s} for s in (224, 320, 640))
    dims = [d.dim_param or d.dim_value for d in res.model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, "H", "W"]


def test_sequences_at_128_batch_at_1_and_metadata_first():
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])
    m = _model([helper.make_node("Cast", ["input_ids"], ["y"], to=F)], [ids],
               [helper.make_tensor_value_info("y", F, None)])
    assert candidates(m)[0][1] == {"batch": 1, "sequence": 128}
    y = yolo_like()
    y.metadata_props.add(key="imgsz", value="[640, 480]")
    y.metadata_props.add(key="stride", value="32")
    assert implied_bindings(y, input_symbols(y)) == {"H": 640, "W": 480}
    assert candidates(y)[0] == ("implied by the model", {"N": 1, "H": 640, "W": 480})


def test_a_fixed_dim_a_symbol_meets_is_implied():
    """A position table of 16 rows added to x [1, seq, 8]: seq is 16."""
    pos = numpy_helper.from_array(np.zeros((1, 16, 8), np.float32), "pos")
    m = _model([helper.make_node("Add", ["x", "pos"], ["y"])], [helper.make_tensor_value_info("x", F, [1, "seq", 8])],
               [helper.make_tensor_value_info("y", F, None)], [pos])
    assert implied_bindings(m, ["seq"]) == {"seq": 16}
    b, _ = first_that_runs(m)
    assert b == {"seq": 16}


def test_user_values_are_kept_in_every_candidate():
    cands = candidates(yolo_like(), {"H": 256})
    assert all(b["H"] == 256 for _, b in cands)
    assert len(cands) <= 6
    assert candidates(yolo_like(), {"N": 1, "H": 64, "W": 64}) == [("as given", {"N": 1, "H": 64, "W": 64})]


def test_a_mode_input_fails_with_the_advice_unless_given(tmp_path):
    with pytest.raises(InputError) as e:
        onnxopt.optimize(vad_like(), str(tmp_path / "f.onnx"), **QUICK)
    msg = str(e.value)
    assert NEEDS_INPUT in msg and "sr may select a mode" in msg and "check_input sr:FILE.npy" in msg
    sr = tmp_path / "sr.npy"
    np.save(sr, np.array(16000, np.int64))
    res = onnxopt.optimize(vad_like(), str(tmp_path / "f.onnx"), check_input=[f"sr:{sr}"], **QUICK)
    assert res.report["check_bindings"] == {}
    x = np.ones((1, 64), np.float32)
    want = ort.InferenceSession(vad_like().SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "sr": np.array(8000, np.int64)})[0]
    got = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "sr": np.array(8000, np.int64)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_broken_model_without_symbols_is_not_said_to_need_input(tmp_path):
    """Nothing the user could give helps a Gather out of bounds in a fixed-shape model: the old message."""
    bad = numpy_helper.from_array(np.array([1000], np.int64), "bad")
    m = _model([helper.make_node("Gather", ["x", "bad"], ["y"], axis=0)], [helper.make_tensor_value_info("x", F, [2, 3])],
               [helper.make_tensor_value_info("y", F, None)], [bad])
    with pytest.raises(InputError) as e:
        onnxopt.optimize(m, str(tmp_path / "f.onnx"), **QUICK)
    assert "fails in onnxruntime on random inputs" in str(e.value) and NEEDS_INPUT not in str(e.value)


def test_input_shape_fixes_a_minus_one_dim_and_the_declared_model_comes_back(tmp_path):
    m = paddle_classifier()
    path = tmp_path / "cls.onnx"
    onnx.save(m, path)
    loaded = load_model(str(path), {"x": [4, 64]})
    assert [d.dim_value for d in loaded.model.graph.input[0].type.tensor_type.shape.dim] == [4, 64]
    back = onnx.ModelProto()
    back.CopyFrom(loaded.model)
    loaded.restore_given(back)
    assert back.SerializeToString() == m.SerializeToString()


def text_recognizer():
    """x [N, 3, H, W] as Paddle2ONNX writes PP-OCR's recognizers (H and W symbolic): the network pools the height
    by 48 and squeezes it, so only a height of 48 to 95 runs (a text line), whatever the width."""
    nodes = [helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[48, 1], strides=[48, 1]),
             helper.make_node("Squeeze", ["p", "axes"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    inits = [numpy_helper.from_array(np.array([2], np.int64), "axes")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 3, "?", "W"])],
                  [helper.make_tensor_value_info("y", F, None)], inits)


def test_a_text_recognizer_is_checked_at_a_text_line():
    b, failed = first_that_runs(text_recognizer())
    assert b == {"N": 1, "?": 48, "W": 320}, (b, failed)
    assert failed == ["typical (image 224, batch 1, sequence 128)"]


def test_unknown_dims_get_a_symbol_too(tmp_path):
    """Silero VAD's export declares its input's dims with neither a value nor a name: symbolic to onnxruntime, so
    the candidates try values for them (and the advice names them) instead of checking at 1."""
    m = paddle_classifier()
    dims = m.graph.input[0].type.tensor_type.shape.dim
    dims[0].ClearField("dim_value")
    assert dims[0].WhichOneof("value") is None
    path = tmp_path / "vad.onnx"
    onnx.save(m, path)
    loaded = load_model(str(path))
    assert input_symbols(loaded.model) == ["dyn__x_0"]
    back = onnx.ModelProto()
    back.CopyFrom(loaded.model)
    loaded.restore_given(back)
    assert back.SerializeToString() == m.SerializeToString()
