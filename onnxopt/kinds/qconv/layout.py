"""Blocked int8 tensors between qconv kernels.

A u8 or s8 tensor [N, C, H, W] that one requantizing qconv kernel writes and only other qconv kernels read, as
their input, is passed in the blocked layout [N, ceil(C / 4), H, W, 4], channels past C zero. A pixel's 4 channels
are then the 4 bytes of K that the dot-product instructions take together, so:
- the reader packs its panels by copying 4-byte words (a 1x1 convolution's panel is 64 contiguous bytes), instead
  of interleaving 4 channel planes byte by byte (exec.c);
- the writer stores one word per pixel for 4 output channels (lower.py).
No DequantizeLinear -> QuantizeLinear runs between them: the QDQ unit's pair is already inside the kernels.

A Concat of such tensors along their channels (a quantized model's, graph/quantized_concats.py: SqueezeNet's fire
modules) passes them through when every part is a whole number of words and only qconv kernels read the result:
it is then a Concat along the blocks, and the copy kernel places the words ([N, C/4, H, W, 4]; copy_exec.c). So
the expands write words and the next squeeze reads them.

This happens only in the blocked plan (driver/plans.py). A chain's kernels can only be judged together, while the
NCHW plan still lets the whole-model decision drop one kernel at a time.

The function fallbacks wrap the original nodes in the float layout's Transpose/Reshape/Pad/Slice
(fusion/layout.py block_nodes, unblock_nodes), so that they compute the same blocked tensors.
"""

from __future__ import annotations

from dataclasses import replace

import onnx

from onnxopt.fusion.layout import block_nodes, unblock_nodes
from onnxopt.fusion.params import CopyParams
from onnxopt.fusion.region import Region

from .params import BLOCK, QUANT, QConvParams


def reads_blocked(p: QConvParams) -> bool:
    """Its packing reads words of 4 channels: one group (grouped ones pack per group, depthwise ones per plane) of
    more than one channel (with one, K runs over the taps)."""
    return p.group == 1 and not p.depthwise and p.cin > 1


def writes_blocked(p: QConvParams) -> bool:
    """It requantizes (an int8 output) and each of its tiles starts at a multiple of 4 output channels."""
    return p.mode == QUANT and p.group == 1 and not p.depthwise and p.mr % BLOCK == 0


def assign(regions: list[Region], index, shape_of, opset: int) -> list[Region]:
    """Convert the plan's qconv regions whose input or output is passed blocked; returns them."""
    node_pos = {id(n): i for i, n in enumerate(index.nodes)}
    owner = {node_pos[id(n)]: r for r in regions for n in r.nodes if id(n) in node_pos}

    def static(name):
        s = shape_of(name)
        return s is not None and len(s) == 4 and all(isinstance(d, int) and d > 0 for d in s)

    def qconv(r):
        return r is not None and isinstance(r.params, QConvParams)

    def passable(t):
        return static(t) and t not in index.graph_outputs and t not in index.used_by_subgraphs

    def users_of(t):
        return list({id(owner.get(c)): owner.get(c) for c in index.consumers.get(t, [])}.values())

    def reads_words(u, t):  # a qconv kernel that reads t as its blocked input
        return qconv(u) and reads_blocked(u.params) and u.inputs[0] == t and t not in u.inputs[1:]

    written = {r.outputs[0] for r in regions
               if qconv(r) and writes_blocked(r.params) and len(r.outputs) == 1 and passable(r.outputs[0])}
    # Concats of int8 tensors along the channels, each part whole words, read by qconv kernels alone
    concats = [r for r in regions
               if isinstance(r.params, CopyParams) and r.params.dtype in ("uint8", "int8") and not r.params.lanes
               and r.params.axis == 1 and passable(r.outputs[0]) and len(set(r.inputs)) == len(r.inputs)
               and all(x in written and shape_of(x)[1] % BLOCK == 0 for x in r.inputs)
               and (users := users_of(r.outputs[0])) and all(reads_words(u, r.outputs[0]) for u in users)]
    while True:  # a Concat passes words only while each of its parts is passed as words
        blocked = {t for t in written
                   if (users := users_of(t)) and all(u is not owner.get(index.producer[t]) and
                                                     (reads_words(u, t) or any(u is c for c in concats))
                                                     for u in users)}
        kept = [c for c in concats if all(x in blocked for x in c.inputs)]
        if len(kept) == len(concats):
            break
        concats = kept
    blocked |= {c.outputs[0] for c in concats}
    converted = []
    for r in regions:
        if qconv(r) and (r.inputs[0] in blocked or r.outputs[0] in blocked):
            convert(r, r.inputs[0] in blocked, r.outputs[0] in blocked, shape_of, opset)
            converted.append(r)
    for c in concats:
        convert_concat(c, shape_of, opset)
        converted.append(c)
    return converted


def convert_concat(r: Region, shape_of, opset: int) -> None:
    """An int8 Concat along the channels to one along the blocks of its blocked inputs and output; its function
    fallback unblocks each input, runs the Concat and blocks the result."""
    prologue, inputs = [], []
    for x in r.inputs:
        inputs.append(f"{x}__nchw")
        prologue += unblock_nodes(x, inputs[-1], shape_of(x)[1], BLOCK, opset)
    (concat,) = [n for n in r.params.body if n.op_type == "Concat"]
    m = onnx.NodeProto()
    m.CopyFrom(concat)
    del m.input[:]
    m.input.extend(inputs)
    o = r.outputs[0]
    m.output[0] = f"{o}__nchw"
    r.params = replace(r.params, lanes=BLOCK,
                       body=prologue + [m] + block_nodes(m.output[0], o, shape_of(o)[1], BLOCK, opset))


def convert(r: Region, in_blocked: bool, out_blocked: bool, shape_of, opset: int) -> None:
    renames, prologue, epilogue = {}, [], []
    if in_blocked:
        x = r.inputs[0]
        renames[x] = f"{x}__nchw"
        prologue = unblock_nodes(x, renames[x], shape_of(x)[1], BLOCK, opset)
    if out_blocked:
        o = r.outputs[0]
        renames[o] = f"{o}__nchw"
        epilogue = block_nodes(renames[o], o, shape_of(o)[1], BLOCK, opset)
    body = []
    for n in r.params.body:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        for field in (m.input, m.output):
            names = [renames.get(x, x) for x in field]
            del field[:]
            field.extend(names)
        body.append(m)
    r.params = replace(r.params, in_blocked=in_blocked, out_blocked=out_blocked,
                       body=tuple(prologue + body + epilogue))
