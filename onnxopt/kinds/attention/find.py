"""Which attention chains become one kernel, and why the others do not.

The chains are found by onnxopt/fusion/attention.py in every form the exporters write; here they are checked for
what the kernel takes: float32 Q, K and V of one rank (2 or more, the dims before the last two broadcast between
them), a float32 additive mask or a bool select mask of at most that rank. Every dim may be known only at run time.
"""

from __future__ import annotations

import onnx

from onnxopt.codegen.glue.kinds import c_define
from onnxopt.fusion.attention import find_attention
from onnxopt.fusion.elementwise import ElementwiseRule
from onnxopt.fusion.region import EwOp, EwProgram, Region, Value

from .params import AttentionParams

MAX_RANK = c_define("glue.h", "MAX_RANK")


def refusal(chain, rule: ElementwiseRule) -> str | None:
    for name in (chain.q, chain.k, chain.v, chain.output):
        if rule.dtype_of(name) != "float32":
            return "the kernel takes float32 queries, keys and values only"
    ranks = [rule.info[x].rank if x in rule.info else None for x in (chain.q, chain.k, chain.v)]
    if None in ranks or len(set(ranks)) != 1:
        return "queries, keys and values are not of one known rank"
    if not 2 <= ranks[0] <= MAX_RANK:
        return f"rank {ranks[0]}: the kernel takes 2 to {MAX_RANK}"
    if chain.mask is not None:
        want = "float32" if chain.mask_kind == "add" else "bool"
        if rule.dtype_of(chain.mask) != want:
            return f"the mask is not {want}"
        mi = rule.info.get(chain.mask)
        if mi is None or mi.rank is None or mi.rank > ranks[0]:
            return "the mask's rank is unknown or above the scores'"
    return None


def find_regions(model: onnx.ModelProto, claimed: set[int], rejected: list[dict] | None = None) -> list[Region]:
    rule = ElementwiseRule(model)
    position = {id(n): i for i, n in enumerate(rule.index.nodes)}
    ranks = {name: ti.rank for name, ti in rule.info.items() if ti is not None and ti.rank is not None}
    found = []
    for chain in find_attention(model, ranks, rejected, rule.index):
        members = [position[id(n)] for n in chain.nodes]
        if any(i in claimed for i in members):
            continue
        why = refusal(chain, rule)
        if why is not None:
            if rejected is not None:
                rejected.append({"nodes": [n.name or n.output[0] for n in chain.nodes], "reason": f"attention: {why}"})
            continue
        inputs = [chain.q, chain.k, chain.v] + ([chain.mask] if chain.mask is not None else [])
        params = AttentionParams(chain.scale, chain.k_transposed, chain.mask_kind, chain.fill, chain.nan_guard)
        # The program only names the computation (the op type hashes it); lower.py writes the kernel.
        program = EwProgram(inputs=[Value(x, rule.dtype_of(x)) for x in inputs], consts={},
                            ops=[EwOp("Attention", tuple(inputs), chain.output, "float32")],
                            outputs=[Value(chain.output, "float32")])
        dims = rule.info[chain.output].shape if chain.output in rule.info else None
        shape = [d if isinstance(d, (int, str)) and not str(d).startswith("unk__") else None for d in (dims or [])]
        region = Region("attention", list(chain.nodes), inputs, [chain.output], program, shape, params=params)
        claimed.update(members)
        found.append(region)
    return found
