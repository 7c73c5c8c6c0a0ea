"""Build our kernels for a small model's elementwise regions and run them in onnxruntime next to the original.

Used by the kernel tests: the reference is onnxruntime itself running the original nodes.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import helper

from onnxopt.backends import backend_of
from onnxopt.codegen.glue.library import link_library
from onnxopt.codegen.target import Target, host_target
from onnxopt.emit.model import build_fused_model
from onnxopt.fusion.elementwise import ElementwiseRule
from onnxopt.kinds.builtin import ELEMENTWISE
from onnxopt.timing import make_session


def make_model(nodes, inputs, outputs, initializers=(), opset=17):
    g = helper.make_graph(nodes, "t", inputs, outputs, initializer=list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def fuse(model: onnx.ModelProto, tmpdir, min_ops: int = 1, target: Target | None = None):
    """Returns (fused model, library path, regions); the kernels built by the target's backend (LLVM, or C for a
    `c:` target)."""
    target = target or host_target()
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    regions = ElementwiseRule(inferred, min_ops=min_ops).find_regions()
    assert regions, "no region found"
    objs, descs = [], []
    seen = {}
    for r in regions:
        r.compute_op_type(target.name + target.llvm_features + f"rank{len(r.shape)}")
        if r.op_type in seen:
            continue
        obj, desc, _ = backend_of(target).lower(ELEMENTWISE, r, target)
        seen[r.op_type] = True
        objs.append(obj)
        descs.append(desc)
    lib = os.path.join(str(tmpdir), f"k{abs(hash(tuple(seen)))}.so")
    sha = link_library(descs, objs, target, lib)
    fused = build_fused_model(inferred, regions, os.path.basename(lib), sha, target.to_dict(),
                              target.required_cpu_flags)
    return fused, lib, regions


def run_both(model, fused, lib, feeds):
    import pytest

    try:
        ref = make_session(model, 1, optimization="none")
    except Exception as e:  # noqa: BLE001
        if "NOT_IMPLEMENTED" in str(e):
            pytest.skip(f"onnxruntime has no CPU kernel for the reference: {str(e).splitlines()[0][-80:]}")
        raise
    want = ref.run(None, feeds)
    got = make_session(fused, 2, library=lib).run(None, feeds)
    return want, got


def assert_close(want, got, rtol=1e-5, atol=1e-6):
    for a, b in zip(want, got):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        if a.dtype.kind == "f":
            np.testing.assert_allclose(b, a, rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(b, a)


def jit_function(ir_text: str, target: Target, name: str, nargs: int):
    """(a ctypes function of `nargs` pointer-sized arguments returning nothing, its execution engine: keep it alive
    while calling) for function `name` of the LLVM IR, compiled by MCJIT for `target`."""
    import ctypes

    from onnxopt.codegen.compile import optimize
    from onnxopt.codegen.target import _llvm

    llvm = _llvm()
    machine = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.llvm_features, opt=2, codemodel="jitdefault")
    engine = llvm.create_mcjit_compiler(optimize(ir_text, target), machine)
    engine.finalize_object()
    return ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * nargs)(engine.get_function_address(name)), engine
