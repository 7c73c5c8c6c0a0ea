"""Compile targets: which machine the generated kernels are for.

A kernel compiled with the host's features (say AVX-512) dies with SIGILL on an older CPU, so every library is built
for an explicit target and records the CPU features it needs; the runtime checks them before it registers anything.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
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
    "amx-fp16": "amx_fp16",
    "avx512fp16": "avx512_fp16",
}

# aarch64: LLVM feature name -> the flag Linux prints on the "Features" line of /proc/cpuinfo.
AARCH64_TO_CPUINFO = {"neon": "asimd", "dotprod": "asimddp", "i8mm": "i8mm", "sve": "sve", "fp16": "fphp"}
AARCH64_TRIPLE = "aarch64-unknown-linux-gnu"
# `--target aarch64`: any Armv8-A Linux machine (NEON is part of the base); `aarch64-dotprod`: Armv8.2-A's dot
# products as well (Neoverse N1, Cortex-A76, Graviton 2 and later), what the int8 kernels need.
_AARCH64_PRESETS = {"aarch64": ("generic", ["neon"]), "aarch64-dotprod": ("neoverse-n1", ["neon", "dotprod"])}

# The x86-64 micro-architecture levels, as LLVM knows them.
_LEVELS = {
    "x86-64": [],
    "x86-64-v2": ["sse4.1", "sse4.2"],
    "x86-64-v3": ["sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "bmi2"],
    "x86-64-v4": ["sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "bmi2",
                  "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"],
}


_V4_VNNI = _LEVELS["x86-64-v4"] + ["avx512vnni"]
_VBMI = ["avx512vbmi"]  # Ice Lake on, Zen 4 on; not Cascade or Cooper Lake
_AMX = ["avx512bf16", "avxvnni", "avx512fp16", "amx-tile", "amx-int8", "amx-bf16"]
# What `cpu=NAME` implies, as LLVM's CPU definitions (X86.td) give them, kept to the features that change the code
# onnxopt writes or checks: LLVM itself compiles for all of a CPU's features, but the ISA table, the library's CPU
# check and the matrix-engine kernels read the target's list, so `cpu=sapphirerapids` must name AMX. A CPU missing
# here gets its x86-64 level's features (if it is one) plus the ones written after it.
CPU_FEATURES = {
    **{cpu: _LEVELS["x86-64-v3"] for cpu in ("haswell", "broadwell", "skylake", "znver1", "znver2", "znver3")},
    "alderlake": _LEVELS["x86-64-v3"] + ["avxvnni"],
    "skylake-avx512": _LEVELS["x86-64-v4"],
    "cascadelake": _V4_VNNI,
    **{cpu: _V4_VNNI + _VBMI for cpu in ("icelake-server", "icelake-client", "tigerlake", "rocketlake")},
    "cooperlake": _V4_VNNI + ["avx512bf16"],
    "znver4": _V4_VNNI + _VBMI + ["avx512bf16"],
    "znver5": _V4_VNNI + _VBMI + ["avx512bf16", "avxvnni"],
    "sapphirerapids": _V4_VNNI + _VBMI + _AMX,
    "emeraldrapids": _V4_VNNI + _VBMI + _AMX,
    "graniterapids": _V4_VNNI + _VBMI + _AMX + ["amx-fp16"],
}


@dataclass(frozen=True)
class Target:
    """An LLVM target: triple, CPU name and the ISA features the code may use."""

    name: str
    triple: str
    cpu: str
    features: tuple[str, ...]  # enabled LLVM feature names, without the '+'
    # The backend that lowers, compiles and links for it (onnxopt/backends/): "llvm" (these LLVM IR kernels), "c"
    # (plain C through the system compiler), "cuda".
    backend: str = "llvm"

    @property
    def llvm_features(self) -> str:
        return ",".join("+" + f for f in self.features)

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def arch(self) -> str:
        """The instruction set: "x86_64" or "aarch64" (the triple's first part)."""
        return self.triple.split("-")[0]

    @property
    def foreign(self) -> bool:
        """Code for another architecture than this process's: it cannot run here (only under an emulator)."""
        return self.arch != _host_arch()

    @property
    def vector_bits(self) -> int:
        """Width of the vector registers the kernels are written for (its ISA row: codegen/isa.py)."""
        from .isa import isa_of

        return isa_of(self).vector_bits

    @property
    def execution_provider(self) -> str:
        """The onnxruntime execution provider the library's ops are registered for (the glue's op_ep): where their
        inputs and outputs live: the CUDA backend's on the GPU, every other on the CPU."""
        return "CUDAExecutionProvider" if self.backend == "cuda" else "CPUExecutionProvider"

    @property
    def float32_lanes(self) -> int:
        from .isa import isa_of

        return isa_of(self).lanes(4)

    @property
    def required_cpu_flags(self) -> list[str]:
        """The /proc/cpuinfo flags a CPU needs to run this target's code: not the matrix engine's, which the library
        checks itself and runs its vector kernels without (codegen/isa.py DISPATCHED_AT_RUN_TIME)."""
        from .isa import DISPATCHED_AT_RUN_TIME

        names = AARCH64_TO_CPUINFO if self.arch == "aarch64" else LLVM_TO_CPUINFO
        return sorted({names[f] for f in self.features if f in names and f not in DISPATCHED_AT_RUN_TIME})

    def to_dict(self) -> dict:
        return {"name": self.name, "triple": self.triple, "cpu": self.cpu, "features": list(self.features),
                "backend": self.backend}


def _llvm():
    import llvmlite.binding as llvm

    # Newer llvmlite initializes the core itself and rejects llvm.initialize(); older ones need it.
    try:
        llvm.initialize()
    except Exception:  # noqa: BLE001 - the deprecation error is the expected case on llvmlite >= 0.45
        pass
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_all_targets()  # --target aarch64 on an x86-64 host, and back
    llvm.initialize_all_asmprinters()
    return llvm


def _host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


# Run everything as if this host were an older x86-64 level: ONNXOPT_HOST_LEVEL=x86-64-v3 on an AVX-512 machine
# makes "native" an AVX2 target and hides AVX-512 from every CPU check, so one machine proves what an AVX2 host sees.
HOST_LEVEL_ENV = "ONNXOPT_HOST_LEVEL"


def host_level() -> str | None:
    """The x86-64 level the host is capped at (ONNXOPT_HOST_LEVEL), or None."""
    level = os.environ.get(HOST_LEVEL_ENV, "").strip()
    if not level:
        return None
    if level not in _LEVELS:
        raise UsageError(f"{HOST_LEVEL_ENV}={level}: give one of {', '.join(_LEVELS)}, or unset it")
    return level


def _vector_feature(f: str) -> bool:
    """An LLVM feature that widens or adds vector instructions (what a host level caps)."""
    return f in LLVM_TO_CPUINFO or f.startswith(("avx", "amx", "sse4", "vpclmul", "vaes", "gfni"))


def _vector_flag(flag: str) -> bool:
    """The same for /proc/cpuinfo flags."""
    return flag in LLVM_TO_CPUINFO.values() or flag.startswith(("avx", "amx", "sse4", "vpclmul", "vaes", "gfni"))


@functools.lru_cache(maxsize=None)
def _host_target(level: str | None) -> Target:
    llvm = _llvm()
    feats = llvm.get_host_cpu_features()
    enabled = sorted(k for k, v in feats.items() if v)
    cpu = llvm.get_host_cpu_name()
    if level is not None:
        allowed = set(_LEVELS[level])
        enabled = [f for f in enabled if not _vector_feature(f) or f in allowed]
        cpu = level  # a CPU name implies its own features; the level's name implies only the level's
    return Target("native", llvm.get_process_triple(), cpu, tuple(enabled))


def host_target() -> Target:
    """The host as a compile target ("native"), capped at ONNXOPT_HOST_LEVEL when that is set."""
    return _host_target(host_level())


def parse_target(spec: str | None) -> Target:
    """`native` (default), an x86-64 level (`x86-64-v3`, `x86-64-v4`), `aarch64`, `aarch64-dotprod`, or
    `cpu=NAME,+feat,+feat` (an x86-64 or an aarch64 CPU, as LLVM names them: `cpu=neoverse-n1,+dotprod`)."""
    if spec in (None, "", "native", "host"):
        return host_target()
    if spec in _AARCH64_PRESETS:
        cpu, feats = _AARCH64_PRESETS[spec]
        return Target(spec, AARCH64_TRIPLE, cpu, tuple(sorted(feats)))
    if _host_arch() != "x86_64":
        raise UsageError(f"--target {spec}: only 'native' and the aarch64 targets are supported on "
                         f"{platform.machine()} for now")
    triple = host_target().triple
    if spec in _LEVELS:
        return Target(spec, triple, spec, tuple(sorted(_LEVELS[spec])))
    if spec.startswith("cpu="):
        parts = spec.split(",")
        cpu = parts[0][4:]
        feats = []
        for p in parts[1:]:
            if not p.startswith("+") or len(p) < 2:
                raise UsageError(f"--target {spec}: features are written '+name', got '{p}'")
            feats.append(p[1:])
        x86 = Target(spec, triple, cpu, tuple(sorted(set(CPU_FEATURES.get(cpu, _LEVELS.get(cpu, [])) + feats))))
        complaint = _llvm_complaints(x86.triple, x86.cpu, x86.llvm_features)
        if not complaint:
            return x86
        arm = Target(spec, AARCH64_TRIPLE, cpu, tuple(sorted(set(["neon"] + feats))))
        if not _llvm_complaints(arm.triple, arm.cpu, arm.llvm_features):
            return arm
        raise UsageError(f"--target {spec}: LLVM does not accept it ({complaint.strip()}); give a CPU name "
                         "LLVM knows (such as skylake-avx512, znver3, x86-64-v3, neoverse-n1) and features it knows")
    raise UsageError(
        f"unknown --target '{spec}': use 'native', one of {', '.join(_LEVELS)}, 'aarch64', 'aarch64-dotprod', or "
        "'cpu=NAME,+feature,...'"
    )


@functools.lru_cache(maxsize=None)
def _llvm_complaints(triple: str, cpu: str, features: str) -> str:
    """What LLVM says when it compiles a tiny function for this CPU and these features, in a child process: it
    stops the whole process on some of them (a CPU name it does not know)."""
    code = ("import llvmlite.binding as b\n"
            "try:\n    b.initialize()\nexcept Exception:\n    pass\n"
            "b.initialize_all_targets(); b.initialize_all_asmprinters()\n"
            f"m = b.parse_assembly('target triple = \"{triple}\"\\ndefine i32 @f(i32 %x) {{\\n  ret i32 %x\\n}}\\n')\n"
            f"tm = b.Target.from_triple({triple!r}).create_target_machine(cpu={cpu!r}, features={features!r})\n"
            "tm.emit_object(m)\n")
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "LLVM did not finish compiling a tiny function for it"
    said = (r.stderr or "").strip().splitlines()
    if r.returncode != 0:
        return said[-1] if said else f"LLVM exited with status {r.returncode}"
    return next((line for line in said if "not a recognized" in line), "")


def host_cpu_flags() -> set[str]:
    """The CPU flags of the machine we are running on (Linux /proc/cpuinfo), less those above ONNXOPT_HOST_LEVEL."""
    flags = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    if flags is None:  # not Linux: ask LLVM instead, translated to cpuinfo spelling
        flags = {LLVM_TO_CPUINFO[f] for f in host_target().features if f in LLVM_TO_CPUINFO}
    return cap_cpu_flags(flags)


def cap_cpu_flags(flags: set[str]) -> set[str]:
    """`flags` without the vector extensions above ONNXOPT_HOST_LEVEL (all of them when it is not set)."""
    level = host_level()
    if level is None:
        return set(flags)
    allowed = {LLVM_TO_CPUINFO[f] for f in _LEVELS[level] if f in LLVM_TO_CPUINFO}
    return {f for f in flags if not _vector_flag(f) or f in allowed}


def missing_cpu_flags(required: list[str]) -> list[str]:
    have = host_cpu_flags()
    return [f for f in required if f not in have]
