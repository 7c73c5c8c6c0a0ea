"""An AFUSION region (a convolution and the one or more convolutions reading its output, or the pool reading it, in
one kernel) -> native object and the glue's description.

Every convolution's tile functions go into one module, prefixed by the fused op type; the glue
(codegen/glue/afusion_exec.c) runs the first into a scratch band and the seconds from it.
"""

from __future__ import annotations

from onnxopt.fusion.region import Region

from ..compile import compile_object, new_module
from ..elementwise.types import ONNX_ENUM
from ..glue.library import AfKernelDesc
from ..target import Target
from .build import define_compute


def build_afusion(region: Region, target: Target) -> tuple[bytes, AfKernelDesc, str]:
    """Returns (object code, glue description, LLVM IR text)."""
    first, *seconds = region.compute.parts
    miso = int(region.compute.attrs.get("miso_extra", -1))
    module = new_module(target, region.op_type)
    d1 = define_compute(module, first, f"{region.op_type}_first", target)
    descs, inputs, at = [], [], len(first.inputs)
    for b, second in enumerate(seconds):
        d = define_compute(module, second, f"{region.op_type}_second{b}", target)
        if miso < 0:
            d.in_blocked = 1  # it reads the blocked band, whatever layout its fallback takes
        descs.append(d)
        # Where the second's inputs start, each without the intermediate: SISO/SIMO its packed weights (its input is
        # the band), MISO its input x (the intermediate was one of its epilogue inputs).
        inputs.append(at)
        at += len(second.inputs) - 1
    ir_text = str(module)
    desc = AfKernelDesc(
        op_type=region.op_type,
        in_types=[ONNX_ENUM["float32"]] * len(region.inputs),
        out_types=[ONNX_ENUM["float32"]] * len(region.outputs),
        first=d1, seconds=descs, second_inputs=inputs,
        band_rows=int(region.compute.attrs["band_rows"]),
        miso_extra=miso,
        pool=region.compute.attrs.get("pool"),
    )
    return compile_object(ir_text, target), desc, ir_text
