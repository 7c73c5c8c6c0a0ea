"""Concat inputs written in place inside a sequence (onnxopt/emit/sequence.py `_concat_views`,
codegen/glue/sequence_exec.c `seq_view`): the planner's choice of views and the lives of the buffers, then real
fused models through real onnxruntime sessions, with the views on and off, at batch 1 (views) and 8 (none)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnxopt.codegen.copy.desc import CopyKernelDesc

import onnxopt
from onnxopt.emit.sequence import SlotView, make_sequences
from tests.onnx_builders import const, make_model

F32 = TensorProto.FLOAT
D = "onnxopt"
vi = helper.make_tensor_value_info


class _Desc:
    def __init__(self, op, n_in=1):
        self.op_type, self.in_types, self.out_types = op, [1] * n_in, [1]


def _copy(op, n_in, lanes=16, factors=None, axis=1):
    return CopyKernelDesc(op, [1] * n_in, [1], lanes, factors or [(1, 1)] * n_in, axis)


def _plan(nodes, shapes, descs, outputs=("y",)):
    """make_sequences on `nodes` (our ops, plus any onnxruntime op) with the tensors' shapes declared."""
    g = helper.make_graph(nodes, "g", [vi("x", F32, shapes["x"])], [vi(o, F32, shapes[o]) for o in outputs],
                          value_info=[vi(n, F32, s) for n, s in shapes.items() if n != "x" and n not in outputs])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(D, 1)])
    return make_sequences(model, descs, D)


def _ours(op, ins, outs):
    return helper.make_node(op, ins, outs, name=op.lower(), domain=D)


def _fire(batch=1, factors=None, twice=False):
    b = [batch, 2, 4, 4, 16]
    shapes = {"x": b, "ta": b, "tb": [batch, 3, 4, 4, 16], "tc": [batch, 5 if not twice else 4, 4, 4, 16],
              "y": [batch, 5 if not twice else 4, 4, 4, 16]}
    second = "ta" if twice else "tb"
    nodes = [_ours("A", ["x"], ["ta"]), _ours("B", ["x"], ["tb"]), _ours("Cat", ["ta", second], ["tc"]),
             _ours("E", ["tc"], ["y"])]
    descs = {"A": _Desc("A"), "B": _Desc("B"), "E": _Desc("E"), "Cat": _copy("Cat", 2, factors=factors)}
    return nodes, shapes, descs


def test_both_inputs_of_a_blocked_concat_are_written_in_its_output():
    nodes, shapes, descs = _fire()
    _, seqs = _plan(nodes, shapes, descs)
    q = seqs[0]
    ta, tb, tc = 0, 1, 2  # slots in write order
    assert q.slot_view[ta] == SlotView(tc, 1, 0, 2, 5)
    assert q.slot_view[tb] == SlotView(tc, 1, 2, 3, 5)
    assert q.slot_view[tc] is None and q.slot_view[3] is None
    # The output lives from the first input's write: no buffer of an input is shared with it.
    assert q.slot_buffer[tc] not in (q.slot_buffer[ta], q.slot_buffer[tb])


def test_an_input_read_outside_the_run_keeps_its_own_tensor():
    nodes, shapes, descs = _fire()
    nodes.append(helper.make_node("Neg", ["ta"], ["z"]))
    shapes["z"] = shapes["ta"]
    _, seqs = _plan(nodes, shapes, descs, outputs=("y", "z"))
    q = seqs[0]
    assert q.slot_output[0] >= 0 and q.slot_view[0] is None  # ta: a sequence output
    assert q.slot_view[1] == SlotView(2, 1, 2, 3, 5)  # tb still goes in place, after ta's 2 blocks


@pytest.mark.parametrize("case", ["batch 2", "repeated input", "nearest repeat", "unknown sizes"])
def test_no_view_where_the_input_is_not_one_contiguous_part_of_the_output(case):
    nodes, shapes, descs = _fire(batch=2 if case == "batch 2" else 1,
                                 factors=[(1, 1), (2, 2)] if case == "nearest repeat" else None,
                                 twice=case == "repeated input")
    if case == "nearest repeat":
        shapes["tb"] = [1, 3, 2, 2, 16]
    if case == "unknown sizes":
        shapes["tb"] = [1, "c", 4, 4, 16]
    _, seqs = _plan(nodes, shapes, descs)
    views = [v for v in seqs[0].slot_view if v is not None]
    if case == "nearest repeat":
        assert views == [SlotView(2, 1, 0, 2, 5)]  # ta only
    else:
        assert views == []


def test_a_plain_concat_views_its_inputs_along_its_axis():
    shapes = {"x": [1, 3, 5], "ta": [1, 3, 5], "tb": [1, 4, 5], "tc": [1, 7, 5], "y": [1, 7, 5]}
    nodes = [_ours("A", ["x"], ["ta"]), _ours("B", ["x"], ["tb"]), _ours("Cat", ["ta", "tb"], ["tc"]),
             _ours("E", ["tc"], ["y"])]
    descs = {"A": _Desc("A"), "B": _Desc("B"), "E": _Desc("E"), "Cat": _copy("Cat", 2, lanes=0)}
    _, seqs = _plan(nodes, shapes, descs)
    assert seqs[0].slot_view[:2] == [SlotView(2, 1, 0, 3, 7), SlotView(2, 1, 3, 4, 7)]


def test_a_concat_of_a_concat_nests_its_views_and_their_lives():
    shapes = {"x": [1, 1, 4, 4, 16], "ta": [1, 1, 4, 4, 16], "tb": [1, 2, 4, 4, 16], "tc": [1, 3, 4, 4, 16],
              "td": [1, 1, 4, 4, 16], "te": [1, 4, 4, 4, 16], "y": [1, 4, 4, 4, 16]}
    nodes = [_ours("A", ["x"], ["ta"]), _ours("B", ["x"], ["tb"]), _ours("Cat", ["ta", "tb"], ["tc"]),
             _ours("A", ["x"], ["td"]), _ours("Cat", ["tc", "td"], ["te"]), _ours("E", ["te"], ["y"])]
    descs = {"A": _Desc("A"), "B": _Desc("B"), "E": _Desc("E"), "Cat": _copy("Cat", 2)}
    _, seqs = _plan(nodes, shapes, descs)
    q = seqs[0]
    ta, tb, tc, td, te = range(5)
    assert q.slot_view[tc] == SlotView(te, 1, 0, 3, 4) and q.slot_view[td] == SlotView(te, 1, 3, 1, 4)
    assert q.slot_view[ta] == SlotView(tc, 1, 0, 1, 3)
    # te holds everything from ta's write on: its buffer is no other slot's.
    assert all(q.slot_buffer[te] != q.slot_buffer[s] for s in (ta, tb, tc, td))


# ---- real models ----------------------------------------------------------------------------------------------


def _fire_model(batch, concat_is_output=False, nested=False):
    """A SqueezeNet fire module (squeeze 1x1, expand 1x1 and 3x3, Concat) and a 1x1 after it."""
    rng = np.random.default_rng(5)
    nodes, inits = [], []

    def conv(name, x, y, ci, co, k):
        w = const(f"{name}_w", rng.standard_normal((co, ci, k, k)).astype(np.float32) * 0.2)
        b = const(f"{name}_b", rng.standard_normal(co).astype(np.float32) * 0.1)
        nodes.append(helper.make_node("Conv", [x, w.name, b.name], [y + "_c"], name=name, pads=[k // 2] * 4))
        nodes.append(helper.make_node("Relu", [y + "_c"], [y]))
        inits.extend([w, b])

    conv("sq", "x", "s", 32, 16, 1)
    conv("e1", "s", "a", 16, 32, 1)
    conv("e3", "s", "b", 16, 48, 3)
    nodes.append(helper.make_node("Concat", ["a", "b"], ["cat"], axis=1))
    channels = 80
    if nested:
        conv("e5", "s", "d", 16, 16, 1)
        nodes.append(helper.make_node("Concat", ["cat", "d"], ["cat2"], axis=1))
        channels = 96
    conv("out", "cat2" if nested else "cat", "y", channels, 32, 1)
    outputs = [vi("y", F32, [batch, 32, 14, 14])] + ([vi("cat", F32, [batch, 80, 14, 14])] if concat_is_output else [])
    return make_model(nodes, [vi("x", F32, [batch, 32, 14, 14])], outputs, inits)


@pytest.fixture(scope="module", params=["plain", "concat is an output", "nested", "batch 8"])
def fire(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("views")
    batch = 8 if request.param == "batch 8" else 1
    src = str(d / "fire.onnx")
    onnx.save(_fire_model(batch, request.param == "concat is an output", request.param == "nested"), src)
    out = str(d / "fused.onnx")
    res = onnxopt.optimize(src, out, threads=2, measure=False, plan="compute-blocked")
    feeds = {"x": np.random.default_rng(9).standard_normal((batch, 32, 14, 14)).astype(np.float32)}
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, feeds)
    return request.param, out, res, feeds, want


def _session(out):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.register_custom_ops_library(os.path.abspath(out + ".so"))
    return ort.InferenceSession(out, so, providers=["CPUExecutionProvider"])


def test_the_fire_module_gives_onnxruntime_answer_with_views_on_and_off(fire, monkeypatch):
    case, out, res, feeds, want = fire
    in_place = sum(q["concat_inputs_in_place"] for q in res.report["sequences"])
    if case == "batch 8":
        assert in_place == 0  # a batch item's channels are not contiguous across items
    else:
        assert in_place >= 2, res.report["sequences"]
    s = _session(out)
    for views in ("1", "0", "1"):
        monkeypatch.setenv("ONNXOPT_SEQUENCE_VIEWS", views)
        for _ in range(2):  # a warm run reuses the sequence's buffers
            got = s.run(None, feeds)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"{case}, views {views}")


def test_the_function_fallback_computes_the_same(fire):
    _, out, _, feeds, want = fire
    s = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
    for g, w in zip(s.run(None, feeds), want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
