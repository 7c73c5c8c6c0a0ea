"""The search's records: a candidate fusion, a leaf of the graph split, a refusal, and the candidates of a graph."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


from onnxopt.fusion.afusion.legality import FusionGraph
from onnxopt.hardware.machine_model import Machine

KINDS = ("vertical", "horizontal", "afusion")  # the fusion kinds the search enumerates



@dataclass(frozen=True)
class Candidate:
    """One candidate kernel: a set of nodes that would run as one fused kernel.

    Node names are the annotated graph's. `key` is a signature of the sub-graph (op types, shapes, attributes,
    wiring; not the weights' values): identical sub-graphs share it, so a kernel or cost cache can be keyed on it.
    `id` is stable for a model: kind, pattern and ROP names.
    """

    id: str
    kind: str  # "vertical", "horizontal" or "afusion"
    pattern: str  # "single", "siblings", "SISO", "SIMO" or "MISO"
    rops: tuple[str, ...]  # the ROPs (and Gemm/MatMul) in topological order
    members: tuple[str, ...]  # every member, EOPs included, in topological order
    node_ids: tuple[int, ...]  # the members' positions in the graph
    removed_tensors: tuple[str, ...]  # intermediates no longer written or read
    shared_inputs: tuple[str, ...]  # inputs read once instead of once per member (horizontal)
    flops_before: int
    recompute_flops: int  # halo recomputation (afusion)
    bytes_before: int
    bytes_after: int
    rop_flops: int  # the ROP members alone (the paper's Table 4 counts convs only)
    rop_bytes_before: int
    seconds_before: float  # sum of the members' roofline times, each its own kernel
    seconds_after: float  # roofline time of the fused kernel
    key: str
    band_height: int | None = None  # afusion: output rows per band used for the recompute
    scratch_bytes: int | None = None  # afusion: intermediate rows one band holds

    @property
    def flops_after(self) -> int:
        return self.flops_before + self.recompute_flops

    @property
    def bytes_saved(self) -> int:
        return self.bytes_before - self.bytes_after

    @property
    def intensity_before(self) -> float:
        return self.flops_before / self.bytes_before if self.bytes_before else 0.0

    @property
    def intensity_after(self) -> float:
        """The paper's fused I: useful FLOPs over the bytes the fused kernel moves (recompute not counted)."""
        return self.flops_before / self.bytes_after if self.bytes_after else 0.0

    @property
    def rop_intensity_before(self) -> float:
        """Table 4's "before": the ROPs' FLOPs over their own bytes, epilogue ops left out."""
        return self.rop_flops / self.rop_bytes_before if self.rop_bytes_before else 0.0

    @property
    def rop_intensity_after(self) -> float:
        """Table 4's "after": the ROPs' FLOPs over the fused kernel's bytes."""
        return self.rop_flops / self.bytes_after if self.bytes_after else 0.0

    @property
    def attainable_before(self) -> float:
        """P~ unfused: useful FLOP/s when each member runs as its own roofline-bound kernel."""
        return self.flops_before / self.seconds_before if self.seconds_before else 0.0

    @property
    def attainable_after(self) -> float:
        """P~ fused: useful FLOP/s of the fused kernel on the roofline (recompute costs time, not useful FLOPs)."""
        return self.flops_before / self.seconds_after if self.seconds_after else 0.0

    @property
    def predicted_speedup(self) -> float:
        return self.seconds_before / self.seconds_after if self.seconds_after else float("inf")

    @property
    def estimate(self) -> float:
        """The roofline cost of the fused kernel in seconds (what a cost source falls back to)."""
        return self.seconds_after

    def to_dict(self) -> dict:
        return {
            "id": self.id, "kind": self.kind, "pattern": self.pattern, "rops": list(self.rops),
            "members": list(self.members), "removed_tensors": list(self.removed_tensors),
            "shared_inputs": list(self.shared_inputs), "flops_before": self.flops_before,
            "recompute_flops": self.recompute_flops, "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after, "intensity_before": self.intensity_before,
            "intensity_after": self.intensity_after, "seconds_before": self.seconds_before,
            "seconds_after": self.seconds_after, "predicted_speedup": self.predicted_speedup,
            "band_height": self.band_height, "scratch_bytes": self.scratch_bytes, "key": self.key,
        }


@dataclass(frozen=True)
class Leaf:
    """A part of GraphSplit: the nodes at positions [start, end) of the split order (`fusion_order`)."""

    start: int
    end: int
    rops: int
    names: tuple[str, ...] = field(repr=False, default=())
    node_ids: tuple[int, ...] = field(repr=False, default=())


@dataclass(frozen=True)
class Refusal:
    kind: str
    pattern: str
    rops: tuple[str, ...]
    reason: str


@dataclass
class CandidateResult:
    """Algorithm 1's answer. `candidates` are the ones kept; `unpruned` the legal ones inside GraphSplit's leaves
    before the roofline filter (Table 5's "before"); `enumerated` every legal one, leaves ignored."""

    graph: FusionGraph = field(repr=False)
    machine: Machine = field(repr=False)
    candidates: list[Candidate]
    unpruned: list[Candidate]
    enumerated: list[Candidate]
    leaves: list[Leaf]
    refused: list[Refusal]
    theta_opt: float
    t_graph: int
    seconds: float
    pruned: bool = True

    def counts(self) -> dict[str, dict[str, int]]:
        """{"before"|"after"|"enumerated": {kind: n, ..., "total": n}} (Table 5's two rows, per kind)."""

        def by_kind(cs: Sequence[Candidate]) -> dict[str, int]:
            d = {k: sum(1 for c in cs if c.kind == k) for k in KINDS}
            d["total"] = len(cs)
            return d

        return {"enumerated": by_kind(self.enumerated), "before": by_kind(self.unpruned),
                "after": by_kind(self.candidates)}

    @property
    def count_before(self) -> int:
        return len(self.unpruned)

    @property
    def count_after(self) -> int:
        return len(self.candidates)

    def by_id(self) -> dict[str, Candidate]:
        return {c.id: c for c in self.enumerated}

    def summary(self) -> str:
        c = self.counts()
        kinds = ", ".join(f"{k} {c['before'][k]}->{c['after'][k]}" for k in KINDS)
        return (f"{c['before']['total']} candidates before pruning, {c['after']['total']} after (theta_opt "
                f"{self.theta_opt}; {kinds}; {len(self.leaves)} leaves of <= {self.t_graph} ROPs; "
                f"{c['enumerated']['total']} legal in the whole graph) on {self.machine.name}, "
                f"{self.seconds:.2f} s")
