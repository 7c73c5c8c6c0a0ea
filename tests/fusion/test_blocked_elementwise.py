"""Elementwise ops inside blocked chains as our kernels on the 5-D tensors (onnxopt/fusion/blocked_elementwise.py):
NASNet's Add -> Relu between cells, drawn unary and binary ops over channels that are not a whole number of vectors,
and the passthrough regions coming back when such a kernel is rejected."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from onnxopt.fusion.params import ElementwiseParams, RelayoutParams
from onnxopt.fusion.region import Region
from onnxopt.driver.policy import passthroughs_kept

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_layout import Chain, check_answers, needs_vectors, optimize_blocked

n = helper.make_node


def _entry(res, first):
    return next(r for r in res.report["regions"] if r["nodes"][0] == first)


@needs_vectors
def test_cells_add_and_relu_run_in_the_sequence(tmp_path):
    """Two pooled branches of one convolution added, then a Relu, read by the next convolution: one kernel of ours
    on the blocked tensors, so the whole model is one sequence; checked with the library and through the function
    fallbacks."""
    ch = Chain(6, 11, 9, batch=1)
    a = ch.conv("x", "a", 20)
    ch.nodes.append(n("AveragePool", [a], ["p1"], name="p1", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                      count_include_pad=0))
    ch.nodes.append(n("MaxPool", [a], ["p2"], name="p2", kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    ch.nodes.append(n("Add", ["p1", "p2"], ["s"], name="add"))
    ch.nodes.append(n("Relu", ["s"], ["r"], name="relu"))
    ch.c["r"] = 20
    out = ch.conv("r", "out", 7, k=1, p=0)
    model = ch.model([out])
    res = optimize_blocked(model, tmp_path)
    entry = _entry(res, "add")
    assert entry["ops"] == "Add -> Relu" and entry["nodes"] == ["add", "relu"]
    assert entry["layout"] == "blocked->blocked"
    assert [nd.op_type for nd in res.model.graph.node if nd.domain != "onnxopt"] == []
    assert len(res.report["sequences"]) == 1
    check_answers(res, model, ch.feeds)


UNARY = [("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Tanh", {}), ("Abs", {}), ("Neg", {})]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


@needs_vectors
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(unary=st.sampled_from(UNARY), binary=st.sampled_from(BINARY), c=st.integers(1, 40), h=st.integers(2, 9),
       batch=st.sampled_from([1, 2]))
def test_drawn_ops_on_blocked_tensors_match_onnxruntime(tmp_path_factory, unary, binary, c, h, batch):
    """A conv's output max-pooled and average-pooled -> binary -> unary -> conv: the elementwise pair is ours on the
    blocked tensors, whatever C is against the lanes (the kernel check also asks the padding channels to stay
    zero). Pools, not convolutions, feed the binary op, so no convolution takes it into its epilogue."""
    ch = Chain(4, h, h + 1, batch=batch, seed=c * 13 + h)
    a = ch.conv("x", "a", c)
    ch.nodes.append(n("MaxPool", [a], ["p1"], name="p1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    ch.nodes.append(n("AveragePool", [a], ["p2"], name="p2", kernel_shape=[2, 2], pads=[1, 1, 0, 0]))
    ch.nodes.append(n(binary, ["p1", "p2"], ["s"], name="bin"))
    op, attrs = unary
    ch.nodes.append(n(op, ["s"], ["u"], name="un", **attrs))
    ch.c["u"] = c
    out = ch.conv("u", "out", 5, k=1, p=0)
    model = ch.model([out])
    res = optimize_blocked(model, tmp_path_factory.mktemp("bew"))
    entry = _entry(res, "bin")
    assert entry["nodes"] == ["bin", "un"] and entry["layout"] == "blocked->blocked"
    assert [nd.op_type for nd in res.model.graph.node if nd.domain != "onnxopt"] == []
    check_answers(res, model, ch.feeds)


def test_rejected_kernel_gives_its_passthroughs_back():
    def region(kind, out, **kw):
        return Region(kind, [n("Relu", ["x"], [out])], ["x"], [out], None, [1], **kw)

    p1, p2, other = (region("relayout", o, params=RelayoutParams([])) for o in ("a", "b", "c"))
    kernel = region("Elementwise", "b", params=ElementwiseParams(blocked_lanes=16, replaces=[p1, p2]))
    regions = [p1, p2, other, kernel]
    assert passthroughs_kept([kernel], regions) == [other]
    assert passthroughs_kept([], regions) == [p1, p2, other]
