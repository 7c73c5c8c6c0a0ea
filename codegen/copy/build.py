"""One copy region (fusion/blocked_copy.py) -> the glue's description; no object code."""

from __future__ import annotations

from onnxopt.fusion.region import Region

from ..elementwise.types import ONNX_ENUM
from ..target import Target
from .desc import ELEMENT_BYTES, INLINE_FLOATS, INT8_LANES, MAX_TASKS, CopyKernelDesc


def build_copy(region: Region, target: Target) -> tuple[tuple, CopyKernelDesc, str]:
    """Returns (no objects, glue description, no IR), the shape build_many expects."""
    c = region.copy
    int8 = c.dtype != "float32"
    if c.lanes and c.lanes != (INT8_LANES if int8 else target.float32_lanes) and (int8 or c.lanes != 1):
        raise ValueError(f"a blocked copy of {c.lanes} lanes for a target of {target.float32_lanes}")
    if c.lanes == 1 and (len(c.factors) != 1 or c.slice):
        raise ValueError("a copy of one lane is a nearest Resize of one NCHW tensor")
    if c.split and (len(c.split) != len(region.outputs) or len(c.factors) != 1 or c.slice or int8
                    or tuple(c.factors[0]) != (1, 1)):
        raise ValueError("a Split's copy reads one float32 tensor and writes one output a part")
    if int8 and (c.slice or any(tuple(f) != (1, 1) for f in c.factors)):
        raise ValueError("a copy of int8 tensors is a Concat (of plain tensors, or of qconv's blocked ones)")
    desc = CopyKernelDesc(op_type=region.op_type, in_types=[ONNX_ENUM[c.dtype]] * len(region.inputs),
                          out_types=[ONNX_ENUM[c.dtype]] * len(region.outputs), elem=ELEMENT_BYTES[c.dtype],
                          lanes=c.lanes, factors=list(c.factors), axis=c.axis, slice=c.slice, split=c.split,
                          max_tasks=c.max_tasks or MAX_TASKS, inline_floats=c.inline_floats or INLINE_FLOATS)
    return (), desc, ""
