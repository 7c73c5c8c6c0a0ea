"""The attention kind (onnxopt/kinds/attention): which chains it takes, and its kernel against onnxruntime on every
form exports write, masks, broadcast heads, dynamic shapes and the function fallback."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from kind_harness import fuse_kind
from attention_models import attention_model, feeds_for
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import onnxopt
from onnxopt.kinds import KINDS
from onnxopt.kinds.attention import KIND
from onnxopt.timing import make_session


def _fuse(model, tmp_path, name="attention.so"):
    fused, lib, _, _ = fuse_kind(KIND, onnx.shape_inference.infer_shapes(model), tmp_path, name)
    return fused, lib


def _check(model, tmp_path, feeds, threads=2, name="attention.so"):
    """The fused model's output (with the library) after checking it, and the fallback's, against onnxruntime."""
    fused, lib = _fuse(model, tmp_path, name)
    want = make_session(model, 1, optimization="none").run(None, feeds)[0]
    got = make_session(fused, threads, library=lib).run(None, feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5 * max(1.0, float(np.nanmax(np.abs(want)))))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    # The function fallback, without our library: the chain's own ops, but onnxruntime's optimized graph sums in
    # another order than the unoptimized reference (4.5e-6 apart at head dim 128 with a single key), so the same
    # tolerance as the kernel's, and NaN where the reference has NaN.
    alone = make_session(fused, 1).run(None, feeds)[0]
    np.testing.assert_allclose(alone, want, rtol=2e-4, atol=2e-5 * max(1.0, float(np.nanmax(np.abs(want)))))
    return got


def test_the_kind_is_registered_and_claims_before_the_compute_rule():
    assert KIND in KINDS and KIND.name == "attention" and KIND.first


@settings(max_examples=25, deadline=None)
@given(form=st.sampled_from(["sdpa", "bert", "fused", "unscaled"]),
       mask=st.sampled_from(["none", "add", "causal", "select", "fill"]), guard=st.booleans(),
       b=st.integers(1, 4), h=st.integers(1, 16), m=st.integers(1, 600), lq=st.integers(1, 600),
       d=st.sampled_from([32, 64, 80, 128]), dv_extra=st.sampled_from([0, 3]), split=st.booleans())
def test_matches_onnxruntime(tmp_path_factory, form, mask, guard, b, h, m, lq, d, dv_extra, split):
    """The issue's ranges (heads 1-16, head dim 32/64/80/128, sequences 1-600, batch 1-4), every mask and form;
    draws whose reference would take seconds are skipped (the kernel is not the slow side)."""
    if mask == "causal":
        lq = max(lq, m)
    assume(b * h * m * lq * d <= 40_000_000)
    model = attention_model(form, b, h, m, lq, d, mask, guard, dv=d + dv_extra, split_heads=split)
    _check(model, tmp_path_factory.mktemp("a"), feeds_for(model))


@pytest.mark.parametrize("seq", [1, 7, 32, 128, 384, 512])
def test_bert_shapes(tmp_path, seq):
    model = attention_model("sdpa", 1, 12, seq, seq, 64, "add", True)
    _check(model, tmp_path, feeds_for(model))


def test_rows_masked_everywhere_give_zeros_with_the_guard_and_nan_without(tmp_path):
    for guard in (True, False):
        model = attention_model("bert", 1, 2, 5, 9, 8, "add", guard)
        feeds = feeds_for(model)
        feeds["mask"][0, 0, 0, :] = -np.inf  # every key of batch 0 masked
        got = _check(model, tmp_path, feeds, name=f"g{guard}.so")
        if guard:
            assert np.all(got[0] == 0)
        else:
            assert np.all(np.isnan(got[0]))


@pytest.mark.parametrize("mask", ["select", "fill"])
@pytest.mark.parametrize("form", ["sdpa", "bert"])
def test_bool_masks_both_ways(tmp_path, form, mask):
    """Where(keep, scores, fill) and masked_fill's Where(masked, fill, scores): the kernel fills where the export
    does, on row tails (lq 37) and on whole column blocks."""
    model = attention_model(form, 2, 3, 11, 37, 64, mask, False)
    feeds = feeds_for(model)
    name = "keep" if mask == "select" else "masked"
    feeds[name][0, 0, 0, :] = mask == "fill"  # a row masked everywhere: uniform over its keys
    _check(model, tmp_path, feeds)


@pytest.mark.parametrize("form", ["sdpa", "bert", "fused", "unscaled"])
def test_the_head_split_and_merge_are_read_in_place(tmp_path, form):
    """Q, K, V token-major through the head split's Transposes, the output through the merge's: the kernel reads
    and writes through the permutations, so the fused model has no Transpose left."""
    model = attention_model(form, 2, 12, 37, 37, 64, "add", True, split_heads=True)
    fused, lib = _fuse(model, tmp_path)
    assert [n.op_type for n in fused.graph.node] == [fused.graph.node[0].op_type] and fused.graph.node[0].domain
    region = KIND.find(onnx.shape_inference.infer_shapes(model), set(), [])[0]
    assert region.inputs[:3] == ["q_tokens", "k_tokens", "v_tokens"] and region.outputs == ["out"]
    assert region.params.perms[0] == (0, 2, 1, 3) and region.params.perms[3] == (0, 2, 1, 3)
    _check(model, tmp_path, feeds_for(model), name="again.so")


def test_a_transpose_read_elsewhere_stays_outside(tmp_path):
    """The head split's output also read by another node is not folded: the region starts after it."""
    model = attention_model("bert", 1, 4, 9, 9, 16, "none", False, split_heads=True)
    model.graph.node.append(helper.make_node("Relu", ["q"], ["q_relu"]))
    model.graph.output.append(helper.make_tensor_value_info("q_relu", TensorProto.FLOAT, None))
    region = KIND.find(onnx.shape_inference.infer_shapes(model), set(), [])[0]
    assert region.inputs[:3] == ["q", "k_tokens", "v_tokens"] and region.params.perms[0] == (0, 1, 2, 3)
    want = make_session(model, 1, optimization="none").run(None, feeds_for(model))
    fused, lib = _fuse(model, tmp_path)
    got = make_session(fused, 2, library=lib).run(None, feeds_for(model))
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


def test_heads_broadcast_between_q_and_kv(tmp_path):
    """One key/value head for all query heads (multi-query attention): the leading dims broadcast."""
    model = attention_model("bert", 2, 4, 6, 10, 16, "add", False, kv_heads=1)
    _check(model, tmp_path, feeds_for(model))


def test_dynamic_batch_and_sequence(tmp_path):
    """Symbolic batch and sequence in the model; the kernel reads them at run time."""
    model = attention_model("sdpa", "batch", 4, "seq", "seq", 32, "add", True)
    fused, lib = _fuse(model, tmp_path)
    for b, seq in ((1, 1), (2, 7), (1, 128), (3, 33)):
        feeds = feeds_for(attention_model("sdpa", b, 4, seq, seq, 32, "add", True))
        want = make_session(model, 1, optimization="none").run(None, feeds)[0]
        got = make_session(fused, 2, library=lib).run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


def test_refusals_say_why():
    model = attention_model("bert", 1, 2, 4, 6, 8, "add", False)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    rejected = []
    assert KIND.find(onnx.shape_inference.infer_shapes(model), set(), rejected) == []
    assert any("float32" in r["reason"] for r in rejected)
    model = attention_model("bert", 1, 2, 4, 6, 8, "add", False)
    claimed = {0}
    assert KIND.find(onnx.shape_inference.infer_shapes(model), claimed, []) == []  # a node taken already


def test_the_driver_fuses_a_chain_end_to_end(tmp_path):
    model = attention_model("sdpa", 1, 4, 48, 48, 32, "add", True)
    res = onnxopt.optimize(model, str(tmp_path / "fused.onnx"), measure=False, threads=2)
    # The report gives the data-movement model's view of the kernel at the checked shapes (plan.py).
    (entry,) = [r for r in res.report["regions"] if "data_movement" in r]
    dm = entry["data_movement"]
    assert dm["extents"] == {"heads": 4, "M": 48, "L": 48, "d": 32, "dv": 32} and dm["illegal"] is None
    assert dm["tiles"] == {"b": 1, "m": 24, "l": 48, "k": 32, "n": 32}  # 4 heads: rows halved so 8 tasks
    assert dm["softmax"] == "row" and dm["order"] == "bmlkn"
    # Q and the output move once, K and V once per block of 24 rows (two), the scores never: per head 48 x 32
    # floats 6 times, 4 bytes each. (The mask is not in Chimera's chain.)
    assert dm["predicted_moved_bytes"] == 4 * 4 * 6 * 48 * 32
    # TileFlow's latency of the kernel's tree, on this machine's model where one is cached
    from onnxopt.codegen.target import host_target
    from onnxopt.hardware.measure import cached_machine
    from onnxopt.kinds.attention import plan

    machine = cached_machine()
    assert dm["tileflow_predicted_seconds"] == (
        None if machine is None else plan.tileflow_seconds(machine, 4, 48, 48, 32, 32, 48,
                                                           panel=2 * host_target().float32_lanes))
    ops = [n.op_type for n in res.model.graph.node]
    assert any(op.startswith("attention_") for op in ops) or any(
        "attention_" in f.name for f in res.model.functions)
    feeds = feeds_for(model)
    want = make_session(model, 1, optimization="none").run(None, feeds)[0]
    got = make_session(res.model, 2, library=res.library).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
