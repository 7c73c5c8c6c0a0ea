"""The AVX2 u8 x s8 dot product of 4 (what VNNI does in one instruction): vpmaddubsw, vpmaddwd with ones, vpaddd.

vpmaddubsw adds each pair of u8 x s8 products in a signed 16-bit lane with saturation: 255 * (|b0| + |b1|) can pass
32767. onnxruntime's AVX2 kernels take that saturation (its quantizer's reduce_range keeps weights to 7 bits to
avoid it); ours never saturate. The weights are constants, so their operand preparation (`split_pairs`) makes
every pair that shares a 16-bit sum satisfy |b0| + |b1| <= 128 (then no u8 input reaches 32767: 255 * 128 = 32640)
by moving the excess of the smaller weight of each offending pair into a short list of exact corrections, which
the kernel adds after its K loop. In BERT-base's 72 int8 weight matrices 0.08% of the pairs need one.
"""

import numpy as np
from llvmlite import ir

from .instruction import Instruction, call_intrinsic, dot4

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


def pairs_cannot_saturate(weights: np.ndarray) -> bool:
    """Whether vpmaddubsw is exact for these s8 weights laid out for it (pairs of adjacent elements along the last
    axis share a 16-bit sum), whatever the u8 inputs."""
    w = np.abs(weights.astype(np.int32)).reshape(-1, 2)
    return bool(np.all(w.sum(axis=1) <= 128))


def split_pairs(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(safe, where, residual): `safe` is `weights` (s8, pairs adjacent along the last axis) with the smaller weight
    of every pair whose magnitudes sum past 128 cut down so they sum to 128; `where` are the flat indices of the cut
    weights and `residual` (int32) what was cut, so weights = safe + residual at `where`."""
    w = weights.astype(np.int32).reshape(-1, 2)
    mag = np.abs(w)
    bad = np.nonzero(mag.sum(axis=1) > 128)[0]
    small = np.where(mag[bad, 0] <= mag[bad, 1], 0, 1)  # the smaller weight of each pair takes the cut
    big = 1 - small
    keep = np.sign(w[bad, small]) * (128 - mag[bad, big])
    where = bad * 2 + small
    residual = w[bad, small] - keep
    safe = w.copy()
    safe[bad, small] = keep
    return safe.astype(np.int8).reshape(weights.shape), where, residual.astype(np.int32)


def _emit(b, acc, a, w):
    n = acc.type.count
    pairs = call_intrinsic(b, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(I16, 2 * n), [a, w])
    ones = ir.Constant(ir.VectorType(I16, 2 * n), [1] * (2 * n))
    quads = call_intrinsic(b, "llvm.x86.avx2.pmadd.wd", ir.VectorType(I32, n), [pairs, ones])
    return b.add(acc, quads)


INSTRUCTION = Instruction(
    name="avx2_u8s8", computation=dot4("vpmaddubsw+vpmaddwd", 8, "u8", "s8"), arch="x86_64",
    features=("avx2",), emit=_emit,
    how="vpmaddubsw + vpmaddwd(ones) + vpaddd on weights split so that no pair saturates 16 bits (split_pairs)")
