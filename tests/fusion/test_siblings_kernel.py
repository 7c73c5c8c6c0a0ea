"""Horizontal fusion (onnxopt/fusion/siblings.py, codegen/glue/siblings_exec.c): sibling convolutions that read the
same input run as one kernel, each with its own kernel size, strides, channels and epilogue. Checked against
onnxruntime with the library and through the function fallback, on an Inception module, a SqueezeNet fire's expands
(OptiFX's G5), a ResNet stage's first block and drawn groups; and the refusals."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnxopt.models import random_inputs
from onnxopt.models.conv_shapes import optifx_model

import onnxopt
from onnxopt.emit.sequence import expand_sequences
from onnxopt.fusion.siblings import sibling_reason, topological

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_layout import Chain, check_answers, fused_nodes, needs_vectors

pytestmark = needs_vectors


@pytest.fixture(autouse=True)
def every_group(monkeypatch):
    """Every legal sibling group is fused (the search's choice is tested in test_search_picks_siblings)."""
    monkeypatch.setenv("ONNXOPT_SIBLINGS", "all")


def optimize_horizontal(model, path):
    return onnxopt.optimize(model, str(path), plan="horizontal", measure=False)


def sibling_nodes(result):
    return [nd for nd in fused_nodes(result.model) if nd.op_type.startswith("siblings_")]


def onnx_concat(inputs, out):
    from onnx import helper

    return helper.make_node("Concat", inputs, [out], axis=1, name=out)


def inception_block(batch=1):
    """Three branches read `a`: a 1x1, a 1x1 followed by a 3x3 (which stands between the siblings in graph order),
    and a 3x3; the Concat joins them."""
    ch = Chain(8, 17, 15, batch=batch)
    a = ch.conv("x", "a", 32, k=3)
    b1 = ch.conv(a, "b1", 24, k=1, p=0)
    b2 = ch.conv(a, "b2", 16, k=1, p=0)
    c2 = ch.conv(b2, "c2", 16, k=3)
    b3 = ch.conv(a, "b3", 20, k=3, p=1)
    ch.nodes.append(onnx_concat([b1, c2, b3], "cat"))
    ch.c["cat"] = 60
    d = ch.conv("cat", "d", 8, k=1, p=0)
    return ch, ch.model([d])


@pytest.mark.parametrize("batch", [1, 2])
def test_inception_branches_run_as_one_kernel(tmp_path, batch):
    ch, model = inception_block(batch)
    res = optimize_horizontal(model, tmp_path / "fused.onnx")
    nodes = sibling_nodes(res)
    assert len(nodes) == 1 and len(nodes[0].output) == 3, res.report["regions"]
    groups = res.report["horizontal"]["groups"]
    assert [g["convs"] for g in groups] == [["b1_pre", "b2_pre", "b3_pre"]]
    # The reader of one sibling (c2) comes after the fused node in the written graph.
    graph = list(expand_sequences(res.model).graph.node)
    at = graph.index(nodes[0])
    readers = [i for i, nd in enumerate(graph) if set(nd.input) & set(nodes[0].output)]
    assert readers and min(readers) > at
    check_answers(res, model, ch.feeds)


def test_fire_expands_1x1_and_3x3(tmp_path):
    """G5, a SqueezeNet fire: the expand 1x1 and 3x3 read the squeeze output; as siblings they share one loop."""
    model = optifx_model("G5")
    res = optimize_horizontal(model, tmp_path / "fused.onnx")
    nodes = sibling_nodes(res)
    assert len(nodes) == 1 and len(nodes[0].output) == 2, res.report["regions"]
    check_answers(res, model, random_inputs(model))


def resnet_first_block(shortcut_first: bool):
    """A ResNet stage's first block: the block's 1x1 and the shortcut's 1x1 (no activation) read the same input and
    meet in an Add. Which conv's epilogue takes the Add follows the graph order."""
    ch = Chain(16, 14, 14)
    x = ch.conv("x", "x0", 32, k=3)
    if shortcut_first:
        short = ch.conv(x, "short", 64, k=1, p=0, act=None)
    b = ch.conv(x, "b1", 16, k=1, p=0)
    b = ch.conv(b, "b2", 16, k=3)
    b = ch.conv(b, "b3", 64, k=1, p=0, act=None)
    if not shortcut_first:  # torchvision's order: b3's epilogue takes the Add and reads the shortcut
        short = ch.conv(x, "short", 64, k=1, p=0, act=None)
    out = ch.add(b, short, "out")
    return ch, ch.model([out])


def test_resnet_block_and_shortcut_read_the_input_once(tmp_path):
    ch, model = resnet_first_block(shortcut_first=False)
    res = optimize_horizontal(model, tmp_path / "fused.onnx")
    assert [g["convs"] for g in res.report["horizontal"]["groups"]] == [["b1_pre", "short"]]
    assert len(sibling_nodes(res)) == 1, res.report["regions"]
    check_answers(res, model, ch.feeds)


def test_sibling_leading_into_another_is_refused(tmp_path):
    """With the shortcut first, its epilogue takes the Add of b3's output, which b1 leads to: fused, the kernel
    would read its own output."""
    _, model = resnet_first_block(shortcut_first=True)
    res = onnxopt.optimize(model, str(tmp_path / "fused.onnx"), measure=False)
    refused = res.report["horizontal"]["refused"]
    assert any("cycle" in r["reason"] for r in refused), refused
    assert not sibling_nodes(res)


def test_a_path_through_onnxruntimes_own_nodes_is_a_cycle_too(tmp_path):
    """Found on NASNet: sibling a's output reaches sibling b's epilogue through a node no region holds (here a
    LRN, left to onnxruntime): fused, the kernel would wait for itself."""
    import onnx

    ch = Chain(8, 10, 10)
    a = ch.conv("x", "a", 16, k=1, p=0)
    ch.nodes.append(onnx.helper.make_node("LRN", [a], ["soft"], name="soft", size=3))
    ch.c["soft"] = 16
    b = ch.conv("x", "b", 16, k=3, act=None)
    out = ch.add(b, "soft", "out")
    model = ch.model([out])
    res = onnxopt.optimize(model, str(tmp_path / "fused.onnx"), measure=False)
    refused = res.report["horizontal"]["refused"]
    assert any("cycle" in r["reason"] for r in refused), refused
    assert not sibling_nodes(res)
    check_answers(res, model, ch.feeds)


@st.composite
def sibling_sets(draw):
    count = draw(st.integers(2, 3))
    c_in = draw(st.sampled_from([8, 16, 24]))
    blocked = draw(st.booleans())  # the shared input made by a fused conv (blocked) or the graph's input (NCHW)
    stride = draw(st.sampled_from([1, 2]))
    sibs = []
    for i in range(count):
        k = draw(st.sampled_from([1, 3, 5]))
        d = draw(st.sampled_from([1, 2])) if k == 3 else 1
        p = (k - 1) * d // 2  # "same" size at stride 1: the siblings share their output size
        depthwise = blocked and i == count - 1 and draw(st.booleans())
        oc = c_in if depthwise else draw(st.sampled_from([8, 16, 20, 40]))
        act = draw(st.sampled_from(["Relu", None]))
        sibs.append((k, d, p, oc, depthwise, act))
    return c_in, blocked, stride, sibs, draw(st.integers(1, 2)), draw(st.integers(6, 19)), draw(st.integers(6, 19))


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=sibling_sets())
def test_drawn_sibling_groups_match_onnxruntime(tmp_path_factory, case):
    c_in, blocked, stride, sibs, batch, h, w = case
    ch = Chain(c_in if not blocked else 3, h, w, batch=batch)
    x = ch.conv("x", "x0", c_in, k=3) if blocked else "x"
    outs = []
    for i, (k, d, p, oc, depthwise, act) in enumerate(sibs):
        outs.append(ch.conv(x, f"s{i}", oc, k=k, s=stride, p=p, d=d, group=c_in if depthwise else 1, act=act))
    model = ch.model(outs)
    res = optimize_horizontal(model, tmp_path_factory.mktemp("sib") / "fused.onnx")
    assert len(sibling_nodes(res)) == 1, (res.report["horizontal"], res.report["regions"])
    check_answers(res, model, ch.feeds)


def test_siblings_with_different_output_sizes_are_refused(tmp_path):
    ch = Chain(8, 12, 12)
    a = ch.conv("x", "a", 16, k=3)
    b1 = ch.conv(a, "b1", 16, k=1, p=0)
    b2 = ch.conv(a, "b2", 16, k=3, p=0)
    model = ch.model([b1, b2])
    res = onnxopt.optimize(model, str(tmp_path / "fused.onnx"), measure=False)
    refused = res.report["horizontal"]["refused"]
    assert any("differ in size" in r["reason"] for r in refused), refused
    assert not sibling_nodes(res)


def test_no_horizontal_skips_the_kind(tmp_path):
    _, model = inception_block()
    res = onnxopt.optimize(model, str(tmp_path / "fused.onnx"), measure=False, skip_fusion=["horizontal"])
    assert not sibling_nodes(res) and res.report["horizontal"]["groups"] == []


def test_search_picks_siblings(tmp_path, monkeypatch):
    """Without the override the search's horizontal candidates choose the groups: what it chose is in the report,
    and each chosen group is among its plan's horizontal candidates."""
    monkeypatch.delenv("ONNXOPT_SIBLINGS")
    _, model = inception_block()
    res = onnxopt.optimize(model, str(tmp_path / "fused.onnx"), measure=False)
    search = res.report["search"]
    assert "error" not in search, search
    wanted = [set(c["nodes"]) for c in search["plan"] if c["kind"] == "horizontal"]
    for g in res.report["horizontal"]["groups"]:
        assert any(set(g["convs"]) <= w for w in wanted)
    assert search["sibling_groups_chosen"] == len(res.report["horizontal"]["groups"])


def test_reasons():
    assert "8 or more lanes" in sibling_reason([], 4)
    assert "2 to 8" in sibling_reason([None], 16)


def test_topological_order_puts_readers_after_producers():
    from onnxopt.fusion.region import EwProgram, Region

    def reg(name, ins, outs):
        return Region(label="x", nodes=[], inputs=ins, outputs=outs, program=EwProgram([], {}, [], []), shape=[],
                      op_type=name)

    a, b, c = reg("a", ["x"], ["t"]), reg("b", ["t"], ["u"]), reg("c", ["x"], ["v"])
    assert [r.op_type for r in topological([b, c, a])] == ["c", "a", "b"]
    with pytest.raises(ValueError, match="cycle"):
        topological([reg("p", ["q_out"], ["p_out"]), reg("q", ["p_out"], ["q_out"])])
