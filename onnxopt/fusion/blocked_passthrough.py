"""onnxruntime's own ops on blocked tensors: the nodes a blocked chain passes through without a reorder.

A blocked tensor [N, C, H, W] is stored as [N, C / L, H, W, L] (fusion/layout.py). Some ops compute the same
values on that 5-D form when they are rewritten for it, so a chain of fused convolutions can run through them in the
blocked layout instead of ending there:

    Concat on channels          Concat(axis=1) of the blocked inputs (every input but the last has C % L == 0)
    Split on channels           Split(axis=1) in blocks of L channels (every output but the last has C % L == 0)
    MaxPool, AveragePool (2-D)  the 3-D pool with a window of 1 over the lanes
    GlobalAveragePool / Max     ReduceMean / ReduceMax over axes 2 and 3, keepdims
    Resize, nearest             scales [1, 1, sh, sw, 1]: the lanes axis is kept as it is
    Relu, LeakyRelu, Clip, ...  unchanged: elementwise, and zero stays zero (Clip when min <= 0 <= max)
    Add, Sub, Mul, Max, Min     unchanged, when both inputs are tensors of the output's shape (both blocked)

The elementwise ones matter for pre-activation networks: NASNet's separable branches start with a Relu of a cell's
input, and a depthwise convolution reads channel vectors only from a blocked input, so without the Relu in the chain
the depthwise convolution ran on its NCHW kernel (one output channel per group: 4 ms for one of NASNet's stem's).

The padding channels of a blocked tensor are zero, and every rewrite keeps them zero (a pool of zeros is zero; the
channels of a concatenation or a split stay where the next kernel expects them), which is what the condition on
C % L protects. The rewritten node is plain ONNX, so the model stays correct without the library.

A global pool can also end a chain: `exit_form` reads the blocked tensor and reorders its [N, C, 1, 1] result to
NCHW for the ops after it (a classifier's Flatten and Gemm).

`admit` says whether a node can be rewritten (None) or why not; `rewrite` gives the replacement nodes; `check`
runs both forms of one node in onnxruntime on random data, once per distinct node, before a plan relies on them.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxopt.verify import random_array

from .elementwise import _attr

POOLS = ("MaxPool", "AveragePool")
GLOBAL_POOLS = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}
ZERO_KEEPING = ("Relu", "LeakyRelu", "Clip", "Tanh", "Abs", "Neg")  # f(0) = 0: the padding channels stay zero
SAME_SHAPE_BINARY = ("Add", "Sub", "Mul", "Max", "Min")  # 0 op 0 = 0
OPS = ("Concat", "Split", "Resize") + POOLS + tuple(GLOBAL_POOLS) + ZERO_KEEPING + SAME_SHAPE_BINARY


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


def _channel_axis(node, rank: int) -> bool:
    axis = _attr(node, "axis", 0)
    return (axis + rank if axis < 0 else axis) == 1


def admit(node: onnx.NodeProto, shape_of, const_of, lanes: int, opset: int) -> str | None:
    """None when `node` can run on blocked tensors (see the module doc); else the reason it cannot.
    `shape_of(name)` gives a static shape or None; `const_of(name)` a constant's numpy value or None."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in OPS:
        return "not an op that runs on blocked tensors"
    if node.op_type in POOLS and len(node.output) > 1 and node.output[1]:
        return "MaxPool's Indices output is requested"
    x = node.input[0] if node.input else ""
    outs = [o for o in node.output if o]
    shapes = [shape_of(t) for t in ([x] + outs)]
    if any(s is None or len(s) != 4 or not all(isinstance(d, int) for d in s[1:]) for s in shapes):
        return "needs [N, C, H, W] with static C, H, W"
    op = node.op_type
    if op == "Concat":
        ins = [shape_of(t) for t in node.input]
        if not _channel_axis(node, 4):
            return "not a concatenation of channels"
        if any(s is None or s[1] % lanes for s in ins[:-1]):
            return f"an input before the last has channels not a multiple of {lanes}"
    elif op == "Split":
        if not _channel_axis(node, 4):
            return "not a split of channels"
        if len(outs) != len(node.output):
            return "an output is omitted"
        if any(shape_of(o)[1] % lanes for o in outs[:-1]):
            return f"an output before the last has channels not a multiple of {lanes}"
    elif op in POOLS:
        if len(_attr(node, "kernel_shape", [])) != 2:
            return "kernel_shape is not 2-D"
        # The chain's reorders are built from onnx's inferred sizes; onnxruntime computes its own, and the two
        # disagree in places (ceil mode's last window starting in the end padding; SAME padding with dilations),
        # found by tests/codegen/test_pool_blocked.py. Such a pool ends the chain.
        if [_ort_pool_size(node, shapes[0][2 + a], a) for a in (0, 1)] != list(shapes[1][2:]):
            return "onnx and onnxruntime disagree on this pool's output size"
    elif op == "Clip":
        if opset >= 11:  # the bounds are optional inputs
            names = list(node.input[1:3]) + [""] * (3 - len(node.input))
            values = [const_of(x) if x else None for x in names]
            if any(x and v is None for x, v in zip(names, values)):
                return "Clip with bounds that are not constants"
            lo = float(values[0]) if names[0] else -np.inf
            hi = float(values[1]) if names[1] else np.inf
        else:
            lo, hi = float(_attr(node, "min", -np.inf)), float(_attr(node, "max", np.inf))
        if not lo <= 0.0 <= hi:
            return "Clip whose range leaves out 0 would change the padding channels"
    elif op in SAME_SHAPE_BINARY:
        data = list(node.input)
        if len(data) != 2 or any(const_of(x) is not None for x in data) or \
                any(shape_of(x) != shapes[1] for x in data):
            return "needs two tensors of the output's shape (no broadcast, no constant)"
    elif op == "Resize":
        if opset < 11 and len(node.input) != 2:
            return "Resize without scales"
        if _text(_attr(node, "mode", "nearest")) != "nearest":
            return "only nearest Resize keeps the lanes apart"
        if _text(_attr(node, "coordinate_transformation_mode", "half_pixel")) == "tf_crop_and_resize":
            return "tf_crop_and_resize reads a region of interest"
        if _attr(node, "axes") is not None:
            return "Resize with axes"
        scales = const_of(node.input[2 if opset >= 11 else 1]) if len(node.input) > (2 if opset >= 11 else 1) \
            else None
        if scales is None or scales.size != 4 or scales[0] != 1 or scales[1] != 1:
            return "needs constant scales that keep N and C"
        if len(node.input) > 3 and node.input[3]:
            return "Resize with sizes"
    return None


def _ort_pool_size(node: onnx.NodeProto, size: int, axis: int) -> int:
    """onnxruntime's output size of a 2-D pool along `axis` (its rules, as codegen/glue/pool_exec.c follows them:
    SAME pads from the undilated kernel, ceil mode dropping a last window that starts in the end padding)."""
    k = _attr(node, "kernel_shape")[axis]
    s = (_attr(node, "strides", None) or [1, 1])[axis]
    d = (_attr(node, "dilations", None) or [1, 1])[axis]
    auto = _text(_attr(node, "auto_pad", "NOTSET"))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        need = (-(-size // s) - 1) * s + k - size
        head = need // 2 if auto == "SAME_UPPER" else (need + 1) // 2
        tail = need - head
    elif auto == "VALID":
        head = tail = 0
    else:
        pads = _attr(node, "pads", None) or [0, 0, 0, 0]
        head, tail = pads[axis], pads[axis + 2]
    num = size + head + tail - d * (k - 1) - 1
    if not _attr(node, "ceil_mode", 0):
        return num // s + 1 if num >= 0 else -1
    out = -(-num // s) + 1
    return out - 1 if (out - 1) * s >= size + head else out


def _i64(name: str, values) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(values, np.int64), name))


def rewrite(node: onnx.NodeProto, shape_of, const_of, lanes: int, opset: int) -> list[onnx.NodeProto]:
    """The nodes that compute `node` on blocked inputs and outputs (names unchanged); `admit` must have passed."""
    op = node.op_type
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    name = node.name or node.output[0]
    tag = f"{node.output[0]}__blocked"
    if op == "Concat":
        return [helper.make_node("Concat", list(node.input), list(node.output), name=name, axis=1)]
    if op == "Split":
        sizes = [-(-shape_of(o)[1] // lanes) for o in node.output]
        if opset >= 13:
            return [_i64(f"{tag}_split", sizes),
                    helper.make_node("Split", [node.input[0], f"{tag}_split"], list(node.output), name=name, axis=1)]
        return [helper.make_node("Split", [node.input[0]], list(node.output), name=name, axis=1, split=sizes)]
    if op in POOLS:
        new = {"kernel_shape": list(attrs["kernel_shape"]) + [1]}
        if "strides" in attrs:
            new["strides"] = list(attrs["strides"]) + [1]
        if "dilations" in attrs:
            new["dilations"] = list(attrs["dilations"]) + [1]
        if "pads" in attrs:
            p = list(attrs["pads"])
            new["pads"] = [p[0], p[1], 0, p[2], p[3], 0]
        for k in ("auto_pad", "ceil_mode", "count_include_pad"):
            if k in attrs:
                new[k] = attrs[k]
        return [helper.make_node(op, [node.input[0]], [node.output[0]], name=name, **new)]
    if op in GLOBAL_POOLS:
        reduce = GLOBAL_POOLS[op]
        # ReduceMean took its axes as an input from opset 18 on (ReduceMax too).
        if opset >= 18:
            return [_i64(f"{tag}_axes", [2, 3]),
                    helper.make_node(reduce, [node.input[0], f"{tag}_axes"], list(node.output), name=name, keepdims=1)]
        return [helper.make_node(reduce, [node.input[0]], list(node.output), name=name, axes=[2, 3], keepdims=1)]
    if op == "Resize":
        return _resize(node, shape_of, const_of, lanes, opset, integer_form=True)
    if op in ZERO_KEEPING or op in SAME_SHAPE_BINARY:  # elementwise: the same node on the blocked tensors
        same = onnx.NodeProto()
        same.CopyFrom(node)
        return [same]
    raise ValueError(f"{op} does not run on blocked tensors")


def _resize(node, shape_of, const_of, lanes: int, opset: int, integer_form: bool) -> list[onnx.NodeProto]:
    """Nearest Resize on blocked tensors. onnxruntime's 5-D Resize is a slow generic loop (18x slower than the 4-D
    one on a YOLO neck's tensor), so: with integer scales, each pixel repeated as a broadcast (Reshape, Expand,
    Reshape); otherwise the 4-D Resize of [N * C / L, H, W, L]. `check` confirms the result per node, since which
    source pixel nearest picks depends on the coordinate mode."""
    name = node.name or node.output[0]
    tag = f"{node.output[0]}__blocked"
    s = const_of(node.input[2 if opset >= 11 else 1]).astype(np.float64)
    _, c, h, w = shape_of(node.input[0])
    _, _, oh, ow = shape_of(node.output[0])
    cb = -(-c // lanes)
    back = [_i64(f"{tag}_shape_out", [-1, cb, oh, ow, lanes])]
    if integer_form and all(float(v).is_integer() for v in s[2:]) and oh == h * s[2] and ow == w * s[3]:
        sh, sw = int(s[2]), int(s[3])
        return [_i64(f"{tag}_shape_in", [0, cb, h, 1, w, 1, lanes]), _i64(f"{tag}_repeat", [1, 1, 1, sh, 1, sw, 1]),
                helper.make_node("Reshape", [node.input[0], f"{tag}_shape_in"], [f"{tag}_in"]),
                helper.make_node("Expand", [f"{tag}_in", f"{tag}_repeat"], [f"{tag}_out"], name=name)] + back + [
                helper.make_node("Reshape", [f"{tag}_out", f"{tag}_shape_out"], [node.output[0]])]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    scales = numpy_helper.from_array(np.asarray([1, s[2], s[3], 1], np.float32), f"{tag}_scales")
    inputs = [f"{tag}_in", node.input[1] if len(node.input) > 1 else "", f"{tag}_scales"] if opset >= 11 \
        else [f"{tag}_in", f"{tag}_scales"]
    return [_i64(f"{tag}_shape_in", [-1, h, w, lanes]), helper.make_node("Constant", [], [f"{tag}_scales"], value=scales),
            helper.make_node("Reshape", [node.input[0], f"{tag}_shape_in"], [f"{tag}_in"]),
            helper.make_node("Resize", inputs, [f"{tag}_out"], name=name, **attrs)] + back + [
            helper.make_node("Reshape", [f"{tag}_out", f"{tag}_shape_out"], [node.output[0]])]


def rewrites(node: onnx.NodeProto, shape_of, const_of, lanes: int, opset: int) -> list[list[onnx.NodeProto]]:
    """The forms `node` can take on blocked tensors, fastest first (more than one only for Resize)."""
    first = rewrite(node, shape_of, const_of, lanes, opset)
    if node.op_type != "Resize":
        return [first]
    general = _resize(node, shape_of, const_of, lanes, opset, integer_form=False)
    return [first] if [m.op_type for m in general] == [m.op_type for m in first] else [first, general]


def exit_form(node: onnx.NodeProto, blocked_form: list[onnx.NodeProto], shape_of, lanes: int,
              opset: int) -> list[onnx.NodeProto]:
    """A global pool that reads a blocked tensor and gives NCHW, for readers left to onnxruntime (a classifier's
    Flatten): the blocked form into a temporary, then the reorder of its [N, C, 1, 1] result, which is tiny."""
    from .layout import unblock_nodes

    out = node.output[0]
    c = shape_of(out)[1]
    tmp = f"{out}__blocked_pool"
    nodes = []
    for m in blocked_form:
        c_ = onnx.NodeProto()
        c_.CopyFrom(m)
        for i, o in enumerate(c_.output):
            if o == out:
                c_.output[i] = tmp
        nodes.append(c_)
    return nodes + unblock_nodes(tmp, out, c, lanes, opset)


_checked: dict[str, bool] = {}


def check(node: onnx.NodeProto, new: list[onnx.NodeProto], shape_of, const_of, lanes: int, opset: int,
          ir_version: int) -> bool:
    """Whether onnxruntime computes the same values with `new` (a rewrite of `node`) on blocked tensors as with
    the original on NCHW ones (random inputs, batch 1); the answer is kept per distinct node and form."""
    from .layout import from_blocked, to_blocked

    ins = [x for x in node.input if x and shape_of(x) is not None and len(shape_of(x)) == 4]
    outs = [o for o in node.output if o]
    key = repr(([m.op_type for m in new], ir_version, node.op_type, [(a.name, helper.get_attribute_value(a)) for a in node.attribute],
                [shape_of(x)[1:] for x in ins], [shape_of(o)[1:] for o in outs], lanes, opset,
                [str(const_of(x)) for x in node.input if x and x not in ins]))
    if key in _checked:
        return _checked[key]
    import onnxruntime as ort

    consts = [numpy_helper.from_array(const_of(x), x) for x in dict.fromkeys(node.input) if x and x not in ins]

    def model(nodes, in_shapes, out_shapes):
        g = helper.make_graph(nodes, "check",
                              [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, s) for x, s in in_shapes],
                              [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o, _ in out_shapes],
                              initializer=consts)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        # The model's IR version, but at least 4: IR 3 wanted every initializer listed as a graph input.
        m.ir_version = min(max(ir_version, 4), m.ir_version)
        so = ort.SessionOptions()
        so.log_severity_level = 4
        return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])

    def blocked_shape(s):
        return [1, -(-s[1] // lanes), s[2], s[3], lanes]

    rng = np.random.default_rng(0)
    try:
        feeds = {x: random_array([1, *shape_of(x)[1:]], "float32", rng) for x in ins}
        want = model([node], [(x, [1, *shape_of(x)[1:]]) for x in ins], [(o, None) for o in outs]).run(outs, feeds)
        got = model(new, [(x, blocked_shape(shape_of(x))) for x in ins], [(o, None) for o in outs]).run(
            outs, {x: to_blocked(v, lanes) for x, v in feeds.items()})
        ok = all(g.shape == to_blocked(w, lanes).shape and np.allclose(from_blocked(g, w.shape[1]), w, rtol=1e-6,
                                                                        atol=1e-6)
                 and np.array_equal(g, to_blocked(from_blocked(g, w.shape[1]), lanes))
                 for g, w in zip(got, want))
    except Exception:  # noqa: BLE001 - onnxruntime refuses the rewritten form: the chain ends here
        ok = False
    _checked[key] = ok
    return ok
