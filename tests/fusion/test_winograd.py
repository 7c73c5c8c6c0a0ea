"""Winograd convolutions (fusion/winograd.py, codegen/compute/winograd.py, glue winograd_exec.c, the measured
choice in tune/winograd_search.py): the transform matrices, the weight packing and the fallback's way back, which
convolutions qualify, and the kernels' answers against onnxruntime with the library and through the fallbacks."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_layout import Chain, check_answers, needs_vectors, reference, run_fused

import onnxopt
from onnxopt.errors import UsageError
from onnxopt.fusion import winograd
from onnxopt.fusion.afusion.siso import conv_part_reason

# Every (kernel, tile length) offered, and the 1-D transforms (m, r) they are built from.
OFFERED = [(k, m) for k, ms in winograd.SIZES_BY_KERNEL.items() for m in ms]
AXES = sorted({(m, r) for (kh, kw), m in OFFERED for r in (kh, kw) if r > 1})
SQUARE = winograd.sizes((3, 3))


# ---- the matrices ----
@pytest.mark.parametrize("m, r", AXES)
def test_matrices_compute_the_correlation_exactly(m, r):
    """A^T [(G g) . (B^T d)] is the 1-D correlation of d (m + r - 1 values) with g (r taps), in exact arithmetic."""
    at, g, bt = winograd.matrices(m, r)
    n = m + r - 1
    assert (len(at), len(at[0]), len(g), len(g[0]), len(bt)) == (m, n, n, r, n)
    rng = np.random.default_rng(m * 10 + r)
    for _ in range(5):
        d = [Fraction(int(x)) for x in rng.integers(-9, 10, n)]
        w = [Fraction(int(x)) for x in rng.integers(-9, 10, r)]
        gw = [sum(g[i][k] * w[k] for k in range(r)) for i in range(n)]
        bd = [sum(bt[i][k] * d[k] for k in range(n)) for i in range(n)]
        y = [sum(at[q][i] * gw[i] * bd[i] for i in range(n)) for q in range(m)]
        assert y == [sum(d[q + k] * w[k] for k in range(r)) for q in range(m)]


def test_the_identity_along_an_axis_the_kernel_does_not_span():
    assert winograd.matrices(1, 1) == (((1,),), ((1,),), ((1,),))
    assert winograd.tile_shape((1, 7), 4) == (1, 4) and winograd.positions((1, 7), 4) == (1, 10)
    assert winograd.tile_shape((7, 1), 2) == (2, 1) and winograd.positions((7, 1), 2) == (8, 1)
    assert winograd.label((5, 5), 2) == "F(2x2,5x5)"


def test_unknown_tile_size_is_refused():
    with pytest.raises(ValueError, match="supported"):
        winograd.matrices(3)  # n = 5: no interpolation points
    with pytest.raises(ValueError, match="tile sizes for this kernel: \\(2,\\)"):
        winograd.transform_weights(np.zeros((2, 2, 5, 5), np.float32), 4)


@pytest.mark.parametrize("kernel, m", OFFERED)
def test_packed_weights_layout_and_the_way_back(kernel, m):
    """[groups][nh * nw][IC][NI * L]: position k of output channel o, input channel c is G_h w G_w^T at
    (k // nw, k % nw); the fallback's left inverses give the weights back."""
    rng = np.random.default_rng(1)
    oc, ic, lanes, ni = 37, 5, 16, 2
    kh, kw = kernel
    w = rng.standard_normal((oc, ic, kh, kw)).astype(np.float32)
    packed = winograd.pack_winograd_weights(w, m, lanes, ni)
    nh, nw = winograd.positions(kernel, m)
    mh, mw = winograd.tile_shape(kernel, m)
    assert packed.shape == (-(-oc // (ni * lanes)), nh * nw, ic, ni * lanes)
    (_, gh, _), (_, gw, _) = (winograd.float_matrices(mh, kh), winograd.float_matrices(mw, kw))
    o, c, k = 33, 4, nh * nw - 2
    want = (gh @ w[o, c].astype(np.float64) @ gw.T)[k // nw, k % nw]
    assert packed[o // (ni * lanes), k, c, o % (ni * lanes)] == pytest.approx(want, rel=1e-6, abs=1e-7)
    assert not packed[1, :, :, oc - ni * lanes:].any()  # padding output channels are zero
    ph, pw = winograd.left_inverse(mh, kh), winograd.left_inverse(mw, kw)
    u = winograd.transform_weights(w, m).astype(np.float64)  # [nh, nw, oc, ic]
    back = np.einsum("ai,ijoc,bj->ocab", ph, u, pw)
    np.testing.assert_allclose(back, w, atol=1e-5)


def test_grouped_weights_are_each_groups_runs_in_turn():
    """A grouped convolution's packed weights are each group's own packing, one after the other: its runs of NI
    output vectors, its output channels padded on their own."""
    rng = np.random.default_rng(2)
    groups, ocg, icg, lanes, ni = 3, 40, 16, 16, 2
    w = rng.standard_normal((groups * ocg, icg, 3, 3)).astype(np.float32)
    packed = winograd.pack_winograd_weights(w, 2, lanes, ni, groups)
    runs = -(-ocg // (ni * lanes))
    assert packed.shape == (groups * runs, 16, icg, ni * lanes)
    for g in range(groups):
        np.testing.assert_array_equal(packed[g * runs:(g + 1) * runs],
                                      winograd.pack_winograd_weights(w[g * ocg:(g + 1) * ocg], 2, lanes, ni))


# ---- what qualifies ----
def _blocked_regions(model, tmp_path, mode="4"):
    res = onnxopt.optimize(model, str(tmp_path / "f.onnx"), plan="compute-blocked", measure=False, winograd=mode)
    return res


@needs_vectors
def test_applies_to_stride_1_kernels_that_offer_the_tile(tmp_path):
    """--winograd 4: the 3x3 and the 1x7 layers (F(1x4, 1x7)); not the strided, 1x1, dilated or grouped ones, nor
    the 5x5 one, whose only tile length is 2."""
    ch = Chain(16, 12, 12)
    a = ch.conv("x", "a", 32, k=3)
    b = ch.conv(a, "b", 32, k=3, s=2)
    c = ch.conv(b, "c", 32, k=1, p=0)
    d = ch.conv(c, "d", 32, k=3, d=2, p=2)
    e = ch.conv(d, "e", 32, k=3, group=2)
    f = ch.conv(e, "f", 32, k=1, kw=7, pads=[0, 3, 0, 3])
    g = ch.conv(f, "g", 32, k=5, p=2)
    model = ch.model([g])
    res = _blocked_regions(model, tmp_path)
    wino = {i.name.split("__")[0] for i in res.model.graph.initializer if "__wino" in i.name}
    assert wino == {"a_pre", "f_pre"}, wino
    check_answers(res, model, ch.feeds)


def test_reasons():
    from onnxopt.fusion.compute import ComputeParams
    from onnxopt.fusion.params import ComputeAttrs
    from onnxopt.fusion.region import Region

    def region(**attrs):
        a = {"kernel": [3, 3], "strides": [1, 1], "dilations": [1, 1], "groups": 1, "out_blocked": 1}
        a.update(attrs)
        c = ComputeParams(op="conv", attrs=ComputeAttrs(**a), weights=np.zeros((4, 4, 3, 3), np.float32))
        return Region(label="Conv", nodes=[], inputs=["x", "w"], outputs=["y"], program=None, shape=[1, 4, 4, 4],
                      params=c)

    assert winograd.applies(region()) is None
    assert winograd.applies(region(kernel=[1, 7])) is None
    assert "7x7" in winograd.applies(region(kernel=[7, 7]))
    assert "strided" in winograd.applies(region(strides=[2, 2]))
    assert "grouped" in winograd.applies(region(groups=2))
    # grouped: on channel vectors, NCHW in and out, when each group's input and output channels are whole vectors
    on_vectors = {"out_blocked": 0, "channel_vectors": 1, "block": 16, "groups": 2, "oc": 64}
    assert winograd.applies(region(**on_vectors, ic_g=16)) is None
    assert "grouped" in winograd.applies(region(**on_vectors, ic_g=8))
    assert "grouped" in winograd.applies(region(**dict(on_vectors, oc=48), ic_g=16))  # 24 outputs a group
    assert "grouped" in winograd.applies(region(**dict(on_vectors, oc=32, groups=32), ic_g=1))  # depthwise
    assert "blocked" in winograd.applies(region(out_blocked=0))
    # --precision: weights in bf16 (or fp16 for AMX-FP16) pairs stay on their kernel; float32 kernels with float16
    # storage keep the Winograd kernel (test_precision_conv_fp16)
    assert "pairs" in winograd.applies(region(b_dtype="bfloat16"))
    assert "pairs" in winograd.applies(region(b_dtype="float16", b_pairs=1))
    assert winograd.applies(region(stored_dtype="float16")) is None
    # an AFUSION kernel cannot hold a Winograd convolution as a part
    assert "Winograd" in conv_part_reason(region(winograd=4), "first")


# ---- answers ----
@needs_vectors
@pytest.mark.parametrize("m", SQUARE)
def test_resnet_block_matches_onnxruntime(tmp_path, m):
    """1x1 -> 3x3 -> 3x3 with a residual Add + Relu in the last one's epilogue, an NCHW input (reordered inside the
    kernel) and an NCHW output (a chain's exit), batch 2, an image that is not a multiple of the tile."""
    ch = Chain(20, 13, 11, batch=2)
    a = ch.conv("x", "a", 40, k=1, p=0)
    b = ch.conv(a, "b", 40, k=3)
    c = ch.conv(b, "c", 40, k=3, act=None)
    d = ch.add(c, a, "d")
    e = ch.conv(d, "e", 24, k=3)
    model = ch.model([e])
    res = _blocked_regions(model, tmp_path, str(m))
    assert sum("__wino" in i.name for i in res.model.graph.initializer) == 3
    check_answers(res, model, ch.feeds)


@needs_vectors
@pytest.mark.parametrize("c_in, oc, size, batch", [(16, 24, 40, 1), (16, 16, 9, 3), (192, 80, 8, 1)])
def test_both_task_forms_match_onnxruntime(tmp_path, c_in, oc, size, batch):
    """winograd_exec.c runs a convolution in one phase (each task transforms its own tiles' inputs) when blocks of
    tiles give the pool enough tasks: a large image, or small layers run inline; and in two phases (all inputs
    transformed first, tasks over output groups too) when few tiles hold many channels. These shapes take each:
    40x40 one phase over 8+ parallel tasks, 9x9 batch 3 one phase, 8x8 with 192 channels two phases."""
    ch = Chain(c_in, size, size, batch=batch, seed=c_in + oc)
    a = ch.conv("x", "a", c_in, k=1, p=0)
    b = ch.conv(a, "b", oc, k=3)
    model = ch.model([ch.conv(b, "c", 16, k=1, p=0)])
    for m in SQUARE:
        res = _blocked_regions(model, tmp_path, str(m))
        assert sum("__wino" in i.name for i in res.model.graph.initializer) == 1
        check_answers(res, model, ch.feeds)


@needs_vectors
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c_in=st.integers(1, 40), oc=st.integers(1, 40), h=st.integers(1, 14), w=st.integers(1, 14),
       pads=st.tuples(*[st.integers(0, 3)] * 4), batch=st.sampled_from([1, 3]), offered=st.sampled_from(OFFERED),
       act=st.sampled_from([None, "Relu", "Sigmoid"]))
def test_drawn_convolutions_match_onnxruntime(tmp_path, c_in, oc, h, w, pads, batch, offered, act):
    """Any kernel and tile length offered, channel counts (padding lanes), image sizes (partial tiles, images smaller
    than a tile), asymmetric pads, batch, and epilogues: Winograd kernels give onnxruntime's answers."""
    (kh, kw), m = offered
    top, left, bottom, right = pads
    if h + top + bottom < kh or w + left + right < kw:
        return
    ch = Chain(c_in, h, w, batch=batch, seed=c_in * 100 + oc)
    a = ch.conv("x", "a", oc, k=kh, kw=kw, pads=[top, left, bottom, right], act=act)
    b = ch.conv(a, "b", 16, k=1, p=0)
    model = ch.model([b])
    res = _blocked_regions(model, tmp_path, str(m))
    assert any("__wino" in i.name for i in res.model.graph.initializer)
    check_answers(res, model, ch.feeds)


@needs_vectors
def test_error_stays_within_the_bound(tmp_path):
    """Many input channels, as deep in a network: the kernel's error against onnxruntime, as a fraction of the
    output's largest magnitude, stays under the bound the kernel check allows."""
    ch = Chain(256, 14, 14, seed=3)
    p = ch.conv("x", "p", 256, k=1, p=0, act=None)
    model = ch.model([ch.conv(p, "a", 64, k=3, act=None)])  # a chain's exit: blocked input, NCHW output
    want = reference(model, ch.feeds)[0]
    for m in SQUARE:
        res = onnxopt.optimize(model, str(tmp_path / f"f{m}.onnx"), plan="compute-blocked", measure=False,
                               winograd=str(m))
        got = run_fused(res, ch.feeds)[0]
        err = float(np.abs(got - want).max() / np.abs(want).max())
        assert err < winograd.error_bound((3, 3), m), (m, err)


@needs_vectors
@pytest.mark.parametrize("kernel", [k for k in winograd.SIZES_BY_KERNEL if k != (3, 3)])
def test_other_kernels_stay_within_their_bounds_and_fall_back(tmp_path, kernel):
    """5x5, 1x7, 7x1, 1x3, 3x1 with 192 input channels, an image that is not a multiple of the tile, batch 2, each
    tile length: within the bound against onnxruntime, and the function fallback (without the library) rebuilds
    the kernel's weights."""
    kh, kw = kernel
    ch = Chain(192, 17, 13, batch=2, seed=kh * 10 + kw)
    p = ch.conv("x", "p", 192, k=1, p=0)
    model = ch.model([ch.conv(p, "a", 40, k=kh, kw=kw, pads=[kh // 2, kw // 2, kh // 2, kw // 2], act=None)])
    want = reference(model, ch.feeds)[0]
    for m in winograd.sizes(kernel):
        res = onnxopt.optimize(model, str(tmp_path / f"f{m}.onnx"), plan="compute-blocked", measure=False,
                               winograd=str(m))
        assert sum("__wino" in i.name for i in res.model.graph.initializer) == 1
        got = run_fused(res, ch.feeds)[0]
        err = float(np.abs(got - want).max() / np.abs(want).max())
        assert err < winograd.error_bound(kernel, m), (kernel, m, err)
        np.testing.assert_allclose(run_fused(res, ch.feeds, library=False)[0], want, rtol=1e-4, atol=1e-4)


@needs_vectors
def test_off_keeps_the_direct_kernel_and_auto_reports_its_choice(tmp_path):
    ch = Chain(64, 28, 28)
    a = ch.conv("x", "a", 64, k=1, p=0)
    b = ch.conv(a, "b", 64, k=3)
    c = ch.conv(b, "c", 64, k=1, p=0)
    model = ch.model([c])
    off = onnxopt.optimize(model, str(tmp_path / "off.onnx"), plan="compute-blocked", winograd="off",
                           cost_cache=False, threads=2)
    assert not any("__wino" in i.name for i in off.model.graph.initializer)
    assert "winograd" not in off.report
    auto = onnxopt.optimize(model, str(tmp_path / "auto.onnx"), plan="compute-blocked", cost_cache=False, threads=2)
    rep = auto.report["winograd"]
    # One 3x3 convolution was considered: a tile chosen, or the direct kernel kept (the search's measurement, or
    # the tuning budget, decides which; both are legal on any host).
    assert rep["searched"] <= 1 and sum(rep["chosen"].values()) + rep["direct"] == 1, rep
    chosen = [m for m in SQUARE if rep["chosen"][f"F({m}x{m},3x3)"]]
    written = any("__wino" in i.name for i in auto.model.graph.initializer)
    if written:  # a Winograd kernel is written only where the search chose it
        assert chosen, rep
    elif chosen:  # chosen, then the region lost to onnxruntime (its check or the whole model's): the report says so
        assert auto.report["rejected"] or auto.report.get("unchanged"), auto.report
    check_answers(auto, model, ch.feeds)


def test_unknown_mode_is_a_usage_error(tmp_path):
    ch = Chain(4, 5, 5)
    model = ch.model([ch.conv("x", "a", 4)])
    with pytest.raises(UsageError, match="winograd='3'"):
        onnxopt.optimize(model, str(tmp_path / "f.onnx"), winograd="3")


@needs_vectors
def test_fallback_weights_come_back_in_the_function_body(tmp_path):
    """Without the library the function body runs: its MatMuls with the left inverse rebuild the weights."""
    ch = Chain(8, 9, 9)
    a = ch.conv("x", "a", 24, k=3)
    model = ch.model([ch.conv(a, "b", 8, k=3)])
    res = _blocked_regions(model, tmp_path, "4")
    fn_ops = {nd.op_type for f in res.model.functions for nd in f.node}
    assert "MatMul" in fn_ops
    want = reference(model, ch.feeds)
    got = run_fused(res, ch.feeds, library=False)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


@needs_vectors
def test_the_winograd_choices_have_their_own_budget(tmp_path):
    """With no tuning time at all, the Winograd choice reports its own budget as spent and keeps the direct kernel
    (the register-tile search reports the tuning budget)."""
    ch = Chain(32, 14, 14)
    a = ch.conv("x", "a", 32, k=1, p=0)
    b = ch.conv(a, "b", 32, k=1, kw=7, pads=[0, 3, 0, 3])
    model = ch.model([ch.conv(b, "c", 32, k=1, p=0)])
    res = onnxopt.optimize(model, str(tmp_path / "f.onnx"), plan="compute-blocked", tune_budget=0, cost_cache=False,
                           min_speedup=0.0)  # emitted whatever the timing: the report keeps emitted regions only
    wins = [r["winograd"] for r in res.report["regions"] if "winograd" in r]
    assert [w["kernel"] for w in wins] == [[1, 7]]
    assert wins[0]["chosen"] == 0 and "Winograd budget (0 s)" in wins[0]["skipped"]
    assert not any("__wino" in i.name for i in res.model.graph.initializer)
    check_answers(res, model, ch.feeds)


def test_weights_cold_flush_counts_the_weights_from_their_dims():
    """Weights over the last-level cache: flush twice its size before each run; weights that fit: no flush. The
    bytes come from the dims, so an initializer whose data is external (not loaded) counts too."""
    from onnx import TensorProto, helper

    from onnxopt.tune.winograd_search import weights_cold_flush

    loaded = helper.make_tensor("w", TensorProto.FLOAT, [64, 64, 3, 3], np.zeros(64 * 64 * 9, np.float32))
    external = TensorProto(name="e", data_type=TensorProto.FLOAT16, dims=[1000, 1000],
                           data_location=TensorProto.EXTERNAL)
    g = helper.make_graph([], "g", [], [], initializer=[loaded, external])
    model = helper.make_model(g)
    total = 64 * 64 * 9 * 4 + 1000 * 1000 * 2
    assert weights_cold_flush(model, total - 1) == 2 * (total - 1)
    assert weights_cold_flush(model, total) == 0
    assert weights_cold_flush(onnx.ModelProto(), 1) == 0


@needs_vectors
def test_a_model_larger_than_the_cache_chooses_with_cold_weights(tmp_path, monkeypatch):
    """A machine whose last-level cache is smaller than the model's weights: the Winograd candidates are timed
    with the caches flushed before every run, the report says so, and the choice is cached apart from a warm one
    (the same cache file answers the cold search the second time and not the warm search)."""
    from onnxopt.hardware import measure

    ch = Chain(32, 14, 14)
    a = ch.conv("x", "a", 32, k=1, p=0)
    model = ch.model([ch.conv(a, "b", 32, k=3)])
    cache = str(tmp_path / "costs.sqlite")
    real = measure.cache_levels

    def run(tag, llc):
        if llc is None:
            monkeypatch.setattr(measure, "cache_levels", real)
        else:
            monkeypatch.setattr(measure, "cache_levels", lambda cpus=None: [measure.CacheLevel(3, llc, 1, 2)])
        res = onnxopt.optimize(model, str(tmp_path / f"{tag}.onnx"), plan="compute-blocked", cost_cache=cache,
                               threads=2, min_speedup=0.0)
        wins = [r["winograd"] for r in res.report["regions"] if "winograd" in r]
        assert len(wins) == 1
        return res, wins[0]

    res, win = run("cold", 16 << 10)  # the 3x3 layer's weights alone are 36 KiB
    assert res.report["winograd"]["weights"] == "cold"
    assert win["cost_cache"] == "miss" and all(c.get("seconds") for c in win["candidates"])
    check_answers(res, model, ch.feeds)
    assert run("cold_again", 16 << 10)[1]["cost_cache"] == "hit"
    res, win = run("warm", None)
    assert res.report["winograd"]["weights"] == "warm" and win["cost_cache"] == "miss"


# ---- a lone NCHW convolution (no blocked tensor around it) ----
def _lone_conv(c_in, oc, size, seed=0):
    ch = Chain(c_in, size, size, seed=seed)
    return ch, ch.model([ch.conv("x", "a", oc, k=3, act=None)])


def test_a_lone_convolution_takes_tiles_only_on_channel_vectors():
    from onnxopt.fusion.compute import ComputeParams
    from onnxopt.fusion.params import ComputeAttrs
    from onnxopt.fusion.region import Region

    def region(**attrs):
        a = {"kernel": [3, 3], "strides": [1, 1], "dilations": [1, 1], "groups": 1}
        a.update(attrs)
        c = ComputeParams(op="conv", attrs=ComputeAttrs(**a), weights=np.zeros((4, 4, 3, 3), np.float32))
        return Region(label="Conv", nodes=[], inputs=["x", "w"], outputs=["y"], program=None, shape=[1, 4, 4, 4],
                      params=c)

    assert winograd.applies(region()) == winograd.NOT_ON_CHANNEL_VECTORS
    assert winograd.applies_on_channel_vectors(region(), 16) and winograd.applies_on_channel_vectors(region(), 8)
    assert not winograd.applies_on_channel_vectors(region(), 4)  # SSE: no channel-vector kernel
    assert not winograd.applies_on_channel_vectors(region(strides=[2, 2]), 16)
    assert not winograd.applies_on_channel_vectors(region(groups=2), 16)
    # each group's channels whole vectors of the target's lanes, never depthwise
    grouped = {"groups": 2, "ic_g": 16, "oc": 64}
    assert winograd.applies_on_channel_vectors(region(**grouped), 16)
    assert winograd.applies_on_channel_vectors(region(**dict(grouped, ic_g=8)), 8)
    assert not winograd.applies_on_channel_vectors(region(**dict(grouped, ic_g=8)), 16)
    assert not winograd.applies_on_channel_vectors(region(groups=16, ic_g=1, oc=16), 16)
    assert not winograd.applies_on_channel_vectors(region(out_blocked=1), 16)  # blocked: applies() itself
    assert not winograd.applies_on_channel_vectors(region(b_dtype="bfloat16"), 16)


@needs_vectors
@pytest.mark.parametrize("m", SQUARE)
def test_forced_tiles_on_a_lone_nchw_convolution(tmp_path, m):
    """--winograd M reaches a convolution between the graph's input and output (the blocked plan has nothing to
    block there): its tiles run on the channel-vector kernel, NCHW in and out, with the library, through the
    function body alone, and in a fresh process through the public loader, where its kernel ran."""
    ch, model = _lone_conv(24, 40, 13)
    _forced_tiles_run_everywhere(tmp_path, ch, model, m)


def _forced_tiles_run_everywhere(tmp_path, ch, model, m):
    """--winograd m: the model's convolution written as F(m) tiles gives onnxruntime's answers with the library and
    through the function body, and in a fresh process through the public loader, where its kernel ran."""
    from fresh_process import assert_written_model_runs

    res = onnxopt.optimize(model, str(tmp_path / "f.onnx"), measure=False, winograd=str(m))
    assert any(i.name.endswith(f"__wino{m}") for i in res.model.graph.initializer)
    check_answers(res, model, ch.feeds)
    src = tmp_path / "src.onnx"
    onnx.save(model, str(src))
    op = next(nd.op_type for nd in res.model.graph.node if nd.domain == "onnxopt")
    assert_written_model_runs(src, tmp_path / "f.onnx", ch.feeds, op, tmp_path)


@needs_vectors
def test_auto_times_a_lone_nchw_convolution_against_its_tiles(tmp_path):
    """By default the NCHW kernel and the channel-vector kernel's Winograd tiles are timed against each other; the
    report keeps every candidate's time and says the convolution was NCHW; a tile is written only if chosen."""
    ch, model = _lone_conv(64, 64, 28, seed=1)
    res = onnxopt.optimize(model, str(tmp_path / "f.onnx"), cost_cache=False, threads=2, min_speedup=0.0)
    wins = [r["winograd"] for r in res.report["regions"] if "winograd" in r]
    assert len(wins) == 1 and wins[0]["nchw"], res.report["regions"]
    assert [c["winograd"] for c in wins[0]["candidates"]] == [0, *SQUARE]
    assert all(c.get("seconds") for c in wins[0]["candidates"]), wins[0]
    written = {i.name.rsplit("__wino", 1)[1] for i in res.model.graph.initializer if "__wino" in i.name}
    assert written == ({str(wins[0]["chosen"])} if wins[0]["chosen"] else set())
    check_answers(res, model, ch.feeds)


# ---- grouped convolutions (each group's channels whole vectors), NCHW in and out ----
def _grouped_conv(c_in, oc, groups, size, kernel=(3, 3), batch=1, pads=None, act=None, seed=0):
    ch = Chain(c_in, size[0], size[1], batch=batch, seed=seed)
    kh, kw = kernel
    pads = pads if pads is not None else [kh // 2, kw // 2, kh // 2, kw // 2]
    return ch, ch.model([ch.conv("x", "a", oc, k=kh, kw=kw, pads=pads, group=groups, act=act)])


@needs_vectors
@pytest.mark.parametrize("c_in, oc, groups, size, batch", [(96, 256, 2, 27, 1), (128, 256, 4, 7, 2)])
def test_grouped_convolution_in_a_fresh_process(tmp_path, c_in, oc, groups, size, batch):
    """AlexNet's grouped 5x5 (96 -> 256 in two groups at 27x27, one phase) and a 7x7 image with four groups at batch 2
    (two phases) as F(2x2) tiles: onnxruntime's answers with the library and through the function body, and in a
    fresh process through the public loader, where the kernel ran."""
    kernel = (5, 5) if size == 27 else (3, 3)
    ch, model = _grouped_conv(c_in, oc, groups, (size, size), kernel, batch=batch, act="Relu", seed=groups)
    _forced_tiles_run_everywhere(tmp_path, ch, model, 2)


@needs_vectors
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.integers(2, 4), icg=st.sampled_from([16, 32]), ocg=st.sampled_from([16, 32, 48]),
       h=st.integers(2, 16), w=st.integers(2, 16), pads=st.tuples(*[st.integers(0, 2)] * 4),
       batch=st.sampled_from([1, 2]), offered=st.sampled_from(OFFERED), act=st.sampled_from([None, "Relu"]))
def test_drawn_grouped_convolutions_match_onnxruntime(tmp_path, groups, icg, ocg, h, w, pads, batch, offered, act):
    """Groups of whole vectors (16 channels: every channel-vector target's lanes divide them), any kernel and tile
    offered, partial tiles, asymmetric pads, batch: the grouped Winograd kernel gives onnxruntime's answers, and a
    grouped convolution whose groups are not whole vectors keeps its direct kernel."""
    (kh, kw), m = offered
    top, left, bottom, right = pads
    if h + top + bottom < kh or w + left + right < kw:
        return
    ch, model = _grouped_conv(groups * icg, groups * ocg, groups, (h, w), (kh, kw), batch, [top, left, bottom, right],
                              act, seed=groups * 100 + icg + ocg)
    res = onnxopt.optimize(model, str(tmp_path / "f.onnx"), measure=False, winograd=str(m))
    assert any(i.name.endswith(f"__wino{m}") for i in res.model.graph.initializer)
    check_answers(res, model, ch.feeds)
    ch, model = _grouped_conv(groups * 4, groups * ocg, groups, (h, w), (kh, kw), batch, [top, left, bottom, right])
    res = onnxopt.optimize(model, str(tmp_path / "g.onnx"), measure=False, winograd=str(m))
    assert not any("__wino" in i.name for i in res.model.graph.initializer)


@needs_vectors
@pytest.mark.parametrize("opset", [9, 17])
def test_tiles_at_an_old_opset(tmp_path, opset):
    """An opset-9 export (AlexNet's in the corpus is one) takes the tiles too: the function fallback recovers the
    weights with Reshape, Gather, Transpose and MatMul, which read the same at every opset from 5."""
    ch, model = _grouped_conv(32, 64, 2, (9, 9), (5, 5), act="Relu", seed=opset)
    model.opset_import[0].version = opset
    assert winograd.check_opset(model) is None
    res = onnxopt.optimize(model, str(tmp_path / "f.onnx"), measure=False, winograd="2")
    assert any(i.name.endswith("__wino2") for i in res.model.graph.initializer)
    check_answers(res, model, ch.feeds)
