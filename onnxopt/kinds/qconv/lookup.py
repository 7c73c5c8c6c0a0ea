"""A requantizing convolution's elementwise tail as a lookup table.

After a QDQ unit's QuantizeLinear, quantize_static wraps every elementwise op in its own pair:
    Conv -> QuantizeLinear -> DequantizeLinear -> BatchNormalization -> QuantizeLinear -> DequantizeLinear
         -> HardSwish -> QuantizeLinear
and a quantized SiLU reads the dequantized value twice (Sigmoid, then Mul with it). Up to a later QuantizeLinear,
such a tail is a function of the convolution's quantized value and its channel alone. So the kernel maps each
requantized value through a table of 256 bytes a channel, made by running those very nodes in onnxruntime on every
value, and onnxruntime's passes over the tensor (one per node) go.

The tail may only hold the ops of POINTWISE, with constants that are scalars or one value a channel (broadcast
over the pixels), and its intermediate tensors may not be read outside it.
"""

from __future__ import annotations

import heapq

import numpy as np
import onnx
from onnx import helper

POINTWISE = frozenset({"DequantizeLinear", "QuantizeLinear", "BatchNormalization", "HardSwish", "HardSigmoid",
                       "Sigmoid", "Relu", "LeakyRelu", "Clip", "Tanh", "Mul", "Add", "Sub", "Div", "Identity",
                       "Neg", "Abs", "Exp", "Erf", "Softplus", "Elu", "Selu", "PRelu", "Max", "Min", "Sqrt"})
MAX_NODES = 16
VALUES = 256


def _per_channel(shape, channels: int, axis_one: bool) -> bool:
    """A constant broadcast over the pixels of [N, C, H, W]: a scalar, or one value a channel."""
    size = int(np.prod(shape)) if len(shape) else 1
    if size == 1:
        return True
    if axis_one and list(shape) == [channels]:  # QuantizeLinear / DequantizeLinear with axis 1
        return True
    return size == channels and (list(shape) in ([channels, 1, 1], [1, channels, 1, 1]))


def _fits(node, derived: set[str], const_shape, channels: int) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type not in POINTWISE:
        return False
    if len([o for o in node.output if o]) != 1:
        return False
    if node.op_type == "BatchNormalization":  # its parameters are one value a channel by definition
        return node.input[0] in derived and all(const_shape(x) is not None for x in node.input[1:5])
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    quant = node.op_type in ("QuantizeLinear", "DequantizeLinear")
    if quant and axis not in (1, -3):
        return False
    for k, x in enumerate(node.input):
        if not x or x in derived:
            continue
        shape = const_shape(x)
        if shape is None or not _per_channel(shape, channels, quant and k > 0):
            return False
    return any(x in derived for x in node.input if x)


def tail_after(index, root: str, claimed: set[int], const_shape, dtype_of, channels: int):
    """(the tail's node indices in order, its output) after the quantized tensor `root`, or None: the longest one
    that ends in a u8 or s8 QuantizeLinear and whose tensors, root's included, are read only inside it."""
    if root in index.graph_outputs:
        return None
    members: list[int] = []
    derived = {root}
    queue = sorted(set(index.consumers.get(root, [])))
    seen = set(queue)
    while queue and len(members) < MAX_NODES:
        i = heapq.heappop(queue)  # in graph order: a node comes after what it reads
        node = index.nodes[i]
        if i in claimed or not _fits(node, derived, const_shape, channels):
            continue
        members.append(i)
        derived.add(node.output[0])
        for c in index.consumers.get(node.output[0], []):
            if c not in seen:
                seen.add(c)
                heapq.heappush(queue, c)
    best = None
    for end_at in range(len(members)):
        end = index.nodes[members[end_at]]
        if end.op_type != "QuantizeLinear" or dtype_of(end.output[0]) not in ("uint8", "int8"):
            continue
        needed = _ancestors(index, members[:end_at + 1], end.output[0], root)
        inside = set(needed)
        made = {root} | {index.nodes[k].output[0] for k in needed} - {end.output[0]}
        if all(c in inside for t in made for c in index.consumers.get(t, [])) and \
                not any(t in index.graph_outputs or t in index.used_by_subgraphs for t in made):
            best = (needed, end.output[0])
    return best


def _ancestors(index, members: list[int], out: str, root: str) -> list[int]:
    """The members that `out` is computed from, in order."""
    by_out = {index.nodes[k].output[0]: k for k in members}
    need, stack = set(), [out]
    while stack:
        t = stack.pop()
        k = by_out.get(t)
        if k is None or k in need:
            continue
        need.add(k)
        stack += [x for x in index.nodes[k].input if x and x != root]
    return [k for k in members if k in need]


def lookup_table(nodes: list[onnx.NodeProto], root: str, end: str, root_dtype: str, end_dtype: str, channels: int,
                 initializers: list[onnx.TensorProto], opsets) -> np.ndarray:
    """The tail run on every value of root's type in every channel, by onnxruntime: [channels * 256 + 4] bytes,
    entry c * 256 + (q - the type's lowest) the output's byte (4 bytes of slack for a gather of dwords)."""
    from onnxopt.timing import make_session

    vals = np.arange(VALUES, dtype=np.int32) - (128 if root_dtype == "int8" else 0)
    x = np.broadcast_to(vals.astype(np.dtype(root_dtype)), (1, channels, 1, VALUES)).copy()
    rt, et = (helper.np_dtype_to_tensor_dtype(np.dtype(t)) for t in (root_dtype, end_dtype))
    g = helper.make_graph(list(nodes), "tail", [helper.make_tensor_value_info(root, rt, list(x.shape))],
                          [helper.make_tensor_value_info(end, et, list(x.shape))], list(initializers))
    model = helper.make_model(g, opset_imports=list(opsets))
    model.ir_version = min(model.ir_version, 9)
    (y,) = make_session(model, 1).run(None, {root: x})  # as onnxruntime optimizes the model: the same kernels
    table = np.zeros(channels * VALUES + 4, np.uint8)
    table[:channels * VALUES] = np.ascontiguousarray(y).view(np.uint8).reshape(-1)
    return table
