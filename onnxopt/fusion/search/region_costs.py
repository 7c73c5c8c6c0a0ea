"""Which of the search's kernels a built region is, so that its measured time can cost that kernel.

The search (Algorithm 2) costs candidates and single nodes by signature (`Candidate.key`, `node_key`); the pipeline
times regions. A convolution region (the conv with its epilogue) is the vertical candidate of that conv with the
most members inside the region (the conv alone, `node_key`, when it has no epilogue the search knows of); an AFUSION
region is the afusion candidate with the same convolutions, a sibling region (horizontal fusion) the horizontal one. Its epilogue may hold a node or two more or fewer than
the candidate's: elementwise work inside a conv's epilogue costs next to nothing, so the time stands for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .candidates import CandidateResult, node_key


def conv_signature(result: CandidateResult, nodes: Sequence[str]) -> str | None:
    """The signature of a region holding one convolution (`nodes[0]`) and its epilogue nodes."""
    if not nodes:
        return None
    conv, inside = nodes[0], set(nodes)
    best = None
    for c in result.enumerated:
        if c.kind == "vertical" and c.rops == (conv,) and set(c.members) <= inside \
                and (best is None or len(c.members) > len(best.members)):
            best = c
    if best is not None:
        return best.key
    if conv in result.graph.names:
        return node_key(result.graph, conv)
    return None


def group_signature(result: CandidateResult, convs: Iterable[str], kind: str = "afusion") -> str | None:
    """The signature of the `kind` candidate (afusion, or horizontal for sibling kernels) over exactly these
    convolutions, or None."""
    want = frozenset(convs)
    for c in result.enumerated:
        if c.kind == kind and frozenset(c.rops) == want:
            return c.key
    return None


def search_signatures(result: CandidateResult) -> list[str]:
    """Every signature the search may ask about: the candidates' and the single nodes'."""
    keys = [c.key for c in result.enumerated]
    keys += [node_key(result.graph, i) for i in range(len(result.graph.nodes))]
    return list(dict.fromkeys(keys))


__all__ = ["conv_signature", "group_signature", "search_signatures"]
