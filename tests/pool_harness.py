"""Pool kernels for the tests: models with one pool (and an optional elementwise chain after it), fused by PoolRule,
compiled into one library for many models at once (one link per test, not one per model), run next to onnxruntime.
"""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnxopt.codegen.glue.library import link_library
from onnxopt.codegen.pool.build import build_pool
from onnxopt.codegen.target import Target, host_target

from onnxopt.emit.model import build_fused_model
from onnxopt.fusion.pool import PoolRule
from onnxopt.timing import make_session

F = onnx.TensorProto.FLOAT
OPSET = 19  # AveragePool's dilations


def pool_model(op: str, in_shape, post=(), inits=(), inputs=(), elem=F, **attrs) -> onnx.ModelProto:
    """`op` on input x, then `post`: (op_type, [other inputs], attrs) applied to the previous output in turn.
    `inputs`: extra graph inputs (name, shape); `inits`: (name, array); `elem`: x's element type."""
    nodes = [helper.make_node(op, ["x"], ["p"], **attrs)]
    last = "p"
    for i, (pop, others, pattrs) in enumerate(post):
        nodes.append(helper.make_node(pop, [last] + list(others), [f"e{i}"], **pattrs))
        last = f"e{i}"
    g = helper.make_graph(
        nodes, "pool", [helper.make_tensor_value_info("x", elem, list(in_shape))]
        + [helper.make_tensor_value_info(n, F, list(s)) for n, s in inputs],
        [helper.make_tensor_value_info(last, elem, None)],
        initializer=[numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 9
    return m


def fuse_models(models, tmpdir, target: Target | None = None):
    """Fuse every model's pool region; returns ([(fused model, regions)], library path). One library for all."""
    target = target or host_target()
    built, fused_regions = {}, []
    for m in models:
        inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
        rejected = []
        regions = PoolRule(inferred).find_regions(set(), rejected)
        assert regions, rejected
        for r in regions:
            r.compute_op_type(target.name + target.llvm_features + f"rank{len(r.shape)}")
            if r.op_type not in built:
                obj, desc, _ = build_pool(r, target)
                built[r.op_type] = (obj, desc)
        fused_regions.append((m, regions))
    lib = os.path.join(str(tmpdir), f"pools{abs(hash(tuple(sorted(built))))}.so")
    sha = link_library([d for _, d in built.values()], [o for o, _ in built.values()], target, lib)
    out = [(build_fused_model(m, regions, os.path.basename(lib), sha, target.to_dict(), target.required_cpu_flags),
            regions) for m, regions in fused_regions]
    return out, lib


def run_fused(fused, lib, feeds, threads=2, op_types=(), tmpdir=None):
    """Run with the library; with `op_types`, also check in onnxruntime's profile that those kernels ran."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    so.register_custom_ops_library(lib)
    if op_types:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(str(tmpdir), "profile")
    sess = ort.InferenceSession(fused.SerializeToString(), so, providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    if op_types:
        with open(sess.end_profiling()) as f:
            ran = {e["args"].get("op_name") for e in json.load(f) if e.get("cat") == "Node"}
        assert set(op_types) <= ran, (sorted(op_types), sorted(x for x in ran if x))
    return got


def reference(model, feeds):
    return make_session(model, 1, optimization="none").run(None, feeds)


def assert_pool_close(want, got, exact: bool, msg=""):
    for a, b in zip(want, got):
        assert a.shape == b.shape, (a.shape, b.shape, msg)
        if exact:
            assert np.array_equal(a, b), f"{msg}: max abs diff {np.abs(a - b).max()}"
        else:
            np.testing.assert_allclose(b, a, rtol=2e-6, atol=1e-6, err_msg=msg)
