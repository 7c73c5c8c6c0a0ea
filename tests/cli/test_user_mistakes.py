"""What the user gets wrong, and what must never happen because of it (issue 31, items 3 and 4).

Every mistake is exit 2 (130 for a signal) with one line on stderr and no traceback; nothing is written at the
output paths, no temporary file or folder is left behind, and no input file (the model, its external data, the
check inputs) changes. The kernel loader stays in the model's own folder; ONNXOPT_HOST_LEVEL caps the host; a build
worker that dies or hangs ends the run instead of killing or hanging it.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxopt.cli.main import main

FAST = ["--threads", "1", "--tune-budget", "0", "--no-cost-cache", "--no-measure"]
SHAPE = [1, 4, 8, 8]


# ---------------------------------------------------------------------------------------------------------- models

def elementwise_model(shape=SHAPE, weight: bool = True) -> onnx.ModelProto:
    """x -> Relu -> Sigmoid -> Mul (-> Mul w): one fused elementwise region; `w` gives it an initializer to keep in
    external data."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["b"]),
             helper.make_node("Mul", ["a", "b"], ["c" if weight else "y"])]
    inits = []
    if weight:
        fixed = [d if isinstance(d, int) else 1 for d in shape]
        w = np.random.default_rng(1).standard_normal([1] + fixed[1:]).astype(np.float32)
        inits.append(numpy_helper.from_array(w, "w"))
        nodes.append(helper.make_node("Mul", ["c", "w"], ["y"]))
    g = helper.make_graph(nodes, "g", [x], [y], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def conv_chain(n: int = 8, c: int = 16, hw: int = 40) -> onnx.ModelProto:
    """3x3 Conv -> Relu, n times: a model whose optimization with measurement takes many seconds."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])
    nodes, inits, prev = [], [], "x"
    for i in range(n):
        inits.append(numpy_helper.from_array((rng.standard_normal([c, c, 3, 3]) * 0.1).astype(np.float32), f"w{i}"))
        inits.append(numpy_helper.from_array(rng.standard_normal([c]).astype(np.float32) * 0.1, f"b{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        out = "y" if i == n - 1 else f"r{i}"
        nodes.append(helper.make_node("Relu", [f"c{i}"], [out]))
        prev = out
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, hw, hw])
    m = helper.make_model(helper.make_graph(nodes, "chain", [x], [y], initializer=inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def save(model: onnx.ModelProto, path, **kw) -> str:
    onnx.save(model, str(path), **kw)
    return str(path)


def run_ort(path: str, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


# --------------------------------------------------------------------------------------------------------- helpers

def sha(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def hashes(paths) -> dict:
    return {str(p): sha(p) for p in paths}


def stray_files(folder) -> list[str]:
    """Temporary files and folders onnxopt may leave: .NAME.*.tmp, .onnxopt-*, onnxopt-*."""
    return sorted(n for n in os.listdir(folder)
                  if (n.startswith(".") and n.endswith(".tmp")) or n.startswith((".onnxopt-", "onnxopt-")))


def assert_nothing_written(out, inputs=()) -> None:
    """Nothing at out, out.so, out.data (but an input of the run there, whose hash the caller checks)."""
    out = str(out)
    keep = {os.path.abspath(str(p)) for p in inputs}
    for p in (out, out + ".so", out + ".data"):
        if os.path.abspath(p) in keep:
            continue
        assert not os.path.exists(p), f"{p} was written by a run that failed"
    assert stray_files(os.path.dirname(os.path.abspath(out)) or ".") == []


def assert_one_error_line(err: str, *needles: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("onnxopt: error:"), lines[0]
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture
def scratch_tmp(tmp_path, monkeypatch):
    """tempfile's folder for in-process runs: a fresh one, so leftover onnxopt-* folders can be seen."""
    d = tmp_path / "systmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    yield d
    assert stray_files(d) == [], f"temporary folders left behind: {stray_files(d)}"


def cli_error(capsys, args, inputs, out, *needles, code=2) -> str:
    """Run `onnxopt ARGS` in this process; it must fail with `code`, one line, no output files, inputs unchanged."""
    before = hashes(inputs)
    capsys.readouterr()
    rc = main([str(a) for a in args])
    captured = capsys.readouterr()
    assert rc == code, (rc, captured.out, captured.err)
    line = assert_one_error_line(captured.err, *needles)
    if out is not None:
        assert_nothing_written(out, inputs)
    assert hashes(inputs) == before, "an input file changed"
    return line


def onnxopt(*args, env=None, timeout=300, cwd=None):
    full_env = dict(os.environ, COLUMNS="250", **(env or {}))
    return subprocess.run([sys.executable, "-m", "onnxopt", *map(str, args)], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=cwd)


@pytest.fixture
def model(tmp_path):
    """m.onnx: [1,4,8,8] elementwise model, plus x.npy that fits it."""
    src = save(elementwise_model(), tmp_path / "m.onnx")
    npy = str(tmp_path / "x.npy")
    np.save(npy, np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32))
    return tmp_path, src, npy


# ------------------------------------------------------------------------------------------------ 1. data loss

def test_output_whose_data_file_is_the_inputs_external_data(tmp_path, capsys, scratch_tmp):
    """a.onnx keeps its weights in b.onnx.data; writing b.onnx would replace b.onnx.data, which a.onnx reads."""
    a = save(elementwise_model(), tmp_path / "a.onnx", save_as_external_data=True, location="b.onnx.data",
             size_threshold=0)
    data = str(tmp_path / "b.onnx.data")
    assert os.path.exists(data)
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)
    want = run_ort(a, x)
    out = tmp_path / "b.onnx"
    cli_error(capsys, [a, "-o", out, *FAST], [a, data], out, "b.onnx.data")
    assert os.path.exists(data)
    np.testing.assert_array_equal(run_ort(a, x), want)


def test_output_equal_to_the_input(model, capsys, scratch_tmp):
    d, src, _ = model
    cli_error(capsys, [src, "-o", src, *FAST], [src], None, "input")
    assert sorted(os.listdir(d)) == ["m.onnx", "systmp", "x.npy"]


def test_output_library_is_the_input_model(tmp_path, capsys, scratch_tmp):
    """onnxopt x.onnx.so -o x.onnx: the library x.onnx.so would replace the model being read."""
    src = save(elementwise_model(), tmp_path / "x.onnx.so")
    out = tmp_path / "x.onnx"
    before = sha(src)
    cli_error(capsys, [src, "-o", out, *FAST], [src], None, "x.onnx.so")
    assert not os.path.exists(out) and sha(src) == before
    assert stray_files(tmp_path) == []


def test_output_library_is_a_check_input(model, capsys, scratch_tmp):
    """--check-input x:f.onnx.so -o f.onnx: the library would replace the check input."""
    d, src, npy = model
    check = str(d / "f.onnx.so")
    shutil.copy(npy, check)
    out = d / "f.onnx"
    cli_error(capsys, [src, "-o", out, "--check-input", f"x:{check}", *FAST], [src, check], None, "f.onnx.so")
    assert not os.path.exists(out) and not os.path.exists(str(out) + ".data")
    assert stray_files(d) == []


def test_report_equal_to_the_input_model(model, capsys, scratch_tmp):
    d, src, _ = model
    out = d / "f.onnx"
    cli_error(capsys, [src, "-o", out, "--report", src, *FAST], [src], out, "m.onnx")


def test_report_equal_to_the_output(model, capsys, scratch_tmp):
    d, src, _ = model
    out = d / "f.onnx"
    cli_error(capsys, [src, "-o", out, "--report", out, *FAST], [src], out, "--report")
    cli_error(capsys, [src, "-o", out, "--report", f"{out}.so", *FAST], [src], out, "--report")


# --------------------------------------------------------------------------------------------- 2. user mistakes

def test_report_into_a_missing_folder_is_refused_before_the_run(model, capsys, scratch_tmp):
    d, src, _ = model
    out = d / "f.onnx"
    cli_error(capsys, [src, "-o", out, "--report", d / "nodir" / "r.json", *FAST], [src], out, "does not exist")
    assert not os.path.exists(d / "nodir")


def test_output_into_a_missing_folder(model, capsys, scratch_tmp):
    d, src, _ = model
    out = d / "nodir" / "f.onnx"
    cli_error(capsys, [src, "-o", out, *FAST], [src], None, "does not exist")
    assert not os.path.exists(d / "nodir")
    assert stray_files(d) == []


@pytest.mark.parametrize("kinds", ["magic", "compute,magic"])
def test_skip_fusion_names_the_unknown_kind(model, capsys, scratch_tmp, kinds):
    d, src, _ = model
    out = d / "f.onnx"
    line = cli_error(capsys, [src, "-o", out, "--skip-fusion", kinds, *FAST], [src], out, "--skip-fusion magic",
                     "known fusion kinds", "qconv")
    assert "skip_fusion" not in line  # the CLI's flag, not the Python keyword


def test_verbose_puts_a_blank_line_between_the_traceback_and_the_error(model, capsys, scratch_tmp):
    d, src, _ = model
    capsys.readouterr()
    rc = main([src, "-o", str(d / "nodir" / "f.onnx"), "--verbose", *FAST])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.rstrip("\n").splitlines()
    assert lines[0].startswith("Traceback") and lines[-1].startswith("onnxopt: error: -o "), err
    assert lines[-2] == "" and lines[-3].startswith("onnxopt.errors.UsageError: "), err


def test_a_warning_is_one_line_without_its_source(monkeypatch, capsys):
    import onnxopt.cli.main as cli
    from onnxopt.cost_cache import CostCacheWarning

    before = warnings.showwarning

    def warns(argv):
        warnings.warn("cost cache off: cannot open x.sqlite (DatabaseError: file is not a database); kernels are "
                      "timed without it", CostCacheWarning, stacklevel=2)
        warnings.warn("something else", DeprecationWarning, stacklevel=2)
        return 0

    monkeypatch.setattr(cli, "cmd_machine", warns)
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["machine"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == ["onnxopt: warning: cost cache off: cannot open x.sqlite (DatabaseError: file is not a "
                                "database); kernels are timed without it",
                                "onnxopt: warning: DeprecationWarning: something else"], err
    assert warnings.showwarning is before  # put back for the caller of main()


def _npy(d, name, arr) -> str:
    p = str(d / name)
    np.save(p, arr)
    return p


@pytest.mark.parametrize("case", ["float64", "rank", "fixed-dim", "unknown-name", "not-npy"])
def test_bad_check_input(model, capsys, scratch_tmp, case):
    d, src, npy = model
    rng = np.random.default_rng(0)
    if case == "float64":
        spec, f, needle = "x:{f}", _npy(d, "c.npy", rng.standard_normal(SHAPE)), "float64"
    elif case == "rank":
        spec, f, needle = "x:{f}", _npy(d, "c.npy", rng.standard_normal([4, 8, 8]).astype(np.float32)), "rank"
    elif case == "fixed-dim":
        spec, f, needle = "x:{f}", _npy(d, "c.npy", rng.standard_normal([1, 3, 8, 8]).astype(np.float32)), "dim 1"
    elif case == "unknown-name":
        spec, f, needle = "image:{f}", npy, "image"
    else:
        f = str(d / "c.npy")
        with open(f, "w") as fh:
            fh.write("1,2,3\n")
        spec, needle = "x:{f}", "npy"
    out = d / "f.onnx"
    cli_error(capsys, [src, "-o", out, "--check-input", spec.format(f=f), *FAST], [src, f], out, needle)


def test_input_shape_contradicting_a_fixed_dim(model, capsys, scratch_tmp):
    d, src, _ = model
    out = d / "f.onnx"
    cli_error(capsys, [src, "-o", out, "--input-shape", "x:2,4,8,8", *FAST], [src], out, "fixed")


def test_huge_input_shape(tmp_path, capsys, scratch_tmp):
    src = save(elementwise_model(["n", "c", "l"], weight=False), tmp_path / "sym.onnx")
    out = tmp_path / "f.onnx"
    cli_error(capsys, [src, "-o", out, "--input-shape", "x:100000,100000,100000", *FAST], [src], out, "elements")




def test_model_that_fails_on_its_inputs_is_refused_before_the_run(tmp_path, capsys, scratch_tmp):
    """A model onnxruntime loads but cannot run (a Conv bias of the wrong size): exit 2 at once, not a failed
    verification after the whole optimization."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal([8, 4, 3, 3]).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros([], np.float32), "b")  # a scalar where Conv wants 8 values
    g = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    src = save(m, tmp_path / "bad-bias.onnx")
    out = tmp_path / "f.onnx"
    cli_error(capsys, [src, "-o", out, "--threads", "1", "--tune-budget", "0", "--no-cost-cache"], [src], out,
              "fails in onnxruntime on random inputs", "--check-input")
NUMERIC = [(flag, v) for flag in ("--search-budget", "--tune-budget", "--min-speedup", "--rtol", "--atol",
                                  "--scale-tol") for v in ("nan", "inf", "-1")] \
    + [("--threads", "0"), ("--threads", "-1"), ("--rtol", "float32:nan"), ("--atol", "float32:-inf")]


@pytest.mark.parametrize("flag,value", NUMERIC)
def test_bad_numbers(model, capsys, scratch_tmp, flag, value):
    d, src, _ = model
    out = d / "f.onnx"
    fast = [a for a in FAST]
    if flag in fast:  # --threads / --tune-budget are in FAST: the value under test replaces the fast one
        i = fast.index(flag)
        del fast[i:i + 2]
    cli_error(capsys, [src, "-o", out, *fast, f"{flag}={value}"], [src], out, flag)


@pytest.mark.parametrize("target", ["cpu=nonsense", "cpu=znver3,+nonsense"])
def test_bad_target_is_exit_2_and_does_not_hang(model, target):
    d, src, _ = model
    out = d / "f.onnx"
    before = sha(src)
    r = onnxopt(src, "-o", out, "--target", target, *FAST, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert_one_error_line(r.stderr, "--target")
    assert_nothing_written(out)
    assert sha(src) == before


@pytest.fixture
def bench_models(tmp_path):
    a = save(elementwise_model(), tmp_path / "a.onnx")
    b = save(elementwise_model([2, 4, 8, 8]), tmp_path / "b.onnx")
    return tmp_path, a, b


def test_bench_models_with_different_fixed_dims(bench_models, capsys):
    d, a, b = bench_models
    cli_error(capsys, ["bench", a, b, "--min-time", "0.1"], [a, b], None, "input x")


def test_bench_input_not_npy(bench_models, capsys):
    d, a, _ = bench_models
    bad = str(d / "bad.npy")
    with open(bad, "w") as f:
        f.write("not an array")
    cli_error(capsys, ["bench", a, a, "--min-time", "0.1", "--input", f"x:{bad}"], [a, bad], None, "bad.npy")


def test_bench_input_wrong_dtype(bench_models, capsys):
    d, a, _ = bench_models
    f = _npy(d, "x64.npy", np.zeros(SHAPE, np.float64))
    cli_error(capsys, ["bench", a, a, "--min-time", "0.1", "--input", f"x:{f}"], [a, f], None, "float64")


def test_bench_min_time_nan(bench_models, capsys):
    d, a, _ = bench_models
    cli_error(capsys, ["bench", a, a, "--min-time", "nan"], [a], None, "--min-time")


def test_bench_missing_file(bench_models, capsys):
    d, a, _ = bench_models
    cli_error(capsys, ["bench", a, d / "missing.onnx", "--min-time", "0.1"], [a], None, "missing.onnx")


# --------------------------------------------------------------------------------------------------- 3. signals

FINALIZER_SIGNAL = """
import os, signal
from onnxopt.cli.main import _interrupt_on_signals
_interrupt_on_signals()


class Finalized:
    def __del__(self):  # the signal's handler runs in here, where Python drops the exception it raises
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100000):
            pass


try:
    Finalized()
    for _ in range(10 ** 8):
        pass
    print("ran on")
except KeyboardInterrupt:
    print("interrupted")
"""


def test_sigterm_that_lands_in_a_finalizer_still_ends_the_run():
    """A SIGTERM whose KeyboardInterrupt lands where Python drops exceptions (a finalizer, as here; a fork's at-fork
    hook, as a run's worker processes start) is sent again and ends the run, not dropped with it."""
    r = subprocess.run([sys.executable, "-c", FINALIZER_SIGNAL], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "interrupted", (r.stdout, r.stderr)


def test_sigterm_ends_the_run_cleanly(tmp_path):
    src = save(conv_chain(), tmp_path / "chain.onnx")
    before = sha(src)
    out = tmp_path / "out" / "f.onnx"
    out.parent.mkdir()
    child_tmp = tmp_path / "childtmp"
    child_tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(child_tmp), COLUMNS="250")
    p = subprocess.Popen([sys.executable, "-m", "onnxopt", src, "-o", str(out), "--threads", "1", "--no-cost-cache"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # SIGTERM once the run is under way (its temporary folder exists), so the cleanup has something to do.
        def started():
            return any(n.startswith("onnxopt-") for n in os.listdir(child_tmp))

        t0 = time.monotonic()
        while time.monotonic() - t0 < 60 and p.poll() is None and not started():
            time.sleep(0.05)
        time.sleep(1.5)
        assert p.poll() is None, ("the run ended before the signal", p.communicate())
        assert started(), "the run made no temporary folder in TMPDIR before the signal"
        p.send_signal(signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130, (p.returncode, stdout, stderr)
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnxopt: interrupted"), stderr
    assert not os.path.exists(out) and not os.path.exists(f"{out}.so") and not os.path.exists(f"{out}.data")
    assert stray_files(out.parent) == []
    assert [n for n in os.listdir(child_tmp) if n.startswith("onnxopt-")] == []
    assert sha(src) == before


# ------------------------------------------------------------------------------------------ 4. loader confinement

@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    """A fused model and library from a real run (measure off), and the original's answer on one input."""
    from onnxopt.pipeline import optimize

    d = tmp_path_factory.mktemp("fused")
    src = save(elementwise_model(), d / "m.onnx")
    out = str(d / "f.onnx")
    optimize(src, out, threads=1, tune_budget=0, cost_cache=False, measure=False)
    assert os.path.exists(out + ".so")
    x = np.random.default_rng(7).standard_normal(SHAPE).astype(np.float32)
    return d, out, x, run_ort(src, x)


def _with_library_name(fused_path: str, name: str, new_path: str) -> str:
    from onnxopt.emit.model import META_LIBRARY

    m = onnx.load(fused_path)
    [p] = [p for p in m.metadata_props if p.key == META_LIBRARY]
    p.value = name
    onnx.save(m, new_path)
    return new_path


def _escaping_models(fused_):
    """The fused model rewritten to name its (real, hash-matching) library outside its folder; the library copied
    there, so only the confinement rule keeps it out."""
    d, out, _, _ = fused_
    lib = out + ".so"
    (d / "sub").mkdir(exist_ok=True)
    shutil.copy(lib, d / "sub" / "x.so")
    shutil.copy(lib, d.parent / "x.so")
    return {"../x.so": _with_library_name(out, "../x.so", str(d / "up.onnx")),
            "absolute": _with_library_name(out, os.path.abspath(lib), str(d / "abs.onnx")),
            "sub/x.so": _with_library_name(out, "sub/x.so", str(d / "sub.onnx"))}


def test_untouched_fused_model_library_is_usable(fused):
    from onnxopt.runtime import check_library

    d, out, x, want = fused
    chk = check_library(out)
    assert chk.usable, chk.reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import onnxopt.runtime as rt
        got = rt.InferenceSession(out).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("which", ["../x.so", "absolute", "sub/x.so"])
def test_library_outside_the_models_folder_is_not_loaded(fused, which):
    import onnxopt.runtime as rt

    d, out, x, want = fused
    path = _escaping_models(fused)[which]
    chk = rt.check_library(path)
    assert not chk.usable
    assert "model's own folder" in chk.reason, chk.reason
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = rt.InferenceSession(path).run(None, {"x": x})[0]  # the function bodies
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("which", ["../x.so", "absolute", "sub/x.so"])
def test_library_outside_the_models_folder_warns(fused, which):
    import onnxopt.runtime as rt

    d, out, x, want = fused
    path = _escaping_models(fused)[which]
    with pytest.warns(rt.LibraryNotUsedWarning, match="own folder"):
        sess = rt.InferenceSession(path)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------- 5. host level

@pytest.fixture
def clear_host_cache():
    from onnxopt.codegen import target

    target._host_target.cache_clear()
    yield target
    target._host_target.cache_clear()


@pytest.mark.parametrize("level,banned", [("x86-64-v3", "avx512"), ("x86-64-v2", "avx2")])
def test_host_level_caps_the_host(monkeypatch, clear_host_cache, level, banned):
    target = clear_host_cache
    monkeypatch.setenv("ONNXOPT_HOST_LEVEL", level)
    target._host_target.cache_clear()
    t = target.host_target()
    assert t.cpu == level
    assert not [f for f in t.features if f.startswith(banned)], t.features
    flags = target.host_cpu_flags()
    assert not [f for f in flags if f.startswith(banned)], sorted(flags)
    assert target.cap_cpu_flags({"avx512f", "avx2", "sse4_2", "fpu"}) >= {"sse4_2", "fpu"}
    assert "avx512f" not in target.cap_cpu_flags({"avx512f", "avx2"})
    if level == "x86-64-v2":
        assert "avx2" not in target.cap_cpu_flags({"avx2"})
        assert target.missing_cpu_flags(["avx2"]) == ["avx2"]


def test_bad_host_level_is_a_usage_error(monkeypatch, clear_host_cache):
    from onnxopt.errors import UsageError

    target = clear_host_cache
    monkeypatch.setenv("ONNXOPT_HOST_LEVEL", "x86-64-v9")
    with pytest.raises(UsageError, match="ONNXOPT_HOST_LEVEL"):
        target.host_target()
    with pytest.raises(UsageError):
        target.host_cpu_flags()


def test_optimize_under_host_level_v3_targets_no_avx512(model):
    d, src, _ = model
    out, rep = d / "f.onnx", d / "r.json"
    before = sha(src)
    r = onnxopt(src, "-o", out, "--report", rep, *FAST, env={"ONNXOPT_HOST_LEVEL": "x86-64-v3"})
    assert r.returncode == 0, r.stderr
    feats = json.load(open(rep))["target"]["features"]
    assert feats and not [f for f in feats if f.startswith("avx512")], feats
    assert sha(src) == before


# ------------------------------------------------------------------------------------------------ 6. cross-target

def test_cross_compiled_target_says_no_kernel_ran(model):
    """x86-64-v4 on a host that lacks AVX-512: the host is capped at x86-64-v3 (ONNXOPT_HOST_LEVEL), so the case runs
    on AVX-512 hosts too."""
    d, src, _ = model
    out = d / "f.onnx"
    before = sha(src)
    r = onnxopt(src, "-o", out, "--target", "x86-64-v4", "--no-measure", "--threads", "1", "--tune-budget", "0",
                "--no-cost-cache", env={"ONNXOPT_HOST_LEVEL": "x86-64-v3"})
    assert r.returncode == 0, r.stderr
    text = " ".join((r.stdout + r.stderr).split())  # rich wraps long lines
    assert "cross-compiled" in text and "No kernel of the library ran here" in text, text
    assert "verified with the kernel library" not in text
    assert os.path.exists(out) and os.path.exists(f"{out}.so")
    assert sha(src) == before


# ------------------------------------------------------------------------------------------------ 7. build workers

def _ok_job():
    return b"obj", "desc"


def _dying_job():
    os._exit(1)


def _hanging_job():
    time.sleep(30)
    return b"never", "never"


def _failing_job():
    raise ValueError("this kernel does not build")


def test_worker_that_dies_is_a_worker_error():
    from onnxopt.codegen.parallel import WorkerError, build_many

    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="died"):
        build_many([_ok_job, _dying_job], workers=2)
    assert time.monotonic() - t0 < 30
    assert multiprocessing.active_children() == []


def test_worker_that_hangs_is_killed(monkeypatch):
    from onnxopt.codegen.parallel import WorkerError, build_many, build_timeout

    monkeypatch.setenv("ONNXOPT_BUILD_TIMEOUT", "2")
    assert build_timeout() == 2
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="ONNXOPT_BUILD_TIMEOUT"):
        build_many([_hanging_job], workers=1)
    assert time.monotonic() - t0 < 10
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_bad_build_timeout(monkeypatch, value):
    from onnxopt.codegen.parallel import build_timeout

    monkeypatch.setenv("ONNXOPT_BUILD_TIMEOUT", value)
    with pytest.raises(ValueError, match="ONNXOPT_BUILD_TIMEOUT"):
        build_timeout()


def test_job_that_raises_is_a_build_error_and_the_rest_build():
    from onnxopt.codegen.parallel import BuildError, build_many

    out = build_many([_ok_job, _failing_job, _ok_job], workers=2)
    assert out[0] == (b"obj", "desc") and out[2] == (b"obj", "desc")
    assert isinstance(out[1], BuildError) and "this kernel does not build" in str(out[1])
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("spec,needle", [
    ("y:1,4,8,8", "inputs are"),  # no such input
    ("x:1,4,8", "rank"),
    ("x:1,5,8,8", "fixed"),  # dim 1 is 4 in the model
])
def test_measure_shape_mistakes(model, capsys, scratch_tmp, spec, needle):
    d, src, _ = model
    out = d / "f.onnx"
    cli_error(capsys, [src, "-o", out, "--measure-shape", spec, *FAST], [src], out, needle)


def test_measure_shape_contradicting_itself(tmp_path, capsys, scratch_tmp):
    """One symbolic dim given two values by two inputs' shapes."""
    m = elementwise_model(["n", "c", "l"], weight=False)
    m.graph.input.append(onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, ["n"]))
    src = save(m, tmp_path / "sym.onnx")
    out = tmp_path / "f.onnx"
    cli_error(capsys, [src, "-o", out, "--measure-shape", "x:2,3,5", "--measure-shape", "z:4", *FAST], [src], out,
              "elsewhere")
