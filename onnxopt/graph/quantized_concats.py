"""A quantized model's Concats moved onto int8 tensors.

quantize_static writes a Concat as DequantizeLinear per input -> Concat -> QuantizeLinear, with the output's steps
those of one input (the widest range) and each other input's its own: SqueezeNet's fire modules concatenate two
convolutions' outputs at 0.0555 and 0.0563. onnxruntime runs the unit as its QLinearConcat, one pass that maps each
input through a table; 220 us of SqueezeNet's 1.1 ms.

A Concat only places values, so the unit is QuantizeLinear(s, z) of DequantizeLinear(s_i, z_i) of each input in its
place. This rewrite writes it so:

    x_i -> DequantizeLinear(s_i, z_i) -> QuantizeLinear(s, z) -> Concat -> y     (an input at other steps)
    x_i -> Concat -> y                                                          (an input at the output's steps)

Exact: for the second form, (q - z) * s / s rounds back to q - z (graph/quantized_pools.py). The QOperator form,
com.microsoft's QLinearConcat (y_scale, y_zero, then each input with its scale and zero point), is the same unit in
one node, and onnxruntime computes it as the same DequantizeLinear -> QuantizeLinear of each value (a table made by
dequantizing every byte and quantizing it with MLAS's QuantizeLinear); it is rewritten the same way.

The pair of the first form is a function of x_i's value alone, so the requantizing convolution that writes x_i
takes it as its lookup table (kinds/qconv/lookup.py), and the Concat then only places bytes: inside a sequence the
convolutions write their parts of its output in place (emit/sequence.py's views) and nothing is copied.
"""

from __future__ import annotations

import onnx
from onnx import helper

from .quantized_pools import _scalar_step, graph_maps, rebuild_nodes, scalar_step


def requantize_before_concats(model: onnx.ModelProto) -> int:
    """Rewrite (in place) every QDQ Concat unit with per-tensor constant steps, one int8 type, each DequantizeLinear
    read by the Concat alone and the Concat by the QuantizeLinear alone, and every QLinearConcat with constant
    scalar steps of one type, as above. Returns how many Concats now run on int8 tensors."""
    graph = model.graph
    inits, outputs, readers, producer = graph_maps(graph)
    drop: set[int] = set()
    before: dict[int, list] = {}  # new QuantizeLinear nodes, placed before the Concat they feed
    moved = 0
    for n in graph.node:
        if n.op_type == "QLinearConcat" and n.domain == "com.microsoft":
            made = _qlinear_concat(n, inits)
            if made is not None:
                before[id(n)], concat = made
                drop.add(id(n))
                before[id(n)].append(concat)
                moved += 1
            continue
        if n.op_type != "Concat" or n.domain not in ("", "ai.onnx") or not n.input or not all(n.input):
            continue
        nxt = readers.get(n.output[0], [])
        if len(nxt) != 1 or n.output[0] in outputs or nxt[0].op_type != "QuantizeLinear":
            continue
        q = nxt[0]
        q_step = _scalar_step(q, inits)
        dqs = [producer.get(x) for x in n.input]
        if q_step is None or q.input[0] != n.output[0] or len(set(n.input)) != len(n.input):
            continue
        if any(d is None or d.op_type != "DequantizeLinear" or readers.get(d.output[0]) != [n]
               or d.output[0] in outputs for d in dqs):
            continue
        steps = [_scalar_step(d, inits) for d in dqs]
        if any(s is None or s[2] != q_step[2] for s in steps):
            continue  # another int8 type, or steps that are not constant scalars
        inputs, fresh = [], []
        for d, s in zip(dqs, steps):
            if s == q_step:  # at the output's steps: the int8 tensor itself
                inputs.append(d.input[0])
                drop.add(id(d))
                continue
            requant = onnx.NodeProto()
            requant.CopyFrom(q)
            requant.name = f"{q.name or q.output[0]}__for_{d.name or d.output[0]}"
            requant.input[0] = d.output[0]
            requant.output[0] = f"{d.output[0]}__requantized"
            fresh.append(requant)
            inputs.append(requant.output[0])
        del n.input[:]
        n.input.extend(inputs)
        n.output[0] = q.output[0]
        drop.add(id(q))
        before[id(n)] = fresh
        moved += 1
    if moved:
        rebuild_nodes(graph, drop, before)
    return moved


def _qlinear_concat(n: onnx.NodeProto, inits: dict) -> tuple[list, onnx.NodeProto] | None:
    """(the requantizing pairs, the Concat) that compute QLinearConcat `n`, or None where a step is not a constant
    scalar or the types differ."""
    args = list(n.input)
    if len(args) < 5 or (len(args) - 2) % 3 or not all(args):
        return None
    y_step = scalar_step(args[0], args[1], inits)
    triples = [args[k:k + 3] for k in range(2, len(args), 3)]
    steps = [scalar_step(s, z, inits) for _, s, z in triples]
    if y_step is None or any(s is None or s[2] != y_step[2] for s in steps):
        return None
    axis = next((a.i for a in n.attribute if a.name == "axis"), None)
    if axis is None:
        return None
    base = n.name or n.output[0]
    pairs, inputs = [], []
    for k, ((x, s, z), step) in enumerate(zip(triples, steps)):
        if step == y_step:
            inputs.append(x)
            continue
        pairs += [helper.make_node("DequantizeLinear", [x, s, z], [f"{base}__dq{k}"], name=f"{base}__dq{k}"),
                  helper.make_node("QuantizeLinear", [f"{base}__dq{k}", args[0], args[1]], [f"{base}__rq{k}"],
                                   name=f"{base}__rq{k}")]
        inputs.append(f"{base}__rq{k}")
    return pairs, helper.make_node("Concat", inputs, [n.output[0]], name=base, axis=axis)


def int8_concats(graph: onnx.GraphProto, dtypes: dict[str, str]) -> set[str]:
    """The Concats of uint8 or int8 tensors, by output: the copy kind places their bytes (a quantized model's, as
    this rewrite leaves them; onnxruntime's Concat does the same). `dtypes`: each tensor's element type."""
    return {n.output[0] for n in graph.node if n.op_type == "Concat" and n.output and n.input
            and all(dtypes.get(x) in ("uint8", "int8") for x in n.input)}
