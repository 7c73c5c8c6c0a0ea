"""Which Softmax and LogSoftmax nodes become a kernel, and why the others do not.

Opsets 1 to 12 coerce the input to 2-D at `axis`: rows of the trailing dims, flattened. Opset 13 and later reduce
one axis: the last one is a row (read as contiguous memory); any other is reduced down its columns, the dims after
it (lower.py define_columns), with no transpose. The lengths may be known only at run time.
"""

from __future__ import annotations

import onnx

from onnxopt.fusion.elementwise import ElementwiseRule, _attr
from onnxopt.fusion.region import EwOp, EwProgram, Region, Value

from ..base import single_node_regions
from .params import SoftmaxParams

OPS = {"Softmax": "softmax", "LogSoftmax": "log_softmax"}


def refusal(node, rule: ElementwiseRule) -> str | None:
    """Why this node is not a row kernel, as a sentence; None when it is one."""
    if rule.dtype_of(node.input[0]) != "float32":
        return "the row kernel takes float32 only"
    ti = rule.info.get(node.input[0])
    rank = ti.rank if ti is not None and ti.rank is not None else None
    if not rank:
        return "its input's rank is unknown (or 0)"
    axis = int(_attr(node, "axis", -1 if rule.opset >= 13 else 1))
    if not -rank <= axis < rank:
        return f"axis {axis} is outside a rank-{rank} input"
    return None


def find_regions(model: onnx.ModelProto, claimed: set[int], rejected: list[dict] | None = None) -> list[Region]:
    rule = ElementwiseRule(model)

    def region(node) -> Region:
        x, y = node.input[0], node.output[0]
        rank = rule.info[x].rank
        axis = int(_attr(node, "axis", -1 if rule.opset >= 13 else 1)) % rank
        dt = rule.dtype_of(x)  # the graph's element type (refusal() takes float32 only)
        # The program only names the computation (the op type hashes it); lower.py writes the kernel.
        program = EwProgram(inputs=[Value(x, dt)], consts={}, ops=[EwOp(node.op_type, (x,), y, dt)],
                            outputs=[Value(y, dt)])
        dims = rule.info[x].shape or [None] * rank
        shape = [d if isinstance(d, (int, str)) and not str(d).startswith("unk__") else None for d in dims]
        r = Region("softmax", [node], [x], [y], program, shape)
        r.params = SoftmaxParams(OPS[node.op_type], axis, dt, columns=rule.opset >= 13 and axis != rank - 1)
        return r

    return single_node_regions(rule.index.nodes, OPS, claimed, rejected, lambda n: refusal(n, rule), region)
