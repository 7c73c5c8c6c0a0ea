"""AFUSION SIMO: one convolution region and the two or more convolution regions that read its output, in one kernel.

A SqueezeNet fire module is the example: the squeeze 1x1 convolution's output is read by a 1x1 and a 3x3 expand
convolution. The kernel (codegen/glue/afusion_exec.c, shared with SISO) keeps the squeeze output in one scratch band,
the union of the tiles both expands need (the 3x3's halo rows and padding columns; the 1x1 reads the band shifted by
the padding), and runs each expand from it; the intermediate is never written. The fused region's inputs are the
first region's, then each second's without the intermediate; its outputs are each second's in turn. Band sizing and
the fused region are siso.py's, which take any number of second convolutions.

What the kernel supports besides SISO's rules for each pair (`simo_reason` says why not):
- two to four second convolutions (AF_MAX_SECOND in codegen/glue/afusion.h), all the intermediate's readers;
- the same strides and output size (the plan checks the sizes on inferred shapes), so one band of output rows is one
  band for every second;
- the same output layout (all blocked or all NCHW): the fused region has one.
"""

from __future__ import annotations

from onnxopt.codegen.glue.kinds import c_define

from ..region import Region
from .siso import siso_reason

MAX_SECONDS = c_define("afusion.h", "AF_MAX_SECOND")


def simo_reason(first: Region, seconds: list[Region], lanes: int, consumers: dict[str, list] | None = None,
                graph_outputs: set[str] = frozenset()) -> str | None:
    """None when `first` and the convolutions `seconds` reading its output can run as one AFUSION kernel, else why
    not."""
    if not 2 <= len(seconds) <= MAX_SECONDS:
        return f"SIMO fuses 2 to {MAX_SECONDS} convolutions reading one intermediate, not {len(seconds)}"
    for second in seconds:
        why = siso_reason(first, second, lanes, None, graph_outputs)
        if why:
            return why
    t = first.outputs[0]
    if consumers is not None and len(consumers.get(t, [])) != len(seconds):
        return "the intermediate is also read outside the fused convolutions; it would have to be written"
    strides = {tuple(r.compute.attrs.strides) for r in seconds}
    if len(strides) > 1:
        return f"the convolutions reading the intermediate have different strides ({sorted(strides)})"
    layouts = {bool(r.compute.attrs.out_blocked) for r in seconds}
    if len(layouts) > 1:
        return "the convolutions reading the intermediate write different layouts (blocked and NCHW)"
    return None
