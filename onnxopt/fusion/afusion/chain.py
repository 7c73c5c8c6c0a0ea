"""AFUSION chains of three: convolution regions A -> B -> C (each with its epilogue) in one kernel.

OptiFX's regions hold up to three region operators (T_graph = 3). The kernel (codegen/glue/afusion_chain_exec.c)
nests the two-convolution band: per band of C's output rows, B computes the rows C needs into a second scratch band
and A the rows those need into a first; neither intermediate is written. MobileNetV2's inverted residual block
(1x1 expand -> 3x3 depthwise -> 1x1 project, the residual Add in the project's epilogue) and ResNet's bottleneck
(1x1 -> 3x3 -> 1x1) are the examples.

What the kernel supports (`chain_reason` says why not): each link is a legal SISO pair (siso.py: 2-D float32 on the
channel-vector kernel, dense or depthwise, each intermediate read by the next convolution only and neither a graph
output, A's and B's epilogue inputs per channel or scalars). The fused region's inputs are A's, then B's and C's
without their intermediates; its outputs are C's; its fallback is the three regions' fallbacks in order.
"""

from __future__ import annotations

from ..params import ComputeAttrs
from ..region import Region
from .siso import DEFAULT_SCRATCH_BYTES, balanced_rows, channel_vector_parts, fused_region, siso_reason


def chain_reason(a: Region, b: Region, c: Region, lanes: int, consumers: dict[str, list] | None = None,
                 graph_outputs: set[str] = frozenset()) -> str | None:
    """None when A -> B -> C can run as one AFUSION kernel, else why not."""
    for first, second in ((a, b), (b, c)):
        why = siso_reason(first, second, lanes, consumers, graph_outputs)
        if why:
            return why
    return None


def _rows_read(r: Region, rows: int) -> int:
    """Input rows that `rows` output rows of convolution region `r` read (its padding rows included)."""
    at = r.compute.attrs
    return (rows - 1) * at.strides[0] + (at.kernel[0] - 1) * at.dilations[0] + 1


def _padded_width(r: Region, width: int) -> int:
    return width + r.compute.attrs.pads[1] + r.compute.attrs.pads[3]


def chain_band_bytes(a: Region, b: Region, c: Region, lanes: int, band_rows: int, out_w_a: int, out_w_b: int) -> int:
    """Bytes of both scratch bands for `band_rows` output rows of C (afusion_chain_exec.c)."""
    s2 = _rows_read(c, band_rows)
    s1 = _rows_read(b, s2)
    band2 = -(-b.compute.attrs.oc // lanes) * s2 * _padded_width(c, out_w_b) * lanes * 4
    band1 = -(-a.compute.attrs.oc // lanes) * s1 * _padded_width(b, out_w_a) * lanes * 4
    return band1 + band2


def chain_band_rows(a: Region, b: Region, c: Region, lanes: int, out_h_c: int, out_w_a: int, out_w_b: int,
                    batch: int, threads: int, scratch_bytes: int = DEFAULT_SCRATCH_BYTES) -> int:
    """The tallest band of C's rows whose two scratch bands fit `scratch_bytes`, balanced over the threads."""
    rows = 1
    while rows < out_h_c and chain_band_bytes(a, b, c, lanes, rows + 1, out_w_a, out_w_b) <= scratch_bytes:
        rows += 1
    return balanced_rows(rows, out_h_c, batch, threads)


def fuse_chain(a: Region, b: Region, c: Region, lanes: int, ni: int, opset: int, band_rows: int) -> Region:
    """The AFUSION region of A -> B -> C (check `chain_reason` first)."""
    parts = channel_vector_parts([a, b, c], lanes, ni, opset)
    pa, pb, pc = parts
    inputs = list(pa.inputs) + list(pb.inputs[1:]) + list(pc.inputs[1:])
    return fused_region(a, parts, inputs=inputs, outputs=list(pc.outputs),
                        attrs=ComputeAttrs(band_rows=int(band_rows), chain=1,
                                           in_blocked=int(pa.compute.attrs.in_blocked),
                                           out_blocked=int(pc.compute.attrs.out_blocked), block=lanes))
