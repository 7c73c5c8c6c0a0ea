"""A sibling region (convolutions reading the same input, horizontal fusion) -> native object and the glue's
description.

Every sibling's tile functions go into one module, prefixed by the fused op type; the glue
(codegen/glue/siblings_exec.c) runs all their tasks in one parallel loop.
"""

from __future__ import annotations

from onnxopt.fusion.region import Region

from ..compile import compile_object, new_module
from ..elementwise.types import ONNX_ENUM
from ..glue.library import SbKernelDesc
from ..target import Target
from .build import define_compute


def build_siblings(region: Region, target: Target) -> tuple[bytes, SbKernelDesc, str]:
    """Returns (object code, glue description, LLVM IR text)."""
    module = new_module(target, region.op_type)
    descs, inputs, outputs = [], [], []
    at_in, at_out = 1, 0  # input 0 is the shared input
    for b, part in enumerate(region.compute.parts):
        descs.append(define_compute(module, part, f"{region.op_type}_part{b}", target))
        inputs.append(at_in)
        outputs.append(at_out)
        at_in += len(part.inputs) - 1
        at_out += len(part.outputs)
    ir_text = str(module)
    desc = SbKernelDesc(
        op_type=region.op_type,
        in_types=[ONNX_ENUM["float32"]] * len(region.inputs),
        out_types=[ONNX_ENUM["float32"]] * len(region.outputs),
        parts=descs, part_inputs=inputs, part_outputs=outputs,
    )
    return compile_object(ir_text, target), desc, ir_text
