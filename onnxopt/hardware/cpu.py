"""What the OS says about the CPU: its name, ISA flags, usable cores, clock, cache levels and free memory."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path



# /proc/cpuinfo flags that matter to the kernels we emit (x86 and Arm spellings).
_ISA_FLAGS = (
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c",
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512ifma", "avx512vbmi", "avx512_vbmi2",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "avx_vnni_int8",
    "amx_tile", "amx_int8", "amx_bf16", "amx_fp16",
    "asimd", "asimddp", "asimdhp", "fphp", "i8mm", "bf16", "sve", "sve2", "sme",
)



# --------------------------------------------------------------------------------------------------------------
# What the OS says about the CPU


def _cpuinfo() -> dict[str, str]:
    """The first processor block of /proc/cpuinfo (empty off Linux)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    if out:
                        break
                    continue
                if ":" in line:
                    k, v = line.split(":", 1)
                    out.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    return out


def cpu_name() -> str:
    info = _cpuinfo()
    for key in ("model name", "Model", "Hardware", "cpu model"):
        if info.get(key):
            return info[key]
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_flags() -> set[str]:
    info = _cpuinfo()
    flags = info.get("flags") or info.get("Features") or ""
    from onnxopt.codegen.target import cap_cpu_flags, host_cpu_flags

    if flags:
        return cap_cpu_flags(set(flags.split()))

    return host_cpu_flags()


def isa_flags() -> list[str]:
    have = cpu_flags()
    return [f for f in _ISA_FLAGS if f in have]


def usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_mhz() -> dict[str, float]:
    """Clock rates we can read: 'nominal' (/proc/cpuinfo 'cpu MHz') and 'max' (cpufreq's cpuinfo_max_freq)."""
    out: dict[str, float] = {}
    mhz = _cpuinfo().get("cpu MHz")
    if mhz:
        try:
            out["nominal"] = float(mhz)
        except ValueError:
            pass
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            out["max"] = int(f.read().strip()) / 1000.0  # kHz -> MHz
    except (OSError, ValueError):
        pass
    return out


def _parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.I)
    if not m:
        raise ValueError(text)
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def _parse_cpu_list(text: str) -> frozenset[int]:
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            cpus.update(range(int(a), int(b) + 1))
        else:
            cpus.add(int(part))
    return frozenset(cpus)


@dataclass(frozen=True)
class CacheLevel:
    level: int
    instance_bytes: int  # size of one instance (what one core can use)
    instances: int  # instances that serve the usable CPUs
    cpus_per_instance: int  # usable CPUs sharing one instance

    @property
    def total_bytes(self) -> int:
        return self.instance_bytes * self.instances


def cache_levels(cpus: list[int] | None = None) -> list[CacheLevel]:
    """Data/unified caches from sysfs, from the closest level; falls back to sysconf, then to common defaults."""
    cpus = cpus or usable_cpus()
    found: dict[int, dict[frozenset[int], int]] = {}
    for cpu in cpus:
        base = Path(f"/sys/devices/system/cpu/cpu{cpu}/cache")
        try:
            entries = sorted(base.glob("index*"))
        except OSError:
            entries = []
        for d in entries:
            try:
                kind = (d / "type").read_text().strip()
                if kind == "Instruction":
                    continue
                level = int((d / "level").read_text())
                size = _parse_size((d / "size").read_text())
                shared = _parse_cpu_list((d / "shared_cpu_list").read_text())
            except (OSError, ValueError):
                continue
            found.setdefault(level, {})[shared or frozenset([cpu])] = size
    usable = set(cpus)
    out = []
    for level in sorted(found):
        inst = found[level]
        size = max(inst.values())
        sharing = max(1, max(len(s & usable) for s in inst))
        out.append(CacheLevel(level, size, len(inst), sharing))
    if out:
        return out
    return _fallback_cache_levels(len(cpus))


def _fallback_cache_levels(ncpu: int) -> list[CacheLevel]:
    """lscpu's usual answer where sysfs is missing: glibc's sysconf, else 32 KiB L1d, 1 MiB L2 per core and
    2 MiB of shared L3 per core."""
    names = {1: "SC_LEVEL1_DCACHE_SIZE", 2: "SC_LEVEL2_CACHE_SIZE", 3: "SC_LEVEL3_CACHE_SIZE"}
    defaults = {1: 32 << 10, 2: 1 << 20, 3: (2 << 20) * ncpu}
    out = []
    for level, name in names.items():
        size = 0
        try:
            size = int(os.sysconf(name)) if name in os.sysconf_names else 0
        except (OSError, ValueError):
            size = 0
        size = size if size > 0 else defaults[level]
        shared = level == 3
        out.append(CacheLevel(level, size, 1 if shared else ncpu, ncpu if shared else 1))
    return out


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# --------------------------------------------------------------------------------------------------------------
# Generated kernels
