"""A quantized Softmax read through a Transpose runs before it, on the axis the Transpose moved there.

YOLOv8n's box head (DFL) transposes [1, 4, 16, A] to [1, 16, 4, A] and takes the Softmax over axis 1, the 16 bins:

    x (int8) -> Transpose(0, 2, 1, 3) -> DequantizeLinear -> Softmax(axis 1) -> QuantizeLinear -> ...

onnxruntime loads the original with its transpose optimizer, which pushes the Transpose past the Softmax into the
NHWC convolution after it, so its QLinearSoftmax runs on [1, 4, 16, A] over axis 2 (183 us). Once the convolution
after it is one of our kernels, the Transpose stays, and the QLinearSoftmax over axis 1 of [1, 16, 4, A] took 881 us.
Rewritten as onnxruntime would have it:

    x -> DequantizeLinear -> Softmax(axis perm[1] = 2) -> QuantizeLinear -> Transpose(0, 2, 1, 3) -> ...

The same softmax over the same values (DequantizeLinear and QuantizeLinear are per tensor, so elementwise), then
the same move of its quantized result; graph/quantized_pools.py first puts the Transpose on the int8 tensor.
"""

from __future__ import annotations

import onnx
from onnx import helper

from .quantized_pools import _opset, _scalar_step, graph_maps


def softmax_before_transposes(model: onnx.ModelProto) -> int:
    """Rewrite (in place) every Transpose -> per-tensor DequantizeLinear -> Softmax -> QuantizeLinear chain, each
    node read by the next alone, as DequantizeLinear -> Softmax on the moved axis -> QuantizeLinear -> Transpose.
    Returns how many. Before opset 13 a Softmax flattens its axis and those after it, so nothing changes there."""
    if _opset(model) < 13:
        return 0
    graph = model.graph
    inits, outputs, readers, producer = graph_maps(graph)
    drop: set[int] = set()
    after: dict[int, onnx.NodeProto] = {}  # the moved Transpose, right after the QuantizeLinear it now reads

    def only_reader(t, op):
        r = readers.get(t, [])
        return r[0] if len(r) == 1 and t not in outputs and r[0].op_type == op else None

    for t in graph.node:
        if t.op_type != "Transpose" or t.domain not in ("", "ai.onnx") or not t.output:
            continue
        perm = next((list(a.ints) for a in t.attribute if a.name == "perm"), None)
        dq = only_reader(t.output[0], "DequantizeLinear")
        sm = dq and only_reader(dq.output[0], "Softmax")
        q = sm and only_reader(sm.output[0], "QuantizeLinear")
        if not perm or q is None or _scalar_step(dq, inits) is None or _scalar_step(q, inits) is None:
            continue
        if q.input[0] != sm.output[0] or dq.input[0] != t.output[0] or id(t) in drop:
            continue
        axis = next((a.i for a in sm.attribute if a.name == "axis"), -1)
        if not -len(perm) <= axis < len(perm):
            continue
        # the chain now reads the Transpose's input, and the Transpose reads the QuantizeLinear's result
        y = q.output[0]
        dq.input[0] = t.input[0]
        del sm.attribute[:]
        sm.attribute.append(helper.make_attribute("axis", perm[axis % len(perm)]))
        q.output[0] = f"{y}__before_transpose"
        moved_t = onnx.NodeProto()
        moved_t.CopyFrom(t)
        moved_t.input[0] = q.output[0]
        moved_t.output[0] = y
        drop.add(id(t))
        after[id(q)] = moved_t
    if after:
        nodes = []
        for n in graph.node:
            if id(n) not in drop:
                nodes.append(n)
            if id(n) in after:
                nodes.append(after[id(n)])
        del graph.node[:]
        graph.node.extend(nodes)
    return len(after)
