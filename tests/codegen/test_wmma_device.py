"""The WMMA description (codegen/instructions/wmma_f16.py) against NVIDIA's tensor cores themselves: one warp's
nvcuda::wmma::mma_sync on 16 x 16 x 16 fragments, compiled by NVRTC through CuPy, its result compared with what
the description evaluates to. It runs where CuPy sees a GPU of compute capability 7.0 or newer (the device machine)
and skips elsewhere: CI has no GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest

from onnxopt.codegen.instructions import by_name
from onnxopt.codegen.instructions.expr import evaluate

cupy = pytest.importorskip("cupy", reason="CuPy is not installed: no CUDA device to run WMMA on")

M = N = K = 16
# Row-major fragments; the accumulator is loaded, used as mma_sync's addend and stored back (accumulate_in_place).
# A K loop of several instructions (k_tiles > 1) is the reduction split by the instruction's trip count.
SOURCE = r"""
#include <cuda_fp16.h>
#include <mma.h>
using namespace nvcuda;
extern "C" __global__ void wmma_tile(const __half *a, const __half *b, float *d, int k_tiles) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, d, 16, wmma::mem_row_major);
  for (int t = 0; t < k_tiles; t++) {
    wmma::load_matrix_sync(fa, a + 16 * t, 16 * k_tiles);
    wmma::load_matrix_sync(fb, b + 256 * t, 16);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}
"""


@pytest.fixture(scope="module")
def kernel():
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        count = 0
    if count == 0:
        pytest.skip("no CUDA device")
    major_minor = int(cupy.cuda.Device(0).compute_capability)
    if major_minor < 70:
        pytest.skip(f"compute capability {major_minor / 10} has no tensor cores (WMMA needs 7.0)")
    # NVRTC's headers from pip (nvidia-cuda-nvrtc) can lack crt/mma.h; a CUDA toolkit's include folder has it
    include = [d for d in (os.path.join(cupy.cuda.get_cuda_path() or "", "include"), "/usr/local/cuda/include")
               if os.path.exists(os.path.join(d, "crt", "mma.h"))]
    if not include:
        pytest.skip("no CUDA toolkit headers with crt/mma.h for NVRTC")
    return cupy.RawKernel(SOURCE, "wmma_tile", options=("--std=c++17", f"-I{include[0]}"))


def _run(kernel, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    k_tiles = a.shape[1] // K
    d = cupy.asarray(c)
    kernel((1,), (32,), (cupy.asarray(a), cupy.asarray(b), d, np.int32(k_tiles)))  # one warp
    return cupy.asnumpy(d)


def test_one_instruction_is_its_description_exactly(kernel):
    """Small integers: every product and partial sum is exact in f32, so the hardware's summation order cannot
    matter and the result must equal the description's evaluation bit for bit (indices, operand roles, the cast
    to f32 and the accumulator as addend)."""
    ins = by_name("wmma_f16")
    rng = np.random.default_rng(0)
    a = rng.integers(-8, 9, (M, K)).astype(np.float16)
    b = rng.integers(-8, 9, (K, N)).astype(np.float16)
    c = rng.integers(-1000, 1000, (M, N)).astype(np.float32)
    want = evaluate(ins.computation, {"a": a, "b": b}, c)
    np.testing.assert_array_equal(_run(kernel, a, b, c), want)
    # not symmetric in its operands: a transposed A gives another answer, so the roles are checked
    assert not np.array_equal(want, evaluate(ins.computation, {"a": a.T.copy(), "b": b}, c))


def test_random_operands_within_f32_rounding(kernel):
    """Normal f16 operands: the products are exact in f32 (11-bit significands); the sums round, in an order the
    hardware does not document (nor whether each partial sum is rounded to nearest), so the bound is loose: 2^-18
    of the sum of magnitudes, against errors of order one for a wrong index or operand role."""
    ins = by_name("wmma_f16")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = rng.standard_normal((M, N)).astype(np.float32)
    exact = evaluate(ins.computation, {"a": a.astype(np.float64), "b": b.astype(np.float64)}, c.astype(np.float64))
    bound = (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + np.abs(c)) * 2.0 ** -18
    assert np.all(np.abs(_run(kernel, a, b, c) - exact) <= bound)


@pytest.mark.parametrize("k_tiles", [2, 5])
def test_the_reduction_split_by_the_instructions_trip_count(kernel, k_tiles):
    """A K of several instructions, one accumulator fragment carried through them (the rewriter's split of the
    reduction loop by the instruction's 16): small integers again, so exactly A @ B + C."""
    rng = np.random.default_rng(k_tiles)
    a = rng.integers(-4, 5, (M, K * k_tiles)).astype(np.float16)
    b = rng.integers(-4, 5, (K * k_tiles, N)).astype(np.float16)
    c = rng.integers(-100, 100, (M, N)).astype(np.float32)
    want = c + a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_array_equal(_run(kernel, a, b, c), want)
