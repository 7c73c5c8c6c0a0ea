"""A foreign target's libraries run for real on this host: onnxruntime's own aarch64 build, in Debian's aarch64
Python, under qemu-aarch64 (user-mode emulation of the instructions, Linux's system calls passed through).

scripts/aarch64_sysroot.sh makes the environment once (the cross compiler, qemu-user, and a sysroot with Python,
numpy and onnxruntime); `unavailable` says what is missing where it was not made. qemu emulates the CPU named by
`cpu` (neoverse-n1 has the dot products; cortex-a53, an Armv8.0 core, has none), and reports its features to the
program as Linux would, so the library's own CPU check (library.py `_cpu_check`) sees them too. Results are exact
emulation, not speed: timings under qemu mean nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile

import numpy as np

from onnxopt.errors import ToolchainError

SYSROOT_ENV = "ONNXOPT_AARCH64_SYSROOT"
_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "emulated_session.py")


def sysroot() -> str:
    """Where scripts/aarch64_sysroot.sh put the aarch64 environment."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get(SYSROOT_ENV) or os.path.join(cache, "onnxopt", "aarch64")


def unavailable(arch: str = "aarch64") -> str | None:
    """Why `arch`'s libraries cannot be run here, or None when they can."""
    if arch != "aarch64":
        return f"no emulator is set up for {arch}"
    if not shutil.which("qemu-aarch64"):
        return "qemu-aarch64 is not installed (Debian's qemu-user; scripts/aarch64_sysroot.sh installs it)"
    if not os.path.exists(os.path.join(sysroot(), "stamp")):
        return f"no aarch64 sysroot at {sysroot()} (make it with scripts/aarch64_sysroot.sh)"
    return None


def run_sessions(jobs: list[dict], cpu: str = "neoverse-n1", timeout: float = 1800.0) -> list[list[np.ndarray]]:
    """Runs each job, {"model": path, "library": path or None, "inputs": {name: array}, "threads": n (default 1),
    "optimization": "all" (default) or "none" (onnxruntime's graph optimizations off)}, in onnxruntime under
    qemu-aarch64 emulating `cpu`, all in one emulated process (its start, about 5 s, is the cost); returns each
    job's outputs."""
    why = unavailable("aarch64")
    if why:
        raise ToolchainError(f"cannot run aarch64 code here: {why}")
    root = sysroot()
    with tempfile.TemporaryDirectory(prefix="onnxopt-qemu-") as folder:
        spec, counts = [], []
        for i, job in enumerate(jobs):
            inputs = {}
            for n, (name, value) in enumerate(job["inputs"].items()):
                inputs[name] = f"in_{i}_{n}.npy"
                np.save(os.path.join(folder, inputs[name]), np.asarray(value))
            n_out = _output_count(job["model"])
            counts.append(n_out)
            spec.append({"model": os.path.abspath(job["model"]),
                         "library": os.path.abspath(job["library"]) if job.get("library") else None,
                         "inputs": inputs, "outputs": [f"out_{i}_{k}.npy" for k in range(n_out)],
                         "threads": int(job.get("threads", 1)),
                         "optimization": job.get("optimization", "all")})
        with open(os.path.join(folder, "jobs.json"), "w") as f:
            json.dump(spec, f)
        cmd = ["qemu-aarch64", "-cpu", cpu, "-L", os.path.join(root, "root"), "-E",
               f"PYTHONPATH={os.path.join(root, 'site')}", os.path.join(root, "root", "usr", "bin", "python3.11"),
               _RUNNER, folder]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ToolchainError(f"the emulated onnxruntime did not finish in {timeout:.0f} s") from None
        if r.returncode != 0:
            raise ToolchainError(f"the emulated onnxruntime failed (status {r.returncode}):\n"
                                 f"{r.stderr.strip()[-3000:]}")
        return [[np.load(os.path.join(folder, f"out_{i}_{k}.npy")) for k in range(n)]
                for i, n in enumerate(counts)]


def _output_count(model_path: str) -> int:
    import onnx

    return len(onnx.load(model_path, load_external_data=False).graph.output)


def qemu_cpu(target) -> str:
    """The CPU qemu emulates for `target`: its own where qemu has that model; for LLVM's `generic` (any Armv8-A),
    the plainest core, an Armv8.0 Cortex-A53, so that nothing newer can pass unnoticed; else qemu's `max`."""
    if target.cpu == "generic":
        return "cortex-a53"
    return target.cpu if target.cpu in _qemu_cpus() else "max"


def describe(target) -> str:
    """How `target`'s code runs here, for the report: qemu's binary and CPU, and the emulated onnxruntime."""
    with open(os.path.join(sysroot(), "stamp")) as f:
        stamp = f.read().split()
    ort = next((s for s in stamp if s.startswith("onnxruntime-")), "onnxruntime")
    return f"qemu-aarch64 -cpu {qemu_cpu(target)}, {ort.replace('-', ' ')}"


_CPUS: list[str] = []


def _qemu_cpus() -> list[str]:
    if not _CPUS:
        r = subprocess.run(["qemu-aarch64", "-cpu", "help"], capture_output=True, text=True)
        _CPUS.extend(line.split()[0] for line in r.stdout.splitlines()[1:] if line.strip())
    return _CPUS
