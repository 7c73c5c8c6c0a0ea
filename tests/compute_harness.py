"""Shared by the compute-kernel tests: optimize a model through the real pipeline, then run the fused model with
the kernel library and with its function bodies only, against the original through onnxruntime."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import onnx
import onnxopt.runtime as rt
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.emit.sequence import ran_in_sequences

RTOL = ATOL = 1e-4
COMPUTE_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
F = TensorProto.FLOAT


# ---- helpers ----------------------------------------------------------------------------------------------------


def _shape_of(vi, dims):
    out = []
    for d in vi.type.tensor_type.shape.dim:
        out.append(d.dim_value if d.HasField("dim_value") else dims[d.dim_param])
    return out


def _feeds(model, rng, dims=None):
    inits = {t.name for t in model.graph.initializer}
    return {vi.name: np.asarray(rng.standard_normal(_shape_of(vi, dims or {})) * 2, np.float32)
            for vi in model.graph.input if vi.name not in inits}


def _compute_regions(report):
    return [r for r in report["regions"] if r["ops"].split(" -> ")[0] in COMPUTE_OPS]


def _optimize(model, directory, **kw):
    src = os.path.join(directory, "model.onnx")
    onnx.save(model, src)
    out = os.path.join(directory, "fused.onnx")
    res = onnxopt.optimize(src, out, measure=False, **kw)
    return src, out, res


def _run_all(src, out, feeds, kernels=()):
    """Original vs fused with the library vs fused without it. `kernels`: op types of the compute kernels that must
    show up in onnxruntime's profile of the library session (run natively, not through their function bodies)."""
    names = [o.name for o in onnx.load(src, load_external_data=False).graph.output]
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(names, feeds)
    so = ort.SessionOptions()
    if kernels:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(os.path.dirname(out), "profile")
    with warnings.catch_warnings():
        warnings.simplefilter("error", rt.LibraryNotUsedWarning)  # the library must really be used
        sess = rt.InferenceSession(out, so)
    got_lib = sess.run(names, feeds)
    if kernels:
        with open(sess.end_profiling()) as f:
            ran = {e["args"].get("op_name") for e in json.load(f) if e.get("cat") == "Node"}
        ran |= ran_in_sequences(onnx.load(out, load_external_data=False), ran)
        assert set(kernels) <= ran, (sorted(kernels), sorted(x for x in ran if x))
    got_fn = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(names, feeds)
    for name, a, b, c in zip(names, want, got_lib, got_fn):
        assert b.shape == a.shape and c.shape == a.shape, (name, a.shape, b.shape, c.shape)
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL, err_msg=f"{name}: kernel library vs onnxruntime")
        np.testing.assert_allclose(c, a, rtol=RTOL, atol=ATOL, err_msg=f"{name}: function fallback vs onnxruntime")
    return want


def check(model, directory, *, ops=None, n_compute=1, seed=0, runs=(None,), **kw):
    """Optimize `model`, require `n_compute` compute regions (with exactly `ops` when given), compare outputs for
    each entry of `runs` (symbolic dim bindings, None for a static model)."""
    src, out, res = _optimize(model, str(directory), **kw)
    regions = _compute_regions(res.report)
    assert len(regions) == n_compute, (res.report["regions"], res.report["rejected"])
    if ops is not None:
        assert sorted(r["ops"] for r in regions) == sorted([ops] if isinstance(ops, str) else ops), \
            (res.report["regions"], res.report["rejected"])
    fused = onnx.load(out)
    # Each compute region holds one compute op; the others (none in most tests) are left to onnxruntime.
    left = [n.op_type for n in fused.graph.node if n.domain in ("", "ai.onnx")]
    assert sum(op in COMPUTE_OPS for op in left) == sum(n.op_type in COMPUTE_OPS for n in model.graph.node) - n_compute
    rng = np.random.default_rng(seed)
    kernels = {r["op_type"] for r in regions}
    for dims in runs:
        feeds = _feeds(model, rng, dims)
        # Profile the runs that have work to do (an empty batch may skip the kernel altogether).
        _run_all(src, out, feeds, kernels if all(v.size for v in feeds.values()) else ())
    return res, fused


def _w(rng, shape, fan_in):
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    if any(not o.type.tensor_type.HasField("shape") for o in m.graph.output):
        # Outputs declared without a shape: take onnx's (a graph output must have one to pass the checker).
        g2 = onnx.shape_inference.infer_shapes(m, strict_mode=True).graph
        inferred = {v.name: v for v in list(g2.value_info) + list(g2.output)}
        for o in m.graph.output:
            if not o.type.tensor_type.HasField("shape"):
                o.CopyFrom(inferred[o.name])
    onnx.checker.check_model(m, full_check=True)
    return m


def _vi(name, shape):
    return helper.make_tensor_value_info(name, F, shape)


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)
