"""Sequence ops (onnxopt/emit/sequence.py, codegen/glue/sequence_exec.c): runs of fused ops become one op that
runs them in one parallel section. The graph rewrite on its own, then real models through real onnxruntime
sessions: with the library, without it (the function fallback), on one to four threads, with the section turned
off, and from several Python threads at once."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import numpy as np
import onnx
import onnxopt.runtime as rt
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import onnxopt
from onnxopt.emit.sequence import MIN_STEPS, _buffers, make_sequences
from tests.onnx_builders import const, make_model

F32 = TensorProto.FLOAT
D = "onnxopt"


def _ours(op, ins, outs):
    return helper.make_node(op, ins, outs, name=op.lower(), domain=D)


def _descs(*ops, n_in=1, n_out=1):
    return {op: SimpleNamespace(op_type=op, in_types=[1] * n_in, out_types=[1] * n_out) for op in ops}


def test_runs_are_grouped_around_onnxruntime_ops_and_only_outside_readers_get_outputs():
    # a -> X (onnxruntime) -> b, and c reads a too: a and c can run together before X, b after it.
    nodes = [_ours("A", ["x"], ["ta"]), helper.make_node("Neg", ["ta"], ["tx"], name="X"),
             _ours("B", ["tx"], ["tb"]), _ours("C", ["ta"], ["tc"]), _ours("E", ["tc"], ["te"])]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "g", [vi("x", F32, [4])], [vi("tb", F32, [4]), vi("te", F32, [4])],
                          value_info=[vi(n, F32, [4]) for n in ("ta", "tx", "tc")])
    model = helper.make_model(g)
    out, seqs = make_sequences(model, _descs("A", "B", "C", "E"), D)
    assert [n.op_type for n in out.graph.node] == [seqs[0].op_type, "Neg", "B"]
    q = seqs[0]
    assert [s[0] for s in q.steps] == ["A", "C", "E"]
    seq = out.graph.node[0]
    # ta is read by X outside the run: an output. tc is read only inside: a buffer of the sequence's own, and its
    # value_info goes. te is a graph output.
    assert list(seq.input) == ["x"] and list(seq.output) == ["ta", "te"]
    assert q.slot_output == [0, -1, 1]
    assert q.steps[1] == ("C", [-1], [1]) and q.steps[2] == ("E", [-2], [2])
    assert {v.name for v in out.graph.value_info} == {"ta", "tx"}
    # The function fallback calls the ops in order.
    f = next(f for f in out.functions if f.name == q.op_type)
    assert [n.op_type for n in f.node] == ["A", "C", "E"] and list(f.input) == ["x"]


def test_a_run_shorter_than_min_steps_stays_as_it_is():
    nodes = [_ours("A", ["x"], ["ta"]), helper.make_node("Neg", ["ta"], ["tx"]), _ours("B", ["tx"], ["y"])]
    vi = helper.make_tensor_value_info
    model = helper.make_model(helper.make_graph(nodes, "g", [vi("x", F32, [4])], [vi("y", F32, [4])]))
    out, seqs = make_sequences(model, _descs("A", "B"), D)
    assert MIN_STEPS == 2 and seqs == [] and out is model


def test_identical_runs_share_one_op_type_and_one_function():
    nodes = [_ours("A", ["x"], ["t1"]), _ours("B", ["t1"], ["t2"]), helper.make_node("Neg", ["t2"], ["t3"]),
             _ours("A", ["t3"], ["t4"]), _ours("B", ["t4"], ["y"])]
    vi = helper.make_tensor_value_info
    model = helper.make_model(helper.make_graph(nodes, "g", [vi("x", F32, [4])], [vi("y", F32, [4])]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(D, 1)])
    out, seqs = make_sequences(model, _descs("A", "B"), D)
    assert len(seqs) == 1 and [n.op_type for n in out.graph.node] == [seqs[0].op_type, "Neg", seqs[0].op_type]
    assert len([f for f in out.functions if f.name == seqs[0].op_type]) == 1
    onnx.checker.check_model(out)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 6)), min_size=1, max_size=40))
def test_buffers_are_shared_only_by_slots_whose_lives_do_not_overlap(raw):
    lives = sorted((first, first + span) for first, span in raw)  # slots are written in step order
    buf = _buffers(lives)
    for i in range(len(lives)):
        for j in range(i):
            if buf[i] == buf[j]:
                assert lives[j][1] < lives[i][0] or lives[i][1] < lives[j][0], (lives[i], lives[j])
    # Greedy colouring by start is optimal for intervals: as many buffers as slots ever live at once.
    most = max(sum(f <= s <= l for f, l in lives) for s in range(40))
    assert max(buf) + 1 == most


def _conv(name, x, y, ci, co, k, rng, stride=1):
    w = const(f"{name}_w", rng.standard_normal((co, ci, k, k)).astype(np.float32) * 0.2)
    b = const(f"{name}_b", rng.standard_normal(co).astype(np.float32) * 0.1)
    node = helper.make_node("Conv", [x, w.name, b.name], [y], name=name, kernel_shape=[k, k],
                            pads=[k // 2] * 4, strides=[stride, stride])
    return node, [w, b]


def _network(batch=1):
    """Convolutions with a residual Add and an LRN (left to onnxruntime) in the middle, so the fused model has a
    sequence on each side of it and tensors that cross it."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for spec in [("c1", "x", "t1", 8, 16, 3), ("c2", "r1", "t2", 16, 16, 1), ("c3", "r2", "t3", 16, 16, 3)]:
        n, i = _conv(*spec, rng)
        nodes.append(n)
        inits += i
        nodes.append(helper.make_node("Relu", [spec[2]], ["r" + spec[2][1:]]))
    nodes.append(helper.make_node("Add", ["r3", "r1"], ["s"]))
    nodes.append(helper.make_node("LRN", ["s"], ["sm"], size=3))
    n, i = _conv("c4", "sm", "t4", 16, 24, 3, rng, stride=2)
    nodes.append(n)
    inits += i
    nodes.append(helper.make_node("Relu", ["t4"], ["r4"]))
    n, i = _conv("c5", "r4", "y", 24, 8, 1, rng)
    nodes.append(n)
    inits += i
    vi = helper.make_tensor_value_info
    return make_model(nodes, [vi("x", F32, [batch, 8, 20, 20])], [vi("y", F32, [batch, 8, 10, 10]),
                                                                 vi("r1", F32, [batch, 16, 20, 20])], inits)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("seq")
    src = str(d / "m.onnx")
    onnx.save(_network(batch="N"), src)
    out = str(d / "fused.onnx")
    res = onnxopt.optimize(src, out, measure=False, threads=2)
    return src, out, res


def _feeds(batch=2):
    return {"x": np.random.default_rng(1).standard_normal((batch, 8, 20, 20)).astype(np.float32)}


def _want(src, feeds):
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_the_optimized_network_runs_in_sequences_and_gives_the_same_answer(built):
    src, out, res = built
    fused = onnx.load(out)
    onnx.checker.check_model(fused, full_check=True)
    seqs = [n for n in fused.graph.node if n.domain == D and n.op_type.startswith("Sequence_")]
    assert len(seqs) >= 2 and res.report["sequences"] and all(q["steps"] >= 2 for q in res.report["sequences"])
    assert "LRN" in [n.op_type for n in fused.graph.node]
    assert res.report["verification"]["ok"]
    feeds = _feeds()
    for got, want in zip(rt.InferenceSession(out).run(None, feeds), _want(src, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 12])
def test_any_thread_count_gives_the_same_answer(built, threads):
    """Every task of every loop runs: the loops' tasks are split into one part per thread in the section (at most 8,
    so 12 threads share parts) and taken from the parts' fronts and backs (sequence_exec.c seq_take). Each warm run
    gets new inputs, so a task skipped would leave the run before's values in the buffers it reuses."""
    src, out, _ = built
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.register_custom_ops_library(os.path.abspath(out + ".so"))
    s = ort.InferenceSession(out, so, providers=["CPUExecutionProvider"])
    for run in range(3):  # warm runs reuse the sequence's buffers
        feeds = {"x": np.random.default_rng(run).standard_normal((2, 8, 20, 20)).astype(np.float32)}
        for got, w in zip(s.run(None, feeds), _want(src, feeds)):
            np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)


def test_with_the_section_off_each_kernel_uses_the_pool_and_the_answer_is_the_same(built, monkeypatch):
    src, out, _ = built
    s = rt.InferenceSession(out)
    feeds = _feeds()
    on = s.run(None, feeds)
    monkeypatch.setenv("ONNXOPT_SEQUENCE_SECTION", "0")
    off = s.run(None, feeds)
    for a, b, w in zip(on, off, _want(src, feeds)):
        np.testing.assert_allclose(b, w, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_without_the_library_the_functions_compute_the_same(built):
    src, out, _ = built
    s = ort.InferenceSession(out, providers=["CPUExecutionProvider"])  # no custom ops: the nested functions run
    feeds = _feeds()
    for got, want in zip(s.run(None, feeds), _want(src, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_concurrent_runs_of_one_session_do_not_share_buffers(built):
    src, out, _ = built
    s = rt.InferenceSession(out)
    inputs = [{"x": np.random.default_rng(10 + i).standard_normal((2, 8, 20, 20)).astype(np.float32)}
              for i in range(4)]
    wants = [_want(src, f) for f in inputs]
    errors = []

    def worker(k):
        try:
            for r in range(15):
                i = (k + r) % len(inputs)
                for got, want in zip(s.run(None, inputs[i]), wants[i]):
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_larger_batch_than_the_last_run_grows_the_buffers(built):
    """Buffer sizes come from the running shapes: a larger batch after a smaller one must not write past one."""
    src, out, _ = built
    s = rt.InferenceSession(out)
    for batch in (1, 3, 1, 3):
        feeds = _feeds(batch)
        for got, want in zip(s.run(None, feeds), _want(src, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_sequences_off_leaves_one_op_per_region(tmp_path):
    src = str(tmp_path / "m.onnx")
    onnx.save(_network(), src)
    out = str(tmp_path / "fused.onnx")
    res = onnxopt.optimize(src, out, measure=False, sequences=False)
    fused = onnx.load(out)
    assert not any(n.op_type.startswith("Sequence_") for n in fused.graph.node)
    assert "sequences" not in res.report and res.report["verification"]["ok"]


def test_two_threads_on_one_cpu_give_the_same_answer(built, tmp_path):
    """Pinned to one CPU, the driver and the helper take turns: the helper must sleep (or yield) instead of
    holding the CPU, and nothing may wait for a thread that cannot run. Run in a child process (the affinity is
    per process)."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity on this platform")
    src, out, _ = built
    feeds = _feeds()
    np.save(tmp_path / "x.npy", feeds["x"])
    np.save(tmp_path / "want.npy", _want(src, feeds)[0])
    code = f"""
import os, numpy as np, onnxruntime as ort
os.sched_setaffinity(0, {{sorted(os.sched_getaffinity(0))[0]}})
so = ort.SessionOptions()
so.intra_op_num_threads = 2
so.add_session_config_entry("session.intra_op.allow_spinning", "0")
so.register_custom_ops_library({os.path.abspath(out + ".so")!r})
s = ort.InferenceSession({out!r}, so, providers=["CPUExecutionProvider"])
x = np.load({str(tmp_path / "x.npy")!r})
want = np.load({str(tmp_path / "want.npy")!r})
for _ in range(20):
    np.testing.assert_allclose(s.run(None, {{"x": x}})[0], want, rtol=1e-4, atol=1e-5)
print("ok")
"""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_sequence_profile_times_every_step(built, tmp_path):
    """ONNXOPT_SEQUENCE_PROFILE=FILE: when the library is unloaded (here, at the child's exit), one line per step of
    each sequence that ran: its op type, the step's index and op type (the sequence function's nodes, in order),
    the runs, and a mean time that is positive and no more than the child's whole run took. Results are unchanged
    by the clock. benchmarks/sequence_profile.py reads the file into a table."""
    import subprocess
    import sys

    src, out, _ = built
    feeds = _feeds()
    np.save(tmp_path / "x.npy", feeds["x"])
    np.save(tmp_path / "want.npy", _want(src, feeds)[0])
    prof = tmp_path / "profile.tsv"
    code = f"""
import os, time, numpy as np, onnxruntime as ort
so = ort.SessionOptions()
so.intra_op_num_threads = 2
so.register_custom_ops_library({os.path.abspath(out + ".so")!r})
s = ort.InferenceSession({out!r}, so, providers=["CPUExecutionProvider"])
x = np.load({str(tmp_path / "x.npy")!r})
want = np.load({str(tmp_path / "want.npy")!r})
t0 = time.perf_counter()
for _ in range(7):
    np.testing.assert_allclose(s.run(None, {{"x": x}})[0], want, rtol=1e-4, atol=1e-5)
print(time.perf_counter() - t0)
"""
    env = dict(os.environ, ONNXOPT_SEQUENCE_PROFILE=str(prof))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                       env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    total_us = float(r.stdout.strip().splitlines()[-1]) * 1e6
    fused = onnx.load(out, load_external_data=False)
    steps = {f.name: [nd.op_type for nd in f.node] for f in fused.functions if f.name.startswith("Sequence_")}
    ran = [nd.op_type for nd in fused.graph.node if nd.domain == D and nd.op_type in steps]
    rows = [line.split("\t") for line in prof.read_text().splitlines()]
    assert [(q, int(i), op) for q, i, op, _, _ in rows] == [(q, i, op) for q in dict.fromkeys(ran)
                                                             for i, op in enumerate(steps[q])]
    assert all(int(runs) == 7 for *_, runs, _ in rows)
    assert all(0 < float(us) for *_, us in rows) and sum(float(us) for *_, us in rows) * 7 <= total_us
    # Without the variable nothing is written.
    prof.unlink()
    env.pop("ONNXOPT_SEQUENCE_PROFILE")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                       env=env)
    assert r.returncode == 0 and not prof.exists()
