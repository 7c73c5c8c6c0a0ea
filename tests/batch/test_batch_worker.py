"""The pieces of a batch on their own: how a child's end is classified, the state file, the HTML page, and the
cost cache shared by several optimizer processes at once."""

import json
import multiprocessing
import os
import signal

from onnxopt.batch.report import fmt_speedup, speedup_band, totals
from onnxopt.batch.report_html import render_html
from onnxopt.batch.state import BatchState
from onnxopt.batch.worker import FAILURES, FINISHED, ChildResult, classify, last_error_line, optimized_status
from onnxopt.cost_cache import CostCache


def test_classify_each_way_a_child_ends():
    assert classify(ChildResult(None, 5.0, ""), 5) == ("timeout", "killed after the 5 s limit")
    assert classify(ChildResult(2, 1.0, "warning: x\nonnxopt: error: m.onnx: not a readable ONNX model\n"), 9) == \
        ("failed", "m.onnx: not a readable ONNX model")
    assert classify(ChildResult(1, 1.0, "onnxopt: error: verification failed: output y differs\n"), 9)[0] == "failed"
    status, reason = classify(ChildResult(-signal.SIGABRT, 1.0, "LLVM ERROR: something\n"), 9)
    assert status == "crashed" and reason == "killed by SIGABRT: LLVM ERROR: something"
    assert classify(ChildResult(3, 1.0, "onnxopt: internal error: KeyError: 'x'; ...\n"), 9)[0] == "crashed"
    assert classify(ChildResult(-signal.SIGSEGV, 1.0, ""), 9) == ("crashed", "killed by SIGSEGV")
    # out of memory, however it shows: Python, C++, the CLI's own message, the kernel's killer
    for text in ("MemoryError\n", "terminate called after throwing an instance of 'std::bad_alloc'\n",
                 "onnxopt: error: out of memory; nothing was written\n", "OSError: [Errno 12] Cannot allocate memory"):
        assert classify(ChildResult(-signal.SIGABRT, 1.0, text), 9)[0] == "out-of-memory", text
        assert classify(ChildResult(2, 1.0, text), 9, memory_limit_gb=1)[1].startswith("over the 1 GB memory limit")
    assert classify(ChildResult(-signal.SIGKILL, 1.0, ""), 9)[0] == "out-of-memory"
    # under a memory limit, a thread that cannot map libgcc_s to unwind aborts the process: that is the limit too
    gcc = "libgcc_s.so.1 must be installed for pthread_cancel to work\n"
    status, reason = classify(ChildResult(-signal.SIGABRT, 1.0, gcc), 9, memory_limit_gb=0.5)
    assert status == "out-of-memory" and reason.startswith("over the 0.5 GB memory limit"), reason
    assert classify(ChildResult(-signal.SIGABRT, 1.0, "terminate called after throwing an instance of "
                                "'std::system_error'\n"), 9, memory_limit_gb=1)[0] == "out-of-memory"
    assert classify(ChildResult(-signal.SIGABRT, 1.0, gcc), 9)[0] == "crashed"  # no limit: a crash as it says
    assert last_error_line("$ python -m onnxopt x\n\n") == ""


def test_a_model_measured_slower_is_not_called_optimized():
    bench = {"speedup": 0.79, "original": {"median": 0.79, "p10": 0.7, "p90": 0.9},
             "optimized": {"median": 1.0, "p10": 0.9, "p90": 1.1}}
    status, reason = optimized_status(bench, no_measure=True)
    assert status == "slower" and "0.79x" in reason and "--no-measure" in reason
    assert optimized_status(bench, no_measure=False)[0] == "slower"
    assert optimized_status(dict(bench, speedup=1.2), no_measure=True) == ("optimized", "")
    # nothing measured: optimized, and the reason says its speedup is unknown rather than claiming one
    for none in (None, {"error": "crashed: killed by SIGSEGV"}):
        status, reason = optimized_status(none, no_measure=True)
        assert status == "optimized" and "unknown" in reason
    assert optimized_status(None, no_measure=False) == ("optimized", "")
    assert "slower" in FINISHED and "slower" not in FAILURES  # written and correct: a rerun skips it


def test_state_is_keyed_by_content_and_options(tmp_path):
    path = str(tmp_path / "batch-state.json")
    out = tmp_path / "m.onnx"
    out.write_bytes(b"model")
    state = BatchState(path)
    state.put("/zoo/m.onnx", "sha-1", "opts-1", {"status": "optimized", "output": str(out)})
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []  # the temporary file was renamed
    again = BatchState(path)
    rec = again.previous("/zoo/m.onnx", "sha-1", "opts-1")
    assert again.is_finished(rec)
    assert again.previous("/zoo/m.onnx", "sha-2", "opts-1") is None  # the model changed
    assert again.previous("/zoo/m.onnx", "sha-1", "opts-2") is None  # other optimize options
    out.unlink()
    assert not again.is_finished(rec)  # its output is gone: run it again
    # an unreadable file is moved aside, with a warning naming both files; a second one does not replace the first
    for n, text in ((1, "{not json"), (2, '{"version": 99}')):
        (tmp_path / "batch-state.json").write_text(text)
        state = BatchState(path)
        assert state.models == {} and not os.path.exists(path)
        aside = f"{path}.corrupt-{n}"
        assert open(aside).read() == text
        assert path in state.warning and aside in state.warning and "run again" in state.warning
    assert BatchState(path).warning is None  # none there: the first run, nothing to say


def test_the_speedup_band_always_holds_the_median(tmp_path):
    # the "1.10x (1.06-1.09)": the ratios of the p10s and of the p90s, which need not bracket the median
    orig, opt = {"median": 1.10, "p10": 1.06, "p90": 1.199}, {"median": 1.0, "p10": 1.0, "p90": 1.1}
    bench = {"speedup": 1.10, "speedup_p10": 1.06, "speedup_p90": 1.09, "original": orig, "optimized": opt}
    rec = {"model": "m.onnx", "status": "optimized", "bench": bench}
    low, high = speedup_band(rec["bench"])
    assert low == orig["p10"] / opt["p90"] and high == orig["p90"] / opt["p10"] and low <= 1.10 <= high
    assert fmt_speedup(rec) == "1.10x (0.96-1.20)"
    # an earlier batch's record with only the two ratios: widened to hold its median
    old = {"model": "o.onnx", "status": "skipped", "bench": {"speedup": 1.10, "speedup_p10": 1.06,
                                                              "speedup_p90": 1.09}}
    assert fmt_speedup(old) == "1.10x (1.06-1.10)"
    report = {"machine": {"cpu": "c", "cpus": 2, "isa": [], "onnxruntime": "1", "onnxopt": "0", "python": "3"},
              "totals": totals([rec, old]), "models": [rec, old], "out_dir": str(tmp_path), "exit_code": 0,
              "finished_at": "now"}
    page = render_html(report, str(tmp_path))
    assert "1.10x (0.96-1.20)" in page and "1.06-1.09" not in page and "band 0.964-1.199" in page


def test_html_escapes_names_and_reasons(tmp_path):
    nasty = '<script>alert("x")</script>&.onnx'
    recs = [{"model": nasty, "status": "failed", "reason": "<img src=x onerror=y>", "wall_s": 1.0},
            {"model": "ok.onnx", "status": "optimized", "reason": "", "wall_s": 2.0, "output": str(tmp_path / "ok.onnx"),
             "verified_library": True, "verified_fallback": "unknown", "nodes_before": 3, "nodes_after": 1,
             "ops_before": {"Add": 1}, "ops_after": {"onnxopt::X": 1},
             "offline": {"search_s": 0.1, "codegen_s": 0.2, "measurement_s": 0.3, "other_s": 0.1, "total_s": 0.7},
             "bench": {"speedup": 1.5, "speedup_p10": 1.4, "speedup_p90": 1.6, "original": {"median": 2e-3, "p10": 1e-3,
                       "p90": 3e-3}, "optimized": {"median": 1e-3, "p10": 1e-3, "p90": 2e-3}}}]
    report = {"machine": {"cpu": "C<P>U", "cpus": 2, "isa": ["avx2"], "onnxruntime": "1", "onnxopt": "0",
                          "python": "3"}, "totals": totals(recs), "models": recs, "out_dir": str(tmp_path),
              "exit_code": 1, "finished_at": "now"}
    page = render_html(report, str(tmp_path))
    assert "<script" not in page and "<img" not in page and "&lt;script&gt;" in page and "C&lt;P&gt;U" in page
    assert page.count("<svg") == 2 and "1.50x" in page and "unknown" in page
    assert report["totals"]["geomean_speedup"] == 1.5 and report["totals"]["failures"] == 1
    json.dumps(report)


def _writer(path, worker, n):
    c = CostCache(path)  # the default busy timeout, as every optimizer of a batch opens it
    for i in range(n):
        c.put_region(f"Op_{worker}_{i}", [[worker, i]], 1, 2.0, 1.0)
        c.put_kernel(f"sig_{worker}_{i}", 1, "t", 1.0, "Op")
        assert c.get_region(f"Op_{worker}_{i}", [[worker, i]], 1) is not None
    assert c.enabled, c.warning
    c.close()


def test_cost_cache_takes_concurrent_writers_at_its_default_timeout(tmp_path):
    """A batch's workers share one cost cache: WAL journal, busy timeout; no writer gives up and turns it off."""
    path = str(tmp_path / "costs.sqlite")  # created by the racing processes themselves
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 60)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    c = CostCache(path)
    assert all(c.get_region(f"Op_{w}_{i}", [[w, i]], 1) for w in range(4) for i in range(60))
