"""Matrix instructions: UNIT's description of an instruction extended from vector dot products to 2-D tiles (AMX's
TDPB*D and TDP*PS here; the same family describes the GPU's WMMA/MMA).

A `MatrixInstruction` is three things:

- its computation in the tensor language (expr.py), written on the logical matrices d[m, n] += a[m, k] * b[k, n]
  with the instruction's dtypes and casts, so that the inspector and AMOS's mapper (inspector.py, mapping.py) can
  tell which loops of an operator it can take (and that u8 x s8 is not s8 x s8);
- its operand layouts: where element (m, k) of A, (k, n) of B and (m, n) of C sit in a tile register of `rows` rows
  of `colsb` bytes (B's K is packed `pack` elements to a 4-byte lane: VNNI's layout);
- its accumulation rule, `execute`: what the hardware does to the bytes of three tile registers, as Intel's ISA
  reference writes it (integers: 32-bit wrapping sums, no saturation; bf16/fp16: each pair's products added to the
  float32 accumulator one at a time, rounding to nearest even; denormal outputs flushed to zero, and denormal bf16
  inputs too, while fp16's are used as they are, as the SDM says of TDPBF16PS and TDPFP16PS).

`execute` is the reference interpreter's step (tile_program.py): it runs on any host, so every packing and tile
program the kernels use is checked where the CPU has no AMX.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .expr import Computation, Loop, access, cast, mul

_NP = {"u8": np.uint8, "s8": np.int8, "bf16": np.uint16, "f16": np.float16}
_BYTES = {"u8": 1, "s8": 1, "bf16": 2, "f16": 2}


@dataclass(frozen=True)
class TileShape:
    """One tile register as configured: `rows` rows of `colsb` bytes (AMX palette 1: at most 16 x 64)."""

    rows: int
    colsb: int

    def check(self, max_rows: int = 16, max_colsb: int = 64) -> None:
        if not (1 <= self.rows <= max_rows and 1 <= self.colsb <= max_colsb and self.colsb % 4 == 0):
            raise ValueError(f"a tile of {self.rows} rows x {self.colsb} bytes: rows 1..{max_rows}, bytes a "
                             f"multiple of 4 up to {max_colsb}")


@dataclass(frozen=True)
class MatrixInstruction:
    name: str  # the mnemonic
    computation: Computation  # d[m, n] += a[m, k] * b[k, n] at the instruction's full shape
    arch: str
    features: tuple[str, ...]  # every LLVM feature it needs
    intrinsic: str  # LLVM's shape-carrying form (the register allocator picks the tiles, LLVM writes ldtilecfg)
    how: str
    max_rows: int = 16
    max_colsb: int = 64

    @property
    def source_dtypes(self) -> tuple[str, str]:
        a, b = self.computation.accesses()
        return a.dtype, b.dtype

    @property
    def accumulator_dtype(self) -> str:
        return self.computation.output.dtype

    @property
    def element_bytes(self) -> int:
        return _BYTES[self.source_dtypes[0]]

    @property
    def pack(self) -> int:
        """K elements per 4-byte lane of a B row (4 bytes, or 2 bf16/fp16)."""
        return 4 // self.element_bytes

    @property
    def shape(self) -> tuple[int, int, int]:
        """(M, N, K) at full tiles."""
        ext = {lp.name: lp.extent for lp in self.computation.loops}
        return ext["m"], ext["n"], ext["k"]

    def available(self, target) -> bool:
        return target.arch == self.arch and all(target.has(f) for f in self.features)

    # ---- operand layouts: (row, byte) of a logical element in its tile register
    def a_at(self, m: int, k: int) -> tuple[int, int]:
        return m, k * self.element_bytes

    def b_at(self, k: int, n: int) -> tuple[int, int]:
        return k // self.pack, (n * self.pack + k % self.pack) * self.element_bytes

    @staticmethod
    def c_at(m: int, n: int) -> tuple[int, int]:
        return m, 4 * n

    def shapes_for(self, m: int, n: int, k: int) -> tuple[TileShape, TileShape, TileShape]:
        """The (C, A, B) tile shapes of an m x n x k product (k a multiple of `pack`)."""
        return (TileShape(m, 4 * n), TileShape(m, k * self.element_bytes),
                TileShape(k // self.pack, 4 * n))

    def check_shapes(self, c: TileShape, a: TileShape, b: TileShape) -> None:
        """The instruction's operand rules (Intel SDM, TDPBSSD/TDPBF16PS: #UD otherwise)."""
        for t in (c, a, b):
            t.check(self.max_rows, self.max_colsb)
        if c.rows != a.rows or c.colsb != b.colsb or a.colsb != 4 * b.rows:
            raise ValueError(f"{self.name}: C {c.rows}x{c.colsb}, A {a.rows}x{a.colsb}, B {b.rows}x{b.colsb} bytes "
                             "break its rules: C and A have the same rows, C and B the same bytes a row, and A's "
                             "bytes a row are 4 x B's rows")

    # ---- packing: logical matrices <-> tile bytes
    def pack_a(self, a: np.ndarray) -> np.ndarray:
        """A[m, k] as the rows x colsb bytes of a tile register."""
        return np.ascontiguousarray(a.astype(_NP[self.source_dtypes[0]])).view(np.uint8).reshape(a.shape[0], -1)

    def pack_b(self, b: np.ndarray) -> np.ndarray:
        """B[k, n] (k a multiple of pack) in the tile's layout: row k // pack holds (n, k % pack) pairs."""
        k, n = b.shape
        packed = b.astype(_NP[self.source_dtypes[1]]).reshape(k // self.pack, self.pack, n).transpose(0, 2, 1)
        return np.ascontiguousarray(packed).view(np.uint8).reshape(k // self.pack, -1)

    # ---- the accumulation rule
    def execute(self, c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The new bytes of C after the instruction on tile registers holding `c`, `a`, `b` (uint8 arrays of their
        configured rows x colsb)."""
        shapes = [TileShape(*x.shape) for x in (c, a, b)]
        self.check_shapes(*shapes)
        rows, groups, cols = a.shape[0], b.shape[0], c.shape[1] // 4
        ta, tb = self.source_dtypes
        av = a.view(_NP[ta]).reshape(rows, groups, self.pack)
        bv = b.view(_NP[tb]).reshape(groups, cols, self.pack)
        if self.accumulator_dtype == "s32":
            total = np.einsum("mkj,knj->mn", av.astype(np.int64), bv.astype(np.int64))
            acc = c.view(np.int32).astype(np.int64) + total
            return ((acc + 2**31) % 2**32 - 2**31).astype(np.int32).view(np.uint8).reshape(c.shape)
        af, bf = _to_f32(av, ta), _to_f32(bv, tb)
        acc = _flush(c.view(np.float32).copy())
        for g in range(groups):
            for j in range(self.pack):  # one product at a time, each add rounded to float32 (exact products)
                acc = _flush((acc + af[:, g, j][:, None] * bf[g, :, j][None, :]).astype(np.float32))
        return acc.view(np.uint8).reshape(c.shape)


def _to_f32(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":  # bf16 denormal inputs read as zero
        return _flush((x.astype(np.uint32) << 16).view(np.float32))
    return x.astype(np.float32)  # fp16 denormals are handled (exact, normal float32 values)


def _flush(x: np.ndarray) -> np.ndarray:
    """float32 denormals to (signed) zero: the tile units' outputs, and their bf16 inputs."""
    tiny = np.abs(x) < np.finfo(np.float32).tiny
    return np.where(tiny, np.copysign(np.float32(0), x), x).astype(np.float32)


def gemm_description(name: str, a_dtype: str, b_dtype: str, acc_dtype: str, m: int, n: int, k: int) -> Computation:
    """d[m, n] += acc(a[m, k]) * acc(b[k, n]): a matrix instruction's computation, or an operator's (a GEMM)."""
    return Computation(name, (Loop("m", m), Loop("n", n), Loop("k", k, reduce=True)), access("d", acc_dtype, "m", "n"),
                       mul(acc_dtype, cast(acc_dtype, access("a", a_dtype, "m", "k")),
                           cast(acc_dtype, access("b", b_dtype, "k", "n"))))


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounding to nearest even (NaN kept quiet): the weights' offline conversion."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded).astype(np.uint16)
