"""An AFUSION region (a convolution and the one or more convolutions reading its output, or the pool reading it, in
one kernel) -> native object and the glue's description.

Each convolution runs its own tile set (codegen/compute/tile_sets.py, shared with any kernel that needs the same
tiles); the glue (codegen/glue/afusion_exec.c) runs the first into a scratch band and the seconds from it.
"""

from __future__ import annotations

from onnxopt.fusion.region import Region

from ..elementwise.types import ONNX_ENUM
from ..glue.descs import AfKernelDesc
from ..target import Target
from .describe import describe_compute
from .tile_sets import TileSetRequest


def describe_afusion(region: Region, name: str, target: Target) -> tuple[AfKernelDesc, list[TileSetRequest]]:
    """The glue's description of the fused op and the tile sets of its convolutions."""
    first, *seconds = region.compute.parts
    miso = int(region.compute.attrs.miso_extra)
    d1, sets = describe_compute(first, f"{name}_first", target)
    descs, inputs, at = [], [], len(first.inputs)
    for b, second in enumerate(seconds):
        d, more = describe_compute(second, f"{name}_second{b}", target)
        sets += more
        if miso < 0:
            d.in_blocked = 1  # it reads the blocked band, whatever layout its fallback takes
        descs.append(d)
        # Where the second's inputs start, each without the intermediate: SISO/SIMO its packed weights (its input is
        # the band), MISO its input x (the intermediate was one of its epilogue inputs).
        inputs.append(at)
        at += len(second.inputs) - 1
    desc = AfKernelDesc(
        op_type=name,
        in_types=[ONNX_ENUM["float32"]] * len(region.inputs),
        out_types=[ONNX_ENUM["float32"]] * len(region.outputs),
        first=d1, seconds=descs, second_inputs=inputs,
        band_rows=int(region.compute.attrs.band_rows),
        miso_extra=miso,
        chain=int(region.compute.attrs.chain),
        pool=region.compute.attrs.pool,
    )
    return desc, sets
