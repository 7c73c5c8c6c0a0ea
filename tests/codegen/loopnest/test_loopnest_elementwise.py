"""Elementwise computes: float and int32 arithmetic, selects, casts, exp; fused, split, vectorized, unrolled and
ranged loops with extents that the vector width does not divide."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loopnest_util import SENTINEL_INT, random_floats, run, run_kernel
from onnxopt.codegen import loopnest as ln
from onnxopt.codegen.target import host_target, parse_target


def _relu_bias(m, n):
    A = ln.placeholder((m, n), "A")
    bias = ln.placeholder((n,), "bias")
    C = ln.compute((m, n), lambda i, j: ln.maximum(A[i, j] * 2.0 + bias[j], 0.0) - ln.minimum(A[i, j], bias[j]),
                   name="C")
    return A, bias, C


def _relu_bias_ref(a, bias):
    return np.maximum(a * np.float32(2) + bias, 0) - np.minimum(a, bias)


@pytest.mark.parametrize("vector_width", [16, 5, 64])
def test_split_vectorize_with_broadcast_operand(vector_width):
    m, n = 7, 45
    rng = np.random.default_rng(0)
    a, bias = random_floats(rng, m, n), random_floats(rng, n)
    _, _, C = _relu_bias(m, n)
    s = ln.Schedule(C)
    _i, j = s.axes
    _jo, ji = s.split(j, vector_width)
    s.vectorize(ji)
    kernel = ln.build(s)
    assert kernel.notes == []
    np.testing.assert_array_equal(run_kernel(kernel, a, bias), _relu_bias_ref(a, bias))


def test_fused_contiguous_axes_vectorize():
    m, n = 9, 13
    rng = np.random.default_rng(1)
    X, Y = ln.placeholder((m, n), "X"), ln.placeholder((m, n), "Y")
    Z = ln.compute((m, n), lambda i, j: X[i, j] * Y[i, j] + 1.0, name="Z")
    s = ln.Schedule(Z)
    f = s.fuse(*s.axes)
    fo, fi = s.split(f, 16)
    s.vectorize(fi)
    s.parallel(fo)
    # i*n + j with i = f // n and j = f % n is just f: the fused loop is contiguous, one 16-lane vector on an
    # AVX-512 target (checked on any host: only the IR), two 8-lane halves on the host's own target if it has AVX2.
    wide = ln.build(s, target=parse_target("x86-64-v4"))
    assert wide.notes == [] and "<16 x float>" in wide.ir
    kernel = ln.build(s)
    assert kernel.notes == []
    x, y = random_floats(rng, m, n), random_floats(rng, m, n)
    out = run_kernel(kernel, x, y, begin=0, end=3)
    np.testing.assert_array_equal(out.ravel()[:48], (x * y + np.float32(1)).ravel()[:48])
    assert np.isnan(out.ravel()[48:]).all()
    run_kernel(kernel, x, y, begin=3, end=kernel.range_extent, out=out)
    np.testing.assert_array_equal(out, x * y + np.float32(1))


def test_strided_access_falls_back_to_scalar():
    m, n = 6, 21
    A = ln.placeholder((n, m), "A")
    T = ln.compute((m, n), lambda i, j: A[j, i], name="T")
    s = ln.Schedule(T)
    s.vectorize(s.axes[1])
    kernel = ln.build(s)
    assert len(kernel.notes) == 1 and "stride 6" in kernel.notes[0]
    a = random_floats(np.random.default_rng(2), n, m)
    np.testing.assert_array_equal(run_kernel(kernel, a), a.T)


def test_condition_on_the_vector_variable_masks_lanes():
    m, n = 3, 40
    A = ln.placeholder((m, n), "A")
    # The read happens only where the condition holds: A[i, j - 5] is out of the row for j < 5.
    C = ln.compute((m, n), lambda i, j: ln.if_then_else(ln.all_of(j >= 5, ln.not_equal(j % 3, 1)), A[i, j - 5], -1.0),
                   name="C")
    s = ln.Schedule(C)
    s.vectorize(s.axes[1])
    kernel = ln.build(s)
    assert kernel.notes == [] and "masked.load" in kernel.ir
    a = random_floats(np.random.default_rng(3), m, n)
    j = np.arange(n)
    want = np.where((j >= 5) & (j % 3 != 1), np.roll(a, 5, axis=1), np.float32(-1))
    np.testing.assert_array_equal(run_kernel(kernel, a), want)


def test_int32_arithmetic_floor_division_and_modulo():
    n = 37  # vector tail of 5 lanes: masked lanes must not divide by zero
    A, B = ln.placeholder((n,), "A", "int32"), ln.placeholder((n,), "B", "int32")
    C = ln.compute((n,), lambda i: (A[i] * 3 - B[i]) // 4 + A[i] % 5 + A[i] // B[i] + B[i] % A[i]
                   + ln.maximum(A[i], B[i]) - ln.minimum(A[i], 7), name="C")
    rng = np.random.default_rng(4)
    a = rng.integers(-50, 50, n).astype(np.int32)
    b = rng.integers(-9, 9, n).astype(np.int32)
    a[a == 0], b[b == 0] = 3, -2
    want = (a * 3 - b) // 4 + a % 5 + a // b + b % a + np.maximum(a, b) - np.minimum(a, 7)
    lanes = host_target().float32_lanes
    for vectorize in (False, True):
        s = ln.Schedule(C)
        if vectorize:
            s.vectorize(s.axes[0])
        kernel = ln.build(s)
        assert kernel.notes == [] and (f"<{lanes} x i32>" in kernel.ir) == vectorize
        np.testing.assert_array_equal(run_kernel(kernel, a, b), want)


def test_casts_and_index_values():
    n = 20
    A = ln.placeholder((n,), "A", "int32")
    C = ln.compute((n,), lambda i: ln.cast(A[i], "float32") * 0.5 + ln.cast(i, "float32"), name="C")
    D = ln.compute((n,), lambda i: ln.cast(ln.cast(A[i], "float32") * 0.5, "int32") + ln.cast(i, "int32"), name="D")
    a = np.arange(-10, 10, dtype=np.int32)
    for vectorize in (False, True):
        sc, sd = ln.Schedule(C), ln.Schedule(D)
        if vectorize:
            sc.vectorize(sc.axes[0])
            sd.vectorize(sd.axes[0])
        np.testing.assert_array_equal(run(sc, a), a * np.float32(0.5) + np.arange(n, dtype=np.float32))
        np.testing.assert_array_equal(run(sd, a), (a * 0.5).astype(np.int32) + np.arange(n))


def test_exp_and_sqrt_vector_equals_scalar():
    n = 50
    A = ln.placeholder((n,), "A")
    C = ln.compute((n,), lambda i: ln.exp(A[i]) + ln.sqrt(A[i] * A[i]), name="C")
    a = np.linspace(-20, 20, n).astype(np.float32)
    scalar = run(ln.Schedule(C), a)
    s = ln.Schedule(C)
    s.vectorize(s.axes[0])
    vector = run(s, a)
    np.testing.assert_allclose(scalar, np.exp(a.astype(np.float64)) + np.abs(a), rtol=1e-6)
    np.testing.assert_array_equal(vector, scalar)


def test_unroll_with_partial_tile_and_dynamic_range():
    m, n = 11, 10
    _, _, C = _relu_bias(m, n)
    s = ln.Schedule(C)
    i, j = s.axes
    io, ii = s.split(i, 4)  # last tile of i has 3 rows
    jo, ji = s.split(j, 3)  # last tile of j has 1 column
    s.reorder(io, jo, ii, ji)
    s.unroll(ii)
    s.unroll(ji)
    rng = np.random.default_rng(5)
    a, bias = random_floats(rng, m, n), random_floats(rng, n)
    np.testing.assert_array_equal(run(s, a, bias), _relu_bias_ref(a, bias))

    # An unrolled range loop: each copy checks it is inside [begin, end).
    s = ln.Schedule(C)
    s.unroll(s.axes[0])
    kernel = ln.build(s)
    out = run_kernel(kernel, a, bias, begin=2, end=5)
    np.testing.assert_array_equal(out[2:5], _relu_bias_ref(a, bias)[2:5])
    assert np.isnan(out[:2]).all() and np.isnan(out[5:]).all()


def test_int_output_sentinel_shows_unwritten_elements():
    # The int sentinel plays the role NaN plays for floats in the range tests.
    n = 8
    A = ln.placeholder((n,), "A", "int32")
    C = ln.compute((n,), lambda i: A[i] + 1, name="C")
    out = run_kernel(ln.build(ln.Schedule(C)), np.zeros(n, np.int32), begin=0, end=3)
    assert (out[:3] == 1).all() and (out[3:] == SENTINEL_INT).all()


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 9), n=st.integers(1, 70), factor=st.sampled_from([1, 3, 4, 16, 17, 32]),
       fuse=st.booleans(), unroll=st.booleans(), seed=st.integers(0, 1000))
def test_random_elementwise_schedules(m, n, factor, fuse, unroll, seed):
    rng = np.random.default_rng(seed)
    X, Y = ln.placeholder((m, n), "X"), ln.placeholder((m, n), "Y")
    Z = ln.compute((m, n), lambda i, j: ln.maximum(X[i, j], Y[i, j]) / (Y[i, j] * Y[i, j] + 1.0), name="Z")
    s = ln.Schedule(Z)
    axis = s.fuse(*s.axes) if fuse else s.axes[1]
    outer, inner = s.split(axis, factor)
    s.vectorize(inner)
    if unroll and outer.extent <= 16 and not fuse:
        s.unroll(outer)
    x, y = random_floats(rng, m, n), random_floats(rng, m, n)
    kernel = ln.build(s)
    assert kernel.notes == []
    np.testing.assert_array_equal(run_kernel(kernel, x, y), np.maximum(x, y) / (y * y + np.float32(1)))


def test_vectorized_range_loop_runs_only_its_range():
    n = 45
    A = ln.placeholder((n,), "A")
    C = ln.compute((n,), lambda i: A[i] * np.float32(3) - np.int64(1), name="C")  # numpy numbers work as constants
    s = ln.Schedule(C)
    s.vectorize(s.axes[0])
    s.parallel(s.axes[0])
    kernel = ln.build(s)
    assert kernel.notes == [] and kernel.range_extent == n
    a = random_floats(np.random.default_rng(6), n)
    want = a * np.float32(3) - np.float32(1)
    out = run_kernel(kernel, a, begin=3, end=29)  # neither end on a vector boundary
    np.testing.assert_array_equal(out[3:29], want[3:29])
    assert np.isnan(out[:3]).all() and np.isnan(out[29:]).all()
    run_kernel(kernel, a, begin=0, end=3, out=out)
    run_kernel(kernel, a, begin=29, end=n, out=out)
    np.testing.assert_array_equal(out, want)
