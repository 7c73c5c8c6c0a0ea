"""The AVX2 u8 x s8 dot product of 4 (what VNNI does in one instruction): vpmaddubsw, vpmaddwd with ones, vpaddd.

vpmaddubsw adds each pair of u8 x s8 products in a signed 16-bit lane with saturation. With u8 inputs the pair's
sum a0 b0 + a1 b1 lies within 255 * (the sum of its negative weights) and 255 * (the sum of its positive ones), and
those bounds are reached, so it can pass 32767 or -32768 only when both weights have one sign and |b0 + b1| > 128
(255 * 128 = 32640); a pair of opposite signs never saturates. onnxruntime's AVX2 kernels take that saturation (its
quantizer's reduce_range keeps weights to 7 bits to avoid it); ours never saturate. The weights are constants, so
their operand preparation (`split_pairs`) moves the excess of the smaller weight of each pair that could saturate
into a short list of exact corrections, which the kernel adds after its K loop. In BERT-base's 72 int8 weight
matrices 0.08% of the pairs need one.
"""

import numpy as np
from llvmlite import ir

from .instruction import Instruction, call_intrinsic, dot4

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


def _can_saturate(w: np.ndarray) -> np.ndarray:
    """Per pair of `w` (int32 [pairs, 2]): whether some u8 inputs saturate its 16-bit sum, i.e. the sum of its
    positive weights passes 128 or that of its negative ones -128 (255 * 129 = 32895)."""
    return (np.maximum(w, 0).sum(axis=1) > 128) | (np.minimum(w, 0).sum(axis=1) < -128)


def pairs_cannot_saturate(weights: np.ndarray) -> bool:
    """Whether vpmaddubsw is exact for these s8 weights laid out for it (pairs of adjacent elements along the last
    axis share a 16-bit sum), whatever the u8 inputs."""
    return not bool(np.any(_can_saturate(weights.astype(np.int32).reshape(-1, 2))))


def split_pairs(weights: np.ndarray, needed: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(safe, where, residual): `safe` is `weights` (s8, pairs adjacent along the last axis) with the smaller weight
    of every pair that could saturate (both of one sign, |b0 + b1| > 128) cut down so that |b0 + b1| = 128; `where`
    are the flat indices of the cut weights and `residual` (int32) what was cut, so weights = safe + residual at
    `where`. Not `needed` (the target's instruction does not saturate: VNNI, AMX, sdot): the weights, no cuts."""
    if not needed:
        return weights.astype(np.int8), np.zeros(0, np.int64), np.zeros(0, np.int32)
    w = weights.astype(np.int32).reshape(-1, 2)
    mag = np.abs(w)
    bad = np.nonzero(_can_saturate(w))[0]
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
    features=("avx2",), emit=_emit, pair_sums_saturate=True,
    how="vpmaddubsw + vpmaddwd(ones) + vpaddd on weights split so that no pair saturates 16 bits (split_pairs)")
