"""What a fusion kind gives the driver: how it finds its regions, and how it builds one."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


def c_signature(prefix: str, op_type: str, kind_id: str, in_types: list[int], out_types: list[int]) -> tuple[str, str]:
    """What every kind's C descriptor starts with: (the declarations of its input and output type arrays, the
    initializer of its `onnxopt_sig` member)."""
    ins = ", ".join(str(t) for t in in_types)
    outs = ", ".join(str(t) for t in out_types)
    decls = (f"static const int {prefix}_in_types[] = {{{ins}}};\n"
             f"static const int {prefix}_out_types[] = {{{outs}}};\n")
    return decls, (f'{{"{op_type}", {kind_id}, {len(in_types)}, {len(out_types)}, {prefix}_in_types, '
                   f"{prefix}_out_types}}")


def single_node_regions(nodes, ops, claimed: set[int], rejected: list[dict] | None, refusal, region) -> list:
    """The regions of a kind whose region is one node: each unclaimed node of `ops` (default domain) that
    `refusal(node)` does not refuse becomes `region(node)` and is claimed; a refused one adds its sentence to
    `rejected` (when not None)."""
    regions = []
    for i, node in enumerate(nodes):
        if i in claimed or node.op_type not in ops or node.domain not in ("", "ai.onnx"):
            continue
        why = refusal(node)
        if why is not None:
            if rejected is not None:
                rejected.append({"nodes": [node.name or node.output[0]], "reason": f"{node.op_type}: {why}"})
            continue
        regions.append(region(node))
        claimed.add(i)
    return regions


@dataclass(frozen=True)
class Kind:
    """A fusion kind of its own folder (see onnxopt/kinds/__init__.py).

    `find(model, claimed, rejected)` returns the kind's regions among the nodes whose indices are not in `claimed`
    (it adds the nodes it takes) and appends `{"nodes": [...], "reason": "..."}` to `rejected` (when not None) for
    each node of its ops it refuses. `build(region, target)` returns (object code, the glue's description, LLVM IR
    text); the description has `op_type`, `in_types` and `out_types` (ONNX element types) and `c_source(prefix)`,
    the C that defines `<prefix>_desc`. Its regions
    carry their typed parameters in `Region.params` (its `key()` is part of the op type)."""

    name: str  # its params' family, its Region.label, its --skip-fusion name and its folder
    find: Callable
    build: Callable
    # Asked for its regions before the compute and pool rules (whose MatMul kernels would take its nodes), not
    # after them.
    first: bool = False
    # report(region, feeds, desc) -> dict: more for the region's entry in the report, at the shapes it was checked
    # on (`feeds`, the region's inputs), with the glue's description its build returned
    report: Callable | None = None
    # layouts(regions, index, shape_of, opset) -> the regions it converted: in the blocked plan, which of the
    # kind's regions pass their tensors to each other in a blocked layout (kinds/qconv/layout.py)
    layouts: Callable | None = None
    # Its lowerings for the backends other than LLVM (onnxopt/backends/): {"c": build_c}, each build's signature;
    # a backend a kind has no lowering for leaves its regions to onnxruntime.
    lowerings: Mapping[str, Callable] = field(default_factory=dict)
    # The element types its kernels are built for (onnxopt/dtypes.py names); asked for another, it refuses.
    dtypes: tuple[str, ...] = ("float32",)
    # Where it is asked among the kinds (lower first); kinds of equal order by name.
    order: int = 100
    # schedule(region, target) -> ScheduleSpace (kinds/schedule.py): its kernel's knobs, the default first; the
    # lowering builds any point of it. None: a kernel with no knobs.
    schedule: Callable | None = None
    # find also takes `target=` (the Target being built for): its regions' tables depend on the target's instruction
    find_takes_target: bool = False

    def lowering(self, backend: str) -> Callable | None:
        """Its build for `backend` (a Target's backend name), or None when it has none there."""
        return self.build if backend == "llvm" else self.lowerings.get(backend)

    def space(self, region, target):
        """The schedule space of the region's kernel on `target` (one point where the kind declares no knobs)."""
        from .schedule import ScheduleSpace

        if self.schedule is None:
            return ScheduleSpace(self.name, note="its kernel has no knobs")
        return self.schedule(region, target)

    def dtype_refusal(self, dtype: str) -> str | None:
        """Why its kernels are not built for `dtype`, as a sentence; None when they are."""
        if dtype in self.dtypes:
            return None
        return f"the {self.name} kind builds {', '.join(self.dtypes)} kernels, not {dtype}"
