"""A classifier after a global pool becomes a 1x1 convolution, so that it runs in the blocked chain.

Image networks end the same way as exported:

    GlobalAveragePool -> Flatten -> Gemm(W, b)            [N, C, 1, 1] -> [N, C] -> [N, M]

Flatten only renames [N, C, 1, 1] to [N, C], and Gemm multiplies by a constant matrix, so this is

    GlobalAveragePool -> Conv 1x1 (W as [M, C, 1, 1], b) -> Flatten          [N, M, 1, 1] -> [N, M]

with the same sums of the same products for each output. What that buys: the pool and the convolution read and write
blocked tensors like the convolutions before them (fusion/layout.py), so the network's last kernels join its sequence
(emit/sequence.py) instead of ending it at onnxruntime's ReduceMean, reorder and Gemm; and the convolution computes
vectors of output channels from weights packed [M / 64][C][64] that both threads stream in order. At batch 1 the
classifier is a matrix-vector product that reads its weights from memory once per inference: 5.1 MB in MobileNetV2,
8.2 MB in ResNet-50 and Inception-v3.

What is matched: a Gemm with transA = 0, alpha = beta = 1 and a constant float32 B (either transB), whose A is the
output of Flatten(axis=1) of a GlobalAveragePool or GlobalMaxPool output of static shape [N, C, 1, 1]; its C is
absent or a constant of M values ([M] or [1, M]). The Flatten stays when something else reads it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .fold import replace_nodes
from .large import add_messages

GLOBAL_POOLS = ("GlobalAveragePool", "GlobalMaxPool")


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _fresh(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    taken.add(out)
    return out


def classifiers_as_convs(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> int:
    """Rewrite every matched classifier in place (see the module docstring); returns how many. `shapes` maps tensor
    names to static shapes (from shape inference)."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output if o}
    readers: dict[str, int] = {}
    for n in graph.node:
        for x in n.input:
            readers[x] = readers.get(x, 0) + 1
    outputs = {o.name for o in graph.output}
    graph_inputs = {v.name for v in graph.input}  # an initializer listed as an input can be fed: it stays
    taken = set(inits) | {x for n in graph.node for x in list(n.input) + list(n.output)} | \
        {v.name for v in list(graph.input) + list(graph.output) + list(graph.value_info)}
    new_nodes, gone_inits, count = [], set(), 0
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    for gemm in graph.node:
        if gemm.op_type != "Gemm" or gemm.domain not in ("", "ai.onnx") or len(gemm.input) < 2:
            continue
        if _attr(gemm, "transA", 0) or _attr(gemm, "alpha", 1.0) != 1.0 or _attr(gemm, "beta", 1.0) != 1.0:
            continue
        flat = producer.get(gemm.input[0])
        if flat is None or flat.op_type != "Flatten" or flat.domain not in ("", "ai.onnx") or \
                _attr(flat, "axis", 1) != 1:
            continue
        x = flat.input[0]
        pool = producer.get(x)
        shape = shapes.get(x)
        if pool is None or pool.op_type not in GLOBAL_POOLS or shape is None or len(shape) != 4 or \
                not all(isinstance(d, int) for d in shape) or shape[2:] != [1, 1]:
            continue
        b = inits.get(gemm.input[1])
        if b is None or b.data_type != onnx.TensorProto.FLOAT or len(b.dims) != 2:
            continue
        w = numpy_helper.to_array(b)
        if not _attr(gemm, "transB", 0):
            w = w.T
        m, k = w.shape
        if k != shape[1]:
            continue
        bias = None
        if len(gemm.input) > 2 and gemm.input[2]:
            c = inits.get(gemm.input[2])
            if c is None or c.data_type != onnx.TensorProto.FLOAT:
                continue
            cv = numpy_helper.to_array(c)
            if cv.size not in (1, m) or (cv.ndim == 2 and cv.shape[0] != 1) or cv.ndim > 2:
                continue
            bias = np.broadcast_to(cv.reshape(-1), (m,)).astype(np.float32)
        w_name = _fresh(f"{gemm.input[1]}__conv", taken)
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w.reshape(m, k, 1, 1)), w_name))
        conv_in = [x, w_name]
        if bias is not None:
            b_name = _fresh(f"{gemm.input[2]}__conv", taken)
            graph.initializer.append(numpy_helper.from_array(bias, b_name))
            conv_in.append(b_name)
        y4 = _fresh(f"{gemm.output[0]}__conv", taken)
        conv = helper.make_node("Conv", conv_in, [y4], name=gemm.name or y4, kernel_shape=[1, 1])
        flatten = helper.make_node("Flatten", [y4], [gemm.output[0]], name=_fresh(f"{gemm.name or y4}__flatten",
                                                                                    taken), axis=1)
        replaced[id(gemm)] = [conv, flatten]
        for name in gemm.input[1:]:
            readers[name] -= 1
            if readers[name] == 0 and name in inits and name not in graph_inputs:
                gone_inits.add(name)
        readers[gemm.input[0]] -= 1
        if readers[gemm.input[0]] == 0 and gemm.input[0] not in outputs:
            dropped.add(id(flat))
        count += 1
    if not count:
        return 0
    for n in graph.node:
        if id(n) in dropped:
            continue
        new_nodes.extend(replaced.get(id(n), [n]))
    gone = {flat_out for n in graph.node if id(n) in dropped for flat_out in n.output}
    replace_nodes(graph, new_nodes, gone)
    keep = [t for t in graph.initializer if t.name not in gone_inits]
    del graph.initializer[:]
    add_messages(graph.initializer, keep)
    return count
