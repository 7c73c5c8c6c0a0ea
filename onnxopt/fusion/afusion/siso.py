"""AFUSION SISO: two convolution regions (each with its epilogue) fused into one kernel.

The first convolution's output tile is kept in a scratch band (codegen/glue/afusion_exec.c) and the second reads
it there; the intermediate tensor is never written. The fused region's inputs are the first region's, then the
second's without the intermediate; its outputs are the second's. Its function fallback is the two regions' fallbacks
one after the other, so the model is correct without the library.

What the kernel supports (`siso_reason` says why not, in words a report can show):
- both are 2-D float32 convolutions on the channel-vector kernel (8 or more lanes), each with one group or
  depthwise: a depthwise first reads channel vectors (an NCHW input is reordered to blocked first); a depthwise
  second (MobileNetV2's 1x1 expand -> 3x3 depthwise, whose intermediate is the network's widest tensor) reads the
  band one channel vector at a time;
- the first has a single output, the intermediate, read by nothing but the second (as its input only);
- the first's epilogue inputs are per channel or scalars (a per-pixel one would need the band's offsets).
"""

from __future__ import annotations

from dataclasses import replace

import onnx

from ..compute import POSITION, ComputeParams
from ..layout import is_depthwise, with_channel_vectors
from ..params import ComputeAttrs
from ..region import EwProgram, Region

# The band lives in the core's private L2 next to the weights it streams; half of it for the band.
DEFAULT_SCRATCH_BYTES = 512 * 1024


def conv_part_reason(r: Region, which: str, depthwise: bool | None = None) -> str | None:
    """Why region `r` cannot be a part of an AFUSION kernel, or None. A depthwise convolution can be a part when
    `depthwise` (by default: when it is the first, the band's producer)."""
    c = r.compute
    if c is None or c.op != "conv":
        return f"the {which} region is not a convolution"
    a = c.attrs
    if len(a.kernel or ()) != 2:
        return f"the {which} convolution is not 2-D"
    depthwise = which == "first" if depthwise is None else depthwise
    if a.groups != 1 and not (depthwise and is_depthwise(c)):
        return f"the {which} convolution is grouped" + \
            (" (only depthwise ones are supported)" if depthwise else " (a depthwise one can only be the first)")
    if c.weights is None:
        return f"the {which} convolution's weights are not constant"
    if c.tile is not None:
        return f"the {which} convolution has a searched register tile"
    if a.winograd:
        return f"the {which} convolution runs as Winograd tiles (its own kernel)"
    return None


def siso_reason(first: Region, second: Region, lanes: int, consumers: dict[str, list] | None = None,
                graph_outputs: set[str] = frozenset()) -> str | None:
    """None when `first` -> `second` can run as one AFUSION kernel, else why not."""
    if lanes < 8:
        return "AFUSION runs on the channel-vector kernel, which needs 8 or more lanes"
    for r, which in ((first, "first"), (second, "second")):
        why = conv_part_reason(r, which, depthwise=True)
        if why:
            return why
    if len(first.outputs) != 1:
        return "the first convolution's region has more than one output"
    t = first.outputs[0]
    if second.inputs[0] != t:
        return "the second convolution does not read the first one's output as its input"
    if t in second.inputs[1:]:
        return "the second convolution also reads the intermediate in its epilogue"
    return kept_inside_reason(first, consumers, graph_outputs)


def kept_inside_reason(first: Region, consumers: dict[str, list] | None, graph_outputs: set[str]) -> str | None:
    """Why the first part's output cannot stay inside the fused kernel (every pattern: it is never written), or None:
    it is a graph output, has another reader, or the first's epilogue needs the band's pixel offsets."""
    t = first.outputs[0]
    if t in graph_outputs:
        return "the intermediate is a graph output; it would have to be written"
    if consumers is not None and len(consumers.get(t, [])) != 1:
        return "the intermediate is also read outside the pair; it would have to be written"
    c1 = first.compute
    extras = first.inputs[len(first.inputs) - len(c1.extra_kinds):]
    if any(k == POSITION for k in c1.extra_kinds):
        return "the first convolution's epilogue reads a per-pixel input (" + \
            ", ".join(x for x, k in zip(extras, c1.extra_kinds) if k == POSITION) + ")"
    return None


def _seconds(seconds) -> list[Region]:
    return [seconds] if isinstance(seconds, Region) else list(seconds)


def band_bytes(first: Region, seconds, lanes: int, band_rows: int, out_w1: int) -> int:
    """Bytes of the scratch band for `band_rows` output rows of the second convolution(s) (afusion_exec.c): the
    union of the rows and columns each second reads, its padding included."""
    seconds = _seconds(seconds)
    a1 = first.compute.attrs
    pt = max(r.compute.attrs.pads[0] for r in seconds)
    rows = max((band_rows - 1) * a.strides[0] + (a.kernel[0] - 1) * a.dilations[0] + 1 + pt - a.pads[0]
               for a in (r.compute.attrs for r in seconds))
    cols = out_w1 + max(r.compute.attrs.pads[1] for r in seconds) + max(r.compute.attrs.pads[3] for r in seconds)
    return -(-a1.oc // lanes) * rows * cols * lanes * 4


def choose_band_rows(first: Region, seconds, lanes: int, out_h2: int, out_w1: int, batch: int,
                     threads: int, scratch_bytes: int = DEFAULT_SCRATCH_BYTES) -> int:
    """The tallest band whose scratch fits `scratch_bytes`, keeping at least two bands per thread when the output
    has the rows for it (a thread whose band is the last, short one waits for the others)."""
    rows = 1
    while rows < out_h2 and band_bytes(first, seconds, lanes, rows + 1, out_w1) <= scratch_bytes:
        rows += 1
    return balanced_rows(rows, out_h2, batch, threads)


def balanced_rows(max_rows: int, out_h: int, batch: int, threads: int) -> int:
    """A band height of at most `max_rows` whose tasks (batch x bands) keep the threads evenly busy: at least two
    per thread, and a whole number per thread unless there are so many that the remainder hardly matters (56 rows
    on 2 threads in bands of 18 is 18, 18, 18, 2: one thread does 36 rows, the other 20; bands of 14 do 28 each)."""
    threads = max(1, threads)
    bands = -(-out_h // max(1, max_rows))
    while True:
        rows = -(-out_h // bands)
        tasks = batch * -(-out_h // rows)
        if rows == 1 or (tasks >= 2 * threads and (tasks % threads == 0 or tasks >= 8 * threads)):
            return rows
        bands += 1


def _distinct_names(body: list, before: list, suffix: str = "__second") -> list:
    """`body` with the tensors it makes renamed where `before` makes the same names: the two fallbacks both name
    the intermediate's NCHW form when it is blocked (one blocks it, the other unblocks it), and a function body must
    assign each name once."""
    taken = {o for n in before for o in n.output}
    renames = {o: f"{o}{suffix}" for n in body for o in n.output if o in taken}
    out = []
    for n in body:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        for seq in (m.input, m.output):
            for i, x in enumerate(seq):
                seq[i] = renames.get(x, x)
        out.append(m)
    return out


def fuse_siso(first: Region, second: Region, lanes: int, ni: int, opset: int, band_rows: int) -> Region:
    """The AFUSION region of `first` -> `second` (check `siso_reason` first)."""
    return fuse_group(first, [second], lanes, ni, opset, band_rows)


def fuse_group(first: Region, seconds: list[Region], lanes: int, ni: int, opset: int, band_rows: int) -> Region:
    """The AFUSION region of `first` and the convolution(s) reading its output (one: SISO, several: SIMO, see
    simo.py; check the pattern's reason first). Inputs: the first's, then each second's without the intermediate;
    outputs: each second's."""
    parts = channel_vector_parts([first, *seconds], lanes, ni, opset)
    p1, rest = parts[0], parts[1:]
    return fused_region(first, parts, inputs=list(p1.inputs) + [x for p in rest for x in p.inputs[1:]],
                        attrs=ComputeAttrs(band_rows=int(band_rows), in_blocked=int(p1.compute.attrs.in_blocked),
                                           out_blocked=int(rest[0].compute.attrs.out_blocked), block=lanes))


def channel_vector_parts(regions: list[Region], lanes: int, ni: int, opset: int) -> list[Region]:
    """Copies of the regions on the channel-vector kernel (a plan's other regions may share their parameters)."""
    parts = []
    for r in regions:
        r = replace(r, inputs=list(r.inputs), outputs=list(r.outputs), measured={})
        c = r.compute
        if c.attrs.out_blocked or c.attrs.channel_vectors:
            r.params = replace(c, attrs=replace(c.attrs), initializers=list(c.initializers), body=list(c.body))
            if r.op_type_key:
                r.compute_op_type(r.op_type_key)
        else:
            with_channel_vectors(r, lanes, ni, opset)
        parts.append(r)
    return parts


def fused_region(first: Region, parts: list[Region], inputs: list[str], attrs: ComputeAttrs,
                 outputs: list[str] | None = None) -> Region:
    """The AFUSION region of `parts` (first first): its fallback is the parts' fallbacks in order, its outputs the
    later parts' (or `outputs`: a chain's, the last part's only)."""
    body = list(parts[0].compute.body)
    for b, p in enumerate(parts[1:]):
        body += _distinct_names(p.compute.body, body, "__second" if b == 0 else f"__second{b}")
    compute = ComputeParams(
        op="afusion", attrs=attrs,
        initializers=[t for p in parts for t in p.compute.initializers],
        body=body,
        orig_consts=[t for p in parts for t in p.compute.orig_consts],
        parts=parts,
    )
    program = EwProgram(inputs=[], consts={}, ops=[], outputs=[])  # the parts carry the epilogues
    fused = Region(label="afusion", nodes=[nd for p in parts for nd in p.nodes], inputs=inputs,
                   outputs=[o for p in parts[1:] for o in p.outputs] if outputs is None else outputs,
                   program=program, shape=list(parts[1].shape if outputs is None else parts[-1].shape),
                   params=compute)
    if first.op_type_key:
        fused.compute_op_type(first.op_type_key)
    return fused
