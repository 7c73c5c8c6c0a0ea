"""The tensor-expression front end, affine forms, schedule bookkeeping and their error messages."""

import numpy as np
import pytest
from loopnest_util import matmul, run
from onnxopt.codegen import loopnest as ln
from onnxopt.codegen.loopnest.affine import flat_offset, linearize
from onnxopt.codegen.loopnest.stmt import IfThen, Loop


def test_compute_records_axes_reduction_and_inputs():
    _A, _B, C, k = matmul(3, 4, 5)
    assert C.shape == (3, 5) and C.dtype == "float32"
    assert [a.name for a in C.op.axes] == ["i", "j"] and C.op.reduce_axes == (k,)
    kernel = ln.build(ln.Schedule(C))
    assert [t.name for t in kernel.args] == ["A", "B", "C"]


def test_inputs_follow_creation_order_or_the_given_order():
    B = ln.placeholder((4,), "B")
    A = ln.placeholder((4,), "A")
    C = ln.compute((4,), lambda i: A[i] - B[i], name="C")
    assert [t.name for t in ln.build(ln.Schedule(C)).args] == ["B", "A", "C"]
    kernel = ln.build(ln.Schedule(C), inputs=[A, B])
    assert [t.name for t in kernel.args] == ["A", "B", "C"]
    from loopnest_util import run_kernel

    a, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    np.testing.assert_array_equal(run_kernel(kernel, a, b), a - b)
    with pytest.raises(ln.ScheduleError, match="do not list"):
        ln.build(ln.Schedule(C), inputs=[A])


def test_front_end_errors():
    A = ln.placeholder((4, 4), "A")
    k = ln.reduce_axis(4, "k")
    C = ln.compute((4,), lambda i: A[i, 0] + 1.0, name="C")
    with pytest.raises(ValueError, match="reads the computed tensor"):
        ln.compute((4,), lambda i: C[i] * 2.0)
    with pytest.raises(ValueError, match="at most one reduction"):
        ln.compute((4,), lambda i: ln.sum(A[i, k], axis=k) + ln.reduce_max(A[k, i], axis=k))
    with pytest.raises(ValueError, match="outside the reduction"):
        ln.compute((4,), lambda i: ln.sum(A[i, k], axis=k) + A[k, i])
    with pytest.raises(TypeError, match="integer operands"):
        ln.compute((4,), lambda i: A[i, 0] // 2.0)
    with pytest.raises(TypeError, match="no truth value"):
        ln.compute((4,), lambda i: A[i, 0] if i > 0 else 0.0)
    with pytest.raises(TypeError, match="not an integer"):
        A[0.5, 0]
    with pytest.raises(IndexError):
        A[0]
    with pytest.raises(TypeError, match="not a reduce_axis"):
        ln.sum(A[0, 0], axis=ln.compute((4,), lambda i: A[i, 0]).op.axes[0])


def test_avg_pool_epilogue_runs_after_the_reduction():
    X = ln.placeholder((6,), "X")
    r = ln.reduce_axis(3, "r")
    Y = ln.compute((4,), lambda i: ln.sum(X[i + r], axis=r) / 3.0 + 1.0, name="Y")
    text = str(ln.Schedule(Y))
    assert text.index("= 0.0") < text.index("+ X[") < text.index("/ 3.0")
    x = np.arange(6, dtype=np.float32)
    want = np.array([x[i:i + 3].sum() / np.float32(3) + 1 for i in range(4)], np.float32)
    np.testing.assert_array_equal(run(ln.Schedule(Y), x), want)


def test_int32_reductions():
    X = ln.placeholder((5, 7), "X", "int32")
    r = ln.reduce_axis(7, "r")
    S = ln.compute((5,), lambda i: ln.sum(X[i, r] * 2, axis=r), name="S")
    Mx = ln.compute((5,), lambda i: ln.reduce_max(X[i, r], axis=r), name="Mx")
    Mn = ln.compute((5,), lambda i: ln.reduce_min(X[i, r], axis=r), name="Mn")
    x = np.random.default_rng(0).integers(-100, 100, (5, 7)).astype(np.int32)
    np.testing.assert_array_equal(run(ln.Schedule(S), x), (x * 2).sum(axis=1))
    np.testing.assert_array_equal(run(ln.Schedule(Mx), x), x.max(axis=1))
    np.testing.assert_array_equal(run(ln.Schedule(Mn), x), x.min(axis=1))


def test_affine_forms_flatten_fused_indices():
    _, _, C, _ = matmul(4, 3, 6)
    s = ln.Schedule(C)
    f = s.fuse(*s.axes)
    fo, fi = s.split(f, 8)
    i_value, j_value = s.value_of(s.axes[0]), s.value_of(s.axes[1])
    offset = flat_offset(C, (i_value, j_value))  # (f // 6) * 6 + f % 6 with f = fo*8 + fi: just f
    assert offset.coefficient(fi) == 1 and offset.coefficient(fo) == 8 and offset.const == 0
    assert linearize(j_value).coefficient(fi) is None  # alone, f % 6 is not affine in fi
    assert linearize((fi * 4 + 8) // 4).coefficient(fi) == 1  # exact division folds
    assert linearize((fi * 4 + 8) % 4).is_constant


def test_non_divisible_split_becomes_a_bound_and_a_guard_where_it_must():
    _, _, C, k = matmul(4, 3, 10)
    s = ln.Schedule(C)
    i, j = s.axes
    jo, ji = s.split(j, 4)
    s.reorder(i, jo, k, ji)
    loops = [n for n in _walk(ln.lower(s).root) if isinstance(n, Loop)]
    inner = [lp for lp in loops if lp.var is ji]  # one in the start-value nest, one in the update nest
    assert len(inner) == 2 and all(len(lp.bounds) == 1 for lp in inner)
    assert not any(isinstance(n, IfThen) for n in _walk(ln.lower(s).root))

    s = ln.Schedule(C)
    i, j = s.axes
    jo, ji = s.split(j, 4)
    s.reorder(i, ji, jo)
    fused = s.fuse(ji, jo)  # j = (fused % 3) * 4 + fused // 3: not affine in the fused loop
    assert any(isinstance(n, IfThen) for n in _walk(ln.lower(s).root))
    a, b = np.ones((4, 3), np.float32), np.arange(30, dtype=np.float32).reshape(3, 10)
    np.testing.assert_array_equal(run(s, a, b), a @ b)
    assert fused.extent == 12


def _walk(stmt):
    yield stmt
    for child in getattr(stmt, "body", []):
        yield from _walk(child)


def test_schedule_errors():
    _, _, C, k = matmul(4, 3, 10)
    s = ln.Schedule(C)
    i, j = s.axes
    jo, ji = s.split(j, 4)
    with pytest.raises(ln.ScheduleError, match="not a current loop"):
        s.split(j, 2)
    with pytest.raises(ln.ScheduleError, match="directly inside"):
        s.fuse(i, ji)
    with pytest.raises(ln.ScheduleError, match="reduce"):
        s.fuse(ji, k)
    with pytest.raises(ln.ScheduleError, match="race"):
        s.parallel(k)
    with pytest.raises(ln.ScheduleError, match="listed twice"):
        s.reorder(i, i)
    with pytest.raises(ln.ScheduleError, match="positive int"):
        s.split(i, 0)
    s.vectorize(ji)
    with pytest.raises(ln.ScheduleError, match="already annotated"):
        s.split(ji, 2)
    s.parallel(jo)
    with pytest.raises(ln.ScheduleError, match="outermost"):
        ln.build(s)
    big = ln.compute((1000,), lambda x: ln.placeholder((1000,), "Z")[x], name="big")
    with pytest.raises(ln.ScheduleError, match="split it first"):
        ln.Schedule(big).unroll(big.op.axes[0])
    with pytest.raises(ln.ScheduleError, match="placeholder"):
        ln.Schedule(ln.placeholder((2,), "P"))


def test_object_code_compiles():
    _, _, C, k = matmul(8, 8, 32)
    s = ln.Schedule(C)
    i, j = s.axes
    jo, ji = s.split(j, 16)
    s.reorder(i, jo, k, ji)
    s.vectorize(ji)
    s.parallel(i)
    kernel = ln.build(s, name="matmul_8x8x32")
    obj = kernel.object_code()
    assert obj[:4] == b"\x7fELF" and b"matmul_8x8x32" in obj
