"""`onnxopt bench --kernels fused.onnx`: how close each fused kernel comes to the memory system's limit.

For every distinct fused op in the model, a chain applies it K times at the region's own shape (output 0 feeds
input 0 of the next application, the other inputs stay fixed). The per-kernel time is (T(K) - T(1)) / (K - 1), which
cancels onnxruntime's per-run overhead, and each application reads data the previous one just wrote, as in a
network. Bytes moved (every input read once, every output written once) over that time is compared with the
measured bandwidth of the memory level that holds the working set (onnxopt machine).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import helper

from onnxopt.emit.model import DOMAIN
from onnxopt.timing import make_session, time_interleaved
from onnxopt.verify import random_array

from . import check_library

CHAIN = 16


def _shapes(model: onnx.ModelProto, bindings: dict[str, int]):
    from onnxopt.annotate.shapes import tensor_info

    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    info = tensor_info(inferred)

    def concrete(name):
        ti = info.get(name)
        if ti is None or ti.shape is None or ti.dtype is None:
            return None
        return [d if isinstance(d, int) else int(bindings.get(d, 1)) if isinstance(d, str) and not
                d.startswith("unk__") else None for d in ti.shape], ti.dtype

    return concrete


def _parallel_min(model: onnx.ModelProto, op_type: str) -> int:
    from onnxopt.codegen.elementwise.build import PARALLEL_MIN_CHEAP, PARALLEL_MIN_TRANSCENDENTAL
    from onnxopt.fusion.elementwise_ops import TRANSCENDENTAL

    body = next((f for f in model.functions if f.name == op_type), None)
    ops = {n.op_type for n in body.node} if body is not None else set()
    return PARALLEL_MIN_TRANSCENDENTAL if ops & TRANSCENDENTAL else PARALLEL_MIN_CHEAP


# A working set lives in a cache level only if it leaves room for everything else there (code, stack, the other
# tensors): three quarters of the capacity, as the stream benchmark sizes its buffers below capacity too.
CACHE_FILL = 0.75


def bench_kernels(fused_path: str, threads: int | None = None, bindings: dict | None = None,
                  min_time: float = 0.3) -> list[dict]:
    from onnxopt.hardware.measure import load_machine

    threads = threads or os.cpu_count()
    model = onnx.load(fused_path)
    chk = check_library(fused_path, model=model)
    if not chk.usable:
        raise RuntimeError(f"cannot benchmark kernels: {chk.reason}")
    concrete = _shapes(model, bindings or {})
    machine = load_machine()
    opsets = list(model.opset_import)
    seen, rows = set(), []
    for node in model.graph.node:
        if node.domain != DOMAIN or not node.op_type.startswith("Elementwise_"):
            continue  # compute kernels (Conv_, MatMul_) are measured against FLOP/s by benchmarks/kernels.py
        ins = [concrete(x) for x in node.input]
        outs = [concrete(x) for x in node.output]
        key = (node.op_type, repr(ins))
        if key in seen:  # one kernel serves every shape: bench each shape it runs at once
            continue
        seen.add(key)
        if any(v is None or None in v[0] for v in ins + outs) or ins[0] != outs[0]:
            continue  # not chainable at a known shape
        rng = np.random.default_rng(0)
        feeds = {f"in{i}": random_array(s, dt, rng) for i, (s, dt) in enumerate(ins)}
        times = {}
        for k in (1, CHAIN):
            nodes, cur = [], "in0"
            for j in range(k):
                outs_j = [f"o{j}_{m}" for m in range(len(node.output))]
                nodes.append(helper.make_node(node.op_type, [cur] + [f"in{i}" for i in range(1, len(ins))], outs_j,
                                              domain=DOMAIN))
                cur = outs_j[0]
            g = helper.make_graph(nodes, "chain",
                                  [helper.make_tensor_value_info(f"in{i}", helper.np_dtype_to_tensor_dtype(
                                      np.dtype(dt)), s) for i, (s, dt) in enumerate(ins)],
                                  [helper.make_tensor_value_info(cur, helper.np_dtype_to_tensor_dtype(
                                      np.dtype(outs[0][1])), outs[0][0])])
            m = helper.make_model(g, opset_imports=opsets, functions=[f for f in model.functions
                                                                      if f.name == node.op_type])
            m.ir_version = model.ir_version
            times[k] = make_session(m, threads, library=chk.load_path)
        t1, tk = time_interleaved([times[1], times[CHAIN]], feeds, min_time=min_time, max_blocks=60)
        per_kernel = max((tk["median"] - t1["median"]) / (CHAIN - 1), 1e-9)
        nbytes = sum(v.nbytes for v in feeds.values()) + sum(
            int(np.prod(s)) * np.dtype(dt).itemsize for s, dt in outs)
        # Below its parallel threshold the glue runs a kernel on one core: its data then lives in what one core can
        # hold, and the ceiling is one core's read+write stream bandwidth; above it, the whole machine's.
        elements = int(np.prod(outs[0][0]))
        one_core = elements < _parallel_min(model, node.op_type) or threads == 1
        level = machine.level_for(nbytes, one_core=one_core, fill=CACHE_FILL)
        ceiling = (level.stream_bandwidth_1core if one_core else level.stream_bandwidth) or level.bandwidth
        rows.append({"op_type": node.op_type, "shape": ins[0][0], "bytes": int(nbytes),
                     "seconds": per_kernel, "bandwidth": nbytes / per_kernel, "level": level.name,
                     "level_bandwidth": ceiling, "fraction": nbytes / per_kernel / ceiling,
                     "cores": 1 if one_core else threads,
                     "level_read_bandwidth": level.bandwidth,
                     "session_overhead_s": t1["median"] - per_kernel})
    return rows
