"""AFUSION MISO: two convolution regions on their own inputs whose outputs meet in the second's epilogue.

A ResNet downsample block is the example (the shortcut's 1x1 convolution and the main path's last 1x1 meet in
Add -> Relu), and NASNet's two 1x1 convolutions into an Add (OptiFX's G6). In the plan the first region writes its
output t and the second reads t as a per-pixel input of its epilogue. The kernel (codegen/glue/afusion_exec.c) runs
both by bands of output rows: the first writes its rows into the fused output, where the second reads them as t and
overwrites them; t never goes to memory as a tensor of its own. No halo: both convolutions produce the same rows.

The fused region's inputs are the first region's, then the second's without t; its outputs are the second's.

What the kernel supports (`miso_reason` says why not):
- both are 2-D float32 convolutions on the channel-vector kernel, one group or depthwise;
- the first has a single output, t, read by nothing but the second's epilogue, as a per-pixel input (same shape as
  the output, which is what lets the first write into it);
- the first's epilogue inputs are per channel or scalars.
"""

from __future__ import annotations

from ..compute import POSITION
from ..params import ComputeAttrs
from ..region import Region
from .siso import (
    DEFAULT_SCRATCH_BYTES,
    balanced_rows,
    channel_vector_parts,
    conv_part_reason,
    fused_region,
    kept_inside_reason,
)


def epilogue_inputs(r: Region) -> list[str]:
    """The region's epilogue inputs, in the order of `compute.extra_kinds`."""
    return r.inputs[len(r.inputs) - len(r.compute.extra_kinds):] if r.compute.extra_kinds else []


def miso_extra(first: Region, second: Region) -> int | None:
    """The index among the second's epilogue inputs of the first's output, when it reads it per pixel once."""
    if len(first.outputs) != 1:
        return None
    hits = [e for e, (x, k) in enumerate(zip(epilogue_inputs(second), second.compute.extra_kinds))
            if x == first.outputs[0] and k == POSITION]
    return hits[0] if len(hits) == 1 else None


def miso_reason(first: Region, second: Region, lanes: int, consumers: dict[str, list] | None = None,
                graph_outputs: set[str] = frozenset()) -> str | None:
    """None when `first`'s output meets `second`'s in the second's epilogue and both can run as one AFUSION kernel,
    else why not."""
    if lanes < 8:
        return "AFUSION runs on the channel-vector kernel, which needs 8 or more lanes"
    for r, which in ((first, "first"), (second, "second")):
        why = conv_part_reason(r, which, depthwise=True)
        if why:
            return why
    if len(first.outputs) != 1:
        return "the first convolution's region has more than one output"
    t = first.outputs[0]
    if second.inputs[0] == t:
        return "the second convolution reads the first one's output as its input (that is SISO)"
    if miso_extra(first, second) is None:
        return "the second convolution's epilogue does not read the first one's output once, per pixel"
    return kept_inside_reason(first, consumers, graph_outputs)


def miso_band_rows(out_channels: int, lanes: int, out_h: int, out_w: int, batch: int, threads: int,
                   scratch_bytes: int = DEFAULT_SCRATCH_BYTES) -> int:
    """The tallest band of output rows (all channels, which the first writes and the second reads back) that fits
    `scratch_bytes`, balanced over the threads (`balanced_rows`)."""
    row_bytes = -(-out_channels // lanes) * lanes * out_w * 4
    return balanced_rows(max(1, min(out_h, scratch_bytes // max(1, row_bytes))), out_h, batch, threads)


def fuse_miso(first: Region, second: Region, lanes: int, ni: int, opset: int, band_rows: int) -> Region:
    """The AFUSION region of the MISO pair (check `miso_reason` first): inputs the first's, then the second's
    without the first's output."""
    e = miso_extra(first, second)
    p1, p2 = channel_vector_parts([first, second], lanes, ni, opset)
    drop = len(p2.inputs) - len(p2.compute.extra_kinds) + e  # the intermediate's place among the second's inputs
    inputs = list(p1.inputs) + [x for i, x in enumerate(p2.inputs) if i != drop]
    return fused_region(first, [p1, p2], inputs,
                        attrs=ComputeAttrs(band_rows=int(band_rows), in_blocked=int(p1.compute.attrs.in_blocked),
                                           out_blocked=int(p2.compute.attrs.out_blocked), block=lanes,
                                           miso_extra=e))
