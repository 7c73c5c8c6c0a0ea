"""onnxopt.graph.load: reading, shape fixing, output-path checks, atomic saving, IR clamping."""

from __future__ import annotations

import os
import shutil
import stat

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxopt.errors import InputError, OnnxoptError, UsageError
from onnxopt.graph import ort_compat
from onnxopt.graph.load import (
    LoadedModel,
    check_output_path,
    fix_input_shapes,
    load_model,
    ort_loadable_ir,
    parse_input_shapes,
    save_model,
)

F32 = TensorProto.FLOAT
IR = 10


def _session(model_or_path):
    src = model_or_path if isinstance(model_or_path, str) else model_or_path.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"])


def add_model(batch="N", width=512) -> onnx.ModelProto:
    """y = Relu(x + w), x: [batch, width], w: [width] (2 KiB at the default width: big enough for external data)."""
    w = (np.arange(width, dtype=np.float32) - width / 2) / 100.0
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["a"], name="add"), helper.make_node("Relu", ["a"], ["y"], name="relu")],
        "add",
        [helper.make_tensor_value_info("x", F32, [batch, width])],
        [helper.make_tensor_value_info("y", F32, [batch, width])],
        initializer=[numpy_helper.from_array(w, "w")],
        value_info=[helper.make_tensor_value_info("a", F32, [batch, width])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def _ref(x, m):
    w = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "w"))
    return np.maximum(x + w, 0)


# ---------------------------------------------------------------- parse_input_shapes


@pytest.mark.parametrize("specs, want", [
    (None, {}),
    ([], {}),
    (["x:1,3,224,224"], {"x": [1, 3, 224, 224]}),
    (["x:1,3,224,224", "mask:1,128"], {"x": [1, 3, 224, 224], "mask": [1, 128]}),
    (["x:1, 3, 8"], {"x": [1, 3, 8]}),
    (["x:7"], {"x": [7]}),
    (["ns:input:0:2,5"], {"ns:input:0": [2, 5]}),  # names may contain ':'; the dims follow the last one
    (["x:1,2", "x:3,4"], {"x": [3, 4]}),
])
def test_parse_input_shapes_good(specs, want):
    assert parse_input_shapes(specs) == want


@pytest.mark.parametrize("spec, words", [
    ("x1,3,224", "name:d0,d1"),
    (":1,3", "name:d0,d1"),
    ("", "name:d0,d1"),
    ("x:1,a,3", "integers"),
    ("x:1.5,2", "integers"),
    ("x:N,3", "integers"),
])
def test_parse_input_shapes_bad(spec, words):
    with pytest.raises(UsageError) as ei:
        parse_input_shapes([spec])
    assert words in str(ei.value)
    assert spec in str(ei.value)  # the message quotes what the user wrote
    assert ei.value.exit_code == 2


def test_parse_input_shapes_rejects_negative_dims():
    with pytest.raises(UsageError):
        parse_input_shapes(["x:-1,3"])


# ---------------------------------------------------------------- fix_input_shapes


def test_fix_input_shapes_fixes_dims_and_drops_stale_value_info():
    m = add_model()
    assert len(m.graph.value_info) == 1
    fix_input_shapes(m, {"x": [4, 512]})
    dims = m.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [4, 512]
    assert all(not d.HasField("dim_param") for d in dims)
    assert len(m.graph.value_info) == 0
    onnx.checker.check_model(m)
    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    sess = _session(m)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _ref(x, m), rtol=1e-6)
    with pytest.raises(Exception):  # the input is now fixed: another batch is refused
        sess.run(None, {"x": np.zeros((2, 512), np.float32)})


def test_fix_input_shapes_wrong_name():
    m = add_model()
    with pytest.raises(UsageError) as ei:
        fix_input_shapes(m, {"input": [1, 512]})
    msg = str(ei.value)
    assert "'input'" in msg and "x" in msg  # says which inputs exist


def test_fix_input_shapes_wrong_rank():
    m = add_model()
    with pytest.raises(UsageError) as ei:
        fix_input_shapes(m, {"x": [1, 3, 512]})
    assert "rank 2" in str(ei.value) and "3 dims" in str(ei.value)


def test_fix_input_shapes_input_without_shape_gets_one():
    m = add_model()
    m.graph.input[0].type.tensor_type.ClearField("shape")
    fix_input_shapes(m, {"x": [3, 512]})
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [3, 512]


# ---------------------------------------------------------------- load_model


def test_load_model_from_path(tmp_path):
    m = add_model()
    p = tmp_path / "m.onnx"
    onnx.save_model(m, str(p))
    loaded = load_model(str(p))
    assert isinstance(loaded, LoadedModel)
    assert loaded.path == str(p)
    assert loaded.used_external_data is False
    assert loaded.size_bytes == os.path.getsize(p)
    assert loaded.model.SerializeToString() == m.SerializeToString()
    # os.PathLike works too
    assert load_model(p).model.SerializeToString() == m.SerializeToString()


def test_load_model_from_proto_is_a_copy():
    m = add_model()
    before = m.SerializeToString()
    loaded = load_model(m, {"x": [2, 512]})
    assert loaded.path is None
    assert loaded.used_external_data is False
    assert loaded.size_bytes == m.ByteSize()
    assert loaded.model is not m
    assert m.SerializeToString() == before  # the caller's model is untouched by the shape fixing
    assert [d.dim_value for d in loaded.model.graph.input[0].type.tensor_type.shape.dim] == [2, 512]
    loaded.model.graph.node[0].name = "changed"
    assert m.graph.node[0].name == "add"


def test_load_model_with_input_shapes_from_path(tmp_path):
    p = tmp_path / "m.onnx"
    onnx.save_model(add_model(), str(p))
    loaded = load_model(str(p), {"x": [5, 512]})
    assert [d.dim_value for d in loaded.model.graph.input[0].type.tensor_type.shape.dim] == [5, 512]
    with pytest.raises(UsageError):
        load_model(str(p), {"nope": [1]})


def test_load_model_missing_file(tmp_path):
    p = tmp_path / "missing.onnx"
    with pytest.raises(InputError) as ei:
        load_model(str(p))
    assert str(p) in str(ei.value) and "no such file" in str(ei.value)
    assert ei.value.exit_code == 2


@pytest.mark.parametrize("content", [b"hello, this is not a model", b"\x08\x07\x12\xff\xff\xff"])
def test_load_model_garbage_file(tmp_path, content):
    p = tmp_path / "bad.onnx"
    p.write_bytes(content)
    with pytest.raises(InputError) as ei:
        load_model(str(p))
    assert str(p) in str(ei.value)
    assert "not a readable ONNX model" in str(ei.value) or "no nodes" in str(ei.value)


def test_load_model_truncated_file(tmp_path):
    data = add_model().SerializeToString()
    p = tmp_path / "trunc.onnx"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError) as ei:
        load_model(str(p))
    assert "not a readable ONNX model" in str(ei.value)
    assert "complete .onnx" in str(ei.value)


def test_load_model_directory_is_an_input_error(tmp_path):
    with pytest.raises(InputError):
        load_model(str(tmp_path))


def test_load_model_empty_graph():
    g = helper.make_graph([], "empty", [helper.make_tensor_value_info("x", F32, [1])],
                          [helper.make_tensor_value_info("x", F32, [1])])
    with pytest.raises(InputError) as ei:
        load_model(helper.make_model(g, ir_version=IR))
    assert "no nodes" in str(ei.value)


def _save_external(m, folder, name="ext.onnx", location="ext.weights"):
    m = onnx.ModelProto.FromString(m.SerializeToString())  # onnx.save_model converts in place
    path = os.path.join(folder, name)
    onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location=location,
                    size_threshold=0)
    return path


def test_load_model_with_external_data(tmp_path):
    m = add_model()
    path = _save_external(m, str(tmp_path))
    assert os.path.exists(tmp_path / "ext.weights")
    raw = onnx.load(path, load_external_data=False)
    assert raw.graph.initializer[0].data_location == TensorProto.EXTERNAL

    loaded = load_model(path)
    assert loaded.used_external_data is True
    assert loaded.size_bytes == os.path.getsize(path)
    w = loaded.model.graph.initializer[0]
    assert w.data_location == TensorProto.DEFAULT  # data now in memory
    np.testing.assert_array_equal(numpy_helper.to_array(w),
                                  numpy_helper.to_array(m.graph.initializer[0]))
    # the loaded model is self-contained: it runs from bytes, away from its data file
    x = np.ones((3, 512), np.float32)
    np.testing.assert_allclose(_session(loaded.model).run(None, {"x": x})[0], _ref(x, m), rtol=1e-6)


def test_load_model_from_other_cwd_with_external_data(tmp_path, monkeypatch):
    path = _save_external(add_model(), str(tmp_path / ""))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    rel = os.path.relpath(path)
    assert load_model(rel).used_external_data is True


def test_load_model_missing_external_data(tmp_path):
    path = _save_external(add_model(), str(tmp_path))
    os.remove(tmp_path / "ext.weights")
    with pytest.raises(InputError) as ei:
        load_model(path)
    msg = str(ei.value)
    assert path in msg and "external data" in msg and ".data" in msg


def test_load_model_truncated_external_data(tmp_path):
    path = _save_external(add_model(), str(tmp_path))
    with open(tmp_path / "ext.weights", "r+b") as f:
        f.truncate(100)
    with pytest.raises(InputError) as ei:
        load_model(path)
    assert "external data" in str(ei.value)


# ---------------------------------------------------------------- check_output_path


def test_check_output_path_accepts_new_and_existing_files(tmp_path):
    inp = tmp_path / "in.onnx"
    inp.write_bytes(b"x")
    check_output_path(str(inp), str(tmp_path / "out.onnx"))
    other = tmp_path / "other.onnx"
    other.write_bytes(b"y")
    check_output_path(str(inp), str(other))  # overwriting another file is fine
    check_output_path(None, str(tmp_path / "out.onnx"))


def test_check_output_path_relative_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_output_path(None, "out.onnx")


def test_check_output_path_refuses_the_input(tmp_path, monkeypatch):
    inp = tmp_path / "in.onnx"
    inp.write_bytes(b"x")
    with pytest.raises(UsageError) as ei:
        check_output_path(str(inp), str(inp))
    assert "input" in str(ei.value)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError):
        check_output_path(str(inp), "in.onnx")  # same file, spelled relatively
    with pytest.raises(UsageError):
        check_output_path("in.onnx", str(inp))
    with pytest.raises(UsageError):
        check_output_path(str(inp), str(tmp_path / "sub" / ".." / "in.onnx"))


def test_check_output_path_refuses_the_input_through_a_symlink(tmp_path):
    inp = tmp_path / "in.onnx"
    inp.write_bytes(b"x")
    link = tmp_path / "link.onnx"
    link.symlink_to(inp)
    with pytest.raises(UsageError):
        check_output_path(str(inp), str(link))
    with pytest.raises(UsageError):
        check_output_path(str(link), str(inp))
    hard = tmp_path / "hard.onnx"
    os.link(inp, hard)
    with pytest.raises(UsageError):
        check_output_path(str(inp), str(hard))


def test_check_output_path_missing_folder(tmp_path):
    with pytest.raises(UsageError) as ei:
        check_output_path(None, str(tmp_path / "nope" / "out.onnx"))
    assert str(tmp_path / "nope") in str(ei.value) and "does not exist" in str(ei.value)


def test_check_output_path_empty():
    with pytest.raises(UsageError) as ei:
        check_output_path(None, "")
    assert "-o" in str(ei.value)


def test_check_output_path_missing_input_existing_output(tmp_path):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"old")
    try:
        check_output_path(str(tmp_path / "missing.onnx"), str(out))
    except OnnxoptError:
        pass


def test_check_output_path_refuses_a_directory(tmp_path):
    d = tmp_path / "dir.onnx"
    d.mkdir()
    with pytest.raises(UsageError):
        check_output_path(None, str(d))


# ---------------------------------------------------------------- save_model


def _leftovers(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith(".tmp") or n.startswith(".onnxopt-") or n.startswith("."))


def test_save_model_inline(tmp_path):
    m = add_model()
    before = m.SerializeToString()
    out = tmp_path / "out.onnx"
    written = save_model(m, str(out), external=False)
    assert written == [str(out)]
    assert out.exists() and not (tmp_path / "out.onnx.data").exists()
    assert _leftovers(tmp_path) == []
    assert m.SerializeToString() == before
    assert onnx.load(str(out)).SerializeToString() == before


def test_save_model_replaces_existing_output(tmp_path):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"old content")
    save_model(add_model(), str(out), external=False)
    assert onnx.load(str(out)).graph.node[0].op_type == "Add"
    assert _leftovers(tmp_path) == []


def test_save_model_relative_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_model(add_model(), "rel.onnx", external=True)
    assert (tmp_path / "rel.onnx").exists() and (tmp_path / "rel.onnx.data").exists()
    assert _leftovers(tmp_path) == []


def test_save_model_external(tmp_path):
    m = add_model()
    before = m.SerializeToString()
    out = tmp_path / "out.onnx"
    save_model(m, str(out), external=True)
    assert m.SerializeToString() == before  # converted on a copy
    assert out.exists() and (tmp_path / "out.onnx.data").exists()
    assert _leftovers(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == ["out.onnx", "out.onnx.data"]

    raw = onnx.load(str(out), load_external_data=False)
    w = raw.graph.initializer[0]
    assert w.data_location == TensorProto.EXTERNAL
    loc = {e.key: e.value for e in w.external_data}["location"]
    assert loc == "out.onnx.data"  # relative: the pair can be moved together
    assert os.path.getsize(tmp_path / "out.onnx.data") >= 512 * 4

    # ORT runs it from its path; so does a copy of the pair moved elsewhere
    x = np.random.default_rng(1).standard_normal((2, 512)).astype(np.float32)
    np.testing.assert_allclose(_session(str(out)).run(None, {"x": x})[0], _ref(x, m), rtol=1e-6)
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.move(str(out), moved / "out.onnx")
    shutil.move(str(tmp_path / "out.onnx.data"), moved / "out.onnx.data")
    np.testing.assert_allclose(_session(str(moved / "out.onnx")).run(None, {"x": x})[0], _ref(x, m), rtol=1e-6)
    # and load_model reads it back with its data
    loaded = load_model(str(moved / "out.onnx"))
    assert loaded.used_external_data is True
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.model.graph.initializer[0]),
                                  numpy_helper.to_array(m.graph.initializer[0]))


def test_save_model_external_small_tensors_stay_inline(tmp_path):
    m = add_model(width=4)  # 32 bytes: below the threshold
    out = tmp_path / "small.onnx"
    save_model(m, str(out), external=True)
    raw = onnx.load(str(out), load_external_data=False)
    assert raw.graph.initializer[0].data_location == TensorProto.DEFAULT
    assert not (tmp_path / "small.onnx.data").exists()
    assert _leftovers(tmp_path) == []


def _failing_save(*args, **kwargs):
    raise OSError("disk full (simulated)")


def test_save_model_failure_leaves_nothing_inline(tmp_path, monkeypatch):
    import onnxopt.graph.load as load_module

    out = tmp_path / "out.onnx"
    out.write_bytes(b"previous")
    monkeypatch.setattr(load_module, "create_new", _failing_save)
    with pytest.raises(OSError, match="disk full"):
        save_model(add_model(), str(out), external=False)
    assert sorted(os.listdir(tmp_path)) == ["out.onnx"]
    assert out.read_bytes() == b"previous"  # the old output is intact


def test_save_model_missing_folder_raises(tmp_path):
    with pytest.raises(OSError):
        save_model(add_model(), str(tmp_path / "nested" / "out.onnx"), external=False)
    assert os.listdir(tmp_path) == []


def test_save_model_failure_leaves_nothing_external(tmp_path, monkeypatch):
    out = tmp_path / "out.onnx"
    monkeypatch.setattr(onnx, "save_model", _failing_save)
    with pytest.raises(OSError, match="disk full"):
        save_model(add_model(), str(out), external=True)
    assert os.listdir(tmp_path) == []


def test_save_model_honours_umask(tmp_path):
    old = os.umask(0o022)
    try:
        out = tmp_path / "out.onnx"
        save_model(add_model(), str(out), external=False)
        assert stat.S_IMODE(os.stat(out).st_mode) == 0o644
    finally:
        os.umask(old)


# ---------------------------------------------------------------- IR versions


def test_ort_loadable_ir_clamps_and_raises():
    top = ort_compat.max_ir_version()
    m = add_model()
    m.ir_version = 99
    ort_loadable_ir(m, needs_functions=False)
    assert m.ir_version == top
    m.ir_version = 99
    ort_loadable_ir(m, needs_functions=True)
    assert m.ir_version == top
    m.ir_version = 4
    ort_loadable_ir(m, needs_functions=True)
    assert m.ir_version == min(8, top) == 8
    m.ir_version = 4
    ort_loadable_ir(m, needs_functions=False)
    assert m.ir_version == 4
    m.ir_version = 9
    ort_loadable_ir(m, needs_functions=True)
    assert m.ir_version == 9


def test_ort_loadable_ir_output_opens_in_ort():
    m = add_model()
    m.ir_version = onnx.IR_VERSION + 5
    ort_loadable_ir(m, needs_functions=False)
    x = np.ones((1, 512), np.float32)
    assert _session(m).run(None, {"x": x})[0].shape == (1, 512)


def test_ort_compat_versions_are_sane():
    ir, opset = ort_compat.max_ir_version(), ort_compat.max_opset()
    assert 8 <= ir <= onnx.IR_VERSION
    assert 13 <= opset <= onnx.defs.onnx_opset_version()
    assert ort_compat.max_ir_version() == ir  # cached, stable
    # ORT opens a model at exactly these versions...
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "p",
                          [helper.make_tensor_value_info("x", F32, [3])], [helper.make_tensor_value_info("y", F32, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)
    out = _session(m).run(None, {"x": np.array([-1, 0, 2], np.float32)})[0]
    np.testing.assert_array_equal(out, [0, 0, 2])
    # ...and the probe is maximal: one more is refused (when onnx knows one more)
    if ir < onnx.IR_VERSION:
        assert not ort_compat._loads(ir + 1, 13)
    if opset < onnx.defs.onnx_opset_version():
        assert not ort_compat._loads(ir, opset + 1)
    assert ort_compat._loads(ir, 13)
