"""Which QDQ GlobalAveragePool units become an int8 kernel, and why the others do not.

A unit is DequantizeLinear(x) -> GlobalAveragePool -> QuantizeLinear, x uint8 or int8 of rank 3 or more (NC and the
spatial dims), each step per tensor with a constant scalar scale and zero point, the pool the DequantizeLinear's only
reader and the QuantizeLinear the pool's, the output of x's type. onnxruntime runs such a unit as
QLinearGlobalAveragePool; the kernel computes what that does (exec.c). The region takes the unit whole, its
function fallback being the three nodes (graph/quantized.py `qdq_pool_units` names them for the guard)."""

from __future__ import annotations

import onnx

from onnxopt.fusion.elementwise import ElementwiseRule
from onnxopt.fusion.region import EwOp, EwProgram, Region, Value

from .params import QGapParams

INTS = ("uint8", "int8")


def _step(rule: ElementwiseRule, node) -> tuple[float, int] | str:
    """(scale, zero point) of a quantization step, or why it is not one the kernel takes."""
    if len(node.input) < 2:
        return "no scale"
    scale = rule.scalar_const(node.input[1])
    if scale is None or scale[1] != "float32" or not scale[0] > 0:
        return "its scale is not one constant positive float32"
    zp = node.input[2] if len(node.input) > 2 else ""
    if not zp:
        return float(scale[0]), 0
    z = rule.scalar_const(zp)
    if z is None or z[1] not in INTS:
        return "its zero point is not one constant int8 or uint8"
    return float(scale[0]), int(z[0])


def unit_of(rule: ElementwiseRule, i: int) -> tuple[list[int], QGapParams] | str:
    """Node i (a GlobalAveragePool)'s unit as (node indices: DQ, pool, Q; its parameters), or why it is not one."""
    idx = rule.index
    node = idx.nodes[i]
    dq_at = idx.producer.get(node.input[0]) if node.input else None
    if dq_at is None or idx.nodes[dq_at].op_type != "DequantizeLinear":
        return "its input is not a DequantizeLinear's"
    dq = idx.nodes[dq_at]
    readers = idx.consumers.get(node.output[0], [])
    if len(readers) != 1 or idx.nodes[readers[0]].op_type != "QuantizeLinear" or \
            node.output[0] in idx.graph_outputs:
        return "its result is not read by one QuantizeLinear only"
    q_at = readers[0]
    q = idx.nodes[q_at]
    if idx.consumers.get(dq.output[0], []) != [i] or dq.output[0] in idx.graph_outputs:
        return "its DequantizeLinear has other readers"
    dtype = rule.dtype_of(dq.input[0])
    if dtype not in INTS or rule.dtype_of(q.output[0]) != dtype:
        return "not uint8 or int8 in and the same type out"
    ti = rule.info.get(dq.input[0])
    if ti is None or ti.rank is None or ti.rank < 3:
        return "its input's rank is unknown or below 3"
    if any(a.name == "block_size" and a.i for step in (dq, q) for a in step.attribute):
        return "blocked quantization"
    x, y = _step(rule, dq), _step(rule, q)
    for what, s in (("DequantizeLinear", x), ("QuantizeLinear", y)):
        if isinstance(s, str):
            return f"its {what}: {s}"
    return [dq_at, i, q_at], QGapParams(dtype, x[0], x[1], y[0], y[1])


def find_regions(model: onnx.ModelProto, claimed: set[int], rejected: list[dict] | None = None) -> list[Region]:
    rule = ElementwiseRule(model)
    regions = []
    for i, node in enumerate(rule.index.nodes):
        if i in claimed or node.op_type != "GlobalAveragePool" or node.domain not in ("", "ai.onnx"):
            continue
        found = unit_of(rule, i)
        if isinstance(found, str):
            dq_at = rule.index.producer.get(node.input[0]) if node.input else None
            if rejected is not None and dq_at is not None and rule.index.nodes[dq_at].op_type == "DequantizeLinear":
                rejected.append({"nodes": [node.name or node.output[0]], "reason": f"GlobalAveragePool: {found}"})
            continue
        members, params = found
        if any(m in claimed for m in members):
            continue
        dq, q = rule.index.nodes[members[0]], rule.index.nodes[members[2]]
        x, y = dq.input[0], q.output[0]
        # The program only names the computation (the op type hashes it); lower.py and exec.c do the work.
        program = EwProgram(inputs=[Value(x, params.dtype)], consts={},
                            ops=[EwOp("GlobalAveragePool", (x,), y, params.dtype)], outputs=[Value(y, params.dtype)])
        dims = rule.info[x].shape or [None] * rule.info[x].rank
        shape = [d if isinstance(d, int) else None for d in dims[:2]] + [1] * (len(dims) - 2)
        region = Region("qgap", [rule.index.nodes[m] for m in members], [x], [y], program, shape)
        region.params = params
        claimed.update(members)
        regions.append(region)
    return regions
