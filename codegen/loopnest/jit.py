"""Run a Kernel in this process (MCJIT), on numpy arrays: for tests and for tuners that measure schedules."""

from __future__ import annotations

import ctypes

import numpy as np

from ..compile import optimize
from ..target import _llvm
from .build import Kernel

NUMPY_DTYPE = {"float32": np.float32, "int32": np.int32}


class JitFunction:
    def __init__(self, kernel: Kernel):
        llvm = _llvm()
        self.kernel = kernel
        module = optimize(kernel.ir, kernel.target)
        machine = llvm.Target.from_triple(kernel.target.triple).create_target_machine(
            cpu=kernel.target.cpu, features=kernel.target.llvm_features, opt=3, codemodel="jitdefault")
        self._engine = llvm.create_mcjit_compiler(module, machine)  # owns the code; keep it alive
        self._engine.finalize_object()
        address = self._engine.get_function_address(kernel.name)
        if not address:
            raise RuntimeError(f"JIT: no address for {kernel.name}")
        pointers = [ctypes.c_void_p] * len(kernel.args)
        self._fn = ctypes.CFUNCTYPE(None, *pointers, ctypes.c_int64, ctypes.c_int64)(address)

    def __call__(self, *arrays: np.ndarray, begin: int = 0, end: int | None = None) -> None:
        """Run iterations [begin, end) of the range loop (all of them by default) on C-contiguous arrays."""
        args = self.kernel.args
        if len(arrays) != len(args):
            raise TypeError(f"{self.kernel.name} takes {len(args)} arrays ({', '.join(t.name for t in args)}), "
                            f"got {len(arrays)}")
        for array, tensor in zip(arrays, args):
            if array.dtype != NUMPY_DTYPE[tensor.dtype] or array.shape != tensor.shape:
                raise TypeError(f"{tensor.name}: expected {tensor.dtype}{list(tensor.shape)}, "
                                f"got {array.dtype}{list(array.shape)}")
            if not array.flags.c_contiguous:
                raise TypeError(f"{tensor.name}: the array must be C-contiguous")
        if not arrays[-1].flags.writeable:
            raise TypeError(f"{args[-1].name}: the output array is read-only")
        end = self.kernel.range_extent if end is None else end
        self._fn(*[a.ctypes.data for a in arrays], begin, end)
