"""`--precision bf16` (and `auto`'s choice) for the recurrent kind: its packed W and R stored as bfloat16.

A batch-1 step reads all of R once a step and is bound by how fast R streams from L2 or L3 (benchmarks/
recurrent_cells.py: 96 GB/s for ddddocr's 4 MiB a direction), so halving R's bytes is what speeds it up. The kernel
widens each bfloat16 vector exactly (a zero-extend and a shift) and multiplies in float32; h, c, the gates and the
sums stay float32, so the only rounding is the weights' (to nearest even, once, here). No instruction is needed
beyond the target's vectors, so every target takes it. float16 would store the same bytes, but `--precision fp16`
keeps the recurrent kernels float32 (its value is float16 arithmetic, which this kernel does not have).
"""

from __future__ import annotations

import dataclasses

import onnx
from onnx import numpy_helper

from onnxopt.fusion.compute import bfloat16_bits, bfloat16_weights


def lower(region, dtype: str, opset: int) -> str | None:
    """Store the region's packed W and R as `dtype` ("bfloat16") in place; or why not."""
    p = region.params
    if dtype != "bfloat16":
        return f"recurrent: float32 (its kernel widens bfloat16 weights; {dtype} is not taken)"
    if p.weights != "float32":
        return None
    names = [region.inputs[1], region.inputs[2]]
    body = []
    for n in p.body:  # copies: the float32 region's own nodes stay as they are
        c = onnx.NodeProto()
        c.CopyFrom(n)
        body.append(c)
    inits = []
    for t in region.initializers:
        if t.name not in names:
            inits.append(t)
            continue
        decoded = f"{t.name}__f32"
        tensor, decode = bfloat16_weights(t.name, bfloat16_bits(numpy_helper.to_array(t)), list(t.dims), opset,
                                          decoded)
        inits.append(tensor)
        for n in body:  # the fallback's unpacking reads the decoded weights
            n.input[:] = [decoded if x == t.name else x for x in n.input]
        body = decode + body
    region.initializers = inits
    region.params = dataclasses.replace(p, weights="bfloat16", body=tuple(body),
                                        weight_type=onnx.TensorProto.BFLOAT16 if opset >= 13
                                        else onnx.TensorProto.UINT16)
    if region.op_type_key:
        region.compute_op_type(region.op_type_key)
    return None
