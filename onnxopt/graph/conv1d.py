"""One-dimensional convolutions become two-dimensional ones of height 1, so that the compute kind takes them.

Speech and sequence models (Whisper's and wav2vec2's front ends, keyword spotters) convolve [N, C, L] tensors:

    Conv(x [N, C, L], W [M, C/g, k])  ->  [N, M, L']

which is, with the same sums of the same products,

    Unsqueeze(x, 2) -> Conv(W as [M, C/g, 1, k], kernel [1, k], strides [1, s], pads [0, p0, 0, p1],
                            dilations [1, d]) -> Squeeze(., 2)

An [N, C, L] tensor and its [N, C, 1, L] view hold the same bytes, so the Unsqueeze and Squeeze are views in
onnxruntime. What that buys: the convolution runs as our kernel, with Winograd's F(1x4, 1x3) and F(1x6, 1x3) for
the stride-1 k = 3 layers. The elementwise ops that follow with only scalar constants (an exporter's GELU: Div, Erf,
Add, Mul, Mul) move onto the 4-D view too, so they stay in the convolution's epilogue and two such convolutions in a
row pass the 4-D tensor from one to the next with no Squeeze between (a blocked chain). A tensor goes back to
three dims (one Squeeze, under its own name) only where something else reads it or the graph returns it.

What is matched: a Conv of the default domain whose input has a static rank-3 shape and whose weights are a
constant rank-3 float32 initializer; its bias, if any, a constant too.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .classifier_conv import _attr, _fresh
from .fold import names_used_by_subgraphs, replace_nodes
from .large import add_messages

# Elementwise ops that keep the shape of their one tensor input when their other inputs are scalar constants.
SHAPE_KEEPING = {"Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Abs", "Neg", "Sqrt", "Reciprocal", "LeakyRelu", "Elu",
                 "Selu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Clip", "Gelu", "Mish", "Identity",
                 "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}


def _scalar_constants(graph: onnx.GraphProto) -> set[str]:
    """Constants of one element and rank 3 at most: against a 3-D tensor they broadcast to its shape, and against
    its 4-D view to the view's (a rank-4 one would make the original's output 4-D)."""
    out = {t.name for t in graph.initializer if int(np.prod(t.dims)) == 1 and len(t.dims) <= 3}
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for a in n.attribute:
                if a.name == "value" and int(np.prod(a.t.dims)) == 1 and len(a.t.dims) <= 3:
                    out.add(n.output[0])
                elif a.name in ("value_float", "value_int"):
                    out.add(n.output[0])
    return out


def _axis_nodes(op: str, src: str, dst: str, name: str, opset: int) -> list[onnx.NodeProto]:
    """Unsqueeze or Squeeze on axis 2 (axes an input from opset 13)."""
    if opset >= 13:
        axes = f"{name}__axes"
        return [helper.make_node("Constant", [], [axes], name=axes,
                                 value=numpy_helper.from_array(np.asarray([2], np.int64), axes)),
                helper.make_node(op, [src, axes], [dst], name=name)]
    return [helper.make_node(op, [src], [dst], name=name, axes=[2])]


def conv1d_as_conv2d(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> int:
    """Rewrite every matched one-dimensional convolution in place (see the module docstring); returns how many.
    `shapes` maps tensor names to static shapes (from shape inference)."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    inits = {t.name: t for t in graph.initializer}
    scalars = _scalar_constants(graph)
    taken = set(inits) | {x for n in graph.node for x in list(n.input) + list(n.output)} | \
        {v.name for v in list(graph.input) + list(graph.output) + list(graph.value_info)}

    def fresh(name: str) -> str:
        return _fresh(name, taken)

    def conv1d(n: onnx.NodeProto) -> bool:
        if n.op_type != "Conv" or n.domain not in ("", "ai.onnx") or len(n.input) < 2:
            return False
        s, w = shapes.get(n.input[0]), inits.get(n.input[1])
        if s is None or len(s) != 3 or not all(isinstance(d, int) and d > 0 for d in s):
            return False
        if w is None or w.data_type != onnx.TensorProto.FLOAT or len(w.dims) != 3:
            return False
        return len(n.input) < 3 or not n.input[2] or n.input[2] in inits

    lifted: dict[str, str] = {}  # a 3-D tensor's name -> its 4-D view's
    rewritten: dict[int, onnx.NodeProto] = {}  # by the node's index
    unsqueezes: dict[int, list[onnx.NodeProto]] = {}
    new_weights = []
    count = 0
    for i, n in enumerate(graph.node):
        if conv1d(n):
            x = n.input[0]
            before = []
            if x not in lifted:
                view = fresh(f"{x}__4d")
                before = _axis_nodes("Unsqueeze", x, view, fresh(f"{x}__unsqueeze"), opset)
                lifted_x = view
            else:
                lifted_x = lifted[x]
            w = numpy_helper.to_array(inits[n.input[1]])
            w_name = fresh(f"{n.input[1]}__2d")
            new_weights.append(numpy_helper.from_array(np.ascontiguousarray(w[:, :, None, :]), w_name))
            k = list(_attr(n, "kernel_shape", [w.shape[2]]))
            pads = list(_attr(n, "pads", [0, 0]))
            attrs = {"kernel_shape": [1] + k, "strides": [1] + list(_attr(n, "strides", [1])),
                     "dilations": [1] + list(_attr(n, "dilations", [1])), "pads": [0, pads[0], 0, pads[1]],
                     "group": _attr(n, "group", 1)}
            auto_pad = _attr(n, "auto_pad", b"NOTSET")
            if auto_pad not in (b"NOTSET", "NOTSET"):
                attrs["auto_pad"] = auto_pad
                del attrs["pads"]
            out = fresh(f"{n.output[0]}__4d")
            conv = helper.make_node("Conv", [lifted_x, w_name] + list(n.input[2:]), [out], name=n.name or out,
                                    **attrs)
            lifted[n.output[0]] = out
            rewritten[i] = conv
            unsqueezes[i] = before
            count += 1
        elif (n.op_type in SHAPE_KEEPING and n.domain in ("", "ai.onnx") and len(n.output) == 1
              and any(x in lifted for x in n.input)
              and all(not x or x in lifted or x in scalars for x in n.input)):
            out = fresh(f"{n.output[0]}__4d")
            node = onnx.NodeProto()
            node.CopyFrom(n)
            del node.input[:]
            node.input.extend(lifted.get(x, x) for x in n.input)
            node.output[0] = out
            lifted[n.output[0]] = out
            rewritten[i] = node
    if not count:
        return 0
    # A 3-D tensor read by anything not rewritten, returned, or read inside a subgraph: one Squeeze back to it.
    needed = {o.name for o in graph.output} | names_used_by_subgraphs(graph)
    needed |= {x for i, n in enumerate(graph.node) if i not in rewritten for x in n.input}
    old_weights = {n.input[1] for i, n in enumerate(graph.node) if n.op_type == "Conv" and i in rewritten}
    nodes, gone = [], set()
    for i, n in enumerate(graph.node):
        if i not in rewritten:
            nodes.append(n)
            continue
        nodes += unsqueezes.get(i, []) + [rewritten[i]]
        y = n.output[0]
        if y in needed:
            nodes += _axis_nodes("Squeeze", lifted[y], y, fresh(f"{y}__squeeze"), opset)
        else:
            gone.add(y)
    replace_nodes(graph, nodes, gone)
    readers = {x for nd in nodes for x in nd.input} | needed | {v.name for v in graph.input}
    keep = [t for t in graph.initializer if t.name not in old_weights or t.name in readers] + new_weights
    del graph.initializer[:]
    add_messages(graph.initializer, keep)
    return count
