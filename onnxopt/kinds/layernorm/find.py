"""Which LayerNormalization nodes become a row kernel, and why the others do not.

A row is the last axis (the hidden size of a transformer, known or not at optimize time); the scale and bias are
float32 vectors of one row. An Add right before it whose two inputs have the normalized tensor's shape is taken in
(the residual connection, which onnxruntime fuses as SkipLayerNormalization); where the sum is read elsewhere too
(a pre-LN block's next residual), the kernel writes it as a second output.

Exports at opsets below 17 (torch's TorchScript exporter) spell the normalization out; that form is taken too:

    mean = ReduceMean(x, last axis); d = Sub(x, mean); var = ReduceMean(Pow(d, 2) or Mul(d, d), last axis)
    y = Div(d, Sqrt(Add(var, epsilon))) -> Mul(gamma) -> Add(beta)          (gamma and beta in either operand order)
"""

from __future__ import annotations

import onnx

from onnxopt.fusion.elementwise import ElementwiseRule, _attr
from onnxopt.fusion.region import EwOp, EwProgram, Region, Value

from .params import LayerNormParams

_ONNX = ("", "ai.onnx")


def refusal(node, rule: ElementwiseRule) -> str | None:
    """Why this LayerNormalization is not a row kernel, as a sentence; None when it is one."""
    x = node.input[0]
    if any(rule.dtype_of(n) != "float32" for n in node.input if n):
        return "the row kernel takes float32 only"
    ti = rule.info.get(x)
    rank = ti.rank if ti is not None else None
    if not rank:
        return "its input's rank is unknown (or 0)"
    if int(_attr(node, "axis", -1)) % rank != rank - 1:
        return "it normalizes more than the last axis"
    for name in node.input[1:]:
        si = rule.info.get(name) if name else None
        if name and (si is None or si.rank != 1):
            return "its scale or bias is not a vector"
    if any(o and (rule.index.consumers.get(o) or o in rule.index.graph_outputs) for o in node.output[1:]):
        return "its mean or inverse standard deviation output is read"
    return None


def _same_shape(rule: ElementwiseRule, a: str, b: str) -> bool:
    sa, sb = rule.info.get(a), rule.info.get(b)
    if sa is None or sb is None or sa.shape is None or sb.shape is None or len(sa.shape) != len(sb.shape):
        return False
    return all(p == q and p is not None and not str(p).startswith("unk__") for p, q in zip(sa.shape, sb.shape))


def _residual_add(x: str, rule: ElementwiseRule, claimed: set[int]) -> tuple[int, onnx.NodeProto] | None:
    """The Add that makes the normalized tensor `x` from two tensors of its shape, when there is one to take."""
    i = rule.index.producer.get(x)
    if i is None or i in claimed:
        return None
    add = rule.index.nodes[i]
    if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.input) != 2:
        return None
    if any(rule.dtype_of(a) != "float32" for a in add.input) or x in rule.index.used_by_subgraphs:
        return None
    if not (_same_shape(rule, add.input[0], add.output[0]) and _same_shape(rule, add.input[1], add.output[0])):
        return None
    return i, add


class _Norm:
    """One normalization found: its nodes (graph indices, in order), the rows' tensor, gamma, beta, epsilon, y."""

    def __init__(self, members, x, gamma, beta, epsilon, y):
        self.members, self.x, self.gamma, self.beta, self.epsilon, self.y = members, x, gamma, beta, epsilon, y


def _last_axis_mean(rule: ElementwiseRule, node, rank: int) -> bool:
    if node.op_type != "ReduceMean" or node.domain not in _ONNX or not int(_attr(node, "keepdims", 1)):
        return False
    axes = _attr(node, "axes", None)
    if axes is None and len(node.input) > 1 and node.input[1] in rule.inits:
        from onnx import numpy_helper

        axes = numpy_helper.to_array(rule.inits[node.input[1]]).reshape(-1).tolist()
    return axes is not None and len(axes) == 1 and int(axes[0]) % rank == rank - 1


def _decomposed(rule: ElementwiseRule, i: int, claimed: set[int]) -> _Norm | None:
    """The spelled-out form starting at ReduceMean node `i`, or None."""
    idx = rule.index
    mean_node = idx.nodes[i]
    x = mean_node.input[0] if mean_node.input else None
    ti = rule.info.get(x) if x else None
    if ti is None or not ti.rank or rule.dtype_of(x) != "float32" or not _last_axis_mean(rule, mean_node, ti.rank):
        return None

    def only(name, op):
        """The one consumer of `name` (no graph output), when it is an `op`; else None."""
        cs = idx.consumers.get(name, [])
        if len(cs) != 1 or name in idx.graph_outputs or name in idx.used_by_subgraphs or cs[0] in claimed:
            return None
        n = idx.nodes[cs[0]]
        return (cs[0], n) if n.op_type == op and n.domain in _ONNX else None

    sub = only(mean_node.output[0], "Sub")
    if sub is None or list(sub[1].input) != [x, mean_node.output[0]]:
        return None
    d = sub[1].output[0]
    readers = idx.consumers.get(d, [])
    if len(readers) != 2 or d in idx.graph_outputs or any(r in claimed for r in readers):
        return None
    square = div = None
    for r in readers:
        n = idx.nodes[r]
        if n.domain not in _ONNX:
            return None
        if n.op_type == "Pow" and n.input[0] == d and rule.scalar_const(n.input[1]) is not None \
                and float(rule.scalar_const(n.input[1])[0]) == 2.0:
            square = (r, n)
        elif n.op_type == "Mul" and list(n.input) == [d, d]:
            square = (r, n)
        elif n.op_type == "Div" and n.input[0] == d:
            div = (r, n)
    if square is None or div is None:
        return None
    var = only(square[1].output[0], "ReduceMean")
    if var is None or not _last_axis_mean(rule, var[1], ti.rank):
        return None
    add_eps = only(var[1].output[0], "Add")
    if add_eps is None:
        return None
    eps_name = [n for n in add_eps[1].input if n != var[1].output[0]]
    eps = rule.scalar_const(eps_name[0]) if len(eps_name) == 1 else None
    if eps is None:
        return None
    sqrt = only(add_eps[1].output[0], "Sqrt")
    if sqrt is None or div[1].input[1] != sqrt[1].output[0] or len(idx.consumers.get(sqrt[1].output[0], [])) != 1:
        return None
    members = [i, sub[0], square[0], var[0], add_eps[0], sqrt[0], div[0]]

    def vector_operand(op, of):
        """(node, the other operand) where `of` is read by only an `op` whose other operand is a float32 vector."""
        got = only(of, op)
        if got is None:
            return None
        other = [n for n in got[1].input if n != of]
        oi = rule.info.get(other[0]) if len(other) == 1 else None
        if oi is None or oi.rank != 1 or rule.dtype_of(other[0]) != "float32":
            return None
        return got, other[0]

    scaled = vector_operand("Mul", div[1].output[0])
    if scaled is None:
        return None  # the kernel always scales; without gamma the pattern is left alone
    members.append(scaled[0][0])
    y, beta = scaled[0][1].output[0], None
    shifted = vector_operand("Add", y)
    if shifted is not None:
        members.append(shifted[0][0])
        y, beta = shifted[0][1].output[0], shifted[1]
    return _Norm(sorted(members), x, scaled[1], beta, float(eps[0]), y)


def find_regions(model: onnx.ModelProto, claimed: set[int], rejected: list[dict] | None = None) -> list[Region]:
    rule = ElementwiseRule(model)
    regions = []
    for i, node in enumerate(rule.index.nodes):
        if i in claimed or node.domain not in _ONNX:
            continue
        if node.op_type == "ReduceMean":
            norm = _decomposed(rule, i, claimed)
            if norm is None:
                continue
        elif node.op_type == "LayerNormalization":
            why = refusal(node, rule)
            if why is not None:
                if rejected is not None:
                    rejected.append({"nodes": [node.name or node.output[0]], "reason": f"LayerNormalization: {why}"})
                continue
            norm = _Norm([i], node.input[0], node.input[1], node.input[2] if len(node.input) > 2 and node.input[2]
                         else None, float(_attr(node, "epsilon", 1e-5)), node.output[0])
        else:
            continue
        y, scale, bias = norm.y, norm.gamma, norm.beta
        add = _residual_add(norm.x, rule, claimed)
        members, nodes = list(norm.members), [rule.index.nodes[m] for m in norm.members]
        if add is not None:
            members.insert(0, add[0])
            nodes.insert(0, add[1])
            s = add[1].output[0]
            sum_output = s in rule.index.graph_outputs or any(c not in members for c in rule.index.consumers.get(s, []))
            rows_in = list(add[1].input)
        else:
            sum_output, rows_in = False, [norm.x]
        inputs = rows_in + [scale] + ([bias] if bias else [])
        outputs = [y] + ([add[1].output[0]] if sum_output else [])
        dt = rule.dtype_of(norm.x)  # the graph's element type (refusal() and _decomposed() take float32 only)
        params = LayerNormParams(norm.epsilon, add is not None, sum_output, bias is not None, dt)
        # The program only names the computation (the op type hashes it); lower.py writes the kernel.
        ops = [EwOp("LayerNormalization", (norm.x, *inputs[len(rows_in):]), y, dt)]
        if add is not None:
            ops.insert(0, EwOp("Add", tuple(rows_in), add[1].output[0], dt))
        program = EwProgram(inputs=[Value(x, dt) for x in inputs], consts={}, ops=ops,
                            outputs=[Value(o, dt) for o in outputs])
        ti = rule.info[norm.x]
        dims = ti.shape or [None] * ti.rank
        shape = [d if isinstance(d, (int, str)) and not str(d).startswith("unk__") else None for d in dims]
        region = Region("layernorm", nodes, inputs, outputs, program, shape, params=params)
        claimed.update(members)
        regions.append(region)
    return regions
