"""The search's cost from measurements (OptiFX §4.2: "the cost is the measured latency of the plan's kernels"), with
the roofline for what has not been measured.

Measured seconds and roofline seconds are not on one scale: our kernels run at some fraction of the roofline, and
that fraction differs between a 1x1 conv on a 56x56 image and a depthwise one. Mixing them raw would make every
measured kernel look worse than the unmeasured nodes it replaces, and the search would fuse nothing it has timed.
So the roofline estimates are *calibrated* by what was measured nearby:

* a node's cost is its roofline estimate times the factor measured/estimate of the smallest measured candidate that
  contains it (a conv's factor comes from its own conv + epilogue kernel); a node no measured candidate contains
  takes the median factor of all measured candidates;
* an unmeasured candidate keeps the roofline's ratio to its members: its estimate times the members' calibrated
  cost over their estimates. An AFUSION group whose two convs were timed but which was not is predicted at the
  roofline's speedup over their measured times;
* a measured candidate or node costs exactly what it measured.

Without measurements every factor is 1 and this is the roofline cost source. With them, a measured candidate's
calibrated members cost at least what it measured (its estimate is at most its members' summed estimates, the
bytes it saves), so the search never prefers unfusing what was timed fused for want of a common scale.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping

from .backtrack import Kernel, NodeKernel, SearchResult, backtrack_search, node_kernels
from .candidates import Candidate, CandidateResult


class MeasuredCostSource:
    """`cost(kernel)`: measured seconds (`measured`: signature -> seconds) where the kernel was timed, else its
    calibrated roofline estimate (see the module docstring). `used` lists the measured signatures the search asked
    for, `estimated` the others, in the order first asked."""

    def __init__(self, result: CandidateResult, measured: Mapping[str, float]):
        self.measured = {k: float(v) for k, v in measured.items() if v and v > 0}
        nodes = node_kernels(result.graph)
        self.node_estimate = [k.estimate for k in nodes]
        self.node_factor: dict[int, float] = {}
        ratios = []
        # The smallest measured kernel around a node says most about it: single nodes first, then candidates by size.
        for k in nodes:
            if k.key in self.measured and k.estimate > 0:
                self.node_factor[k.node_id] = self.measured[k.key] / k.estimate
                ratios.append(self.node_factor[k.node_id])
        for c in sorted(result.enumerated, key=lambda c: (len(c.node_ids), c.node_ids, c.id)):
            if c.key in self.measured and c.estimate > 0:
                f = self.measured[c.key] / c.estimate
                ratios.append(f)
                for n in c.node_ids:
                    self.node_factor.setdefault(n, f)
        self.factor = statistics.median(ratios) if ratios else 1.0
        self.used: list[str] = []
        self.estimated: list[str] = []
        self._seen: set[str] = set()

    def _factor(self, node_id: int) -> float:
        return self.node_factor.get(node_id, self.factor)

    def calibrated(self, kernel: Kernel) -> float:
        """The kernel's roofline estimate on the measured scale (what `cost` answers when it was not measured)."""
        if isinstance(kernel, NodeKernel):
            return kernel.estimate * self._factor(kernel.node_id)
        assert isinstance(kernel, Candidate)
        est = sum(self.node_estimate[n] for n in kernel.node_ids)
        if est <= 0:
            return kernel.estimate * self.factor
        return kernel.estimate * sum(self.node_estimate[n] * self._factor(n) for n in kernel.node_ids) / est

    def cost(self, kernel: Kernel) -> float:
        hit = kernel.key in self.measured
        if kernel.key not in self._seen:
            self._seen.add(kernel.key)
            (self.used if hit else self.estimated).append(kernel.key)
        return self.measured[kernel.key] if hit else self.calibrated(kernel)


def measured_search(result: CandidateResult, measured: Mapping[str, float], *, budget_s: float = 60.0,
                    built: Callable[[Candidate], bool] | None = None) -> tuple[SearchResult, MeasuredCostSource]:
    """Algorithm 2 on measured costs: over the candidates the roofline kept, and over those it pruned that a
    measurement covers (the roofline's filter is there to spare measuring hopeless candidates; one that was
    measured is judged on its time).

    `built`: the pipeline's second search chooses among the kernels it built, and a plan holding a group that was
    never built would be costed for a kernel it cannot have. With it, the search set is the candidates it accepts
    (measured or not: a vertical candidate always has a kernel), taken from all enumerated candidates, so a built
    group that GraphSplit's leaves cut apart is judged too (its legality was checked when it was built)."""
    if built is not None:
        search_set = [c for c in result.enumerated if built(c)]
    else:
        kept = {c.id for c in result.candidates}
        search_set = list(result.candidates) + [c for c in result.unpruned if c.id not in kept and c.key in measured]
    source = MeasuredCostSource(result, measured)
    return backtrack_search(result, search_set, source, budget_s=budget_s), source


__all__ = ["MeasuredCostSource", "measured_search"]
