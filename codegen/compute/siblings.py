"""A sibling region (convolutions reading the same input, horizontal fusion) -> native object and the glue's
description.

Each sibling runs its own tile set (codegen/compute/tile_sets.py; siblings with the same epilogue share one); the
glue (codegen/glue/siblings_exec.c) runs all their tasks in one parallel loop.
"""

from __future__ import annotations

from onnxopt.fusion.region import Region

from ..elementwise.types import ONNX_ENUM
from ..glue.descs import SbKernelDesc
from ..target import Target
from .describe import describe_compute
from .tile_sets import TileSetRequest


def describe_siblings(region: Region, name: str, target: Target) -> tuple[SbKernelDesc, list[TileSetRequest]]:
    """The glue's description of the fused op and the tile sets of its convolutions."""
    descs, inputs, outputs, sets = [], [], [], []
    at_in, at_out = 1, 0  # input 0 is the shared input
    for b, part in enumerate(region.compute.parts):
        d, more = describe_compute(part, f"{name}_part{b}", target)
        descs.append(d)
        sets += more
        inputs.append(at_in)
        outputs.append(at_out)
        at_in += len(part.inputs) - 1
        at_out += len(part.outputs)
    desc = SbKernelDesc(
        op_type=name,
        in_types=[ONNX_ENUM["float32"]] * len(region.inputs),
        out_types=[ONNX_ENUM["float32"]] * len(region.outputs),
        parts=descs, part_inputs=inputs, part_outputs=outputs,
    )
    return desc, sets
