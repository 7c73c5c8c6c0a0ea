"""Concat and nearest Resize inside blocked chains, as one copy kernel of ours (codegen/glue/copy_exec.c).

A blocked chain runs through Concat and integer-scale nearest Resize as onnxruntime nodes on the 5-D tensors
(fusion/blocked_passthrough.py): a Concat of channel blocks, and Reshape -> Expand -> Reshape. Both are single
threaded passes, and a decoder's up-block does one after the other:

    Resize(x, 2x) -> Concat(., skip)        (UNet, YOLO's neck)

Here a Concat becomes one kernel that writes each output row once, on all threads, reading every input's rows
repeated by its Resize factors: the Resize that only this Concat reads is absorbed (its output is never written).
A Resize no Concat absorbs becomes a copy of one input. UNet at 112x112 spent 0.5 ms in those nodes against
onnxruntime's 0.3 ms on the original graph (its NCHWc Upsample and Concat).

The kernel region replaces the passthrough regions of its nodes, which stay as its fallback: its function body is
their rewritten nodes, and if the kernel is rejected (not faster than onnxruntime) the plan gets them back.

The same kernel also copies plain Concats (lanes 0: any float32 tensors, along any axis; `plain_concats`). Those
are as fast as onnxruntime's on their own; they matter because an onnxruntime op between two of our kernels ends a
sequence (emit/sequence.py), and each sequence opens a parallel section of its own: DenseNet-BC's compute-blocked
plan had 48 sequences, each ended by the Concat of a dense layer (12 channels, not a whole number of vectors, so the
tensors are not blocked there).

And nearest Resizes of NCHW tensors by integer factors (`plain_resizes`, lanes 1: the blocked copy with one channel
a vector). PP-OCRv4's detector upsamples its FPN's levels with six of them outside the blocked chains; onnxruntime
ran them in 0.55 ms of a 5.9 ms bf16 run, each ending a sequence.

And Splits (`split_copies` on blocked tensors, `plain_splits` on plain ones), for the same reason: YOLOv8's C2f
blocks each split their first convolution's output in two, and the nine Splits were onnxruntime nodes between the
model's ten sequences. Inside a sequence, a Split's output that a Concat of ours reads is written in place there.

And Slices with unit steps and constant arguments (`plain_slices`), for the same reason: the box of a tensor of the
planned dims, copied as runs along its last axis. NASNet-A's factorized reductions leave a crop after a convolution
(graph/subsample_conv.py), and those three Slices were the last onnxruntime nodes between its sequences.
"""

from __future__ import annotations

import onnx

from onnxopt.codegen.glue.kinds import c_define

from .params import CopyParams
from .params import RelayoutParams
from .region import EwProgram, Region, Value

MAX_INPUTS = c_define("copy.h", "CP_MAX_IN")


def _repeat_factors(r: Region, shape_of) -> tuple[int, int] | None:
    """The integer (rows, columns) factors of a nearest Resize's passthrough region, or None for another form (the
    4-D Resize that a fractional scale needs)."""
    if "Expand" not in [n.op_type for n in r.relayout]:
        return None
    x, y = shape_of(r.inputs[0]), shape_of(r.outputs[0])
    if x is None or y is None or len(x) != 4 or y[2] % x[2] or y[3] % x[3]:
        return None
    return y[2] // x[2], y[3] // x[3]


def fuse_copies(relayouts: list[Region], index, shape_of, lanes: int) -> list[Region]:
    """Copy regions for the Concats and integer-scale Resizes among a blocked plan's passthrough regions."""
    by_output = {r.outputs[0]: r for r in relayouts if isinstance(r.params, RelayoutParams) and not r.params.exit}
    resizes = {out: f for out, r in by_output.items()
               if r.nodes[0].op_type == "Resize" and (f := _repeat_factors(r, shape_of)) is not None}
    copies, absorbed = [], set()
    for out, r in by_output.items():
        node = r.nodes[0]
        if node.op_type != "Concat" or len(node.input) > MAX_INPUTS:
            continue
        inputs, factors, parts = [], [], []
        for x in node.input:
            src = by_output.get(x)
            readers = set(index.consumers.get(x, []))
            if x in resizes and len(readers) == 1 and x not in index.graph_outputs:
                inputs.append(src.inputs[0])
                factors.append(resizes[x])
                if src not in parts:
                    parts.append(src)
            else:
                inputs.append(x)
                factors.append((1, 1))
        absorbed.update(id(p) for p in parts)
        copies.append(_region(parts + [r], inputs, factors, out, shape_of, lanes))
    for out, r in by_output.items():
        if out in resizes and id(r) not in absorbed:
            copies.append(_region([r], [r.inputs[0]], [resizes[out]], out, shape_of, lanes))
    return copies


def split_copies(relayouts: list[Region], shape_of, lanes: int) -> list[Region]:
    """Copy regions for the Splits of channels among a blocked plan's passthrough regions (their sizes in blocks)."""
    out = []
    for r in relayouts:
        node = r.nodes[0]
        if not isinstance(r.params, RelayoutParams) or r.params.exit or node.op_type != "Split":
            continue
        if not 2 <= len(node.output) <= MAX_INPUTS or not all(node.output):
            continue
        x = shape_of(node.input[0])
        sizes = [shape_of(y) for y in node.output]
        if x is None or any(s is None or not isinstance(s[1], int) for s in sizes):
            continue
        out.append(_split_region(node, [-(-s[1] // lanes) for s in sizes], x, lanes, 1, r.relayout, [r]))
    return out


def _split_region(node, sizes: list[int], x_shape, lanes: int, axis: int, body: list, fallback: list) -> Region:
    program = EwProgram(inputs=[Value(node.input[0], "float32")], consts={}, ops=[], outputs=[])
    region = Region("Copy", [node], [node.input[0]], list(node.output), program, list(x_shape))
    region.params = CopyParams(lanes=lanes, factors=[(1, 1)], body=list(body), fallback=list(fallback), axis=axis,
                               split=list(sizes))
    return region


def plain_splits(index, shape_of, dtype_of, const_of, claimed: set[int], opset: int) -> list[Region]:
    """Copy regions for the float32 Splits of known shapes, along any axis, whose outputs are all named and whose
    sizes are constants (an input, the attribute, or equal parts)."""
    out = []
    for i, node in enumerate(index.nodes):
        if i in claimed or node.op_type != "Split" or node.domain not in ("", "ai.onnx"):
            continue
        if not 2 <= len(node.output) <= MAX_INPUTS or not all(node.output) or not node.input[0]:
            continue
        x = shape_of(node.input[0])
        ys = [shape_of(y) for y in node.output]
        if x is None or not x or not all(isinstance(d, int) for d in x) or any(y is None for y in ys):
            continue
        x = list(x)
        if dtype_of(node.input[0]) != "float32":
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if not -len(x) <= axis < len(x):
            continue
        axis %= len(x)
        if len(node.input) > 1 and node.input[1]:
            given = const_of(node.input[1])
            if given is None:
                continue
            sizes = [int(v) for v in given.reshape(-1)]
        else:
            sizes = next((list(a.ints) for a in node.attribute if a.name == "split"), None)
        if sizes is None:  # equal parts (opset 18's num_outputs: the last may be smaller)
            part = -(-x[axis] // len(node.output))
            sizes = [min(part, x[axis] - k * part) for k in range(len(node.output))]
        if len(sizes) != len(node.output) or sum(sizes) != x[axis] or any(v <= 0 for v in sizes):
            continue
        if any(list(y) != x[:axis] + [v] + x[axis + 1:] for y, v in zip(ys, sizes)):
            continue  # onnx's inferred shapes disagree with ours: leave it to onnxruntime
        out.append(_split_region(node, sizes, x, 0, axis, [node], []))
    return out


def _region(parts: list[Region], inputs: list[str], factors, out: str, shape_of, lanes: int) -> Region:
    # No elementwise work: the program only names the inputs' dtypes for the op type's hash.
    program = EwProgram(inputs=[Value(x, "float32") for x in inputs], consts={}, ops=[], outputs=[])
    region = Region("Copy", [p.nodes[0] for p in parts], list(inputs), [out], program, list(shape_of(out)))
    region.params = CopyParams(lanes=lanes, factors=[tuple(f) for f in factors],
                             body=[n for p in parts for n in p.relayout], fallback=list(parts))
    return region


def plain_concats(index, shape_of, dtype_of, claimed: set[int], dtypes=("float32",)) -> list[Region]:
    """Copy regions (lanes 0) for the Concats of `dtypes` (float32; a quantized model's uint8 and int8, which
    graph/quantized_concats.py writes) that no other region holds, whose input shapes are known."""
    out = []
    for i, node in enumerate(index.nodes):
        if i in claimed or node.op_type != "Concat" or node.domain not in ("", "ai.onnx"):
            continue
        if not node.input or len(node.input) > MAX_INPUTS or not all(node.input) or not node.output[0]:
            continue
        shapes = [shape_of(x) for x in node.input]
        y = shape_of(node.output[0])
        if y is None or any(s is None or len(s) != len(y) for s in shapes):
            continue
        dtype = dtype_of(node.output[0])
        if dtype not in dtypes or any(dtype_of(x) != dtype for x in node.input) or not y:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), None)
        if axis is None or not -len(y) <= axis < len(y):
            continue
        axis %= len(y)
        if any(not all(isinstance(d, int) for d in s) for s in shapes):
            continue  # symbolic dims: the glue checks sizes at run time, but the region's shape must be known
        program = EwProgram(inputs=[Value(x, dtype) for x in node.input], consts={}, ops=[], outputs=[])
        region = Region("Copy", [node], list(node.input), [node.output[0]], program, list(y))
        region.params = CopyParams(lanes=0, factors=[(1, 1)] * len(node.input), body=[node], axis=axis, dtype=dtype)
        out.append(region)
    return out


# The coordinate modes under which an integer factor s reads input pixel floor(o / s) for output pixel o, as the copy
# kernel does: asymmetric (o / s) and TensorFlow's (o + 0.5) / s rounded down, and half pixel ((o + 0.5) / s - 0.5,
# within 0.5 of floor(o / s) but never exactly half way) rounded to the nearest; PyTorch's half pixel differs only
# at a length of 1 (pixel 0). tests/fusion/test_plain_resize.py checks the table against onnxruntime.
NEAREST_FLOOR_MODES = {("asymmetric", "floor"), ("tf_half_pixel_for_nn", "floor"),
                       ("half_pixel", "round_prefer_floor"), ("half_pixel", "round_prefer_ceil"),
                       ("pytorch_half_pixel", "round_prefer_floor"), ("pytorch_half_pixel", "round_prefer_ceil")}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def plain_resizes(index, shape_of, dtype_of, const_of, claimed: set[int], opset: int) -> list[Region]:
    """Copy regions (lanes 1) for the float32 nearest Resizes of known 4-D shapes that repeat each pixel by integer
    factors along H and W (constant scales or sizes), in a coordinate mode where that is what nearest picks."""
    out = []
    for i, node in enumerate(index.nodes):
        if i in claimed or node.op_type != "Resize" or node.domain not in ("", "ai.onnx") or opset < 11:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if _text(attrs.get("mode", "nearest")) != "nearest" or "axes" in attrs:
            continue
        mode = (_text(attrs.get("coordinate_transformation_mode", "half_pixel")),
                _text(attrs.get("nearest_mode", "round_prefer_floor")))
        if mode not in NEAREST_FLOOR_MODES or not node.input[0] or not node.output[0]:
            continue
        x, y = shape_of(node.input[0]), shape_of(node.output[0])
        if x is None or y is None or len(x) != 4 or len(y) != 4 or not all(isinstance(d, int) and d > 0
                                                                            for d in list(x) + list(y)):
            continue
        x, y = list(x), list(y)
        if dtype_of(node.input[0]) != "float32" or x[:2] != y[:2] or y[2] % x[2] or y[3] % x[3]:
            continue
        if any(name and const_of(name) is None for name in node.input[1:]):
            continue  # scales or sizes computed at run time: onnx's inferred shape could be a guess
        program = EwProgram(inputs=[Value(node.input[0], "float32")], consts={}, ops=[], outputs=[])
        region = Region("Copy", [node], [node.input[0]], [node.output[0]], program, list(y))
        region.params = CopyParams(lanes=1, factors=[(y[2] // x[2], y[3] // x[3])], body=[node])
        out.append(region)
    return out


def _slice_box(node, dims: list[int], const_of, opset: int) -> tuple[list[int], list[int]] | None:
    """The box [start, end) per axis that a Slice with unit steps takes of a tensor of `dims` (ONNX's rules:
    negative indices count from the end, then clamped to the axis), or None when its arguments are not constants
    or a step is not 1."""
    if opset < 10:
        attrs = {a.name: list(a.ints) for a in node.attribute}
        starts, ends, axes, steps = attrs.get("starts"), attrs.get("ends"), attrs.get("axes"), None
    else:
        args = [const_of(x) if x else None for x in list(node.input[1:]) + [""] * (5 - len(node.input))]
        if any(x and a is None for x, a in zip(list(node.input[1:]), args)):
            return None
        starts, ends, axes, steps = (None if a is None else [int(v) for v in a.reshape(-1)] for a in args[:4])
    if starts is None or ends is None or len(starts) != len(ends):
        return None
    rank = len(dims)
    axes = list(range(len(starts))) if axes is None else [a + rank if a < 0 else a for a in axes]
    if len(axes) != len(starts) or len(set(axes)) != len(axes) or not all(0 <= a < rank for a in axes):
        return None
    if steps is not None and (len(steps) != len(starts) or any(st != 1 for st in steps)):
        return None
    start, end = [0] * rank, list(dims)
    for a, b, e in zip(axes, starts, ends):
        b = b + dims[a] if b < 0 else b
        e = e + dims[a] if e < 0 else e
        start[a] = min(max(b, 0), dims[a])
        end[a] = max(min(max(e, 0), dims[a]), start[a])
    return start, end


def plain_slices(index, shape_of, dtype_of, const_of, claimed: set[int], opset: int) -> list[Region]:
    """Copy regions for the float32 Slices with unit steps and constant arguments that no other region holds, whose
    input shape is known: the same box copied by our kernel, so that the Slice does not end a sequence."""
    out = []
    for i, node in enumerate(index.nodes):
        if i in claimed or node.op_type != "Slice" or node.domain not in ("", "ai.onnx"):
            continue
        if not node.input or not node.input[0] or not node.output or not node.output[0]:
            continue
        x, y = shape_of(node.input[0]), shape_of(node.output[0])
        if x is None or y is None or not x or not all(isinstance(d, int) for d in x):
            continue
        if dtype_of(node.input[0]) != "float32" or dtype_of(node.output[0]) != "float32":
            continue
        box = _slice_box(node, list(x), const_of, opset)
        if box is None or [e - b for b, e in zip(*box)] != list(y):
            continue  # not one we take, or onnx's inferred shape disagrees with ours: leave it to onnxruntime
        program = EwProgram(inputs=[Value(node.input[0], "float32")], consts={}, ops=[], outputs=[])
        region = Region("Copy", [node], [node.input[0]], [node.output[0]], program, list(y))
        region.params = CopyParams(lanes=0, factors=[(1, 1)], body=[node], slice=(list(x), *box))
        out.append(region)
    return out
