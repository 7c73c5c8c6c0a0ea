"""Blocked int8 tensors between qconv kernels.

A u8 or s8 tensor [N, C, H, W] that one requantizing qconv kernel writes and only other qconv kernels read, as
their input, is passed in the blocked layout [N, ceil(C / 4), H, W, 4], channels past C zero. A pixel's 4 channels
are then the 4 bytes of K that the dot-product instructions take together, so:
- the reader packs its panels by copying 4-byte words (a 1x1 convolution's panel is 64 contiguous bytes), instead
  of interleaving 4 channel planes byte by byte (exec.c);
- the writer stores one word per pixel for 4 output channels (lower.py).
No DequantizeLinear -> QuantizeLinear runs between them: the QDQ unit's pair is already inside the kernels.

This happens only in the blocked plan (driver/plans.py). A chain's kernels can only be judged together, while the
NCHW plan still lets the whole-model decision drop one kernel at a time.

The function fallbacks wrap the original nodes in the float layout's Transpose/Reshape/Pad/Slice
(fusion/layout.py block_nodes, unblock_nodes), so that they compute the same blocked tensors.
"""

from __future__ import annotations

from dataclasses import replace

import onnx

from onnxopt.fusion.layout import block_nodes, unblock_nodes
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

    blocked = set()
    for r in regions:
        if not qconv(r) or not writes_blocked(r.params) or len(r.outputs) != 1:
            continue
        t = r.outputs[0]
        if not static(t) or t in index.graph_outputs or t in index.used_by_subgraphs:
            continue
        users = {id(owner.get(c)): owner.get(c) for c in index.consumers.get(t, [])}
        if users and all(qconv(u) and u is not r and reads_blocked(u.params) and u.inputs[0] == t
                         and t not in u.inputs[1:] for u in users.values()):
            blocked.add(t)
    converted = []
    for r in regions:
        if qconv(r) and (r.inputs[0] in blocked or r.outputs[0] in blocked):
            convert(r, r.inputs[0] in blocked, r.outputs[0] in blocked, shape_of, opset)
            converted.append(r)
    return converted


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
