"""optimize() as a Python API: its signature and docstring, its messages (the Python keyword, never a CLI flag or a
raw ValueError), strings and bytes where a list or a model is meant, and what it returns without an output path."""

import inspect
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxopt.pipeline as pipeline
from onnxopt.driver.policy import FUSION_KINDS
from onnxopt.driver.result import Result
from onnxopt.emit.model import META_LIBRARY
from onnxopt.errors import InputError, UsageError
from onnxopt.models import build_model

# Every option callers pass today (cli/main.py, tests, benchmarks): the signature must keep accepting each.
CALLERS_OPTIONS = {"input_shape", "measure_shape", "target", "rtol", "atol", "scale_tol", "check_input",
                   "also_writes", "skip_fusion", "threads", "verify", "measure", "min_speedup", "seed", "progress",
                   "plan", "cost_cache", "tile_search", "search_budget", "tune_budget", "prune", "sequences",
                   "winograd", "verify_fallback", "emulate"}


def options() -> dict:
    return {k: p for k, p in inspect.signature(pipeline.optimize).parameters.items()
            if p.kind == p.KEYWORD_ONLY and not k.startswith("_")}


def documented() -> dict:
    """`name: text` lines of the docstring's Options section (continuation lines indented further)."""
    doc = inspect.getdoc(pipeline.optimize)
    section = doc.split("\nOptions:\n", 1)[1]
    return dict(re.findall(r"^    (\w+): (.+)$", section, re.M))


def test_every_option_is_a_typed_keyword_with_a_docstring_line():
    opts = options()
    assert CALLERS_OPTIONS <= set(opts)
    assert set(documented()) == set(opts)
    for name, p in opts.items():
        assert p.annotation is not inspect.Parameter.empty, name
        assert p.default is not inspect.Parameter.empty, name
    model, output = list(inspect.signature(pipeline.optimize).parameters.values())[:2]
    assert model.kind == model.POSITIONAL_OR_KEYWORD and output.default is None


def test_the_defaults_are_the_options_defaults():
    o, d = pipeline.Options(), {k: p.default for k, p in options().items()}
    for key in ("verify", "measure", "min_speedup", "seed", "tile_search", "search_budget", "tune_budget", "prune",
                "sequences", "winograd", "verify_fallback", "emulate", "threads", "plan", "cost_cache"):
        assert d[key] == getattr(o, key), key


@pytest.fixture
def captured(monkeypatch):
    """optimize() up to its Options: the run itself is replaced, so option handling is tested in milliseconds."""
    seen = {}

    class Fake:
        def __init__(self, model, output, opts):
            seen.update(model=model, output=output, opts=opts)

        def run(self):
            return Result(onnx.ModelProto(), {})

    monkeypatch.setattr(pipeline, "_Optimizer", Fake)
    return seen


BAD = [
    ("tune_budget", "abc"), ("tune_budget", -1), ("search_budget", 0), ("search_budget", float("inf")),
    ("min_speedup", float("nan")), ("min_speedup", "fast"), ("threads", 0), ("threads", 1.5), ("threads", True),
    ("seed", -1), ("seed", "x"), ("verify", "no"), ("measure", "yes"), ("tile_search", 2), ("prune", None),
    ("sequences", "off"), ("verify_fallback", []), ("emulate", "x"), ("plan", "fastest"), ("winograd", "3"),
    ("skip_fusion", "bogus"), ("skip_fusion", "compute,bogus"), ("skip_fusion", ["compute", 3]), ("target", 3),
    ("target", "z80"), ("rtol", "abc"), ("atol", -1), ("scale_tol", "float32:nan"), ("input_shape", "x"),
    ("input_shape", 5), ("measure_shape", "x:a"), ("check_input", "x"), ("cost_cache", 3), ("progress", 3),
    ("also_writes", 5), ("report_file", 3),
]


@pytest.mark.parametrize("key,value", BAD, ids=[f"{k}={v!r}" for k, v in BAD])
def test_a_bad_value_is_a_usage_error_naming_the_keyword(captured, tmp_path, key, value):
    with pytest.raises(UsageError) as e:
        pipeline.optimize(build_model("mobilenetv3", image_size=32), str(tmp_path / "o.onnx"), **{key: value})
    msg = str(e.value)
    assert re.search(rf"\b{key}\b", msg), msg
    assert "--" not in msg, msg  # not the CLI's flag
    assert not captured  # refused before any work


def test_an_unknown_keyword_is_a_usage_error_naming_it(captured):
    with pytest.raises(UsageError, match="tune_bugdet") as e:
        pipeline.optimize(build_model("mobilenetv3", image_size=32), tune_bugdet=3)
    assert "tune_budget" in str(e.value)  # the options it has


def test_messages_from_deeper_down_name_the_keyword(tmp_path):
    with pytest.raises(UsageError, match=r"^input_shape names 'nope'"):
        pipeline.optimize(build_model("mobilenetv3", image_size=32), str(tmp_path / "o.onnx"), input_shape="nope:1,2")
    with pytest.raises(UsageError, match=r"^output \S+: the folder"):
        pipeline.optimize(build_model("mobilenetv3", image_size=32), str(tmp_path / "no" / "o.onnx"))


def test_the_cli_names_its_flags(captured):
    with pytest.raises(UsageError, match=r"^--tune-budget -1"):
        pipeline.optimize(build_model("mobilenetv3", image_size=32), tune_budget=-1, _cli=True)
    with pytest.raises(UsageError, match=r"^--skip-fusion magic: known fusion kinds"):
        pipeline.optimize(build_model("mobilenetv3", image_size=32), skip_fusion=["magic"], _cli=True)


@pytest.mark.parametrize("given,kinds", [("compute", ("compute",)), ("compute,pool", ("compute", "pool")),
                                         (["pool", "copy"], ("pool", "copy")), (None, ())])
def test_skip_fusion_takes_a_string_as_one_kind(captured, given, kinds):
    pipeline.optimize(build_model("mobilenetv3", image_size=32), skip_fusion=given)
    assert captured["opts"].skip_fusion == kinds
    assert set(kinds) <= set(FUSION_KINDS)


def test_strings_are_one_value_not_characters(captured):
    pipeline.optimize(build_model("mobilenetv3", image_size=32), input_shape="input:1,3,32,32", rtol="float32:1e-2",
                      atol=1e-3, seed="3", threads=2)
    o = captured["opts"]
    assert o.input_shapes == {"input": [1, 3, 32, 32]}
    assert o.tolerance.rtol["float32"] == 1e-2 and o.tolerance.atol["float32"] == 1e-3
    assert o.seed == 3 and o.threads == 2


def test_bytes_of_a_serialized_model_are_a_model(captured):
    m = build_model("mobilenetv3", image_size=32)
    pipeline.optimize(m.SerializeToString())
    assert isinstance(captured["model"], onnx.ModelProto) and captured["model"] == m


@pytest.mark.parametrize("data", [b"\x08\x07\xff\xfe" + bytes(range(256)) * 8, bytearray(b"\xff" * 5000)])
def test_bytes_that_are_no_model_are_never_echoed(captured, data):
    with pytest.raises(InputError) as e:
        pipeline.optimize(data)
    msg = str(e.value)
    assert f"{len(data):,} bytes" in msg and "not a serialized ONNX model" in msg
    assert "\\x" not in msg and "b'" not in msg and len(msg) < 200


def test_a_model_of_another_type_is_a_usage_error(captured):
    with pytest.raises(UsageError, match="model of type dict"):
        pipeline.optimize({"graph": None})


def test_without_an_output_the_result_names_no_library(tmp_path, monkeypatch):
    """The contract without `output`: nothing is written, Result.library is None and the model's metadata names no
    library file (the one the checks linked is gone with the run's temporary folder). The model runs in a plain
    onnxruntime (its fused nodes' function bodies) and gives the original's answers."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    m = build_model("mobilenetv3", image_size=32)
    # verify=False: the whole-model check is the driver's; this test runs the returned model itself
    res = pipeline.optimize(m.SerializeToString(), measure=False, verify=False, skip_fusion="compute", threads=1,
                            cost_cache=False)
    assert res.output is None and res.library is None
    assert any(n.domain == "onnxopt" for n in res.model.graph.node), "nothing was fused"
    assert META_LIBRARY not in {p.key for p in res.model.metadata_props}
    assert not list(tmp_path.iterdir()), "optimize() without an output left files"
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    got = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-3, atol=1e-4)
