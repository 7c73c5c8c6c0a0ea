"""A model that runs at no shape the optimizer tries ends `needs-input` in a batch, with the list-file line that
gives it what it needs; that line then gets it optimized. (graph/bindings.py; the single-model side is in
tests/graph/test_bindings.py.)"""

import os

import numpy as np
import onnx
from onnx import TensorProto

from onnxopt.batch import run_batch
from onnxopt.batch.sources import collect_sources

from batch_models import add_relu_mul
from onnx_builders import vad_model

F = TensorProto.FLOAT


def vad_like(path):
    """onnx_builders.vad_like, saved at `path`."""
    os.makedirs(os.path.dirname(os.fspath(path)), exist_ok=True)
    onnx.save(vad_model(), os.fspath(path))


def paddle_like(path):
    """add_relu_mul with its batch declared -1, as Paddle2ONNX writes it."""
    add_relu_mul(path, batch=1)
    m = onnx.load(os.fspath(path))
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_value = -1
    onnx.save(m, os.fspath(path))


def test_a_folder_gives_needs_input_with_the_list_line_and_the_line_optimizes_it(tmp_path, quick_kwargs):
    zoo = tmp_path / "zoo"
    vad_like(zoo / "vad.onnx")
    paddle_like(zoo / "cls.onnx")
    res = run_batch([str(zoo)], str(tmp_path / "out"), bench=False, **quick_kwargs)
    by = {r["model"]: r for r in res.records}
    assert by["cls.onnx"]["status"] in ("optimized", "unchanged"), by["cls.onnx"]  # -1 is a symbolic batch
    vad = by["vad.onnx"]
    assert vad["status"] == "needs-input", vad
    assert "needs input shapes or data" in vad["reason"] and "`vad.onnx --check-input sr:FILE.npy`" in vad["reason"]
    assert "list file" in vad["reason"]
    assert res.exit_code == 0  # not a failure: nothing broke, the model needs what only the user knows
    assert res.report["totals"]["failures"] == 0 and res.report["totals"]["by_status"]["needs-input"] == 1
    assert not os.path.exists(tmp_path / "out" / "vad.onnx")

    np.save(zoo / "sr16k.npy", np.array(16000, np.int64))
    (zoo / "list.txt").write_text("vad.onnx --check-input sr:sr16k.npy  # Silero's sample rate\n")
    res = run_batch([f"@{zoo / 'list.txt'}"], str(tmp_path / "out2"), bench=False, **quick_kwargs)
    (r,) = res.records
    assert r["status"] in ("optimized", "unchanged"), r
    assert os.path.isfile(tmp_path / "out2" / "vad.onnx") and res.exit_code == 0


def test_list_lines_take_measure_shapes_and_check_inputs(tmp_path):
    add_relu_mul(tmp_path / "m.onnx", batch=None)
    np.save(tmp_path / "x.npy", np.zeros((3, 64), np.float32))
    (tmp_path / "list.txt").write_text("m.onnx --measure-shape x:4,64 --check-input x:x.npy\n")
    (s,) = collect_sources([f"@{tmp_path / 'list.txt'}"], str(tmp_path / "out"))
    assert s.measure_shape == ["x:4,64"] and s.check_input == [f"x:{tmp_path / 'x.npy'}"]
    from onnxopt.batch.runner import _model_args

    args = _model_args(["--measure-shape", "x:2,64", "--threads", "1"], [], s)
    assert args == ["--threads", "1", "--measure-shape", "x:4,64", "--check-input", f"x:{tmp_path / 'x.npy'}"]
    (tmp_path / "bad.txt").write_text("m.onnx --check-input x:missing.npy\n")
    import pytest

    from onnxopt.errors import UsageError

    with pytest.raises(UsageError, match="missing.npy"):
        collect_sources([f"@{tmp_path / 'bad.txt'}"], str(tmp_path / "out"))
