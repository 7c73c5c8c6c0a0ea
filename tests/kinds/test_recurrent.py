"""The recurrent kind (onnxopt/kinds/recurrent): which LSTMs and GRUs it takes, its packing, and its kernels against
onnxruntime's LSTM and GRU, with and without the library, at every direction, optional input and output, and on
drawn shapes; written models run as a user runs them, in a fresh process, with their kernels' calls counted."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from fresh_process import run_written
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kind_harness import fuse_kind
from onnx import TensorProto
from onnx_builders import rnn_model

import onnxopt
from onnxopt.codegen.target import parse_target
from onnxopt.kinds import KINDS
from onnxopt.kinds.recurrent import KIND
from onnxopt.kinds.recurrent.find import packed_bias, packed_weights
from onnxopt.kinds.recurrent.lower import tile_rows
from onnxopt.timing import make_session


def _feeds(model, steps, batch, seed=1):
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in model.graph.input:
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
        shape = [steps, batch, dims[2]] if i.name == "x" else [dims[0], batch, dims[2]]
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _check(model, fused, lib, feeds, tol=2e-5):
    want = make_session(model, 1, optimization="none").run(None, feeds)
    got = make_session(fused, 2, library=lib).run(None, feeds)
    alone = make_session(fused, 1).run(None, feeds)  # the function fallback, without our library
    assert len(got) == len(want)
    for w, g, a in zip(want, got, alone):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
        np.testing.assert_allclose(a, w, rtol=tol, atol=tol)  # the unpacked weights and summed bias


def test_the_kind_is_registered():
    assert KIND in KINDS and KIND.name == "recurrent"


def test_the_packing_keeps_each_units_gates_together():
    """Block b's gate g of unit u at [d, b, k, g, u]; the padding units zero; the bias is Wb + Rb."""
    rng = np.random.default_rng(0)
    hidden, k = 20, 7
    w = rng.standard_normal((2, 4 * hidden, k)).astype(np.float32)
    p = packed_weights(w, hidden)
    assert p.shape == (2, 2, k, 4, 16)
    for d, g, unit, i in [(0, 0, 0, 0), (1, 3, 19, 6), (0, 2, 16, 3), (1, 1, 5, 2)]:
        assert p[d, unit // 16, i, g, unit % 16] == w[d, g * hidden + unit, i]
    assert not p[:, 1, :, :, 4:].any()
    b = rng.standard_normal((2, 8 * hidden)).astype(np.float32)
    pb = packed_bias(b, hidden)
    assert pb.shape == (2, 2, 4, 16)
    assert pb[1, 1, 2, 3] == np.float32(b[1, 2 * hidden + 19] + b[1, 4 * hidden + 2 * hidden + 19])
    assert not pb[:, 1, :, 4:].any()


def test_a_grus_bias_keeps_rbh_apart():
    """A GRU's slots: Wbz + Rbz, Wbr + Rbr, Wbh, Rbh (the reset gate scales Rbh, so it is not summed)."""
    rng = np.random.default_rng(1)
    hidden = 18
    w = rng.standard_normal((1, 3 * hidden, 5)).astype(np.float32)
    assert packed_weights(w, hidden, 3)[0, 1, 4, 2, 1] == w[0, 2 * hidden + 17, 4]
    b = rng.standard_normal((1, 6 * hidden)).astype(np.float32)
    pb = packed_bias(b, hidden, "gru")
    wb, rb = b[0, :3 * hidden].reshape(3, hidden), b[0, 3 * hidden:].reshape(3, hidden)
    np.testing.assert_array_equal(pb[0, 0, 1], wb[1, :16] + rb[1, :16])
    np.testing.assert_array_equal(pb[0, 0, 2], wb[2, :16])
    np.testing.assert_array_equal(pb[0, 1, 3, :2], rb[2, 16:])


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("hidden,input_size", [(16, 8), (20, 33), (64, 64), (5, 1)])
def test_matches_onnxruntime(tmp_path, op, direction, hidden, input_size):
    model = rnn_model(7, 3, input_size, hidden, direction, op=op)
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path)
    assert [n.op_type for n in region.nodes] == [op]
    assert region.outputs == (["y", "yh", "yc"] if op == "LSTM" else ["y", "yh"])
    _check(model, fused, lib, _feeds(model, 7, 3))


@pytest.mark.parametrize("states,bias,outputs", [
    (False, True, (True, False, False)), (True, False, (False, True, True)),
    (False, False, (False, False, True)), (True, True, (True, False, True))])
def test_optional_inputs_and_outputs(tmp_path, states, bias, outputs):
    model = rnn_model(5, 2, 12, 24, "bidirectional", states=states, bias=bias, outputs=outputs)
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path)
    assert region.params.has_h0 == states and region.params.outputs == outputs
    _check(model, fused, lib, _feeds(model, 5, 2))


@pytest.mark.parametrize("states,bias,outputs", [(False, True, (True, False)), (True, False, (False, True)),
                                                 (True, True, (True, True))])
def test_a_grus_optional_inputs_and_outputs(tmp_path, states, bias, outputs):
    model = rnn_model(5, 2, 12, 24, "reverse", op="GRU", states=states, bias=bias, outputs=outputs)
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path)
    assert region.params.has_h0 == states and region.params.outputs == outputs + (False,)
    _check(model, fused, lib, _feeds(model, 5, 2))


def test_symbolic_steps_and_batch(tmp_path):
    model = rnn_model(0, 0, 16, 32, "bidirectional", symbolic=True)
    fused, lib, _, _ = fuse_kind(KIND, model, tmp_path)
    for steps, batch in [(1, 1), (9, 1), (4, 6), (40, 2)]:
        _check(model, fused, lib, _feeds(model, steps, batch, seed=steps * 10 + batch))


def _check_threads(model, fused, lib, feeds, threads, tol=5e-5):
    want = make_session(model, 1, optimization="none").run(None, feeds)
    for n in threads:
        got = make_session(fused, n, library=lib).run(None, feeds)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"{n} threads")


@pytest.mark.parametrize("serpentine", [True, False])
def test_a_large_single_direction_shares_its_steps_in_either_block_order(tmp_path, serpentine):
    """R above RECURRENT_SHARE_BYTES (exec.c): the direction's blocks in groups shared by the tasks of one parallel
    section, in either block order."""
    model = rnn_model(6, 2, 32, 272, "forward")  # R packed: 17 blocks x 272 x 64 floats = 1.18 MB: 2 groups
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path,
                                      params=lambda p: dataclasses.replace(p, serpentine=serpentine))
    assert region.params.serpentine == serpentine
    _check(model, fused, lib, _feeds(model, 6, 2), tol=5e-5)


@pytest.mark.parametrize("op,steps,batch,hidden,direction", [
    ("GRU", 49, 1, 128, "forward"),     # gru_kws's GRU: R 192 KiB, 2 groups of 4 blocks
    ("LSTM", 16, 1, 128, "reverse"),    # silero's LSTM: R 256 KiB
    ("GRU", 200, 3, 136, "reverse"),    # 9 blocks: groups of 5 and 4, many steps to race through
    ("LSTM", 7, 2, 400, "forward"),     # R 2.5 MB: 5 groups, more tasks than threads
])
def test_a_shared_direction_matches_at_any_thread_count(tmp_path, op, steps, batch, hidden, direction):
    """Each task takes its own group of a step first, then any group left, and waits only for groups a running task
    holds: one thread (the tasks run one after the other, the first does everything) gives the same answer as two
    and four, every output included."""
    model = rnn_model(steps, batch, 24, hidden, direction, op=op, states=True, seed=hidden)
    fused, lib, _, _ = fuse_kind(KIND, model, tmp_path)
    _check_threads(model, fused, lib, _feeds(model, steps, batch, seed=steps), threads=(1, 2, 4))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.integers(1, 30), batch=st.integers(1, 4), input_size=st.integers(1, 40),
       hidden=st.integers(120, 300), direction=st.sampled_from(["forward", "reverse"]), states=st.booleans(),
       op=st.sampled_from(["LSTM", "GRU"]), threads=st.integers(1, 3))
def test_drawn_shared_directions(tmp_path, steps, batch, input_size, hidden, direction, states, op, threads):
    model = rnn_model(steps, batch, input_size, hidden, direction, op=op, states=states, seed=hidden)
    fused, lib, _, _ = fuse_kind(KIND, model, tmp_path)
    _check_threads(model, fused, lib, _feeds(model, steps, batch, seed=steps + batch), threads=(threads,))


@pytest.mark.parametrize("serpentine", [True, False])
def test_both_block_orders_match(tmp_path, serpentine):
    model = rnn_model(5, 3, 24, 150, "bidirectional")  # serpentine by default (R 352 KiB a direction)
    assert KIND.find(model, set(), [])[0].params.serpentine
    fused, lib, _, _ = fuse_kind(KIND, model, tmp_path, params=lambda p: dataclasses.replace(p, serpentine=serpentine))
    _check(model, fused, lib, _feeds(model, 5, 3), tol=5e-5)


@pytest.mark.parametrize("target", ["cpu=x86-64-v3", "cpu=x86-64-v4"])
def test_both_vector_widths_build(tmp_path, target):
    """The tiles follow the target's registers; a target this CPU cannot run is built and checked through its
    function bodies elsewhere, here its code is only compiled."""
    t = parse_target(target)
    rows = tile_rows(t)
    assert rows == ((6, 4, 2) if "v4" in target else (1, 1, 1))
    model = rnn_model(3, 1, 8, 16, "forward")
    _, _, _, ir_text = fuse_kind(KIND, model, tmp_path, target=t)
    assert "_step" in ir_text and "_proj" in ir_text


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.integers(1, 9), batch=st.integers(1, 7), input_size=st.integers(1, 40), hidden=st.integers(1, 40),
       direction=st.sampled_from(["forward", "reverse", "bidirectional"]), states=st.booleans(),
       op=st.sampled_from(["LSTM", "GRU"]))
def test_drawn_shapes(tmp_path, steps, batch, input_size, hidden, direction, states, op):
    model = rnn_model(steps, batch, input_size, hidden, direction, op=op, states=states, seed=hidden)
    fused, lib, _, _ = fuse_kind(KIND, model, tmp_path)
    _check(model, fused, lib, _feeds(model, steps, batch, seed=steps + batch))


@pytest.mark.parametrize("attrs,reason", [
    ({"activations": ["Relu", "Tanh", "Tanh"]}, "activations"),
    ({"clip": 3.0}, "clip"),
    ({"input_forget": 1}, "input_forget"),
    ({"layout": 1}, "layout"),
])
def test_refused_forms_say_why(attrs, reason):
    model = rnn_model(3, 1, 4, 8, "forward", attrs=attrs, opset=17)
    rejected = []
    assert KIND.find(model, set(), rejected) == []
    assert len(rejected) == 1 and reason in rejected[0]["reason"], rejected


def test_a_gru_with_the_reset_gate_before_the_product_is_refused():
    model = rnn_model(3, 1, 4, 8, "forward", op="GRU", attrs={"linear_before_reset": 0})
    rejected = []
    assert KIND.find(model, set(), rejected) == []
    assert len(rejected) == 1 and rejected[0]["reason"].startswith("GRU: it has linear_before_reset 0"), rejected


def test_the_default_activations_spelled_out_are_taken():
    model = rnn_model(3, 1, 4, 8, "bidirectional", attrs={"activations": ["Sigmoid", "Tanh", "Tanh"] * 2})
    assert len(KIND.find(model, set(), [])) == 1


@pytest.mark.parametrize("op,hidden,direction", [("LSTM", 64, "bidirectional"), ("GRU", 64, "bidirectional"),
                                                 ("GRU", 128, "forward")])  # the last: a shared direction
def test_a_written_model_runs_its_kernel_in_a_fresh_process(tmp_path, op, hidden, direction):
    """optimize() writes fused.onnx and its library; the public loader runs it in a new process, the kernel's
    calls are counted there, and the answer is onnxruntime's."""
    model = rnn_model(12, 1, 48, hidden, direction, op=op, states=False, outputs=(True, False, False))
    src = tmp_path / "lstm.onnx"
    onnx.save(model, str(src))
    out = tmp_path / "fused.onnx"
    result = onnxopt.optimize(str(src), str(out), threads=2, plan="compute", min_speedup=0.0)
    assert [r["op_type"].split("_")[0] for r in result.report["regions"]] == ["recurrent"], result.report["regions"]
    x = np.random.default_rng(3).standard_normal((12, 1, 48)).astype(np.float32)
    got, loaded = run_written(out, x, tmp_path)
    assert any(k.startswith("recurrent_") for k in loaded["calls"]), loaded
    want = make_session(model, 1, optimization="none").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("op,opset", [("LSTM", 17), ("GRU", 17), ("LSTM", 11), ("GRU", 11)])
def test_bfloat16_weights(tmp_path, op, opset):
    """W and R stored as bfloat16 (BFLOAT16 from opset 13, UINT16 bits before): the kernel widens them exactly, so
    it matches the function fallback (which decodes the same weights) to float32 rounding, and onnxruntime's float32
    LSTM or GRU to bfloat16's."""
    from onnxopt.kinds.recurrent.precision import lower

    model = rnn_model(9, 2, 40, 36, "bidirectional", op=op, opset=opset)
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path, convert=lambda r: lower(r, "bfloat16", opset))
    assert region.params.weights == "bfloat16"
    types = {t.name: t.data_type for t in fused.graph.initializer}
    want_type = TensorProto.BFLOAT16 if opset >= 13 else TensorProto.UINT16
    assert [types[region.inputs[1]], types[region.inputs[2]]] == [want_type] * 2
    feeds = _feeds(model, 9, 2)
    want = make_session(model, 1, optimization="none").run(None, feeds)
    got = make_session(fused, 2, library=lib).run(None, feeds)
    alone = make_session(fused, 1).run(None, feeds)
    for w, g, a in zip(want, got, alone):
        np.testing.assert_allclose(g, a, rtol=1e-5, atol=1e-5)
        assert 0 < np.abs(g - w).max() < 0.02 * np.abs(w).max()


def test_precision_bf16_writes_bfloat16_weights_that_run(tmp_path):
    """`--precision bf16` lowers the recurrent kernel; the written model runs its kernel through the public loader
    in a fresh process, within bfloat16's tolerance of the float32 original."""
    model = rnn_model(16, 1, 64, 96, "bidirectional", states=False, outputs=(True, False, False))
    src, out = tmp_path / "lstm.onnx", tmp_path / "lstm_bf16.onnx"
    onnx.save(model, str(src))
    result = onnxopt.optimize(str(src), str(out), precision="bf16", threads=2, plan="compute", min_speedup=0.0)
    assert [r.get("weights_dtype") for r in result.report["regions"]] == ["bfloat16"], result.report["regions"]
    x = np.random.default_rng(4).standard_normal((16, 1, 64)).astype(np.float32)
    got, loaded = run_written(out, x, tmp_path)
    assert any(k.startswith("recurrent_") for k in loaded["calls"]), loaded
    want = make_session(model, 1, optimization="none").run(None, {"x": x})[0]
    assert np.abs(got - want).max() < 0.02 * np.abs(want).max()


def test_precision_auto_simulates_the_recurrent_kernel():
    """`auto` rounds the cell's W and R in its simulation and takes bf16 within the budget."""
    model = rnn_model(8, 1, 32, 48, "forward", states=False)
    result = onnxopt.optimize(model, precision="auto", accuracy_budget=0.05, threads=1, plan="compute",
                              min_speedup=0.0)
    assert [r.get("weights_dtype") for r in result.report["regions"]] == ["bfloat16"], result.report
    assert result.report["precision"]["auto"]["regions_simulated"] == 1


def test_a_cell_whose_bf16_error_compounds_keeps_its_float32_kernel():
    """Over 64 steps of 256 units, bfloat16 weights put the cell past the bf16 kernel tolerance (bf16_error), so
    `--precision bf16` keeps its float32 kernel and says why, rather than leaving it to onnxruntime."""
    model = rnn_model(64, 1, 64, 256, "forward", states=False, outputs=(True, False, False))
    result = onnxopt.optimize(model, precision="bf16", threads=1, plan="compute", min_speedup=0.0, measure=False)
    kept = result.report["precision"]["float32_regions"]
    assert len(kept) == 1 and "past the bf16 kernel tolerance" in kept[0]["reason"], kept
    assert [(x["op_type"].split("_")[0], x.get("weights_dtype")) for x in result.report["regions"]] == \
        [("recurrent", None)]
