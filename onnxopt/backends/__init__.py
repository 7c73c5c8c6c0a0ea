"""Backends: what the driver asks of the code generator and nothing else.

A backend is one folder here with a `BACKEND` (a `Backend`) in its `__init__.py` and a row in BACKENDS below:

    targets         which `--target` texts are its (`owns`), and the Target each one means (`parse_target`)
    layout policy   the lanes of the blocked layouts and the register tile the fusion rules plan for, or None
                    where it plans plain layouts only (`layout`)
    lowering        a kind's lowering for it (`lower`): the kind's own (Kind.lowering(name)); a kind with none
                    here is not fused (`families_not_lowered`, which the driver adds to the kinds it skips)
    compile, link   source -> object code (`compile`), descriptions + objects -> the library (`link`)
    execution       the onnxruntime execution provider its ops declare (`execution_provider`), and the sessions
                    that feed, check and time them (`session`)
    device check    why its kernels cannot run on this machine, or None (`cannot_run`)

llvm (LLVM IR through llvmlite, the kernels of codegen/) is the default; c (plain C through the system compiler)
runs the elementwise and row kinds anywhere a C compiler does; cuda compiles CUDA C offline with nvcc (its kernels,
library and registration come with the GPU issue, so the driver refuses it as a target for now).
"""

from __future__ import annotations

from collections.abc import Sequence

from onnxopt.codegen.target import Target

from .base import Backend


def _backends() -> tuple[Backend, ...]:
    from .c import BACKEND as C
    from .cuda import BACKEND as CUDA
    from .llvm import BACKEND as LLVM

    return (C, CUDA, LLVM)  # LLVM last: it takes every spec the others do not


def backend_named(name: str) -> Backend:
    for b in _backends():
        if b.name == name:
            return b
    raise KeyError(f"no backend named {name!r}: the backends are {', '.join(b.name for b in _backends())}")


def backend_of(target: Target) -> Backend:
    return backend_named(target.backend)


def parse_target(spec: str | None) -> Target:
    """The Target a `--target` text means, parsed by the backend it names (none: the LLVM backend's host)."""
    text = "native" if spec in (None, "") else spec
    return next(b for b in _backends() if b.owns(text)).parse_target(text)


def target_forms() -> Sequence[str]:
    return [b.target_help for b in _backends()]


__all__ = ["Backend", "backend_named", "backend_of", "parse_target", "target_forms"]
