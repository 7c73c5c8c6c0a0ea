"""Kernels built in forked workers (codegen/parallel.py): the same object code as a build in this process, in the
order asked, and a kernel that fails to build fails alone, with its own message."""

from __future__ import annotations

import pytest

from onnxopt.codegen.compile import compile_object
from onnxopt.codegen.parallel import BuildError, build_many, build_workers
from onnxopt.codegen.target import parse_target

TARGET = parse_target("x86-64")


def scale_ir(k: int) -> str:
    """A function that multiplies a float array by k: small, and different for each k."""
    return f"""
target triple = "{TARGET.triple}"
define void @scale{k}(float* %p, i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%j, %loop]
  %q = getelementptr float, float* %p, i64 %i
  %v = load float, float* %q
  %w = fmul float %v, {float(k):.1f}
  store float %w, float* %q
  %j = add i64 %i, 1
  %c = icmp slt i64 %j, %n
  br i1 %c, label %loop, label %done
done:
  ret void
}}
"""


def job(k):
    return lambda: (compile_object(scale_ir(k), TARGET), f"scale{k}")


def broken():
    raise ValueError("no kernel for this op")


def test_workers_give_the_serial_objects_in_order():
    jobs = [job(k) for k in range(1, 6)]
    serial = build_many(jobs, workers=1)
    forked = build_many(jobs, workers=2)
    assert [d for _, d in forked] == [f"scale{k}" for k in range(1, 6)]
    assert forked == serial
    assert all(b"scale" in obj for obj, _ in forked)  # the symbol is in the object


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_kernel_fails_alone(workers):
    out = build_many([job(1), broken, job(2)], workers=workers)
    assert out[0][1] == "scale1" and out[2][1] == "scale2"
    assert isinstance(out[1], BuildError) and "ValueError: no kernel for this op" in str(out[1])


def test_worker_count_from_the_environment(monkeypatch):
    monkeypatch.setenv("ONNXOPT_BUILD_WORKERS", "3")
    assert build_workers() == 3
    monkeypatch.setenv("ONNXOPT_BUILD_WORKERS", "many")
    with pytest.raises(ValueError, match="whole number"):
        build_workers()
