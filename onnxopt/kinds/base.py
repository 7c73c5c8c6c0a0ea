"""What a fusion kind gives the driver: how it finds its regions, and how it builds one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def c_signature(prefix: str, op_type: str, kind_id: str, in_types: list[int], out_types: list[int]) -> tuple[str, str]:
    """What every kind's C descriptor starts with: (the declarations of its input and output type arrays, the
    initializer of its `onnxopt_sig` member)."""
    ins = ", ".join(str(t) for t in in_types)
    outs = ", ".join(str(t) for t in out_types)
    decls = (f"static const int {prefix}_in_types[] = {{{ins}}};\n"
             f"static const int {prefix}_out_types[] = {{{outs}}};\n")
    return decls, (f'{{"{op_type}", {kind_id}, {len(in_types)}, {len(out_types)}, {prefix}_in_types, '
                   f"{prefix}_out_types}}")


@dataclass(frozen=True)
class Kind:
    """A fusion kind of its own folder (see onnxopt/kinds/__init__.py).

    `find(model, claimed, rejected)` returns the kind's regions among the nodes whose indices are not in `claimed`
    (it adds the nodes it takes) and appends `{"nodes": [...], "reason": "..."}` to `rejected` (when not None) for
    each node of its ops it refuses. `build(region, target)` returns (object code, the glue's description, LLVM IR
    text); the description has `op_type` and `c_source(prefix)`, the C that defines `<prefix>_desc`. Its regions
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
