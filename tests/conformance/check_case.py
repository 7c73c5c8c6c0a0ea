"""One conformance case, end to end: onnxruntime on the original, then onnxopt, then onnxruntime on the result.

`run_case` returns a record (a dict) and raises:
* `OrtFails` when onnxruntime itself cannot load, run or match the original (the case says nothing about onnxopt);
* `AssertionError` / `onnxopt.errors.OnnxoptError` / anything else when onnxopt breaks a case onnxruntime passes.
"""

from __future__ import annotations

import os
import re
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort
from onnx.backend.test.runner import Runner

import onnxopt
import onnxopt.runtime
from onnxopt.emit.model import DOMAIN
from onnxopt.emit.sequence import expand_sequences

import cases as _cases  # tests/conformance is on sys.path (pytest rootdir-relative import, or the script's dir)


class OrtFails(Exception):
    """onnxruntime fails the original case: the case cannot judge onnxopt."""


def session_options(threads: int = 1) -> ort.SessionOptions:
    """Default onnxruntime settings (ORT_ENABLE_ALL), single-threaded so parallel workers do not oversubscribe."""
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return so


# "/onnxruntime_src/onnxruntime/core/graph/model.cc:256 onnxruntime::Model::Model(<signature>) Message": keep Message
_ORT_SOURCE_LOCATION = re.compile(r"/onnxruntime_src/\S+:\d+ .*?\) (?=\S)")


def short(e: BaseException, n: int = 200) -> str:
    text = _ORT_SOURCE_LOCATION.sub("", str(e).strip())
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = f"{type(e).__name__}: {line}"
    return line if len(line) <= n else line[: n - 3] + "..."


def assert_similar(ref_outputs, outputs, rtol: float, atol: float):
    """`Runner.assert_similar_outputs` for each tensor, recursing into sequences (the runner's own recursion passes
    bare arrays where it expects lists, so it cannot compare a sequence of 0-d tensors, e.g. test_loop16_seq_none),
    and accepting empty optionals (None on both sides)."""
    np.testing.assert_equal(len(outputs), len(ref_outputs))
    for i, (ref, out) in enumerate(zip(ref_outputs, outputs)):
        if ref is None or out is None:
            assert ref is None and out is None, f"output {i}: expected {type(ref)}, got {type(out)}"
        elif isinstance(ref, (list, tuple)) or isinstance(out, (list, tuple)):
            assert isinstance(ref, (list, tuple)) and isinstance(out, (list, tuple)), \
                f"output {i}: expected {type(ref)}, got {type(out)}"
            assert_similar(list(ref), list(out), rtol, atol)
        else:
            Runner.assert_similar_outputs([ref], [out], rtol=rtol, atol=atol)


def feeds_for(case, inputs) -> dict:
    names = _cases.feed_names(case.model)
    if len(inputs) > len(names):
        raise OrtFails(f"{len(inputs)} inputs for {len(names)} graph inputs")
    return dict(zip(names, inputs))


def _run(sess, case, feeds):
    return sess.run([o.name for o in case.model.graph.output], feeds)


def check_original(case, threads: int = 1) -> float:
    """Run the original model in onnxruntime on every data set; raise OrtFails when that fails. Returns seconds."""
    t = time.perf_counter()
    try:
        sess = ort.InferenceSession(case.model.SerializeToString(), session_options(threads),
                                    providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        raise OrtFails(f"load: {short(e)}") from None
    for inputs, expected in case.data_sets:
        try:
            got = _run(sess, case, feeds_for(case, inputs))
        except OrtFails:
            raise
        except Exception as e:  # noqa: BLE001
            raise OrtFails(f"run: {short(e)}") from None
        try:
            assert_similar(expected, got, case.rtol, case.atol)
        except Exception as e:  # noqa: BLE001
            raise OrtFails(f"mismatch: {short(e, 300)}") from None
    return time.perf_counter() - t


def _checker_accepts(model_or_path, full_check: bool) -> str | None:
    try:
        onnx.checker.check_model(model_or_path, full_check=full_check)
        return None
    except Exception as e:  # noqa: BLE001
        return short(e, 300)


def run_case(case, tmp_path, threads: int = 1, rec: dict | None = None) -> dict:
    """Fills `rec` in place (so a caller keeps what was learnt when a check fails) and returns it."""
    rec = {} if rec is None else rec
    rec.update({"id": case.name, "kind": case.kind})
    rec["ort_s"] = check_original(case, threads)

    # (b) optimize: every correct kernel is emitted (measure=False), no whole-model check (we check it here)
    out = os.path.join(os.fspath(tmp_path), "fused.onnx")
    # run from an empty scratch directory: files onnxopt leaves in the current directory are reported
    # (not failed: the conformance criteria are about results), and never land in the caller's checkout
    scratch = os.path.join(os.fspath(tmp_path), "cwd")
    os.makedirs(scratch, exist_ok=True)
    old_cwd = os.getcwd()
    os.chdir(scratch)
    t = time.perf_counter()
    try:
        result = onnxopt.optimize(case.model, out, verify=False, measure=False, threads=threads)
    finally:
        rec["optimize_s"] = time.perf_counter() - t
        os.chdir(old_cwd)
        litter = sorted(os.listdir(scratch))
        if litter:
            rec["cwd_litter"] = litter[:5]
    rep = result.report
    rec["regions"] = len(rep.get("regions", []))
    rec["rejected"] = len([r for r in rep.get("rejected", []) if r.get("op_type")])
    rec["rejected_reasons"] = sorted({r["reason"][:120] for r in rep.get("rejected", []) if r.get("op_type")})[:5]
    # One node per region; sequence ops (emit/sequence.py) count as the regions they run.
    rec["fused_nodes"] = sum(1 for n in expand_sequences(result.model).graph.node if n.domain == DOMAIN)
    rec["timings"] = {k: round(v, 4) for k, v in rep.get("timings", {}).items()}

    assert os.path.exists(out), "optimize() returned but wrote no model"
    if rec["regions"]:
        assert result.library and os.path.exists(result.library), \
            f"{rec['regions']} regions fused but no kernel library ({result.library})"
        assert rec["fused_nodes"] == rec["regions"], \
            f"report lists {rec['regions']} regions, model has {rec['fused_nodes']} {DOMAIN} nodes"
    else:
        assert result.library is None and rec["fused_nodes"] == 0, \
            f"no regions reported, yet library={result.library} and {rec['fused_nodes']} {DOMAIN} nodes"

    # (d) the ONNX checker accepts the written model (and the full check when the original passes it)
    err = _checker_accepts(out, full_check=False)
    assert err is None, f"ONNX checker rejects the fused model: {err}"
    if _checker_accepts(case.model, full_check=True) is None:
        err = _checker_accepts(out, full_check=True)
        assert err is None, f"ONNX checker (full_check) rejects the fused model but accepts the original: {err}"

    # (c) serve it the supported way and match the expected outputs; the library must actually be used
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error", onnxopt.runtime.LibraryNotUsedWarning)
        sess = onnxopt.runtime.InferenceSession(out, session_options(threads))
    for inputs, expected in case.data_sets:
        got = _run(sess, case, feeds_for(case, inputs))
        assert_similar(expected, got, case.rtol, case.atol)
    rec["fused_run_s"] = time.perf_counter() - t
    return rec
