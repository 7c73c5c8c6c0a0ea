"""The AVX2 u8 x s8 dot product of 4 (what VNNI does in one instruction): vpmaddubsw, vpmaddwd with ones, vpaddd.

vpmaddubsw adds each pair of u8 x s8 products in a signed 16-bit lane with saturation: 255 * (|b0| + |b1|) can pass
32767. The weights are constants, so the packer checks them offline (`pairs_cannot_saturate`): when every pair
sharing a 16-bit sum has |b0| + |b1| <= 128, no u8 input can saturate it (255 * 128 = 32640) and the three
instructions are exact. Otherwise the kernel uses `emit_widened`: both sources widened to 16 bits and vpmaddwd, exact
for all inputs at about half the rate. onnxruntime's AVX2 kernels use the saturating sequence either way (its
quantizer's reduce_range keeps weights to 7 bits for that reason); ours never saturate.
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


def _emit(b, acc, a, w):
    n = acc.type.count
    pairs = call_intrinsic(b, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(I16, 2 * n), [a, w])
    ones = ir.Constant(ir.VectorType(I16, 2 * n), [1] * (2 * n))
    quads = call_intrinsic(b, "llvm.x86.avx2.pmadd.wd", ir.VectorType(I32, n), [pairs, ones])
    return b.add(acc, quads)


def emit_widened(b, acc, a, w):
    """The exact form for any weights: u8 and s8 widened to 16 bits, vpmaddwd on each half, the pairs summed."""
    n = acc.type.count
    a16 = b.zext(a, ir.VectorType(I16, 4 * n))
    w16 = b.sext(w, ir.VectorType(I16, 4 * n))
    halves = []
    for h in range(2):
        idx = ir.Constant(ir.VectorType(I32, 2 * n), list(range(h * 2 * n, (h + 1) * 2 * n)))
        x = b.shuffle_vector(a16, a16, idx)
        y = b.shuffle_vector(w16, w16, idx)
        halves.append(call_intrinsic(b, "llvm.x86.avx2.pmadd.wd", ir.VectorType(I32, n), [x, y]))
    # halves[0] lane k = pair k of elements 0..2n-1; lane i of the result sums pairs 2i and 2i + 1
    both = b.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n))))
    even = b.shuffle_vector(both, both, ir.Constant(ir.VectorType(I32, n), list(range(0, 2 * n, 2))))
    odd = b.shuffle_vector(both, both, ir.Constant(ir.VectorType(I32, n), list(range(1, 2 * n, 2))))
    return b.add(acc, b.add(even, odd))


INSTRUCTION = Instruction(
    name="avx2_u8s8", computation=dot4("vpmaddubsw+vpmaddwd", 8, "u8", "s8"), arch="x86_64",
    features=("avx2",), emit=_emit,
    how="vpmaddubsw + vpmaddwd(ones) + vpaddd when the weights' pairs cannot saturate 16 bits, else widened vpmaddwd")
