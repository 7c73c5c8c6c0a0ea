"""Which LSTM nodes become a recurrent kernel, and why the others do not.

Exporters write an LSTM as one node (torch.nn.LSTM, Paddle's and Keras's converters): X [T, B, I], constant W
[D, 4H, I], R [D, 4H, H] and B [D, 8H], optional initial_h and initial_c [D, B, H], outputs Y [T, D, B, H], Y_h and
Y_c [D, B, H]. The kernel takes that form with the default gates (sigmoid, tanh, tanh; no peepholes, clip or coupled
input-forget gate), layout 0 and no sequence_lens (every batch row runs all T steps); T and B may be known only at
run time.

The weights are packed once, here, in blocks of BLOCK hidden units with their four gates side by side (packed_*):
a step reads one block's rows of R as whole vectors and finishes its units' gates in registers. The biases Wb + Rb
are summed into one. The function fallback unpacks them into the node's own W, R and B (with Rb zero).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxopt.fusion.elementwise import ElementwiseRule, _attr
from onnxopt.fusion.region import EwOp, EwProgram, Region, Value

from .params import BLOCK, RecurrentParams

_ONNX = ("", "ai.onnx")
DIRECTIONS = {b"forward": (1, False), b"reverse": (1, True), b"bidirectional": (2, False)}
DEFAULT_ACTIVATIONS = [b"Sigmoid", b"Tanh", b"Tanh"]
# R of one direction above this: its steps run serpentine (params.py). Measured on Zen 5 (1 MiB L2), 2 threads: 1.08x
# and 1.11x on bidirectional LSTMs of 256 and 512 units (R 1 and 4 MiB a direction), 0.80x on 128 units (256 KiB,
# held in L2 either way: one call a block costs more than it saves).
SERPENTINE_R_BYTES = 256 << 10


def _pad_units(a: np.ndarray, hidden: int, axis: int) -> np.ndarray:
    """`a` with its hidden-unit axis zero-padded to whole blocks."""
    extra = -(-hidden // BLOCK) * BLOCK - hidden
    if not extra:
        return a
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, extra)
    return np.pad(a, pad)


def packed_weights(w: np.ndarray, hidden: int) -> np.ndarray:
    """W [D, 4H, I] (or R [D, 4H, H]) -> [D, NB, I, 4, BLOCK]: block b's gate g of unit u at [d, b, i, g, u]."""
    d, _, k = w.shape
    g = _pad_units(w.reshape(d, 4, hidden, k), hidden, 2)
    return np.ascontiguousarray(g.reshape(d, 4, -1, BLOCK, k).transpose(0, 2, 4, 1, 3), dtype=np.float32)


def packed_bias(b: np.ndarray, hidden: int) -> np.ndarray:
    """B [D, 8H] (Wb then Rb) -> Wb + Rb as [D, NB, 4, BLOCK]."""
    d = b.shape[0]
    s = (b[:, :4 * hidden] + b[:, 4 * hidden:]).reshape(d, 4, hidden)
    return np.ascontiguousarray(_pad_units(s, hidden, 2).reshape(d, 4, -1, BLOCK).transpose(0, 2, 1, 3),
                                dtype=np.float32)


def _const(name, arr):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr, np.int64), name))


def _unpack(packed: str, out: str, d: int, hidden: int, k: int | None, opset: int) -> list[onnx.NodeProto]:
    """Nodes that rebuild W or R [D, 4H, k] from their packed form (k None: the bias [D, 4H])."""
    nb = -(-hidden // BLOCK)
    if k is None:  # [D, NB, 4, BLOCK] -> [D, 4, NB * BLOCK]
        perm, grouped = [0, 2, 1, 3], [d, 4, nb * BLOCK]
    else:  # [D, NB, k, 4, BLOCK] -> [D, 4, NB * BLOCK, k]
        perm, grouped = [0, 3, 1, 4, 2], [d, 4, nb * BLOCK, k]
    body = [helper.make_node("Transpose", [packed], [f"{out}_t"], perm=perm), _const(f"{out}_gs", grouped),
            helper.make_node("Reshape", [f"{out}_t", f"{out}_gs"], [f"{out}_g"])]
    units = f"{out}_g"
    if nb * BLOCK != hidden:  # the padding units off
        units = f"{out}_u"
        if opset >= 10:
            body += [_const(f"{out}_b", [0]), _const(f"{out}_e", [hidden]), _const(f"{out}_a", [2]),
                     helper.make_node("Slice", [f"{out}_g", f"{out}_b", f"{out}_e", f"{out}_a"], [units])]
        else:
            body.append(helper.make_node("Slice", [f"{out}_g"], [units], starts=[0], ends=[hidden], axes=[2]))
    body += [_const(f"{out}_s", [d, 4 * hidden] + ([] if k is None else [k])),
             helper.make_node("Reshape", [units, f"{out}_s"], [out])]
    return body


def refusal(node, rule: ElementwiseRule) -> str | None:
    """Why this LSTM is not a recurrent kernel, as a sentence; None when it is one."""
    if any(n and rule.dtype_of(n) != "float32" for n in node.input[:3]):
        return "the recurrent kernel takes float32 only"
    for name, what in ((node.input[1], "W"), (node.input[2], "R")):
        if name not in rule.inits:
            return f"its {what} is not a constant"
    if len(node.input) > 3 and node.input[3] and node.input[3] not in rule.inits:
        return "its B is not a constant"
    if len(node.input) > 4 and node.input[4]:
        return "it has sequence_lens (rows of different lengths)"
    if len(node.input) > 7 and node.input[7]:
        return "it has peepholes (P)"
    if _attr(node, "direction", b"forward") not in DIRECTIONS:
        return "its direction is not forward, reverse or bidirectional"
    directions = DIRECTIONS[_attr(node, "direction", b"forward")][0]
    acts = _attr(node, "activations", None)
    if acts is not None and [a.capitalize() if isinstance(a, bytes) else a for a in acts] != \
            DEFAULT_ACTIVATIONS * directions:
        return "its activations are not the default sigmoid, tanh, tanh"
    for name in ("activation_alpha", "activation_beta", "clip"):
        if _attr(node, name, None) is not None:
            return f"it has {name}"
    if int(_attr(node, "input_forget", 0)) or int(_attr(node, "layout", 0)):
        return "it has input_forget or layout 1"
    w = numpy_helper.to_array(rule.inits[node.input[1]])
    r = numpy_helper.to_array(rule.inits[node.input[2]])
    hidden = int(_attr(node, "hidden_size", r.shape[-1] if r.ndim == 3 else 0))
    if w.ndim != 3 or r.shape != (directions, 4 * hidden, hidden) or w.shape[:2] != (directions, 4 * hidden):
        return "its W or R does not have the shape hidden_size and direction give"
    ti = rule.info.get(node.input[0])
    if ti is None or ti.rank != 3:
        return "its X is not of rank 3"
    if not any(o and (rule.index.consumers.get(o) or o in rule.index.graph_outputs) for o in node.output):
        return "no output is used"
    return None


def _region(node, rule: ElementwiseRule) -> Region:
    direction = _attr(node, "direction", b"forward")
    directions, reverse = DIRECTIONS[direction]
    w = numpy_helper.to_array(rule.inits[node.input[1]]).astype(np.float32)
    r = numpy_helper.to_array(rule.inits[node.input[2]]).astype(np.float32)
    hidden, input_size = r.shape[-1], w.shape[-1]
    has_b = len(node.input) > 3 and bool(node.input[3])
    b = numpy_helper.to_array(rule.inits[node.input[3]]).astype(np.float32) if has_b else \
        np.zeros((directions, 8 * hidden), np.float32)
    uid = node.output[0] or node.name or "lstm"
    names = {"w": f"{uid}__packed_w", "r": f"{uid}__packed_r", "b": f"{uid}__packed_b"}
    tables = {"w": packed_weights(w, hidden), "r": packed_weights(r, hidden), "b": packed_bias(b, hidden)}
    has_h0 = len(node.input) > 5 and bool(node.input[5])
    has_c0 = len(node.input) > 6 and bool(node.input[6])
    used = tuple(bool(o) and bool(rule.index.consumers.get(o) or o in rule.index.graph_outputs)
                 for o in (list(node.output) + ["", "", ""])[:3])
    outputs = [o for o, u in zip(node.output, used) if u]

    opset = rule.opset
    body = (_unpack(names["w"], f"{uid}__w", directions, hidden, input_size, opset)
            + _unpack(names["r"], f"{uid}__r", directions, hidden, hidden, opset)
            + _unpack(names["b"], f"{uid}__b4", directions, hidden, None, opset)
            + [helper.make_node("Sub", [f"{uid}__b4", f"{uid}__b4"], [f"{uid}__b0"]),
               helper.make_node("Concat", [f"{uid}__b4", f"{uid}__b0"], [f"{uid}__b"], axis=1)])
    lstm = onnx.NodeProto()
    lstm.CopyFrom(node)
    del lstm.input[:]
    lstm.input.extend([node.input[0], f"{uid}__w", f"{uid}__r", f"{uid}__b", "",
                       node.input[5] if has_h0 else "", node.input[6] if has_c0 else ""])
    while lstm.input and not lstm.input[-1]:
        lstm.input.pop()
    body.append(lstm)

    inputs = [node.input[0], names["w"], names["r"], names["b"]] + ([node.input[5]] if has_h0 else []) + \
        ([node.input[6]] if has_c0 else [])
    program = EwProgram(inputs=[Value(x, "float32") for x in inputs], consts={},
                        ops=[EwOp("LSTM", tuple(inputs), o, "float32", (("output", k),))
                             for k, o in enumerate(node.output[:3]) if o in outputs],
                        outputs=[Value(o, "float32") for o in outputs])
    x_shape = rule.info[node.input[0]].shape or [None] * 3
    shape = [d if isinstance(d, (int, str)) and not str(d).startswith("unk__") else None for d in x_shape]
    params = RecurrentParams(cell="lstm", directions=directions, reverse=reverse, hidden=hidden,
                             input_size=input_size, has_h0=has_h0, has_c0=has_c0, outputs=used,
                             serpentine=16 * hidden * hidden > SERPENTINE_R_BYTES, body=tuple(body))
    region = Region("recurrent", [node], inputs, outputs, program, shape, params=params)
    region.initializers = [numpy_helper.from_array(tables[key], name) for key, name in names.items()]
    return region


def find_regions(model: onnx.ModelProto, claimed: set[int], rejected: list[dict] | None = None) -> list[Region]:
    rule = ElementwiseRule(model)
    regions = []
    for i, node in enumerate(rule.index.nodes):
        if i in claimed or node.op_type != "LSTM" or node.domain not in _ONNX:
            continue
        why = refusal(node, rule)
        if why is not None:
            if rejected is not None:
                rejected.append({"nodes": [node.name or node.output[0]], "reason": f"LSTM: {why}"})
            continue
        regions.append(_region(node, rule))
        claimed.add(i)
    return regions
