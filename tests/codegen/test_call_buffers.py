"""The buffers a kernel needs for one call (padded input copies, blocked scratch, Winograd products) come from one
cache for the process (glue_bytes / glue_release in codegen/glue/ort_glue.c) instead of a fresh malloc each call
(same kernels, NASNet-A's compute-blocked plan went from 0.756x to 0.835x onnxruntime's speed). Checked here: the
answers stay right when calls of different sizes take each other's released buffers, a warm session allocates
none, and new sessions reuse what earlier ones released."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fusion"))
from test_layout import Chain, fused_nodes, needs_vectors, optimize_blocked, reference


def _padded_chain():
    """Padded convolutions of four sizes: each full padded copy is a buffer of its own size (64 channels at 48x48
    padded is 650 KB, above the mmap threshold), released and taken again within one run."""
    c = Chain(3, 96, 96, batch=2)
    x = c.conv("x", "stem", 32, k=3, s=2, p=1)  # NCHW input: 48x48
    x = c.conv(x, "a", 64, k=5, p=2)
    x = c.conv(x, "b", 64, k=3, s=2, p=1)  # 24x24
    x = c.conv(x, "c", 96, k=3, p=1)
    y = c.conv(x, "d", 16, k=7, p=3, act=None)
    return c, c.model([y])


def _session(result):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.register_custom_ops_library(result.library)
    return ort.InferenceSession(result.model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@needs_vectors
def test_reused_buffers_keep_the_answers_right(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXOPT_CONV_BORDER", "copy")  # every padded convolution takes a full padded copy
    chain, model = _padded_chain()
    res = optimize_blocked(model, tmp_path)
    assert len(fused_nodes(res.model)) == 5
    sess = _session(res)
    rng = np.random.default_rng(1)
    for _ in range(4):  # new inputs each run: a stale buffer would show in the answer
        feeds = {"x": rng.standard_normal(chain.feeds["x"].shape).astype(np.float32)}
        want = reference(model, feeds)[0]
        got = sess.run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@needs_vectors
def test_warm_session_reuses_its_buffers(tmp_path, monkeypatch):
    """The library counts the buffers it allocates instead of reusing (onnxopt_fresh_buffers): once every thread
    has run every call, more runs allocate none."""
    monkeypatch.setenv("ONNXOPT_CONV_BORDER", "copy")
    chain, model = _padded_chain()
    res = optimize_blocked(model, tmp_path)
    sess = _session(res)
    fresh = ctypes.CDLL(res.library).onnxopt_fresh_buffers  # the same loaded library as the session's
    fresh.restype = ctypes.c_int64
    sess.run(None, chain.feeds)
    assert fresh() >= 1  # the first run allocates; its later calls already reuse what earlier ones released
    for _ in range(5):
        sess.run(None, chain.feeds)
    warm = fresh()
    for _ in range(20):
        sess.run(None, chain.feeds)
    assert fresh() == warm


@needs_vectors
def test_sessions_come_and_go_without_new_buffers(tmp_path, monkeypatch):
    """Sessions of the same model one after another (each with its own pool threads, which exit with it) take the
    buffers the earlier ones released: a cache per thread would allocate anew, and leak, with every session."""
    monkeypatch.setenv("ONNXOPT_CONV_BORDER", "copy")
    chain, model = _padded_chain()
    res = optimize_blocked(model, tmp_path, winograd="4")  # Winograd tasks take their buffers on the pool threads
    assert any("__wino" in i.name for i in res.model.graph.initializer), "no Winograd kernel: the pool takes nothing"
    fresh = ctypes.CDLL(res.library).onnxopt_fresh_buffers  # keeps the library loaded between the sessions
    fresh.restype = ctypes.c_int64
    counts = []
    for _ in range(4):
        sess = _session(res)
        for _ in range(3):
            sess.run(None, chain.feeds)
        del sess
        counts.append(fresh())
    assert counts[0] >= 1 and counts[1:] == [counts[0]] * 3, counts
