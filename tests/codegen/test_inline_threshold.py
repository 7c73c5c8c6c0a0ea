"""Which compute kernels run on the calling thread (CT_INLINE_FLOPS in codegen/glue/compute_exec.c): a library's
tables set it (codegen/glue/library.py), and the optimizer times the chosen plan with a library whose threshold is
INLINE_FLOPS_WIDE, keeping that one only if it wins (onnxopt/driver/decision.py, _inline_choice). Checked here: the library reports
the threshold it was linked with, the answers do not depend on it (each output is computed by one tile whatever the
split), and the emitted library is the one the report says was kept."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnxopt.codegen.glue.library import (
    INLINE_FLOPS,
    INLINE_FLOPS_WIDE,
    library_source,
    link_library,
)
from onnxopt.codegen.target import host_target

import onnxopt
from onnxopt import pipeline
from onnxopt.driver import policy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fusion"))
from test_layout import Chain, fused_nodes, needs_vectors, optimize_blocked, reference


def _threshold(library: str) -> float:
    fn = ctypes.CDLL(library).onnxopt_inline_threshold
    fn.restype = ctypes.c_double
    return fn()


def _small_convs():
    """1x1 convolutions of 16 channels at 56x56 (1.6 MFLOP each), then a 3x3 of 11 MFLOP: the first run inline
    under the wide threshold and on the pool under the default one; the last on the pool under both."""
    c = Chain(16, 56, 56, batch=1, seed=3)
    x = "x"
    for i in range(3):
        x = c.conv(x, f"p{i}", 16, k=1, p=0)
    y = c.conv(x, "big", 24, k=3, p=1, act=None)
    return c, c.model([y])


def _run(result, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.register_custom_ops_library(result.library)
    sess = ort.InferenceSession(result.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def test_tables_define_the_threshold_and_refuse_a_bad_one(tmp_path):
    assert INLINE_FLOPS < INLINE_FLOPS_WIDE
    assert "const double onnxopt_inline_flops = 1048576.0;" in library_source([], host_target())
    assert "onnxopt_inline_flops = 4194304.0;" in library_source([], host_target(), INLINE_FLOPS_WIDE)
    with pytest.raises(ValueError, match="inline_flops"):
        link_library([], [], host_target(), str(tmp_path / "lib.so"), inline_flops=-1.0)
    out = tmp_path / "lib.so"
    link_library([], [], host_target(), str(out), inline_flops=12345.0)
    assert _threshold(str(out)) == 12345.0


@needs_vectors
def test_answers_do_not_depend_on_the_threshold(tmp_path, monkeypatch):
    """Every kernel inline (a threshold above any kernel) and every kernel on the pool (0): bitwise the same
    answers, and onnxruntime's."""
    chain, model = _small_convs()
    got = {}
    for threshold in (0.0, 1e18):
        monkeypatch.setattr(pipeline, "INLINE_FLOPS", threshold)
        res = optimize_blocked(model, tmp_path, name=f"fused{threshold:g}.onnx")
        assert len(fused_nodes(res.model)) == 4 and _threshold(res.library) == threshold
        got[threshold] = _run(res, chain.feeds)
    np.testing.assert_array_equal(got[0.0], got[1e18])
    want = reference(model, chain.feeds)[0]
    np.testing.assert_allclose(got[0.0], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@needs_vectors
def test_emitted_library_is_the_one_the_report_kept(tmp_path):
    """A real optimize with its measurements: the plan was timed with both thresholds head to head, the report
    says which won and by how much, and the emitted library runs with that one."""
    chain, model = _small_convs()
    res = onnxopt.optimize(model, str(tmp_path / "fused.onnx"), threads=2, cost_cache=False, min_speedup=0.0)
    choice = res.report["whole_model"]["inline_flops"]
    assert choice["tried"] == INLINE_FLOPS_WIDE and choice["gain"] > 0
    assert choice["kept"] == (INLINE_FLOPS_WIDE if choice["gain"] >= policy.INLINE_MARGIN else INLINE_FLOPS)
    if res.library:
        assert _threshold(res.library) == choice["kept"]
        want = reference(model, chain.feeds)[0]
        got = _run(res, chain.feeds)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@needs_vectors
def test_no_second_library_when_every_kernel_is_large(tmp_path):
    """Convolutions far above both thresholds run on the pool with either library: the choice is not timed, the
    report says why, and the emitted library keeps the default."""
    c = Chain(32, 56, 56, batch=1, seed=5)
    y = c.conv(c.conv("x", "a", 64, k=3, p=1), "b", 64, k=3, p=1, act=None)  # 58 and 231 MFLOP
    res = onnxopt.optimize(c.model([y]), str(tmp_path / "fused.onnx"), threads=2, cost_cache=False,
                           min_speedup=0.0)
    choice = res.report["whole_model"]["inline_flops"]
    assert "skipped" in choice and "gain" not in choice and choice["kept"] == INLINE_FLOPS
    if res.library:
        assert _threshold(res.library) == INLINE_FLOPS
