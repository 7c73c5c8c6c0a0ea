"""Which attention chains become one kernel, and why the others do not.

The chains are found by onnxopt/fusion/attention.py in every form the exporters write; here they are checked for
what the kernel takes: float32 Q, K and V of one rank (2 or more, the dims before the last two broadcast between
them), a float32 additive mask or a bool select mask of at most that rank. Every dim may be known only at run time.

The head split and merge around a chain, Transpose(Reshape(x), [0, 2, 1, 3]) into Q, K or V and the Transpose of
its output, are taken into the region where the chain alone reads them: the kernel reads and writes through the
permutation (AttentionParams.perms), so no transposed copy is made. A head dim must stay innermost in memory: Q's
and V's last dim, K's head dim (where it is, a task packs K^T as it does from K).
"""

from __future__ import annotations

import onnx

from onnxopt.codegen.glue.kinds import c_define
from onnxopt.fusion.attention import find_attention
from onnxopt.fusion.elementwise import ElementwiseRule, _attr
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


def _perm(node, rank: int) -> list[int] | None:
    """A Transpose's permutation when it keeps rank `rank`; None for anything else."""
    if node is None or node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
        return None
    perm = _attr(node, "perm", None)
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    return perm if sorted(perm) == list(range(rank)) else None


def fold_layouts(chain, rule: ElementwiseRule, claimed: set[int], rank: int):
    """The Transposes that move heads in and out of the chain, where only the chain reads them: (their node indices,
    the tensors the kernel reads for q, k, v, the one it writes, the permutations)."""
    idx = rule.index
    members = {id(n) for n in chain.nodes}
    taken, names, perms = [], [chain.q, chain.k, chain.v], [(), (), ()]
    head_dim = {0: rank - 1, 1: rank - 2 if chain.k_transposed else rank - 1, 2: rank - 1}
    for t, x in enumerate(names):
        i = idx.producer.get(x)
        node = idx.nodes[i] if i is not None else None
        perm = _perm(node, rank)
        readers = idx.consumers.get(x, [])
        if perm is None or i in claimed or x in idx.graph_outputs or x in idx.used_by_subgraphs or \
                not readers or any(id(idx.nodes[r]) not in members for r in readers):
            continue
        if perm[head_dim[t]] != rank - 1 and not (t == 1 and perm[rank - 1] == rank - 1):
            continue  # the head dim would not be innermost in memory (K^T's keys innermost is read in place)
        taken.append(i)
        names[t] = node.input[0]
        perms[t] = tuple(perm)
    out, out_perm = chain.output, ()
    readers = idx.consumers.get(out, [])
    if len(readers) == 1 and out not in idx.graph_outputs and out not in idx.used_by_subgraphs:
        node = idx.nodes[readers[0]]
        perm = _perm(node, rank)
        if perm is not None and readers[0] not in claimed and perm[rank - 1] == rank - 1:
            taken.append(readers[0])
            out = node.output[0]
            inverse = [0] * rank  # memory dim j is logical dim perm[j]: logical dim i is memory dim inverse[i]
            for j, p in enumerate(perm):
                inverse[p] = j
            out_perm = tuple(inverse)
    perms.append(out_perm)
    if not any(perms):
        return [], names, chain.output, ((), (), (), ())
    return taken, names, out, tuple(p or tuple(range(rank)) for p in perms)


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
        rank = rule.info[chain.q].rank
        taken, (q, k, v), output, perms = fold_layouts(chain, rule, claimed, rank)
        inputs = [q, k, v] + ([chain.mask] if chain.mask is not None else [])
        dt = rule.dtype_of(chain.q)  # the graph's element type (refusal() takes float32 only)
        params = AttentionParams(chain.scale, chain.k_transposed, chain.mask_kind, chain.fill, chain.nan_guard,
                                 perms, dt, middle=chain.middle)
        # The program only names the computation (the op type hashes it); lower.py writes the kernel.
        program = EwProgram(inputs=[Value(x, rule.dtype_of(x)) for x in inputs], consts={},
                            ops=[EwOp("Attention" if chain.middle == "softmax" else f"MatMulChain_{chain.middle}",
                                      tuple(inputs), output, dt)],
                            outputs=[Value(output, dt)])
        dims = rule.info[output].shape if output in rule.info else None
        shape = [d if isinstance(d, (int, str)) and not str(d).startswith("unk__") else None for d in (dims or [])]
        nodes = sorted([rule.index.nodes[i] for i in taken] + list(chain.nodes), key=lambda n: position[id(n)])
        region = Region("attention", nodes, inputs, [output], program, shape, params=params)
        claimed.update(members + taken)
        found.append(region)
    return found
