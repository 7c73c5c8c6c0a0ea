"""A quantized model's MaxPools, nearest Resizes and Transposes moved onto int8 tensors: MaxPool -> QuantizeLinear
becomes QuantizeLinear -> MaxPool, and the same for a Resize in nearest mode and a Transpose.

A maximum commutes with any non-decreasing map, and QuantizeLinear (divide by a positive scale, round, add the zero
point, saturate) is one, so quantizing the window's largest value gives what the largest of the quantized values is,
padding included: a float MaxPool pads with the lowest float, which quantizes to the type's least value, the value
an integer MaxPool pads with. onnxruntime does the same when it loads a QDQ model (its QDQ propagation moves the
QuantizeLinear above the MaxPool and then runs an integer MaxPool); writing it into the graph lets the pool kind run
that integer MaxPool (onnxruntime's own is a plain loop: 65 us of PP-OCR cls's 0.75 ms), and the QuantizeLinear
join the elementwise unit that makes the float.

Where the MaxPool's input is a DequantizeLinear with the very steps of the QuantizeLinear (SqueezeNet's and YOLOv8n's
DequantizeLinear -> MaxPool -> QuantizeLinear units), the pair quantizes back what it dequantized: the MaxPool reads
the int8 tensor and both steps go. (q - z) * s / s rounds back to q - z exactly for |q - z| <= 255: the quotient is
within two ulps of that integer.

A nearest Resize only copies input values to output positions, so it commutes with any elementwise map, quantizing
included (YOLOv8n's and PP-OCR det's upsampling between QDQ pairs); not its tf_crop_and_resize mode, whose
extrapolated float value need not quantize to what an integer Resize writes there. A Transpose only moves values
(YOLOv8n's box head transposes between two QDQ pairs before its Softmax: graph/quantized_softmax.py).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

INT8_TYPES = (onnx.TensorProto.UINT8, onnx.TensorProto.INT8)


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _scalar_step(node: onnx.NodeProto, inits: dict) -> tuple | None:
    """(scale, zero point, its element type) of a per-tensor step with constant scalar operands, else None."""
    if len(node.input) < 2:
        return None
    zp_name = node.input[2] if len(node.input) > 2 else ""
    if not zp_name and any(a.name == "output_dtype" and a.i not in (0, onnx.TensorProto.UINT8) for a in node.attribute):
        return None  # no zero point, and another type than uint8
    return scalar_step(node.input[1], zp_name, inits)


def scalar_step(scale_name: str, zp_name: str, inits: dict) -> tuple | None:
    """(scale, zero point, its element type) of constant scalar operands (no zero point: uint8's 0), else None."""
    if scale_name not in inits:
        return None
    scale = inits[scale_name]
    if scale.data_type != onnx.TensorProto.FLOAT or int(np.prod(scale.dims)) != 1:
        return None
    if not zp_name:
        return float(numpy_helper.to_array(scale).reshape(-1)[0]), 0, onnx.TensorProto.UINT8
    if zp_name not in inits:
        return None
    zp = inits[zp_name]
    if zp.data_type not in INT8_TYPES or int(np.prod(zp.dims)) != 1:
        return None
    return float(numpy_helper.to_array(scale).reshape(-1)[0]), int(numpy_helper.to_array(zp).reshape(-1)[0]), \
        zp.data_type


def _selects(n: onnx.NodeProto, opset: int) -> bool:
    """Whether `n` only picks or moves input values (a maximum, nearest neighbours, a transposition) in an opset
    where it takes int8."""
    if n.domain not in ("", "ai.onnx") or not n.input or not n.output:
        return False
    attrs = {a.name: a for a in n.attribute}
    if n.op_type == "MaxPool":
        return opset >= 12
    if n.op_type == "Resize":
        mode = attrs["mode"].s if "mode" in attrs else b"nearest"
        ctm = attrs["coordinate_transformation_mode"].s if "coordinate_transformation_mode" in attrs else b""
        return opset >= 11 and mode == b"nearest" and ctm != b"tf_crop_and_resize"
    return n.op_type == "Transpose"


def graph_maps(graph: onnx.GraphProto) -> tuple[dict, set, dict, dict]:
    """(initializers by name, the graph's output names, each tensor's reader nodes, each tensor's producer node)."""
    readers: dict[str, list] = {}
    producer = {}
    for n in graph.node:
        for x in n.input:
            if x:
                readers.setdefault(x, []).append(n)
        for o in n.output:
            if o:
                producer[o] = n
    return {t.name: t for t in graph.initializer}, {o.name for o in graph.output}, readers, producer


def rebuild_nodes(graph: onnx.GraphProto, drop: set[int], before: dict[int, list]) -> None:
    """The graph's nodes less those in `drop` (by id), each node preceded by its `before` nodes (new ones; a dropped
    node's replacement)."""
    nodes = []
    for n in graph.node:
        nodes.extend(before.get(id(n), []))
        if id(n) not in drop:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)


def quantize_before_max_pools(model: onnx.ModelProto) -> dict[str, int]:
    """Rewrite (in place) every MaxPool or nearest Resize whose only reader is a per-tensor QuantizeLinear into the
    same op on int8 after it, and drop a DequantizeLinear -> op -> QuantizeLinear unit's equal steps. Returns how
    many of each op type now run on int8 tensors. Before opset 12 (11 for Resize) they take no integers."""
    opset = _opset(model)
    moved = {"MaxPool": 0, "Resize": 0, "Transpose": 0}
    graph = model.graph
    inits, outputs, readers, producer = graph_maps(graph)
    drop: set[int] = set()
    before: dict[int, list] = {}  # a new QuantizeLinear, placed before the MaxPool it feeds
    for n in graph.node:
        if not _selects(n, opset):
            continue
        indices = n.output[1] if n.op_type == "MaxPool" and len(n.output) > 1 else ""
        if indices and (readers.get(indices) or indices in outputs):
            continue  # its Indices are used
        nxt = readers.get(n.output[0], [])
        if len(nxt) != 1 or n.output[0] in outputs or nxt[0].op_type != "QuantizeLinear":
            continue
        q = nxt[0]
        q_step = _scalar_step(q, inits)
        if q_step is None or q.input[0] != n.output[0]:
            continue
        dq = producer.get(n.input[0])
        dq_step = _scalar_step(dq, inits) if dq is not None and dq.op_type == "DequantizeLinear" else None
        if dq_step is not None and dq_step == q_step and readers.get(dq.output[0]) == [n] \
                and dq.output[0] not in outputs:
            n.input[0] = dq.input[0]  # the DequantizeLinear's int8 input, with both steps gone
            drop.add(id(dq))
        else:
            fresh = onnx.NodeProto()
            fresh.CopyFrom(q)
            fresh.name = f"{q.name or q.output[0]}__before_{n.name or n.output[0]}"
            fresh.output[0] = f"{n.input[0]}__quantized_for_{n.output[0]}"
            fresh.input[0] = n.input[0]
            n.input[0] = fresh.output[0]
            before[id(n)] = [fresh]
        del n.output[1:]
        n.output[0] = q.output[0]
        drop.add(id(q))
        moved[n.op_type] += 1
    if drop:
        rebuild_nodes(graph, drop, before)
    return moved


def int8_max_pools(graph: onnx.GraphProto, dtypes: dict[str, str]) -> set[str]:
    """The MaxPools of int8 or uint8 tensors, by first output: the pool kind runs them (an integer maximum), as
    onnxruntime's integer MaxPool does. `dtypes`: the element type of each tensor (onnxopt/dtypes.py names)."""
    return {n.output[0] for n in graph.node
            if n.op_type == "MaxPool" and n.input and n.output and dtypes.get(n.input[0]) in ("uint8", "int8")}
