"""The CUDA backend: kernels written as CUDA C++ and compiled offline by nvcc into a fat binary (the target's cubin
plus PTX the oldest supported driver can JIT), for onnxruntime's CUDA execution provider.

What lands here first (the seams issue): the target description (`cuda:sm_80|sm_89|sm_90`), the offline compile,
the device check through the CUDA driver loaded at run time (no GPU needed to import or build), and the elementwise
chains' kernel source (elementwise.py, the same C expressions as the C backend). The library's GPU side, the
registration for CUDAExecutionProvider, placement and the tensor-core kinds come with the GPU issue, so the driver
refuses a CUDA target (`unsupported`) until then.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile

from onnxopt.backends.base import Backend
from onnxopt.codegen.target import Target
from onnxopt.errors import ToolchainError, UsageError

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")
# The PTX in every binary is for this virtual architecture: the oldest GPU generation a target takes, so that a
# newer GPU's driver can JIT it.
PTX_ARCH = "compute_80"
TRIPLE = "nvptx64-nvidia-cuda"


def nvcc() -> str:
    for name in (os.environ.get("NVCC"), "nvcc", "/usr/local/cuda/bin/nvcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise ToolchainError("no nvcc found: install the CUDA toolkit (or the nvidia-cuda-nvcc wheel) or point $NVCC "
                         "at it")


def compile_cuda(source: str, target: Target) -> bytes:
    """CUDA C++ -> a fat binary: SASS for the target's architecture and PTX for PTX_ARCH."""
    from onnxopt.codegen.glue.library import write_sources

    sm = target.cpu
    with tempfile.TemporaryDirectory(prefix="onnxopt-cuda-") as tmp:
        src, out = os.path.join(tmp, "kernel.cu"), os.path.join(tmp, "kernel.fatbin")
        write_sources(tmp, [(src, source.encode())])
        cmd = [nvcc(), "-fatbin", "-O3", "-std=c++17", f"-gencode=arch=compute_{sm[3:]},code={sm}",
               f"-gencode=arch={PTX_ARCH},code={PTX_ARCH}", src, "-o", out]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise ToolchainError(f"nvcc could not compile a CUDA kernel:\n{r.stderr.strip()[-2000:]}")
        with open(out, "rb") as f:
            return f.read()


def _driver():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def device_problems(target: Target) -> list[str]:
    """What this machine lacks to run the target's kernels: a CUDA driver, a GPU, its compute capability."""
    cuda = _driver()
    if cuda is None:
        return ["a CUDA driver (libcuda.so.1)"]
    if cuda.cuInit(0) != 0:
        return ["a working CUDA driver (cuInit failed)"]
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return ["a CUDA GPU"]
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, 0)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, 0)
    have = major.value * 10 + minor.value
    want = int(target.cpu[3:])
    if have < want:
        return [f"a GPU of compute capability {want // 10}.{want % 10} or later (this one is "
                f"{major.value}.{minor.value})"]
    return []


class CudaBackend(Backend):
    name = "cuda"
    target_help = f"cuda:{'|'.join(ARCHS)} (compiles offline; not yet a --target of the optimizer)"

    def owns(self, spec: str) -> bool:
        return spec == "cuda" or spec.startswith("cuda:")

    def parse_target(self, spec: str) -> Target:
        sm = spec.partition(":")[2] or "sm_90"
        if sm not in ARCHS:
            raise UsageError(f"--target {spec}: give one of {', '.join('cuda:' + a for a in ARCHS)}")
        return Target(f"cuda:{sm}", TRIPLE, sm, (), backend="cuda")

    def unsupported(self) -> str:
        return ("the CUDA backend compiles kernels offline but cannot yet build a library or register its ops for "
                "onnxruntime's CUDA execution provider (the GPU issue): give a CPU target (native, x86-64-v3, c, ...)")

    def layout(self, target: Target):
        return None  # its tiles come from the tensor-core kinds' schedule spaces (the GPU issue)

    def compile(self, source: str, target: Target, **options) -> bytes:
        return compile_cuda(source, target)

    def link(self, descs, objects, target, output, **options) -> str:
        raise ToolchainError(self.unsupported())

    def cannot_run(self, target: Target) -> list[str]:
        return device_problems(target)


BACKEND = CudaBackend()
