"""Relus and Adds inside blocked chains, as our elementwise kernels on the 5-D tensors.

A blocked chain runs through zero-keeping unary ops (Relu, Clip around zero, ...) and through Add, Sub, Mul, Max and
Min of two blocked tensors as onnxruntime nodes on [N, C / L, H, W, L] (fusion/blocked_passthrough.py): the same
op on the same elements, plus padding channels that stay zero. Our elementwise kernels (codegen/elementwise) take
their shapes from the tensors at run time, so the region the elementwise rule builds from those nodes computes the
5-D form as it is, and a run of them (an Add and the Relu after it) becomes one kernel.

Why it pays: every onnxruntime node between two of our kernels ends a sequence (emit/sequence.py), and each
sequence opens a parallel section of its own. NASNet-A's cells add two pooled branches and apply a Relu before the
next cell's Concat: in its compute-blocked plan those Adds and Relus were onnxruntime's, between its sequences.

The kernel region replaces the passthrough regions of its nodes (Region.replaces), which stay in the plan as its
fallback: if the kernel is rejected, the plan gets them back (driver/policy.py, passthroughs_kept). Its function fallback is
its nodes, which are their own passthrough form.
"""

from __future__ import annotations

import onnx

from .blocked_passthrough import SAME_SHAPE_BINARY, ZERO_KEEPING
from .elementwise import ElementwiseRule
from .params import ElementwiseParams, RelayoutParams
from .region import Region

OPS = ZERO_KEEPING + SAME_SHAPE_BINARY


def blocked_elementwise(relayouts: list[Region], model: onnx.ModelProto, lanes: int) -> list[Region]:
    """Elementwise regions over the elementwise passthrough regions among `relayouts` (a blocked plan's), one per
    connected run of them, each marked with the lanes of its blocked inputs and outputs."""
    passthrough = {r.outputs[0]: r for r in relayouts
                   if isinstance(r.params, RelayoutParams) and not r.params.exit and len(r.nodes) == 1 and r.nodes[0].op_type in OPS}
    if not passthrough:
        return []
    rule = ElementwiseRule(model, min_ops=1)
    exclude = {i for i, n in enumerate(rule.index.nodes) if not n.output or n.output[0] not in passthrough}
    regions = rule.find_regions(exclude=exclude)
    for r in regions:
        r.params = ElementwiseParams(blocked_lanes=int(lanes), replaces=[passthrough[n.output[0]] for n in r.nodes])
    return regions
