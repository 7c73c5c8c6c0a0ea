"""`onnxopt batch` end to end: a folder of models (one in a subfolder, one broken), the reports, a rerun, a retry,
a per-model timeout and memory limit from a list file, and a worker that dies of a signal."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import onnx
import onnxruntime as ort
from batch_models import add_relu_mul, conv_relu, transpose_only, tree_hashes

import onnxopt.runtime as rt
from onnxopt.batch import run_batch, worker


def onnxopt(*args, env=None):
    return subprocess.run([sys.executable, "-m", "onnxopt", *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, COLUMNS="200", **(env or {})))  # the summary table unfolded


def records(out) -> dict:
    with open(os.path.join(out, "report.json")) as f:
        return {m["model"]: m for m in json.load(f)["models"]}


def assert_same_answers(src, out):
    """The optimized model loads in onnxruntime, with its kernel library and without, and answers as the original."""
    x = np.random.default_rng(1).standard_normal(
        [d.dim_value for d in onnx.load(src).graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for sess in (rt.InferenceSession(out), ort.InferenceSession(out, providers=["CPUExecutionProvider"])):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)


def test_folder_reports_rerun_and_retry(tmp_path, quick):
    zoo, out = tmp_path / "zoo", tmp_path / "out"
    add_relu_mul(zoo / "a.onnx")
    conv_relu(zoo / "sub" / "b.onnx")
    (zoo / "broken.onnx").write_bytes(b"this is not an onnx model")
    sources = tree_hashes(zoo)
    # two workers at once, sharing one cost cache
    cmd = ["batch", str(zoo), "-o", str(out), "--jobs", "2", "--bench-time", "0.2", *quick]
    r = onnxopt(*cmd)
    assert r.returncode == 1, r.stderr  # the broken one failed; the others finished
    by = records(out)
    assert set(by) == {"a.onnx", "sub/b.onnx", "broken.onnx"}
    assert by["broken.onnx"]["status"] == "failed"
    assert "not a readable ONNX model" in by["broken.onnx"]["reason"], by["broken.onnx"]
    for name in ("a.onnx", "sub/b.onnx"):
        m = by[name]
        b = m["bench"]
        # kept untimed as a whole (--min-speedup 0): the bench decides whether it may be called optimized
        assert m["status"] == ("optimized" if b["speedup"] >= 1 else "slower"), m
        assert m["output"] == str(out / name) and os.path.isfile(str(out / name) + ".so")
        assert m["verified_library"] is True and m["verified_fallback"] is True
        assert m["nodes_after"] < m["nodes_before"] and m["ops_after"] and m["ops_before"]
        assert {"search_s", "codegen_s", "measurement_s", "other_s", "total_s"} <= set(m["offline"])
        assert m["timings"]["total_s"] > 0
        assert 0 < b["speedup_low"] <= b["speedup"] <= b["speedup_high"] and b["outputs_match"], b
        assert b["original"]["p10"] <= b["original"]["median"] <= b["original"]["p90"]
        with open(m["report"]) as f:
            cache = json.load(f)["cost_cache"]
        assert cache["enabled"] and "warning" not in cache, cache  # the shared SQLite file took both writers
        assert_same_answers(str(zoo / name), m["output"])
    with open(out / "report.json") as f:
        report = json.load(f)
    assert sum(report["totals"]["by_status"].get(k, 0) for k in ("optimized", "slower")) == 2
    assert report["totals"]["by_status"]["failed"] == 1 and report["exit_code"] == 1
    assert report["machine"]["onnxruntime"] == ort.__version__ and report["machine"]["cpu"]
    assert report["machine"]["onnxopt"] and isinstance(report["machine"]["isa"], list)
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 2 and "sub/b.onnx" in page
    assert "http://" not in page and "https://" not in page and "<script" not in page and "<link" not in page
    with open(out / "batch-state.json") as f:
        assert set(json.load(f)["models"]) == {str(zoo / "a.onnx"), str(zoo / "sub" / "b.onnx"),
                                               str(zoo / "broken.onnx")}
    assert "broken.onnx" in r.stderr and by["a.onnx"]["status"] in r.stderr  # the summary table

    # A rerun skips the finished models and leaves the failed one as it was.
    written = {n: os.stat(out / n).st_mtime_ns for n in ("a.onnx", "sub/b.onnx")}
    broken_log = os.stat(out / "broken.log").st_mtime_ns
    r = onnxopt(*cmd)
    assert r.returncode == 1, r.stderr
    by = records(out)
    assert by["a.onnx"]["status"] == by["sub/b.onnx"]["status"] == "skipped"
    assert by["a.onnx"]["previous_status"] in ("optimized", "slower") and by["a.onnx"]["bench"]["speedup"] > 0
    assert by["broken.onnx"]["status"] == "failed" and by["broken.onnx"]["rerun"] is False
    assert {n: os.stat(out / n).st_mtime_ns for n in written} == written
    assert os.stat(out / "broken.log").st_mtime_ns == broken_log

    # --retry-failed runs the failed one again (and only it).
    r = onnxopt(*cmd, "--retry-failed")
    assert r.returncode == 1, r.stderr
    by = records(out)
    assert by["broken.onnx"]["status"] == "failed" and "rerun" not in by["broken.onnx"]
    assert os.stat(out / "broken.log").st_mtime_ns != broken_log
    assert by["a.onnx"]["status"] == "skipped"
    assert tree_hashes(zoo) == sources


def _alive(marker: str) -> list[int]:
    """Processes whose command line names `marker` (a model path of this test)."""
    pids = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(pid))
        except (OSError, ValueError):
            pass
    return pids


# Put first on the children's PYTHONPATH: the optimizer of slow.onnx sleeps before it starts, so its timeout comes
# whatever the host's speed (a real child, killed by the batch's timeout).
_SLOW_CHILD = """
import os, sys, time
if "-o" in sys.argv and any(a.endswith("slow.onnx") for a in sys.argv):
    open(os.path.join(os.path.dirname(__file__), "slept"), "w").close()
    time.sleep(300)
"""


def test_list_file_timeout_memory_limit_and_unchanged(tmp_path, quick):
    models = tmp_path / "models"
    add_relu_mul(models / "a.onnx", batch=None)  # a symbolic batch dim, fixed by its list line
    add_relu_mul(models / "slow.onnx")
    add_relu_mul(models / "big.onnx")
    transpose_only(models / "t.onnx")
    listing = tmp_path / "zoo.txt"
    listing.write_text("# the zoo\n\nmodels/a.onnx --input-shape x:2,64\n"
                       "models/slow.onnx --timeout 1   # killed at 1 s\n"
                       "models/big.onnx --memory-limit 0.05\n"
                       "models/t.onnx\n")
    sources = tree_hashes(models)
    out = tmp_path / "out"
    t = time.perf_counter()
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SLOW_CHILD)
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p)
    r = onnxopt("batch", "@" + str(listing), "-o", str(out), "--no-bench", *quick, env={"PYTHONPATH": path})
    assert r.returncode == 1, r.stderr
    by = records(out)
    assert by["a.onnx"]["status"] == "optimized" and "bench" not in by["a.onnx"]
    dims = [d.dim_value for d in onnx.load(by["a.onnx"]["output"]).graph.input[0].type.tensor_type.shape.dim]
    assert dims == [2, 64]
    assert by["slow.onnx"]["status"] == "timeout" and by["slow.onnx"]["wall_s"] < 10, by["slow.onnx"]
    assert "1 s" in by["slow.onnx"]["reason"] and os.path.exists(hook / "slept")
    assert not _alive(str(models / "slow.onnx"))  # its process group is gone
    assert by["big.onnx"]["status"] == "out-of-memory", by["big.onnx"]
    assert not os.path.exists(out / "slow.onnx") and not os.path.exists(out / "big.onnx")
    assert by["t.onnx"]["status"] == "unchanged" and "nothing in this model" in by["t.onnx"]["reason"], by["t.onnx"]
    assert os.path.isfile(out / "t.onnx") and not os.path.exists(out / "t.onnx.so")
    assert time.perf_counter() - t < 120
    assert tree_hashes(models) == sources


def test_a_worker_killed_by_a_signal_is_crashed_and_the_rest_finish(tmp_path, quick_kwargs):
    zoo = tmp_path / "zoo"
    add_relu_mul(zoo / "crash.onnx")
    add_relu_mul(zoo / "fine.onnx")
    sources = tree_hashes(zoo)
    target = str(zoo / "crash.onnx")

    def segfault_the_crash_worker():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with worker._live_lock:
                procs = [p for p in worker._live if target in p.args]
            if procs:
                time.sleep(0.3)
                os.kill(procs[0].pid, signal.SIGSEGV)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=segfault_the_crash_worker)
    killer.start()
    result = run_batch([str(zoo)], str(tmp_path / "out"), bench=False, **quick_kwargs)
    killer.join()
    by = {m["model"]: m for m in result.records}
    assert by["crash.onnx"]["status"] == "crashed" and "SIGSEGV" in by["crash.onnx"]["reason"], by["crash.onnx"]
    assert by["fine.onnx"]["status"] == "optimized"
    assert result.exit_code == 1 and result.report["totals"]["failures"] == 1
    assert tree_hashes(zoo) == sources


def test_a_corrupted_state_file_is_set_aside_with_a_warning(tmp_path, quick_kwargs, capfd):
    zoo, out = tmp_path / "zoo", tmp_path / "out"
    transpose_only(zoo / "t.onnx")
    out.mkdir()
    (out / "batch-state.json").write_text('{"version": 1, "models": {')  # cut short
    result = run_batch([str(zoo)], str(out), bench=False, **quick_kwargs)  # quiet, and still warned
    assert [m["status"] for m in result.records] == ["unchanged"]
    lines = [ln for ln in capfd.readouterr().err.splitlines() if "warning" in ln]
    state = str(out / "batch-state.json")
    assert len(lines) == 1 and state in lines[0] and state + ".corrupt-1" in lines[0], lines
    assert (out / "batch-state.json.corrupt-1").read_text() == '{"version": 1, "models": {'
    with open(state) as f:
        assert list(json.load(f)["models"]) == [str(zoo / "t.onnx")]  # a new state, written as usual
