"""`--precision bf16` (and `auto`'s choice) for the recurrent kind: its packed W and R stored as bfloat16.

A batch-1 step reads all of R once a step and is bound by how fast R streams from L2 or L3 (benchmarks/
recurrent_cells.py: 96 GB/s for ddddocr's 4 MiB a direction), so halving R's bytes is what speeds it up. The kernel
widens each bfloat16 vector exactly (a zero-extend and a shift) and multiplies in float32; h, c, the gates and the
sums stay float32, so the only rounding is the weights' (to nearest even, once, here). No instruction is needed
beyond the target's vectors, so every target takes it. float16 would store the same bytes, but `--precision fp16`
keeps the recurrent kernels float32 (its value is float16 arithmetic, which this kernel does not have).

The rounding compounds over the steps: ddddocr's LSTM (512 units, 32 steps) reached 3% of its output range on the
region check's random inputs, past the bf16 kernel tolerance, and the region then went back to onnxruntime's own
LSTM, slower than the float32 kernel. So before lowering, the cell runs in onnxruntime on random inputs at the
region's shape with its weights rounded and not (`bf16_error`); past the tolerance the region keeps its float32
kernel, and the report says why.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxopt.fusion.compute import bfloat16_bits, bfloat16_values, bfloat16_weights
from onnxopt.verify import LOW_PRECISION_TOLERANCE, compare, random_array

STEPS_UNKNOWN = 32  # the steps the error is judged at when T is known only at run time


def lower(region, dtype: str, opset: int) -> str | None:
    """Store the region's packed W and R as `dtype` ("bfloat16") in place; or why not."""
    p = region.params
    if dtype != "bfloat16":
        return f"recurrent: float32 (its kernel widens bfloat16 weights; {dtype} is not taken)"
    if p.weights != "float32":
        return None
    failed = bf16_error(region)
    if failed:
        return f"recurrent: float32 ({failed})"
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


def bf16_error(region, seed: int = 0) -> str | None:
    """Why the cell's output with bfloat16 W and R is past the bf16 kernel tolerance, or None: its function body
    (the packed weights unpacked into the node) run in onnxruntime with the weights as they are and rounded, on random
    inputs at the region's shape (T and B where known, else STEPS_UNKNOWN steps of one row)."""
    import onnxruntime as ort

    p = region.params
    shape = [d if isinstance(d, int) else None for d in (region.shape or [None] * 3)]
    steps, batch = shape[0] or STEPS_UNKNOWN, shape[1] or 1
    rng = np.random.default_rng(seed)
    inputs = {region.inputs[0]: random_array([steps, batch, p.input_size], "float32", rng)}
    for name in region.inputs[4:]:  # initial_h, initial_c
        inputs[name] = random_array([p.directions, batch, p.hidden], "float32", rng)
    tables = {t.name: numpy_helper.to_array(t) for t in region.initializers}

    def run(weights):
        graph = helper.make_graph(
            list(p.body), "cell",
            [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, v.shape) for x, v in inputs.items()],
            [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in region.outputs],
            [numpy_helper.from_array(weights.get(k, v), k) for k, v in tables.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        so = ort.SessionOptions()
        so.log_severity_level = 3
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
            None, inputs)

    rounded = {name: bfloat16_values(tables[name]) for name in region.inputs[1:3]}
    bad = [d for d in compare(region.outputs, run({}), run(rounded), LOW_PRECISION_TOLERANCE) if not d.ok]
    if not bad:
        return None
    d = bad[0]
    return (f"with bfloat16 weights its {d.name} is off by {d.max_abs:.3g} after {steps} steps, past the bf16 "
            "kernel tolerance")
