"""What a fusion kind gives the driver: how it finds its regions, and how it builds one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


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
