"""A new kind is one folder (issue 45): a small row kernel written here, dropped into a temporary copy of the package,
is found, fused, built by both CPU backends (LLVM and C), checked, fallback-verified and reported, with no other
edit. Each step runs as a user runs it: the optimizer in a fresh process on the copy, the written model loaded
through `onnxopt.runtime` in another, where the library's own Compute counter must show the kernel ran."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxopt

# The kind: LpNormalization (p = 2) over the last axis, y = x / ||row||.
KIND_FILES = {
    "__init__.py": '''
        """Rows scaled to unit L2 norm (LpNormalization, p = 2, last axis): a kind dropped in by a test."""
        from ..base import Kind
        from . import c
        from .find import find_regions
        from .lower import build

        KIND = Kind(name="rownorm", find=find_regions, build=build, lowerings={"c": c.build})
    ''',
    "params.py": '''
        from dataclasses import dataclass
        from typing import ClassVar

        from onnxopt.fusion.params import KindParams


        @dataclass(frozen=True)
        class RowNormParams(KindParams):
            family: ClassVar[str] = "rownorm"
    ''',
    "find.py": '''
        from onnxopt.fusion.elementwise import ElementwiseRule, _attr
        from onnxopt.fusion.region import EwOp, EwProgram, Region, Value

        from .params import RowNormParams


        def find_regions(model, claimed, rejected=None):
            rule = ElementwiseRule(model)
            regions = []
            for i, node in enumerate(rule.index.nodes):
                if i in claimed or node.op_type != "LpNormalization":
                    continue
                ti = rule.info.get(node.input[0])
                rank = ti.rank if ti is not None else None
                if rule.dtype_of(node.input[0]) != "float32" or not rank or _attr(node, "p", 2) != 2 \\
                        or int(_attr(node, "axis", -1)) % rank != rank - 1:
                    if rejected is not None:
                        rejected.append({"nodes": [node.name], "reason": "rownorm: float32, p = 2, last axis only"})
                    continue
                x, y = node.input[0], node.output[0]
                program = EwProgram(inputs=[Value(x, "float32")], consts={},
                                    ops=[EwOp(node.op_type, (x,), y, "float32")], outputs=[Value(y, "float32")])
                region = Region("rownorm", [node], [x], [y], program, list(ti.shape or [None] * rank))
                region.params = RowNormParams()
                claimed.add(i)
                regions.append(region)
            return regions
    ''',
    "desc.py": '''
        from dataclasses import dataclass

        from ..base import c_signature


        @dataclass
        class RowNormKernelDesc:
            op_type: str
            rows: str
            in_types: tuple = (1,)  # ONNX's FLOAT
            out_types: tuple = (1,)

            def c_source(self, prefix):
                decls, sig = c_signature(prefix, self.op_type, "KIND_ROWNORM", self.in_types, self.out_types)
                return (f"extern void {self.rows}(const float *, float *, int64_t, int64_t);\\n{decls}"
                        f"static const onnxopt_rownorm_desc {prefix}_desc = {{{sig}, {self.rows}}};\\n")
    ''',
    "lower.py": '''
        from llvmlite import ir

        from onnxopt.codegen.compile import compile_object, new_module
        from onnxopt.codegen.vmath.irutil import for_range

        from .desc import RowNormKernelDesc

        F32, I64, PTR = ir.FloatType(), ir.IntType(64), ir.PointerType()


        def build(region, target):
            module = new_module(target, region.op_type)
            sym = f"{region.op_type}_rows"
            fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64]), name=sym)
            x, y, rows, n = fn.args
            b = ir.IRBuilder(fn.append_basic_block("entry"))
            zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)

            def row(r, _):
                base = b.mul(r, n)

                def square(j, acc):
                    v = b.load(b.gep(x, [b.add(base, j)], source_etype=F32), typ=F32)
                    return [b.fadd(acc[0], b.fmul(v, v))]

                (ss,) = for_range(b, zero, n, one, square, [ir.Constant(F32, 0.0)])
                sqrt = module.declare_intrinsic("llvm.sqrt", [F32])
                inv = b.fdiv(ir.Constant(F32, 1.0), b.call(sqrt, [ss]))

                def scale(j, _a):
                    at = b.add(base, j)
                    v = b.load(b.gep(x, [at], source_etype=F32), typ=F32)
                    b.store(b.fmul(v, inv), b.gep(y, [at], source_etype=F32))
                    return []

                for_range(b, zero, n, one, scale)
                return []

            for_range(b, zero, rows, one, row)
            b.ret_void()
            text = str(module)
            return compile_object(text, target), RowNormKernelDesc(region.op_type, sym), text
    ''',
    "c.py": '''
        from onnxopt.backends.c import compile_c

        from .desc import RowNormKernelDesc


        def build(region, target):
            sym = f"{region.op_type}_rows"
            source = f"""#include <math.h>
        #include <stdint.h>
        void {sym}(const float *x, float *y, int64_t rows, int64_t n) {{
          for (int64_t r = 0; r < rows; r++) {{
            float ss = 0.0f;
            for (int64_t j = 0; j < n; j++) ss += x[r * n + j] * x[r * n + j];
            const float inv = 1.0f / sqrtf(ss);
            for (int64_t j = 0; j < n; j++) y[r * n + j] = x[r * n + j] * inv;
          }}
        }}
        """
            return compile_c(source, target), RowNormKernelDesc(region.op_type, sym), source
    ''',
    "glue.h": '''
        #ifndef ONNXOPT_ROWNORM_H
        #define ONNXOPT_ROWNORM_H
        typedef struct {
          onnxopt_sig sig;
          void (*rows)(const float *x, float *y, int64_t rows, int64_t n);
        } onnxopt_rownorm_desc;
        #endif
    ''',
    "exec.c": '''
        static OrtStatus *rownorm_execute(const onnxopt_rownorm_desc *d, OrtKernelContext *ctx) {
          const OrtValue *in;
          OrtTensorTypeAndShapeInfo *info;
          size_t rank;
          int64_t dims[MAX_RANK];
          CHECK(API(KernelContext_GetInput)(ctx, 0, &in));
          CHECK(API(GetTensorTypeAndShape)(in, &info));
          OrtStatus *st = API(GetDimensionsCount)(info, &rank);
          if (!st && (rank == 0 || rank > MAX_RANK)) st = fail(ORT_INVALID_ARGUMENT, "onnxopt: rownorm rank");
          if (!st) st = API(GetDimensions)(info, dims, rank);
          API(ReleaseTensorTypeAndShapeInfo)(info);
          if (st) return st;
          int64_t rows = 1;
          for (size_t i = 0; i + 1 < rank; i++) rows *= dims[i];
          OrtValue *out;
          const float *x;
          float *y;
          CHECK(API(KernelContext_GetOutput)(ctx, 0, dims, rank, &out));
          CHECK(API(GetTensorMutableData)((OrtValue *)in, (void **)&x));
          CHECK(API(GetTensorMutableData)(out, (void **)&y));
          d->rows(x, y, rows, dims[rank - 1]);
          return NULL;
        }
    ''',
}

OPTIMIZE = textwrap.dedent("""
    import json, sys
    import onnxopt
    model, out, target = sys.argv[1:4]
    # sequences off: the written graph names each kernel's op (a sequence would run them as its steps)
    result = onnxopt.optimize(model, out, target=target, measure=False, threads=1, sequences=False)
    print("RESULT " + json.dumps({"file": onnxopt.__file__, "regions": result.report["regions"],
                                  "target": result.report["target"],
                                  "kernel_calls": result.report["verification"].get("kernel_calls")}))
""")

LOAD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import onnxruntime as ort
    import onnxopt.runtime as rt
    from onnxopt.runtime.kernel_calls import kernel_calls
    model, feeds = sys.argv[1], dict(np.load(sys.argv[2]))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = rt.InferenceSession(model, so)
    got = [sess.run(None, feeds)[0] for _ in range(2)]
    np.save(sys.argv[3], got[-1])
    lib = rt.registered_library(sess, loadable=True)
    print("RESULT " + json.dumps({"library": lib, "calls": kernel_calls(lib) if lib else None}))
""")


def _package_copy(root) -> str:
    """The installed package laid out as one tree (its package-dir mapping resolved), plus the new kind's folder."""
    dest = os.path.join(root, "pkg", "onnxopt")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(os.path.dirname(onnxopt.__file__), dest, ignore=ignore)
    for name in ("codegen", "runtime", "cli", "models"):
        mod = importlib.import_module(f"onnxopt.{name}")
        if not os.path.isdir(os.path.join(dest, name)):
            shutil.copytree(os.path.dirname(mod.__file__), os.path.join(dest, name), ignore=ignore)
    folder = os.path.join(dest, "kinds", "rownorm")
    assert not os.path.exists(folder)
    os.makedirs(folder)
    for name, text in KIND_FILES.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(textwrap.dedent(text).lstrip())
    return os.path.join(root, "pkg")


def _run(code: str, args: list[str], pythonpath: str) -> dict:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    # Run from the copy's folder: `python -c` puts the working directory first on sys.path.
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600,
                       cwd=pythonpath)
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return _package_copy(str(tmp_path_factory.mktemp("dropin")))


def _model(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5, 40])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5, 40])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "x"], ["a"], name="add"),
             helper.make_node("LpNormalization", ["a"], ["y"], name="norm", axis=-1, p=2)]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    onnx.save(m, path)


@pytest.mark.parametrize("target", ["native", "c"])
def test_a_dropped_in_kind_is_found_built_checked_and_run(package, tmp_path, target):
    model = str(tmp_path / "m.onnx")
    _model(model)
    out = str(tmp_path / "out" / "fused.onnx")
    os.makedirs(os.path.dirname(out))
    done = _run(OPTIMIZE, [model, out, target], package)
    assert done["file"].startswith(package)  # the copy ran, not the installed package
    assert done["target"]["backend"] == ("c" if target == "c" else "llvm")
    kinds = {r["op_type"].split("_")[0] for r in done["regions"]}
    assert "rownorm" in kinds, done["regions"]  # found, fused and reported
    assert done["kernel_calls"], done  # the optimizer's own check of the written files

    fused = onnx.load(out)
    ops = [n.op_type for n in fused.graph.node]
    assert any(o.startswith("rownorm_") for o in ops), ops
    x = np.random.default_rng(0).standard_normal([3, 5, 40]).astype(np.float32) + 0.1
    feeds = str(tmp_path / "feeds.npz")
    np.savez(feeds, x=x)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got_file = str(tmp_path / "got.npy")
    ran = _run(LOAD, [out, feeds, got_file], package)  # the user's load, in a fresh process
    assert ran["library"], ran
    calls = {k: v for k, v in ran["calls"].items() if k.startswith("rownorm_")}
    assert list(calls.values()) == [2], ran["calls"]  # the kind's own kernel ran, once per run
    np.testing.assert_allclose(np.load(got_file), want, rtol=1e-5, atol=1e-6)
    # The fallback: the written model without the library runs the function bodies.
    alone = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(alone, want, rtol=1e-6, atol=1e-7)
