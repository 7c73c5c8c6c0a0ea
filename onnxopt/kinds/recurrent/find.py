"""Which LSTM and GRU nodes become a recurrent kernel, and why the others do not.

Exporters write a recurrent layer as one node (torch.nn.LSTM and GRU, Paddle's and Keras's converters): X [T, B, I],
constant W [D, G H, I], R [D, G H, H] and B [D, 2 G H] (G gates: LSTM 4, GRU 3), optional initial_h (and an LSTM's
initial_c) [D, B, H], outputs Y [T, D, B, H], Y_h (and Y_c) [D, B, H]. The kernel takes that form with the default
gates (LSTM: sigmoid, tanh, tanh, no peepholes or coupled input-forget gate; GRU: sigmoid, tanh with
linear_before_reset = 1, as torch and Keras 2 write it), no clip, layout 0 and no sequence_lens (every batch row runs
all T steps); T and B may be known only at run time.

The weights are packed once, here, in blocks of BLOCK hidden units with their gates side by side (packed_*): a step
reads one block's rows of R as whole vectors and finishes its units' gates in registers. The biases go into four
slots a block: an LSTM's Wb + Rb per gate; a GRU's Wbz + Rbz, Wbr + Rbr, Wbh and Rbh (which the reset gate scales,
so it stays apart). The function fallback unpacks them into the node's own W, R and B.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxopt.fusion.elementwise import ElementwiseRule, _attr
from onnxopt.fusion.region import EwOp, EwProgram, Region, Value

from ..base import single_node_regions
from .params import BLOCK, SLOTS, RecurrentParams

_ONNX = ("", "ai.onnx")
DIRECTIONS = {b"forward": (1, False), b"reverse": (1, True), b"bidirectional": (2, False)}


@dataclass(frozen=True)
class Cell:
    name: str  # RecurrentParams.cell
    gates: int
    activations: tuple[bytes, ...]  # the defaults, one direction's
    states: int  # initial_h (and initial_c): inputs 5 (and 6); outputs Y, Y_h (and Y_c)


CELLS = {"LSTM": Cell("lstm", 4, (b"Sigmoid", b"Tanh", b"Tanh"), 2), "GRU": Cell("gru", 3, (b"Sigmoid", b"Tanh"), 1)}
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


def packed_weights(w: np.ndarray, hidden: int, gates: int = 4) -> np.ndarray:
    """W [D, G H, I] (or R [D, G H, H]) -> [D, NB, I, G, BLOCK]: block b's gate g of unit u at [d, b, i, g, u]."""
    d, _, k = w.shape
    g = _pad_units(w.reshape(d, gates, hidden, k), hidden, 2)
    return np.ascontiguousarray(g.reshape(d, gates, -1, BLOCK, k).transpose(0, 2, 4, 1, 3), dtype=np.float32)


def packed_bias(b: np.ndarray, hidden: int, cell: str = "lstm") -> np.ndarray:
    """B [D, 2 G H] (Wb then Rb) -> the four slots [D, NB, SLOTS, BLOCK]: an LSTM's Wb + Rb per gate; a GRU's
    Wbz + Rbz, Wbr + Rbr, Wbh, Rbh."""
    d = b.shape[0]
    if cell == "lstm":
        s = (b[:, :4 * hidden] + b[:, 4 * hidden:]).reshape(d, 4, hidden)
    else:
        wb, rb = b[:, :3 * hidden].reshape(d, 3, hidden), b[:, 3 * hidden:].reshape(d, 3, hidden)
        s = np.concatenate([wb[:, :2] + rb[:, :2], wb[:, 2:], rb[:, 2:]], axis=1)
    return np.ascontiguousarray(_pad_units(s, hidden, 2).reshape(d, SLOTS, -1, BLOCK).transpose(0, 2, 1, 3),
                                dtype=np.float32)


def _const(name, arr):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr, np.int64), name))


def _slice(src: str, dst: str, start: int, end: int, axis: int, opset: int) -> list[onnx.NodeProto]:
    if opset < 10:
        return [helper.make_node("Slice", [src], [dst], starts=[start], ends=[end], axes=[axis])]
    return [_const(f"{dst}_b", [start]), _const(f"{dst}_e", [end]), _const(f"{dst}_a", [axis]),
            helper.make_node("Slice", [src, f"{dst}_b", f"{dst}_e", f"{dst}_a"], [dst])]


def _reshape(src: str, dst: str, shape: list[int]) -> list[onnx.NodeProto]:
    return [_const(f"{dst}_s", shape), helper.make_node("Reshape", [src, f"{dst}_s"], [dst])]


def _unpack(packed: str, out: str, d: int, hidden: int, k: int | None, gates: int,
            opset: int) -> list[onnx.NodeProto]:
    """Nodes that rebuild W or R [D, G H, k] from their packed form; k None: the bias slots as [D, SLOTS, H]."""
    nb = -(-hidden // BLOCK)
    if k is None:  # [D, NB, SLOTS, BLOCK] -> [D, SLOTS, NB * BLOCK]
        perm, grouped = [0, 2, 1, 3], [d, SLOTS, nb * BLOCK]
    else:  # [D, NB, k, G, BLOCK] -> [D, G, NB * BLOCK, k]
        perm, grouped = [0, 3, 1, 4, 2], [d, gates, nb * BLOCK, k]
    units = out if k is None else f"{out}_u"  # [D, G or SLOTS, H(, k)]
    padded = nb * BLOCK != hidden
    body = [helper.make_node("Transpose", [packed], [f"{out}_t"], perm=perm)]
    body += _reshape(f"{out}_t", f"{out}_g" if padded else units, grouped)
    if padded:  # the padding units off
        body += _slice(f"{out}_g", units, 0, hidden, 2, opset)
    if k is not None:
        body += _reshape(units, out, [d, gates * hidden, k])
    return body


def _unpack_bias(packed: str, out: str, d: int, hidden: int, cell: str, opset: int) -> list[onnx.NodeProto]:
    """Nodes that rebuild B [D, 2 G H] from the bias slots: Rb zero where its part was summed into Wb."""
    s = f"{out}_slots"
    body = _unpack(packed, s, d, hidden, None, SLOTS, opset)
    if cell == "lstm":
        return body + _reshape(s, f"{out}_wb", [d, 4 * hidden]) + [
            helper.make_node("Sub", [f"{out}_wb", f"{out}_wb"], [f"{out}_rb"]),
            helper.make_node("Concat", [f"{out}_wb", f"{out}_rb"], [out], axis=1)]
    body += _slice(s, f"{out}_w3", 0, 3, 1, opset) + _reshape(f"{out}_w3", f"{out}_wb", [d, 3 * hidden])
    body += _slice(s, f"{out}_zr", 0, 2, 1, opset) + [helper.make_node("Sub", [f"{out}_zr", f"{out}_zr"],
                                                                        [f"{out}_z0"])]
    body += _reshape(f"{out}_z0", f"{out}_rzr", [d, 2 * hidden])
    body += _slice(s, f"{out}_h1", 3, 4, 1, opset) + _reshape(f"{out}_h1", f"{out}_rh", [d, hidden])
    return body + [helper.make_node("Concat", [f"{out}_wb", f"{out}_rzr", f"{out}_rh"], [out], axis=1)]


def refusal(node, rule: ElementwiseRule) -> str | None:
    """Why this LSTM or GRU is not a recurrent kernel, as a sentence; None when it is one."""
    cell = CELLS[node.op_type]
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
            list(cell.activations) * directions:
        return f"its activations are not the default {', '.join(a.decode().lower() for a in cell.activations)}"
    for name in ("activation_alpha", "activation_beta", "clip"):
        if _attr(node, name, None) is not None:
            return f"it has {name}"
    if int(_attr(node, "input_forget", 0)) or int(_attr(node, "layout", 0)):
        return "it has input_forget or layout 1"
    if cell.name == "gru" and int(_attr(node, "linear_before_reset", 0)) != 1:
        return "it has linear_before_reset 0 (the reset gate before the recurrent product: a step needs all of r " \
               "first)"
    w = numpy_helper.to_array(rule.inits[node.input[1]])
    r = numpy_helper.to_array(rule.inits[node.input[2]])
    hidden = int(_attr(node, "hidden_size", r.shape[-1] if r.ndim == 3 else 0))
    g = cell.gates
    if w.ndim != 3 or r.shape != (directions, g * hidden, hidden) or w.shape[:2] != (directions, g * hidden):
        return "its W or R does not have the shape hidden_size and direction give"
    ti = rule.info.get(node.input[0])
    if ti is None or ti.rank != 3:
        return "its X is not of rank 3"
    if not any(o and (rule.index.consumers.get(o) or o in rule.index.graph_outputs) for o in node.output):
        return "no output is used"
    return None


def _region(node, rule: ElementwiseRule) -> Region:
    cell = CELLS[node.op_type]
    directions, reverse = DIRECTIONS[_attr(node, "direction", b"forward")]
    w = numpy_helper.to_array(rule.inits[node.input[1]]).astype(np.float32)
    r = numpy_helper.to_array(rule.inits[node.input[2]]).astype(np.float32)
    hidden, input_size, gates = r.shape[-1], w.shape[-1], cell.gates
    has_b = len(node.input) > 3 and bool(node.input[3])
    b = numpy_helper.to_array(rule.inits[node.input[3]]).astype(np.float32) if has_b else \
        np.zeros((directions, 2 * gates * hidden), np.float32)
    uid = next(o for o in node.output if o)  # one is used (refusal): a name no other node's tables share
    names = {"w": f"{uid}__packed_w", "r": f"{uid}__packed_r", "b": f"{uid}__packed_b"}
    tables = {"w": packed_weights(w, hidden, gates), "r": packed_weights(r, hidden, gates),
              "b": packed_bias(b, hidden, cell.name)}
    states = [len(node.input) > 5 + k and bool(node.input[5 + k]) for k in range(cell.states)]
    has_h0, has_c0 = states[0], cell.states > 1 and states[1]
    n_out = 1 + cell.states
    used = tuple(k < n_out and bool(o) and bool(rule.index.consumers.get(o) or o in rule.index.graph_outputs)
                 for k, o in enumerate((list(node.output) + ["", "", ""])[:3]))
    outputs = [o for o, u in zip(node.output, used) if u]

    opset = rule.opset
    body = (_unpack(names["w"], f"{uid}__w", directions, hidden, input_size, gates, opset)
            + _unpack(names["r"], f"{uid}__r", directions, hidden, hidden, gates, opset)
            + _unpack_bias(names["b"], f"{uid}__b", directions, hidden, cell.name, opset))
    own = onnx.NodeProto()
    own.CopyFrom(node)
    del own.input[:]
    own.input.extend([node.input[0], f"{uid}__w", f"{uid}__r", f"{uid}__b", ""]
                     + [node.input[5 + k] if states[k] else "" for k in range(cell.states)])
    while own.input and not own.input[-1]:
        own.input.pop()
    body.append(own)

    inputs = [node.input[0], names["w"], names["r"], names["b"]] + [node.input[5 + k] for k in range(cell.states)
                                                                     if states[k]]
    program = EwProgram(inputs=[Value(x, "float32") for x in inputs], consts={},
                        ops=[EwOp(node.op_type, tuple(inputs), o, "float32", (("output", k),))
                             for k, o in enumerate(node.output[:3]) if o in outputs],
                        outputs=[Value(o, "float32") for o in outputs])
    x_shape = rule.info[node.input[0]].shape or [None] * 3
    shape = [d if isinstance(d, (int, str)) and not str(d).startswith("unk__") else None for d in x_shape]
    params = RecurrentParams(cell=cell.name, directions=directions, reverse=reverse, hidden=hidden,
                             input_size=input_size, has_h0=has_h0, has_c0=has_c0, outputs=used,
                             serpentine=4 * gates * hidden * hidden > SERPENTINE_R_BYTES, body=tuple(body))
    region = Region("recurrent", [node], inputs, outputs, program, shape, params=params)
    region.initializers = [numpy_helper.from_array(tables[key], name) for key, name in names.items()]
    return region


def find_regions(model: onnx.ModelProto, claimed: set[int], rejected: list[dict] | None = None) -> list[Region]:
    rule = ElementwiseRule(model)
    return single_node_regions(rule.index.nodes, CELLS, claimed, rejected, lambda n: refusal(n, rule),
                               lambda n: _region(n, rule))
