"""Compile targets: which machine the generated kernels are for.

A kernel compiled with the host's features (say AVX-512) dies with SIGILL on an older CPU, so every library is built
for an explicit target and records the CPU features it needs; the runtime checks them before it registers anything.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

from onnxopt.errors import UsageError

# LLVM feature name -> the flag Linux prints in /proc/cpuinfo. Only features that change the code we emit matter.
LLVM_TO_CPUINFO = {
    "sse4.1": "sse4_1",
    "sse4.2": "sse4_2",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "bmi2": "bmi2",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512dq": "avx512dq",
    "avx512vl": "avx512vl",
    "avx512cd": "avx512cd",
    "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16",
    "avxvnni": "avx_vnni",
    "amx-tile": "amx_tile",
    "amx-int8": "amx_int8",
    "amx-bf16": "amx_bf16",
}

# The x86-64 micro-architecture levels, as LLVM knows them.
_LEVELS = {
    "x86-64": [],
    "x86-64-v2": ["sse4.1", "sse4.2"],
    "x86-64-v3": ["sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "bmi2"],
    "x86-64-v4": ["sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "bmi2",
                  "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"],
}


@dataclass(frozen=True)
class Target:
    """An LLVM target: triple, CPU name and the ISA features the code may use."""

    name: str
    triple: str
    cpu: str
    features: tuple[str, ...]  # enabled LLVM feature names, without the '+'

    @property
    def llvm_features(self) -> str:
        return ",".join("+" + f for f in self.features)

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def vector_bits(self) -> int:
        """Width of the vector registers the kernels are written for."""
        if self.has("avx512f"):
            return 512
        if self.has("avx2") or self.has("avx"):
            return 256
        return 128

    @property
    def float32_lanes(self) -> int:
        return self.vector_bits // 32

    @property
    def required_cpu_flags(self) -> list[str]:
        """The /proc/cpuinfo flags a CPU needs to run this target's code."""
        return sorted({LLVM_TO_CPUINFO[f] for f in self.features if f in LLVM_TO_CPUINFO})

    def to_dict(self) -> dict:
        return {"name": self.name, "triple": self.triple, "cpu": self.cpu, "features": list(self.features)}


def _llvm():
    import llvmlite.binding as llvm

    # Newer llvmlite initializes the core itself and rejects llvm.initialize(); older ones need it.
    try:
        llvm.initialize()
    except Exception:  # noqa: BLE001 - the deprecation error is the expected case on llvmlite >= 0.45
        pass
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm


@functools.lru_cache(maxsize=None)
def host_target() -> Target:
    llvm = _llvm()
    feats = llvm.get_host_cpu_features()
    enabled = tuple(sorted(k for k, v in feats.items() if v))
    return Target("native", llvm.get_process_triple(), llvm.get_host_cpu_name(), enabled)


def parse_target(spec: str | None) -> Target:
    """`native` (default), an x86-64 level (`x86-64-v3`, `x86-64-v4`), or `cpu=NAME,+feat,+feat`."""
    if spec in (None, "", "native", "host"):
        return host_target()
    if platform.machine() not in ("x86_64", "AMD64"):
        raise UsageError(f"--target {spec}: only 'native' is supported on {platform.machine()} for now")
    triple = host_target().triple
    if spec in _LEVELS:
        return Target(spec, triple, spec, tuple(sorted(_LEVELS[spec])))
    if spec.startswith("cpu="):
        parts = spec.split(",")
        cpu = parts[0][4:]
        base = list(_LEVELS.get(cpu, []))
        for p in parts[1:]:
            if not p.startswith("+"):
                raise UsageError(f"--target {spec}: features are written '+name', got '{p}'")
            base.append(p[1:])
        return Target(spec, triple, cpu, tuple(sorted(set(base))))
    raise UsageError(
        f"unknown --target '{spec}': use 'native', one of {', '.join(_LEVELS)}, or 'cpu=NAME,+feature,...'"
    )


def host_cpu_flags() -> set[str]:
    """The CPU flags of the machine we are running on (Linux /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    # Not Linux: ask LLVM instead, translated to cpuinfo spelling.
    return {LLVM_TO_CPUINFO[f] for f in host_target().features if f in LLVM_TO_CPUINFO}


def missing_cpu_flags(required: list[str]) -> list[str]:
    have = host_cpu_flags()
    return [f for f in required if f not in have]
