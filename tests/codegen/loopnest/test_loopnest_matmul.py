"""Matmul under every primitive and their combinations: equal to numpy, and bit-identical to the default schedule
whenever the schedule keeps each element's summation order (split k outer-before-inner, spatial moves, vectors)."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loopnest_util import has_avx512, matmul, random_floats, run, run_kernel
from onnxopt.codegen import loopnest as ln

M, K, N = 10, 13, 37  # nothing divides nicely


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return random_floats(rng, M, K), random_floats(rng, K, N)


def _default_result(a, b):
    _, _, C, _ = matmul(M, K, N)
    return run(ln.Schedule(C), a, b)


def s_split_j_vectorize(s, k):
    i, j = s.axes
    jo, ji = s.split(j, 16)
    s.reorder(i, jo, k, ji)
    s.vectorize(ji)


def s_split_i_unroll(s, k):
    i, j = s.axes
    io, ii = s.split(i, 4)
    jo, ji = s.split(j, 16)
    s.reorder(io, jo, k, ii, ji)
    s.unroll(ii)
    s.vectorize(ji)


def s_split_k_keeps_order(s, k):
    _ko, ki = s.split(k, 4)
    s.unroll(ki)


def s_parallel_tiles(s, k):
    i, j = s.axes
    io, ii = s.split(i, 3)
    jo, ji = s.split(j, 8)
    s.reorder(io, jo, k, ii, ji)
    s.parallel(io)
    s.unroll(ii)
    s.vectorize(ji)


def s_fuse_then_split(s, k):
    i, j = s.axes
    f = s.fuse(i, j)
    fo, fi = s.split(f, 16)
    s.reorder(fo, k, fi)
    s.vectorize(fi)  # A[f // N, k] is not affine in fi: stays scalar


def s_reduction_outermost(s, k):
    i, j = s.axes
    s.reorder(k, i, j)
    s.vectorize(j)


def s_vectorize_reduce_axis(s, k):
    s.vectorize(k)  # a reduction along the loop: must stay scalar to keep the order


def s_split_larger_than_extent(s, k):
    i, j = s.axes
    jo, ji = s.split(j, 64)
    s.reorder(i, jo, k, ji)
    s.vectorize(ji)
    s.parallel(i)


EXACT_SCHEDULES = [s_split_j_vectorize, s_split_i_unroll, s_split_k_keeps_order, s_parallel_tiles, s_fuse_then_split,
                   s_reduction_outermost, s_vectorize_reduce_axis, s_split_larger_than_extent]


@pytest.mark.parametrize("apply", EXACT_SCHEDULES, ids=lambda f: f.__name__[2:])
def test_schedule_matches_numpy_and_default_bitwise(apply):
    a, b = _inputs()
    _, _, C, k = matmul(M, K, N)
    s = ln.Schedule(C)
    apply(s, k)
    got = run(s, a, b)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got, _default_result(a, b))


def test_reassociating_schedule_is_still_close():
    a, b = _inputs(1)
    _, _, C, k = matmul(M, K, N)
    s = ln.Schedule(C)
    ko, ki = s.split(k, 4)
    s.reorder(ki, ko)  # sums k in a different order: same value up to rounding
    np.testing.assert_allclose(run(s, a, b), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_fallbacks_are_reported():
    _, _, C, k = matmul(M, K, N)
    s = ln.Schedule(C)
    s_vectorize_reduce_axis(s, k)
    notes = ln.build(s).notes
    assert len(notes) == 1 and "reduction along k" in notes[0]

    _, _, C, k = matmul(M, K, N)
    s = ln.Schedule(C)
    s_split_j_vectorize(s, k)
    assert ln.build(s).notes == []


def test_vectorized_inner_loop_uses_16_wide_multiply_add():
    if not has_avx512():
        pytest.skip("the host has no avx512f: vectors are narrower than 16 floats")
    _, _, C, k = matmul(64, 32, 64)
    s = ln.Schedule(C)
    s_split_j_vectorize(s, k)
    kernel = ln.build(s)
    assert kernel.notes == []
    fma = "llvm.fma.v16f32" in kernel.ir
    mul_add = re.search(r"fmul <16 x float>", kernel.ir) and re.search(r"fadd <16 x float>", kernel.ir)
    assert fma or mul_add, "the update C += A*B is not a 16-lane vector operation"
    assert re.search(r"\bvmulps\b.*zmm|\bvfmadd\w*\b.*zmm", kernel.assembly()), "no zmm multiply in the code"


def test_unvectorized_schedule_has_no_vectors():
    # The structural test above must be able to fail: without vectorize there is no <16 x float> update.
    _, _, C, _ = matmul(64, 32, 64)
    assert "<16 x float>" not in ln.build(ln.Schedule(C)).ir


def test_parallel_range_function_computes_only_its_range():
    a, b = _inputs(2)
    _, _, C, k = matmul(M, K, N)
    s = ln.Schedule(C)
    s_parallel_tiles(s, k)  # io (extent 4, tiles of 3 rows) is the range loop
    kernel = ln.build(s)
    assert kernel.parallel and kernel.range_extent == 4
    want = _default_result(a, b)

    out = run_kernel(kernel, a, b, begin=0, end=2)  # rows 0..5
    np.testing.assert_array_equal(out[:6], want[:6])
    assert np.isnan(out[6:]).all(), "the first half wrote rows outside its range"

    run_kernel(kernel, a, b, begin=2, end=4, out=out)
    np.testing.assert_array_equal(out, want)


def test_range_is_clamped_and_empty_ranges_do_nothing():
    a, b = _inputs(3)
    _, _, C, k = matmul(M, K, N)
    s = ln.Schedule(C)
    s_split_j_vectorize(s, k)
    kernel = ln.build(s)
    assert not kernel.parallel and kernel.range_extent == M
    assert np.isnan(run_kernel(kernel, a, b, begin=4, end=4)).all()
    assert np.isnan(run_kernel(kernel, a, b, begin=7, end=3)).all()
    np.testing.assert_array_equal(run_kernel(kernel, a, b, begin=-5, end=1000), _default_result(a, b))


def test_reduction_outermost_runs_everything_in_one_range_iteration():
    _, _, C, k = matmul(M, K, N)
    s = ln.Schedule(C)
    s_reduction_outermost(s, k)
    kernel = ln.build(s)
    assert kernel.range_extent == 1
    a, b = _inputs(4)
    half = run_kernel(kernel, a, b, begin=1, end=1)
    assert np.isnan(half).all()
    np.testing.assert_array_equal(run_kernel(kernel, a, b), _default_result(a, b))


@st.composite
def matmul_schedules(draw):
    """A random schedule: splits, a permutation keeping k.outer before k.inner, then annotations."""
    m, k_extent, n = draw(st.integers(1, 12)), draw(st.integers(1, 12)), draw(st.integers(1, 40))
    factors = st.sampled_from([1, 2, 3, 4, 5, 8, 16, 32])
    plan = {"sizes": (m, k_extent, n), "split": [draw(st.booleans()) for _ in range(3)],
            "factors": [draw(factors) for _ in range(3)], "order_seed": draw(st.integers(0, 10**6)),
            "vectorize": draw(st.booleans()), "unroll": draw(st.booleans()), "parallel": draw(st.booleans()),
            "cut": draw(st.floats(0, 1))}
    return plan


def _apply_plan(plan):
    m, k_extent, n = plan["sizes"]
    _A, _B, C, k = matmul(m, k_extent, n)
    s = ln.Schedule(C)
    leaves = []
    for axis, do_split, factor in zip([*s.axes, k], plan["split"], plan["factors"]):
        leaves.append(list(s.split(axis, factor)) if do_split else [axis])
    # Shuffle whole groups, then flatten: each axis' outer stays before its inner, so k keeps its order.
    rng = np.random.default_rng(plan["order_seed"])
    order = [leaf for g in rng.permutation(len(leaves)) for leaf in leaves[g]]
    s.reorder(*order)
    innermost, outermost = order[-1], order[0]
    if plan["vectorize"]:
        s.vectorize(innermost)
    if plan["unroll"] and len(order) > 1 and order[-2].extent <= 32:
        s.unroll(order[-2])
    if plan["parallel"] and outermost.kind == "spatial" and outermost is not innermost:
        s.parallel(outermost)
    return s, (m, k_extent, n)


@settings(max_examples=30, deadline=None)
@given(plan=matmul_schedules())
def test_random_schedules_are_exact(plan):
    s, (m, k_extent, n) = _apply_plan(plan)
    rng = np.random.default_rng(0)
    a, b = random_floats(rng, m, k_extent), random_floats(rng, k_extent, n)
    kernel = ln.build(s)
    # Two calls splitting the range anywhere compute what one call computes.
    cut = int(plan["cut"] * kernel.range_extent)
    out = run_kernel(kernel, a, b, begin=0, end=cut)
    run_kernel(kernel, a, b, begin=cut, end=kernel.range_extent, out=out)
    _, _, C0, _ = matmul(m, k_extent, n)
    np.testing.assert_array_equal(out, run(ln.Schedule(C0), a, b))
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
