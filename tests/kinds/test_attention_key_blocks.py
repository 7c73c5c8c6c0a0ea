"""The attention kernel's l tile, chosen by Chimera's data-movement model (kinds/attention/plan.py): the closed form
exec.c runs is the model's least-DV choice; blocks of keys merged as the online softmax does (or, in a plain GEMM
chain, added up) give onnxruntime's answers on drawn shapes, masks and rows masked everywhere; perturbing the
model's cache capacities changes the kernel that is built."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from attention_models import attention_model, feeds_for
from hypothesis import given, settings
from hypothesis import strategies as st
from kind_harness import fuse_kind
from test_gemm_chain import chain_model

from onnxopt.annotate import tile_tree
from onnxopt.codegen.target import host_target
from onnxopt.hardware.machine_model import Machine, MemoryLevel
from onnxopt.kinds.attention import KIND, plan
from onnxopt.kinds.attention.lower import MR
from onnxopt.timing import make_session


def _run(model, tmp_path, key_floats, name, feeds=None, min_tasks=1):
    """The kernel with this capacity (a task a head where `min_tasks` is 1: all its rows reuse a key block)."""
    model = onnx.shape_inference.infer_shapes(model)
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path, name, params=lambda p: dataclasses.replace(
        p, key_floats=key_floats, min_tasks=min_tasks))
    feeds = feeds or feeds_for(model)
    want = make_session(model, 1, optimization="none").run(None, feeds)[0]
    got = make_session(fused, 2, library=lib).run(None, feeds)[0]
    alone = make_session(fused, 1).run(None, feeds)[0]  # the function fallback, without the library
    for out in (got, alone):
        np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-5 * max(1.0, float(np.nanmax(np.abs(want)))))
        assert np.array_equal(np.isnan(out), np.isnan(want))
    return got


def _panel():
    return host_target().float32_lanes * 2  # the kernel's column block at the default vectors a row


def test_the_closed_form_is_the_models_least_movement():
    """key_block (exec.c's rule) moves as little as the best l tile of the model's DV over every whole-panel
    candidate, on a grid of shapes, capacities and panel widths."""
    for L in (8, 33, 100, 257, 512, 1000, 4096):
        for d in (16, 64, 80):
            for rows in (1, MR, MR + 1, 48, 512):
                for capacity in (2000, 20_000, 131_072):
                    for block in (16, 32, 64):
                        M = 3 * rows
                        rule = plan.key_block(L, d, d, rows, capacity, block)
                        best = plan.model_key_block(M, L, d, d, rows, capacity, block)
                        assert plan.key_block_moved(M, L, d, d, rows, rule, capacity) == \
                            plan.key_block_moved(M, L, d, d, rows, best, capacity), (L, d, rows, capacity, block)


def test_whole_rows_where_they_fit_or_nothing_is_reused():
    assert plan.key_block(512, 64, 64, 48, 512 * (128 + MR), 32) == 512  # fits
    assert plan.key_block(4096, 64, 64, MR, 10_000, 32) == 4096  # one block of rows: nothing to reuse
    assert plan.key_block(4096, 64, 64, 48, 100, 32) == 4096  # not even one panel fits
    tl = plan.key_block(4096, 64, 64, 48, 131_072, 32)
    assert tl % 32 == 0 and tl * (128 + MR) <= 131_072 and tl < 4096


@settings(max_examples=12, deadline=None)
@given(form=st.sampled_from(["sdpa", "bert"]), mask=st.sampled_from(["none", "add", "causal", "select", "fill"]),
       guard=st.booleans(), h=st.integers(1, 3), m=st.integers(MR + 1, 70), lq=st.integers(2, 300),
       d=st.sampled_from([16, 64, 80]), panels=st.integers(1, 3))
def test_key_blocks_match_onnxruntime(tmp_path_factory, form, mask, guard, h, m, lq, d, panels):
    """A capacity of `panels` whole panels a block: several blocks a row wherever lq is longer."""
    if mask == "causal":
        lq = max(lq, m)
    model = attention_model(form, 1, h, m, lq, d, mask, guard)
    _run(model, tmp_path_factory.mktemp("k"), panels * _panel() * (2 * d + MR), "kb.so")


def test_rows_masked_in_some_blocks_and_everywhere(tmp_path):
    """Two tasks a head (12 rows and 3, the panels packed once, shared). Row 0 masked everywhere (zeros with the
    guard, NaN without); row 1 masked in the first block only, row 2 in all but the first: a block masked for a row
    adds nothing, and the first unmasked one starts it."""
    W = _panel()
    for guard in (True, False):
        model = attention_model("bert", 1, 2, 15, 3 * W + 5, 16, "add", guard)
        model.graph.input[3].type.tensor_type.shape.dim[2].dim_value = 15  # a mask a query row
        feeds = feeds_for(model)
        feeds["mask"] = np.zeros((1, 1, 15, 3 * W + 5), np.float32)
        feeds["mask"][0, 0, 0, :] = -np.inf
        feeds["mask"][0, 0, 1, :W] = -np.inf
        feeds["mask"][0, 0, 2, W:] = -np.inf
        got = _run(model, tmp_path, W * (32 + MR), f"g{guard}.so", feeds, min_tasks=4)
        assert np.all(got[0, :, 0] == 0) if guard else np.all(np.isnan(got[0, :, 0]))
        assert not np.isnan(got[0, :, 1:]).any()


@pytest.mark.parametrize("middle", [None, "relu"])
def test_plain_chains_add_their_blocks(tmp_path, middle):
    _run(chain_model([2], 40, 16, 200, 24, middle), tmp_path, _panel() * (16 + 24 + MR), f"{middle}.so")


def test_the_blocks_run_where_the_model_says(tmp_path):
    """Blocks sum in another order than whole rows: where key_block says whole rows, the kernel's answer is
    bit-for-bit the whole-row kernel's; where it says blocks, it is not."""
    W, d, m, lq = _panel(), 16, 48, 4 * _panel()
    model = attention_model("sdpa", 1, 2, m, lq, d, "none", False)
    whole = _run(model, tmp_path, -1, "whole.so")
    roomy = lq * (2 * d + MR)
    assert plan.key_block(lq, d, d, m, roomy, W) == lq
    assert np.array_equal(_run(model, tmp_path, roomy, "roomy.so"), whole)
    tight = W * (2 * d + MR)
    assert plan.key_block(lq, d, d, m, tight, W) == W
    assert not np.array_equal(_run(model, tmp_path, tight, "tight.so"), whole)


def _machine(l2_bytes: int, l3_gbs: float):
    """A machine model of 2 cores at 200 GFLOP/s float32 with these L2 (a core's) and L3 bandwidth."""
    g = 1e9
    return Machine("perturbed", 2, ["avx2"], {"float32": 200 * g}, [
        MemoryLevel("L1", 64 << 10, 400 * g), MemoryLevel("L2", 2 * l2_bytes, 200 * g),
        MemoryLevel("L3", 32 << 20, l3_gbs * g), MemoryLevel("DRAM", None, 40 * g)])


def test_a_written_model_with_key_blocks_runs_its_kernel_in_a_fresh_process(tmp_path):
    """The blocked kernel as a user runs it: the written model and its library through the public loader in a new
    process, the kernel's calls counted there; and the function bodies alone, without the library."""
    from fresh_process import assert_written_model_runs

    W, d = _panel(), 32
    model = onnx.shape_inference.infer_shapes(attention_model("sdpa", 1, 2, 40, 5 * W + 3, d, "add", True))
    src = tmp_path / "attention.onnx"
    onnx.save(model, src)
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path, "blocks.so", params=lambda p: dataclasses.replace(
        p, key_floats=W * (2 * d + MR), min_tasks=1))
    assert plan.key_block(5 * W + 3, d, d, 40, W * (2 * d + MR), W) == W  # six blocks a row
    written = tmp_path / "fused.onnx"
    onnx.save(fused, written)
    assert_written_model_runs(src, written, feeds_for(model), region.op_type, tmp_path, rtol=2e-4, atol=2e-5)


def test_perturbed_capacities_change_the_kernel(tmp_path):
    """Where L3 cannot feed whole rows (balance 200 / 40 = 5 flops a byte, above MR / 2), the capacity is a share
    of a core's L2: with 4 MiB a 2048-key head fits whole, with 128 KiB it is cut into blocks. Where it can (200 /
    150), whole rows always. The built kernels differ in their descriptors and op types."""
    model = onnx.shape_inference.infer_shapes(attention_model("sdpa", 1, 1, 64, 2048, 64, "none", False))
    built = {}
    for l2, l3_gbs in ((4 << 20, 40.0), (128 << 10, 40.0), (128 << 10, 150.0)):
        capacity = plan.key_floats(MR, {"L2": l2}, _machine(l2, l3_gbs))
        region = KIND.find(model, set(), [])[0]
        point = dict(KIND.space(region, host_target()).default(), key_floats=capacity or -1)
        region.params = dataclasses.replace(region.params, key_floats=point["key_floats"])
        region.compute_op_type(host_target().name)
        _, desc, _ = KIND.build(region, host_target())
        built[l2, l3_gbs] = (region.op_type, desc.key_floats,
                             plan.key_block(2048, 64, 64, 64, desc.key_floats, desc.block))
    assert built[4 << 20, 40.0][2] == 2048 and built[128 << 10, 40.0][2] < 2048
    assert built[128 << 10, 150.0][1] == 0 and built[128 << 10, 150.0][2] == 2048
    assert len({b[0] for b in built.values()}) == 3 and built[4 << 20, 40.0][1] > built[128 << 10, 40.0][1]


def test_the_capacity_follows_the_l3_balance_and_the_l2():
    assert plan.key_floats(MR, {"L2": 1 << 20}, _machine(1 << 20, 40.0)) == int(plan.KEY_SHARE * (1 << 20)) // 4
    assert plan.key_floats(MR, {"L2": 1 << 20}, _machine(1 << 20, 200 / (MR / 2))) == 0  # at the balance: whole
    assert plan.l3_balance(_machine(1 << 20, 40.0)) == pytest.approx(5.0)


def test_tileflows_tree_of_the_kernel():
    """TileFlow's tree of one task (plan.kernel_tree): whole rows whose K^T and V outgrow the L2 sit at L3 and stream
    them to the micro-kernel again for every block of MR rows; key blocks that fit keep them in the L2 (moved in
    once a task) and merge each block's output rows into the task's."""
    rows, L, d, dv, l2 = 8 * MR, 1024, 64, 32, 64 * 1024  # 1024 keys x (64 + 32 + 6) floats do not fit, 256 do
    whole, ext = plan.kernel_tree(rows, L, d, dv, L, l2)
    assert tile_tree.illegal(whole) is None and whole.level == "L3"
    an = tile_tree.analyze(whole, ext, outer="L3")
    scores = next(r for r in an.tiles if r.tile.op == "scores")
    assert scores.parent_level == "L3" and scores.loads == 8 * (MR * d + d * L)  # its Q rows and all of K^T, 8 times
    blocks, ext = plan.kernel_tree(rows, L, d, dv, 256, l2)
    assert tile_tree.illegal(blocks) is None and blocks.level == "L2" and ext["lb"] == 4
    an = tile_tree.analyze(blocks, ext, outer="L3")
    task, merge = an.tiles[0], next(r for r in an.tiles if r.tile.op == "merge")
    assert task.loads == L * (d + dv) + rows * (d + dv) and task.stores == rows * dv  # once a task
    assert next(r for r in an.tiles if r.tile.op == "scores").loads == 4 * 8 * MR * d + 8 * L * d  # from the L2
    assert merge.loads == 4 * 2 * rows * dv and merge.stores == 4 * rows * dv  # a block's rows and the task's


@pytest.mark.parametrize("l3_gbs", [40.0, 150.0])
def test_tileflows_latency_agrees_with_the_capacitys_gate(l3_gbs):
    """Where the L3 cannot feed whole rows (40 GB/s: 5 flops a byte against the micro-kernel's 3), TileFlow's latency
    puts the capacity's key blocks ahead of whole rows; where it can (150 GB/s) whole rows are at least as fast: the
    verdict of capacity.py's balance gate, from the tree's movement and the machine model's bandwidths."""
    machine = _machine(1 << 20, l3_gbs)
    heads, M, L, d = 1, 1024, 2048, 64
    capacity = plan.key_floats(MR, {"L2": 1 << 20}, machine)
    share = int(plan.KEY_SHARE * (1 << 20)) // 4
    tl = plan.key_block(L, d, d, plan.task_rows(M, heads), share, 32)
    assert tl < L
    whole = plan.tileflow_seconds(machine, heads, M, L, d, d, L)
    blocked = plan.tileflow_seconds(machine, heads, M, L, d, d, tl)
    flops = 4 * M * L * d
    assert min(whole, blocked) >= flops / 200e9  # never faster than the peak
    assert (whole <= blocked) == (capacity == 0)
