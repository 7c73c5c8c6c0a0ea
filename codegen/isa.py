"""The ISA table: one row per instruction set the CPU backend writes kernels for, best first (XNNPACK's config
tables, MLAS's platform dispatch).

Everything that depends on the instruction set reads its row: the vector width and lanes (`Target.vector_bits`,
`Target.float32_lanes`), the fp32 micro-kernel (`microkernel/registry.py` `select`), the int8 dot-product
instructions (`instructions.available`), the vector math's flavour (`vmath/isa.py`), the int8 conv's table lookups
(`kinds/qconv/lower.py`) and the library's own CPU check (`glue/library.py` `_cpu_check`). `isa_of(target)` picks
the first row of the target's architecture whose required features the target has and fills it in with what
depends on the target's exact features; adding an instruction set is adding a row to ROWS.

Only the target passed in decides: nothing here looks at the host.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# The instructions' own files (not the package: its `available` reads this table), for their `available` check.
from .instructions import amx, arm_sdot, arm_udot, avx2_u8s8, avx512_vnni, avx_vnni

ANY_ARCH = "*"  # a row for every architecture (the last resort)

# x86-64: the LLVM features gcc's __builtin_cpu_supports knows by the same name. The library checks them itself, so a
# non-Python host on an older CPU also falls back to the function bodies instead of dying on SIGILL.
GCC_CPU_NAMES = ("sse4.1", "sse4.2", "avx", "avx2", "fma", "bmi2", "avx512f", "avx512vl", "avx512bw", "avx512dq",
                 "avx512cd", "avx512vnni", "avx512bf16", "avx512vbmi")

# aarch64 features -> their bit in the auxiliary vector (AT_HWCAP, AT_HWCAP2), as Linux's asm/hwcap.h numbers them.
AARCH64_HWCAPS = {"neon": ("AT_HWCAP", 1 << 1), "dotprod": ("AT_HWCAP", 1 << 20), "sve": ("AT_HWCAP", 1 << 22),
                  "fp16": ("AT_HWCAP", 1 << 9), "i8mm": ("AT_HWCAP2", 1 << 13)}

# The dot-product instructions a row may list, by name: a new one's file is imported above and named here.
_DOT = {m.INSTRUCTION.name: m.INSTRUCTION for m in (avx512_vnni, avx_vnni, avx2_u8s8, arm_sdot, arm_udot)}
# The matrix instructions (tiles: codegen/instructions/matrix.py), likewise.
_MATRIX = {i.name: i for i in amx.INSTRUCTIONS}

# Features the library itself checks when it registers its ops, carrying kernels without them for a CPU (or an OS)
# that lacks them: the matrix engine, which also needs the kernel's permission per process (glue/amx.c). A library
# for a target with them still loads on a CPU without them; only its vector kernels run there.
DISPATCHED_AT_RUN_TIME = ("amx-tile", "amx-int8", "amx-bf16", "amx-fp16")


@dataclass(frozen=True)
class IsaConfig:
    """One instruction set. In ROWS, `dot_instructions` and `runtime_check` list all the row may use or check;
    `isa_of` returns the row with only those the target has."""

    name: str
    arch: str  # the triple's first part ("x86_64", "aarch64"), or ANY_ARCH
    requires: tuple[str, ...]  # the LLVM features a target needs for this row
    vector_bits: int  # the width the kernels are written for
    micro_kernel: str  # the fp32 outer-product micro-kernel: a MicroKernel's name in microkernel/registry.py
    dot_instructions: tuple[str, ...] = ()  # int8 dot products (codegen/instructions names), best first
    # Matrix instructions (tiles rather than vectors: codegen/instructions/amx.py), best first; the kernels that use
    # one carry a vector variant too (DISPATCHED_AT_RUN_TIME).
    matrix_instructions: tuple[str, ...] = ()
    # The vector math's flavour: "avx512" may use the AVX-512 float32 intrinsics (vscalefps, vrcp14ps) on 16-lane
    # vectors, "portable" writes plain LLVM IR.
    vmath: str = "portable"
    # How the int8 conv reads its 256-byte tables (TABLE_LOOKUPS: the first the target has): "permute_bytes" (AVX-512
    # VBMI's vpermi2b on the table held in 4 registers), "gather_dwords" (AVX2's vpgatherdd at byte offsets) or
    # "lanes" (a load a lane).
    table_lookup: str = "lanes"
    # The LLVM features the library checks at load time before it registers its ops, when the target enables them:
    # __builtin_cpu_supports names on x86-64 (GCC_CPU_NAMES), HWCAP bits on aarch64 (AARCH64_HWCAPS).
    runtime_check: tuple[str, ...] = ()

    def lanes(self, dtype_bytes: int) -> int:
        """Elements of `dtype_bytes` bytes in one vector."""
        return self.vector_bits // (8 * dtype_bytes)

    @property
    def float32_lanes(self) -> int:
        return self.lanes(4)


_X86 = dict(arch="x86_64", runtime_check=GCC_CPU_NAMES)
_ARM = dict(arch="aarch64", runtime_check=tuple(AARCH64_HWCAPS))

# Best first within an architecture: isa_of takes the first row whose requirements the target has, so no row may
# require a subset of what a later row of its architecture requires.
ROWS = (
    IsaConfig("avx512", requires=("avx512f",), vector_bits=512, micro_kernel="avx512_fp32_outer_product",
              dot_instructions=("avx512_vnni", "avx_vnni", "avx2_u8s8"),
              matrix_instructions=tuple(i.name for i in amx.INSTRUCTIONS), vmath="avx512", **_X86),
    IsaConfig("avx2", requires=("avx2", "fma"), vector_bits=256, micro_kernel="avx2_fp32_outer_product",
              dot_instructions=("avx_vnni", "avx2_u8s8"), **_X86),
    # AVX2 without FMA: 8 lanes, but the fp32 micro-kernel needs the FMAs; the int8 one does not.
    IsaConfig("avx2-nofma", requires=("avx2",), vector_bits=256, micro_kernel="sse_fp32_outer_product",
              dot_instructions=("avx_vnni", "avx2_u8s8"), **_X86),
    IsaConfig("avx", requires=("avx",), vector_bits=256, micro_kernel="sse_fp32_outer_product", **_X86),
    IsaConfig("sse", requires=(), vector_bits=128, micro_kernel="sse_fp32_outer_product", **_X86),
    IsaConfig("neon-dotprod", requires=("dotprod",), vector_bits=128, micro_kernel="sse_fp32_outer_product",
              dot_instructions=("arm_sdot", "arm_udot"), **_ARM),
    # NEON is part of Armv8-A's base: every aarch64 target has this row. Its fp32 micro-kernel is the 4-lane one.
    IsaConfig("neon", requires=(), vector_bits=128, micro_kernel="sse_fp32_outer_product", **_ARM),
    IsaConfig("generic", arch=ANY_ARCH, requires=(), vector_bits=128, micro_kernel="sse_fp32_outer_product"),
)


# The int8 conv's table lookups, best first, with the x86-64 features each needs. A 64-byte vpermi2b pair reads 64
# entries in 4 instructions where vpgatherdd reads 8 or 16 at a dword load each (slow on AMD's cores, and on Intel's
# since the microcode fix for Gather Data Sampling).
TABLE_LOOKUPS = (("permute_bytes", ("avx512vbmi", "avx512bw")), ("gather_dwords", ("avx2",)))


def isa_of(target) -> IsaConfig:
    """The row of `target` (a codegen.target.Target, or anything with its `arch`, `triple`, `features` and `has`),
    with the dot-product and matrix instructions it has (each one's own `available` check) and the features its library
    checks. An empty `arch` (an LLVM module without a triple) matches the rows of every architecture."""
    global _cached_rows
    if _cached_rows is not ROWS:  # a row added (a test's monkeypatch): forget what the old table said
        _cache.clear()
        _cached_rows = ROWS
    key = (target.arch, tuple(target.features))
    row = _cache.get(key)
    if row is None:
        row = _cache[key] = _row_of(ROWS, *key)
    return row


_cache: dict[tuple[str, tuple[str, ...]], IsaConfig] = {}  # Target.vector_bits asks often
_cached_rows = None


def _row_of(rows: tuple[IsaConfig, ...], arch: str, features: tuple[str, ...]) -> IsaConfig:
    have = frozenset(features)
    target = Features(arch, features)  # what each instruction's `available` reads
    for row in rows:
        if (not arch or row.arch in (arch, ANY_ARCH)) and have.issuperset(row.requires):
            return dataclasses.replace(
                row,
                dot_instructions=tuple(n for n in row.dot_instructions if _DOT[n].available(target)),
                matrix_instructions=tuple(n for n in row.matrix_instructions if _MATRIX[n].available(target)),
                runtime_check=tuple(f for f in features if f in row.runtime_check),
                table_lookup=_table_lookup(row.arch, have))
    raise LookupError(f"no ISA row for {arch} with {sorted(have)}: ROWS ends with an {ANY_ARCH} row needing nothing")


def _table_lookup(arch: str, have: frozenset) -> str:
    if arch == "x86_64":
        for name, needs in TABLE_LOOKUPS:
            if have.issuperset(needs):
                return name
    return "lanes"


@dataclass(frozen=True)
class Features:
    """A target known only by its triple (or architecture) and features: what `vmath.isa.set_features` knows of a
    module's target."""

    triple: str
    features: tuple[str, ...]

    @property
    def arch(self) -> str:
        """The triple's first part; "" for none (llvmlite's default triple, "unknown-unknown-unknown")."""
        arch = self.triple.split("-")[0]
        return "" if arch == "unknown" else arch

    def has(self, feature: str) -> bool:
        return feature in self.features
