"""Blocked layouts kept across chains of fused convolutions.

A tensor [N, C, H, W] in the blocked layout is stored as [N, ceil(C / L), H, W, L], L = the target's vector lanes
(NCHW16c on AVX-512, NCHW8c on AVX2), channels past C zero. A convolution kernel that writes it computes vectors of
output channels (codegen/compute/blocked_tile.py): every lane is busy whatever the image size. The next convolution
reads it directly (a blocked kernel as broadcasts at each tap, an NCHW kernel through its padded copy), so between
two fused convolutions there is no reorder node at all; the layout changes only inside a kernel's input copy.

`assign_blocked_layouts` decides, for one plan, which region outputs are blocked: those of one-group convolutions
whose every consumer is a fused convolution reading the tensor as its input, or as a per-pixel epilogue input of a
convolution that is itself blocked. It is a fixed point: dropping one region from the blocked set can disqualify
the regions that feed it or that it feeds. Graph outputs, and tensors read by anything left to onnxruntime or by an
elementwise region, stay NCHW.

The layout is part of each fused op: its attributes (in the op type's hash), its packed weights, and its function
fallback, which wraps the original ops in Transpose/Reshape (and Pad/Slice when C is not a multiple of L) so that
it computes the same blocked tensors without the library.

A registered kind may block its own tensors (its `Kind.layouts`, in the same plan: int8 ones between qconv
kernels, blocked by 4, kinds/qconv/layout.py); `blocked_inputs` and `blocked_outputs` read its params'
`blocked_io()`, so the checks, the decision and the emitter treat them as these.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .compute import FLOAT16_MAX, POSITION, bfloat16_bits, bfloat16_weights
from .params import ComputeParams, CopyParams, ElementwiseParams, KindParams, PoolParams, RelayoutParams
from .region import Region


# ---- numpy forms, for the kernel checks and the tests ----
def to_blocked(a: np.ndarray, lanes: int) -> np.ndarray:
    n, c, h, w = a.shape
    cb = -(-c // lanes)
    out = np.zeros((n, cb * lanes, h, w), a.dtype)
    out[:, :c] = a
    return np.ascontiguousarray(out.reshape(n, cb, lanes, h, w).transpose(0, 1, 3, 4, 2))


def from_blocked(a: np.ndarray, channels: int) -> np.ndarray:
    n, cb, h, w, lanes = a.shape
    return np.ascontiguousarray(a.transpose(0, 1, 4, 2, 3).reshape(n, cb * lanes, h, w)[:, :channels])


# ---- what a region reads and writes blocked ----
def blocked_inputs(region: Region) -> set[str]:
    match region.params:
        case RelayoutParams():
            return set(region.inputs)
        case ElementwiseParams() | CopyParams() as p:  # blocked: every input; a plain Concat: none
            return set(region.inputs) if p.tensor_lanes() else set()
        case PoolParams() as p:
            return {region.inputs[0]} if p.attrs.get("blocked") else set()
        case ComputeParams(op="afusion") as c:  # what its parts read blocked, less the intermediates kept inside
            return set().union(*(blocked_inputs(p) for p in c.parts)) - {o for p in c.parts for o in p.outputs}
        case ComputeParams(op="siblings") as c:
            return set().union(*(blocked_inputs(p) for p in c.parts))
        case ComputeParams(op="conv") as c:
            names = {region.inputs[0]} if c.attrs.in_blocked else set()
            if c.attrs.out_blocked:
                extras = region.inputs[len(region.inputs) - len(c.extra_kinds):]
                names |= {x for x, k in zip(extras, c.extra_kinds) if k == POSITION}
            return names
        case KindParams() as p:  # a registered kind's (kinds/qconv/layout.py)
            return {region.inputs[0]} if p.blocked_io()[0] else set()
    return set()


def blocked_outputs(region: Region) -> set[str]:
    match region.params:
        case RelayoutParams() as p:
            return set() if p.exit else set(region.outputs)
        case ElementwiseParams() | CopyParams() as p:
            return set(region.outputs) if p.tensor_lanes() else set()
        case PoolParams() as p:  # NCHW when it ends the chain
            return set(region.outputs) if p.attrs.get("blocked") and not p.attrs.get("exit_channels") else set()
        case ComputeParams(op="siblings") as c:
            return set().union(*(blocked_outputs(p) for p in c.parts))
        case ComputeParams() as c:
            return set(region.outputs) if c.attrs.out_blocked else set()
        case KindParams() as p:
            return set(region.outputs) if p.blocked_io()[1] else set()
    return set()


# ---- the decision ----
def is_depthwise(c) -> bool:
    """A convolution with one input and one output channel per group, which the depthwise channel-vector tiles
    compute (codegen/microkernel/depthwise.py)."""
    a = c.attrs
    return (c.op == "conv" and (a.groups or 1) > 1 and a.ic_g == 1 and a.oc == a.groups
            and c.weights is not None)


def assign_blocked_layouts(regions: list[Region], index, shape_of, lanes: int, ni: int, opset: int,
                           passthrough: dict[int, list[onnx.NodeProto]] | None = None,
                           exits: dict[int, list[onnx.NodeProto]] | None = None) -> list[Region]:
    """Convert the regions of one plan in place. `passthrough` maps the index of a node that onnxruntime can run
    on blocked tensors (fusion/blocked_passthrough.py) to its rewritten nodes; `exits` maps a node that can read a
    blocked tensor and still give NCHW (a global pool before a classifier) to its nodes. Returns the regions that
    write blocked outputs, with one `relayout` region per passthrough node kept blocked and one `relayout-exit`
    region per exit node that reads a blocked tensor."""
    passthrough = passthrough or {}
    exits = exits or {}
    owner: dict[int, Region] = {}
    node_pos = {id(n): i for i, n in enumerate(index.nodes)}
    for r in regions:
        for n in r.nodes:
            owner[node_pos[id(n)]] = r

    def static(name):
        s = shape_of(name)
        return s is not None and len(s) == 4 and all(isinstance(d, int) for d in s[1:])

    def is_conv(r):
        return r is not None and r.compute is not None and r.compute.op == "conv"

    def roles(t: str, r: Region) -> set[str]:
        out = set()
        if r.inputs[0] == t:
            out.add("x")
        extras = r.inputs[len(r.inputs) - len(r.compute.extra_kinds):]
        for x, k in zip(extras, r.compute.extra_kinds):
            if x == t:
                out.add("pos" if k == POSITION else "other")
        return out or {"other"}

    # The candidates: one-group and depthwise convolutions, and passthrough nodes. Each one that cannot write
    # blocked tensors is dropped until none changes: a tensor stays blocked only if its producer and every consumer
    # handle it. (A depthwise convolution reads channel vectors; on an NCHW input it reorders it first, below.)
    blocked_regions = {id(r) for r in regions
                       if is_conv(r) and (r.compute.attrs.groups == 1 or is_depthwise(r.compute))
                       and static(r.inputs[0]) and all(static(o) for o in r.outputs)}
    blocked_nodes = {i for i in passthrough if i not in owner}
    by_id = {id(r): r for r in regions}

    def made_blocked(t: str) -> bool:
        i = index.producer.get(t)
        if i is None:
            return False
        return i in blocked_nodes if i not in owner else id(owner[i]) in blocked_regions

    def readable(t: str, producer) -> bool:
        if t in index.graph_outputs or t in index.used_by_subgraphs:
            return False
        for c in index.consumers.get(t, []):
            if c in blocked_nodes or (c in exits and c not in owner):
                continue
            user = owner.get(c)
            if user is producer and producer is not None and t not in producer.inputs:
                continue  # read inside its own region (an epilogue with two outputs: a conv's and its Relu's)
            if not is_conv(user) or user is producer:
                return False
            rl = roles(t, user)
            if "other" in rl or ("pos" in rl and id(user) not in blocked_regions) or not static(user.inputs[0]):
                return False
        return True

    changed = True
    while changed:
        changed = False
        for rid in list(blocked_regions):
            r = by_id[rid]
            extras = r.inputs[len(r.inputs) - len(r.compute.extra_kinds):]
            ok = all(readable(t, r) for t in r.outputs) and all(
                made_blocked(x) for x, k in zip(extras, r.compute.extra_kinds) if k == POSITION)
            if not ok:
                blocked_regions.discard(rid)
                changed = True
        for i in list(blocked_nodes):
            node = index.nodes[i]
            data = [x for x in node.input if x and static(x)]
            if not (data and all(made_blocked(x) for x in data) and all(readable(o, None) for o in node.output if o)):
                blocked_nodes.discard(i)
                changed = True
    for r in regions:
        if not is_conv(r):
            continue
        in_blocked = made_blocked(r.inputs[0])
        out_blocked = id(r) in blocked_regions
        # A chain's last convolution, blocked in and NCHW out, still computes on vectors of output channels (into a
        # blocked buffer, reordered at the end), even with fewer output channels than a vector: the NCHW kernel
        # reading a blocked input copies it into planes first, and ran 2x onnxruntime's time on a 64->64 3x3 at
        # 56x56; UNet's 16->1 1x1 output head took 194 us on it, 104 us on one vector of which one lane is used.
        # So does a depthwise one, whatever its channels and its input's layout: its NCHW kernel has one output
        # channel per group (a 7x7 /2 of NASNet's stem on it took 4 ms, 10x onnxruntime); an NCHW input is
        # reordered to blocked inside the kernel, as onnxruntime's NCHWc depthwise convolution does.
        exit_vectors = not out_blocked and r.compute.weights is not None and (
            (in_blocked and r.compute.attrs.groups == 1)
            or (is_depthwise(r.compute) and static(r.inputs[0]) and all(static(o) for o in r.outputs)))
        if in_blocked or out_blocked or exit_vectors:
            _convert(r, in_blocked, out_blocked, shape_of, lanes, ni, opset, channel_vectors=exit_vectors)
    relayouts = []
    for i in sorted(blocked_nodes):
        node = index.nodes[i]
        data = [x for x in node.input if x and static(x)]
        relayouts.append(Region(label="relayout", nodes=[node], inputs=data, outputs=[o for o in node.output if o],
                                program=None, shape=list(shape_of(node.output[0])), params=RelayoutParams(passthrough[i])))
    for i in sorted(set(exits) - blocked_nodes - set(owner)):
        node = index.nodes[i]
        data = [x for x in node.input if x and static(x)]
        if data and all(made_blocked(x) for x in data):
            relayouts.append(Region(label="relayout-exit", nodes=[node], inputs=data, outputs=[node.output[0]],
                                    program=None, shape=list(shape_of(node.output[0])), params=RelayoutParams(exits[i], exit=True)))
    return [by_id[rid] for rid in blocked_regions] + relayouts


# ---- the conversion ----
def _i64(name, values):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(values, np.int64), name))


def block_nodes(src: str, dst: str, c: int, lanes: int, opset: int) -> list[onnx.NodeProto]:
    """[N, C, H, W] -> [N, C/L, H, W, L] (zero channels added): Pad, Transpose, Reshape, Transpose.

    Only C is fixed (Reshape's 0 keeps N, H and W): these nodes go into function fallbacks, which every node of the
    op type calls, and one convolution kernel serves every image size (DenseNet-BC's 32x32, 16x16 and 8x8 blocks
    share op types)."""
    cb = -(-c // lanes)
    nodes = []
    cur = src
    if cb * lanes != c:
        pads = [0, 0, 0, 0, 0, cb * lanes - c, 0, 0]
        if opset >= 11:
            nodes += [_i64(f"{dst}__pads", pads), helper.make_node("Pad", [cur, f"{dst}__pads"], [f"{dst}__padded"])]
        else:
            nodes.append(helper.make_node("Pad", [cur], [f"{dst}__padded"], pads=pads))
        cur = f"{dst}__padded"
    nodes += [helper.make_node("Transpose", [cur], [f"{dst}__nhwc"], perm=[0, 2, 3, 1]),
              _i64(f"{dst}__shape5", [0, 0, 0, cb, lanes]),
              helper.make_node("Reshape", [f"{dst}__nhwc", f"{dst}__shape5"], [f"{dst}__split"]),
              helper.make_node("Transpose", [f"{dst}__split"], [dst], perm=[0, 3, 1, 2, 4])]
    return nodes


def unblock_nodes(src: str, dst: str, c: int, lanes: int, opset: int) -> list[onnx.NodeProto]:
    """[N, C/L, H, W, L] -> [N, C, H, W]: Transpose, Reshape, Transpose, Slice; as block_nodes, only C is fixed."""
    cb = -(-c // lanes)
    full = dst if cb * lanes == c else f"{dst}__full"
    nodes = [helper.make_node("Transpose", [src], [f"{dst}__t"], perm=[0, 2, 3, 1, 4]),
             _i64(f"{dst}__shape4", [0, 0, 0, cb * lanes]),
             helper.make_node("Reshape", [f"{dst}__t", f"{dst}__shape4"], [f"{dst}__nhwc"]),
             helper.make_node("Transpose", [f"{dst}__nhwc"], [full], perm=[0, 3, 1, 2])]
    if full != dst:
        if opset >= 10:
            nodes += [_i64(f"{dst}__starts", [0]), _i64(f"{dst}__ends", [c]), _i64(f"{dst}__axes", [1]),
                      helper.make_node("Slice", [full, f"{dst}__starts", f"{dst}__ends", f"{dst}__axes"], [dst])]
        else:
            nodes.append(helper.make_node("Slice", [full], [dst], starts=[0], ends=[c], axes=[1]))
    return nodes


def pack_blocked_weights(w: np.ndarray, lanes: int, ni: int) -> np.ndarray:
    """[OC, IC, KH, KW] -> [ceil(OC / (NI * L))][IC * KH * KW][NI * L], zero-padded."""
    oc = w.shape[0]
    k = int(np.prod(w.shape[1:]))
    width = ni * lanes
    groups = -(-oc // width)
    padded = np.zeros((groups * width, k), np.float32)
    padded[:oc] = w.reshape(oc, k)
    return np.ascontiguousarray(padded.reshape(groups, width, k).transpose(0, 2, 1))


def use_channel_vectors(r: Region, lanes: int, ni: int, opset: int) -> None:
    """Give a one-group NCHW convolution the blocked kernel (vectors of output channels), NCHW in and out: it
    computes into blocked buffers and reorders at the end, which pays where the NCHW kernel leaves lanes idle."""
    # A region reading a blocked input with the NCHW kernel (a chain's exit) keeps its blocked input.
    _convert(r, bool(r.compute.attrs.in_blocked), False, None, lanes, ni, opset, channel_vectors=True)


def with_channel_vectors(region: Region, lanes: int, ni: int, opset: int) -> Region:
    """`use_channel_vectors` on a region whose compute params may be shared (a plan's copy): the params are copied
    first, and the op type recomputed. Returns the region."""
    c = region.compute
    region.params = replace(c, attrs=replace(c.attrs), initializers=list(c.initializers), body=list(c.body))
    region.inputs = list(region.inputs)
    use_channel_vectors(region, lanes, ni, opset)
    if region.op_type_key:
        region.compute_op_type(region.op_type_key)
    return region


def channel_vectors_apply(region: Region, lanes: int, any_groups: bool = False) -> bool:
    """Whether the channel-vector kernel can replace this region's NCHW kernel. The direct kernel runs one group;
    `any_groups`: for Winograd tiles, whose glue runs each group apart (fusion/winograd.py group_refusal)."""
    c = region.compute
    return (lanes >= 8 and c is not None and c.op == "conv" and (any_groups or c.attrs.groups == 1)
            and c.weights is not None
            and not c.attrs.in_blocked and not c.attrs.channel_vectors)


def _convert(r: Region, in_blocked: bool, out_blocked: bool, shape_of, lanes, ni, opset, channel_vectors=False):
    c = r.compute
    a = c.attrs
    body = list(c.body)
    # Converted before with a blocked input (then given channel vectors): its prologue already unblocks the input.
    unblocked = bool(a.in_blocked) and in_blocked
    conv_at = next(i for i, n in enumerate(body) if n.op_type == "Conv")
    conv = body[conv_at]
    if out_blocked or channel_vectors:
        w = c.weights
        # Depthwise tiles are one channel vector wide (codegen/microkernel/depthwise.py).
        packed = pack_blocked_weights(w, lanes, 1 if is_depthwise(c) else ni)
        old_name = r.inputs[1]
        name = f"{old_name}_blocked"
        c.initializers = [t for t in c.initializers if t.name != old_name] + [numpy_helper.from_array(packed, name)]
        r.inputs[1] = name
        oc, k = w.shape[0], int(np.prod(w.shape[1:]))
        u = f"{name}__unpack"
        unpack = [helper.make_node("Transpose", [name], [f"{u}_t"], perm=[0, 2, 1]),
                  _i64(f"{u}_s1", [packed.shape[0] * packed.shape[2], k]),
                  helper.make_node("Reshape", [f"{u}_t", f"{u}_s1"], [f"{u}_r"])]
        if opset >= 10:
            unpack += [_i64(f"{u}_starts", [0]), _i64(f"{u}_ends", [oc]), _i64(f"{u}_axes", [0]),
                       helper.make_node("Slice", [f"{u}_r", f"{u}_starts", f"{u}_ends", f"{u}_axes"], [f"{u}_sl"])]
        else:
            unpack.append(helper.make_node("Slice", [f"{u}_r"], [f"{u}_sl"], starts=[0], ends=[oc], axes=[0]))
        unpack += [_i64(f"{u}_s2", list(w.shape)), helper.make_node("Reshape", [f"{u}_sl", f"{u}_s2"], [conv.input[1]])]
        # the old prologue's nodes (they name the unblocked input, which the Conv reads) stay; the old weights' do not
        prologue_kept = [n for n in body[:conv_at] if all(o.startswith(conv.input[0]) for o in n.output)] \
            if unblocked else []
        body = prologue_kept + unpack + body[conv_at:]
        a.packed_shape = packed.shape
    renames: dict[str, str] = {}
    prologue: list[onnx.NodeProto] = []
    epilogue: list[onnx.NodeProto] = []
    extras = zip(r.inputs[len(r.inputs) - len(c.extra_kinds):], c.extra_kinds)
    to_unblock = ([r.inputs[0]] if in_blocked and not unblocked else []) + \
        ([x for x, k in extras if k == POSITION] if out_blocked else [])
    for x in dict.fromkeys(to_unblock):
        ch = shape_of(x)[1]
        renames[x] = f"{x}__nchw"
        prologue += unblock_nodes(x, renames[x], ch, lanes, opset)
    if out_blocked:
        for o in r.outputs:
            ch = shape_of(o)[1]
            renames[o] = f"{o}__nchw"
            epilogue += block_nodes(renames[o], o, ch, lanes, opset)
    new_body = []
    for n in body:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        for i, x in enumerate(m.input):
            if x in renames:
                m.input[i] = renames[x]
        for i, x in enumerate(m.output):
            if x in renames:
                m.output[i] = renames[x]
        new_body.append(m)
    c.body = prologue + new_body + epilogue
    a.in_blocked = int(in_blocked)
    a.out_blocked = int(out_blocked)
    a.channel_vectors = int(out_blocked or channel_vectors)
    a.block = lanes


BF16_NCHW_MIN_CHANNELS = 16


def blocked_conv_refusal(region: Region, opset: int = 13) -> str | None:
    """Why `lower_blocked_conv` would keep this region's weights float32, or None when it can lower them (already
    lowered included). Changes nothing."""
    c = region.compute
    a = c.attrs if c is not None else None
    if c is None or c.op != "conv":
        return "not a convolution"
    if a.b_dtype is not None:
        return None if a.b_dtype == "bfloat16" else f"its weights are already stored as {a.b_dtype}"
    if not (a.out_blocked or a.channel_vectors):
        return "conv: float32 (bf16 convolutions run on the blocked kernel, vectors of output channels)"
    if a.groups != 1:
        return "conv: float32 (grouped and depthwise convolutions have no reduction over channel pairs)"
    if not a.in_blocked and a.ic_g < BF16_NCHW_MIN_CHANNELS:
        # the glue blocks an NCHW input in its bfloat16 copy, 16 channels a pixel: with few channels that copy is
        # mostly zeros, larger than the float32 input, for a convolution with little arithmetic
        return (f"conv: float32 (an NCHW input of {a.ic_g} channels, as a network's first convolution reads: its "
                "blocked bfloat16 copy would be mostly padding)")
    if a.winograd:
        return "conv: float32 (Winograd)"
    if a.block != 16:
        return f"conv: float32 (bf16 convolutions take 16-lane blocks, vdpbf16ps; this one has {a.block})"
    if opset < 11:
        return f"opset {opset}: the fallback's decoding of bfloat16 needs opset 11"
    if not any(t.name == region.inputs[1] for t in c.initializers) or a.packed_shape is None \
            or len(a.packed_shape) != 3:
        return "no packed weights in the region"
    return None


def lower_blocked_conv(region: Region, opset: int, ic_step: int = 2, b_dtype: str = "bfloat16") -> str | None:
    """Store a blocked convolution's packed weights as bfloat16 for its vdpbf16ps tiles (codegen/compute/
    blocked_tile.py, `--precision bf16`), in place: pairs of adjacent input channels of one tap side by side,
    [groups][ceil(IC / 2) * KH * KW][NI * L][2] under the shape [groups][2 * ceil(IC / 2) * KH * KW][NI * L] (an odd
    IC's last pair has zero weights for its second channel, which the blocked input holds as zeros; `ic_step` 32, an
    AMX target's, pads IC to whole blocks of 32 channels with zero weights, codegen/compute/amx_conv_tile.py). The
    input may be blocked or NCHW (with at least BF16_NCHW_MIN_CHANNELS channels): the glue's bfloat16 copy is blocked
    either way. The function fallback casts them back to float32 and undoes the pairing, so the weights are stored once. Returns why the
    region keeps float32 weights, or None when lowered. The glue makes the bfloat16 copy of the input the tiles read
    (conv_blocked_prepare_exec.c). `b_dtype` "float16" stores the same pairs as float16 for AMX-FP16 tiles
    (`ic_step` 32; `b_pairs` set); where the tiles cannot run, the glue unpacks them into float32 for the float32
    kernel."""
    why = blocked_conv_refusal(region, opset)
    if why is not None or region.compute.attrs.b_dtype is not None:
        return why
    c = region.compute
    a = c.attrs
    name = region.inputs[1]
    init = next(t for t in c.initializers if t.name == name)
    packed = numpy_helper.to_array(init)
    if not np.all(np.isfinite(packed)):
        return "the weights have values that are not finite"
    big = float(np.max(np.abs(packed))) if packed.size else 0.0
    if b_dtype == "float16" and big > FLOAT16_MAX:
        return f"conv: float32 (a weight of magnitude {big:.4g} is past float16's 65504)"
    g, k, width = packed.shape
    taps = a.kernel[0] * a.kernel[1]
    ic = k // taps
    if ic * taps != k or ic != a.ic_g:
        return "the packed weights are not [groups][IC * KH * KW][NI * L]"
    ic2 = -(-ic // ic_step) * ic_step
    w = packed.reshape(g, ic, taps, width)
    if ic2 != ic:
        w = np.concatenate([w, np.zeros((g, ic2 - ic, taps, width), w.dtype)], axis=1)
    pairs = np.ascontiguousarray(w.reshape(g, ic2 // 2, 2, taps, width).transpose(0, 1, 3, 4, 2))
    u = f"{name}__bf16"
    if b_dtype == "float16":
        tensor = numpy_helper.from_array(pairs.astype(np.float16).reshape(g, ic2 * taps, width), name)
        body = [helper.make_node("Cast", [name], [f"{u}_f"], to=onnx.TensorProto.FLOAT)]
        a.b_pairs = 1
    else:
        tensor, body = bfloat16_weights(name, bfloat16_bits(pairs), (g, ic2 * taps, width), opset, f"{u}_f")
    body += [_i64(f"{u}_s5", [g, ic2 // 2, taps, width, 2]),
             helper.make_node("Reshape", [f"{u}_f", f"{u}_s5"], [f"{u}_r5"]),
             helper.make_node("Transpose", [f"{u}_r5"], [f"{u}_t"], perm=[0, 1, 4, 2, 3]),
             _i64(f"{u}_s4", [g, ic2, taps, width]),
             helper.make_node("Reshape", [f"{u}_t", f"{u}_s4"], [f"{u}_r4"])]
    full = f"{u}_r4"
    if ic2 != ic:  # the padding channels
        body += [_i64(f"{u}_starts", [0]), _i64(f"{u}_ends", [ic]), _i64(f"{u}_axes", [1]),
                 helper.make_node("Slice", [full, f"{u}_starts", f"{u}_ends", f"{u}_axes"], [f"{u}_sl"])]
        full = f"{u}_sl"
    body += [_i64(f"{u}_s3", [g, k, width]), helper.make_node("Reshape", [full, f"{u}_s3"], [f"{u}_w"])]
    new_body = []
    for node in c.body:
        m = onnx.NodeProto()
        m.CopyFrom(node)
        for i, x in enumerate(m.input):
            if x == name:
                m.input[i] = f"{u}_w"
        new_body.append(m)
    c.body = body + new_body
    c.initializers = [tensor if t.name == name else t for t in c.initializers]
    a.b_dtype = b_dtype
    return None
