"""tensorize: a 16-lane multiply-add row intrinsic replaces the inner matmul nest and gives the same bits."""

import numpy as np
import pytest
from loopnest_util import matmul, random_floats, run, run_kernel
from onnxopt.codegen import loopnest as ln


def _row_schedule(m, k, n, intrinsic, lanes=16, depth=1):
    _A, _B, C, r = matmul(m, k, n)
    s = ln.Schedule(C)
    i, j = s.axes
    jo, ji = s.split(j, lanes)
    if depth == 1:
        s.reorder(i, jo, r, ji)
        s.tensorize(ji, intrinsic)
    else:
        ko, ki = s.split(r, depth)
        s.reorder(i, jo, ko, ki, ji)
        s.tensorize(ki, intrinsic)
    return s


def _untensorized(m, k, n, a, b):
    _, _, C, _ = matmul(m, k, n)
    return run(ln.Schedule(C), a, b)


@pytest.mark.parametrize("m,k,n,depth", [(4, 6, 48, 1), (3, 5, 40, 1), (5, 8, 32, 4), (2, 10, 37, 4)],
                         ids=["divisible", "partial_j_tile", "depth4", "partial_j_and_k_tiles"])
def test_tensorized_equals_untensorized_bitwise(m, k, n, depth):
    s = _row_schedule(m, k, n, ln.row_fma_f32(16, depth=depth), depth=depth)
    kernel = ln.build(s)
    assert f"row_fma_f32x16_d{depth}(" in str(kernel.nest)
    rng = np.random.default_rng(m * 100 + n)
    a, b = random_floats(rng, m, k), random_floats(rng, k, n)
    got = run_kernel(kernel, a, b)
    np.testing.assert_array_equal(got, _untensorized(m, k, n, a, b))
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_fused_fma_variant_is_close_and_uses_fma():
    m, k, n = 6, 9, 64
    kernel = ln.build(_row_schedule(m, k, n, ln.row_fma_f32(16, fused=True)))
    assert "llvm.fma.v16f32" in kernel.ir
    rng = np.random.default_rng(7)
    a, b = random_floats(rng, m, k), random_floats(rng, k, n)
    np.testing.assert_allclose(run_kernel(kernel, a, b), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_intrinsic_operands_are_views_of_the_program_buffers():
    m, k, n = 2, 8, 32
    kernel = ln.build(_row_schedule(m, k, n, ln.row_fma_f32(16, depth=4), depth=4))
    nest_text = str(kernel.nest)
    assert "a=A@" in nest_text and "b=B@" in nest_text and "c=C@" in nest_text
    (tensorized,) = [s for s in _walk(kernel.nest.root) if type(s).__name__ == "Tensorized"]
    assert tensorized.operands["a"].strides == (1,)
    assert tensorized.operands["b"].strides == (n, 1)  # a row step of B is n elements
    assert tensorized.operands["c"].strides == (1,)


def _walk(stmt):
    yield stmt
    for child in getattr(stmt, "body", []):
        yield from _walk(child)


def test_wrong_tile_width_is_refused():
    with pytest.raises(ln.ScheduleError, match="extents"):
        ln.build(_row_schedule(4, 4, 32, ln.row_fma_f32(16), lanes=8))


def test_non_contiguous_operand_is_refused():
    # C[i, j] = sum_k A[i, k] * Bt[j, k]: along j, Bt moves by k elements, not 1.
    m, k, n = 2, 3, 32
    A, Bt = ln.placeholder((m, k), "A"), ln.placeholder((n, k), "Bt")
    r = ln.reduce_axis(k, "k")
    C = ln.compute((m, n), lambda i, j: ln.sum(A[i, r] * Bt[j, r], axis=r), name="C")
    s = ln.Schedule(C)
    i, j = s.axes
    jo, ji = s.split(j, 16)
    s.reorder(i, jo, r, ji)
    s.tensorize(ji, ln.row_fma_f32(16))
    with pytest.raises(ln.ScheduleError, match="not contiguous"):
        ln.build(s)


def test_different_computation_is_refused():
    m, k, n = 2, 3, 32
    A, B = ln.placeholder((m, k), "A"), ln.placeholder((k, n), "B")
    r = ln.reduce_axis(k, "k")
    C = ln.compute((m, n), lambda i, j: ln.sum(A[i, r] + B[r, j], axis=r), name="C")  # + instead of *
    s = ln.Schedule(C)
    i, j = s.axes
    jo, ji = s.split(j, 16)
    s.reorder(i, jo, r, ji)
    s.tensorize(ji, ln.row_fma_f32(16))
    with pytest.raises(ln.ScheduleError, match="does not match"):
        ln.build(s)


def test_tensorize_outside_the_reduction_is_refused():
    _, _, C, _r = matmul(2, 3, 16)
    s = ln.Schedule(C)
    _i, j = s.axes
    s.tensorize(j, ln.row_fma_f32(16))  # j encloses k: the nest holds the start value too
    with pytest.raises(ln.ScheduleError, match="update statement"):
        ln.build(s)


def test_custom_intrinsic_for_an_elementwise_row():
    """A user-defined intrinsic: y[0:8] = x[0:8] * 2 + 1 over a contiguous row, emitted as one vector op."""
    from llvmlite import ir

    xs = ln.placeholder((8,), "x")
    ys = ln.compute((8,), lambda j: xs[j] * 2.0 + 1.0, name="y")
    vty = ir.VectorType(ir.FloatType(), 8)

    def emit(builder, ops):
        v = builder.load(ops["x"].ptr, typ=vty, align=4)
        v = builder.fadd(builder.fmul(v, ir.Constant(vty, [2.0] * 8)), ir.Constant(vty, [1.0] * 8))
        builder.store(v, ops["y"].ptr, align=4)

    intrinsic = ln.TensorIntrinsic("scale_row8", ys, emit, unit_stride=("x", "y"))
    m, n = 3, 20
    X = ln.placeholder((m, n), "X")
    Y = ln.compute((m, n), lambda i, j: X[i, j] * 2.0 + 1.0, name="Y")
    s = ln.Schedule(Y)
    _i, j = s.axes
    _jo, ji = s.split(j, 8)  # 20 = 8 + 8 + 4: the last tile runs the plain loop
    s.tensorize(ji, intrinsic)
    x = random_floats(np.random.default_rng(8), m, n)
    np.testing.assert_array_equal(run(s, x), x * np.float32(2) + np.float32(1))
