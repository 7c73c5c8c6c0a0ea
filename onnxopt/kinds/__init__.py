"""Fusion kinds: every kind of kernel the optimizer builds, one row each.

Kinds that plug in as one folder each are found here by their folder, with no other edit: a folder of this package
whose `__init__.py` defines `KIND = Kind(...)` (onnxopt/kinds/base.py). Its folder holds:
    find.py         how it finds its regions and refuses the rest, with the reason as a sentence
    params.py       its typed parameters, a KindParams (Region.params; their key() is part of the op type)
    lower.py        its lowering to LLVM IR for the LLVM CPU backend (Kind.build)
    c.py            (optional) its lowering to plain C for the C backend (Kind.lowerings["c"])
    desc.py         the glue's description of one op type, and its C initializer
    glue.h, exec.c  the C descriptor and the executor, found by the glue (codegen/glue/kinds.py): its id is
                    KIND_<FOLDER>, its executor <folder>_execute
    __init__.py     KIND = Kind(name, find, build, ...), name == the folder's name

The driver asks every folder kind for regions in every plan (after the compute and pool rules, or before them for a
kind with `first`; always before the elementwise one; in `order`), builds their kernels with the lowering of the
target's backend (onnxopt/backends/) and links their descriptions; nothing else needs to know the kind.

The kinds written before the folders (elementwise, compute, pool, copy: kinds/builtin.py) are found by the driver's
own rules in fusion/ and built from codegen/; they are rows of the same Kind type, so what is asked of a kind
(its lowering per backend, its dtypes, its schedule space) is asked of every kind the same way (`kind_for`).
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Kind


def _folder_kinds() -> tuple[Kind, ...]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        if not info.ispkg:
            continue
        kind = getattr(importlib.import_module(f"{__name__}.{info.name}"), "KIND", None)
        if kind is None:
            continue
        if not isinstance(kind, Kind) or kind.name != info.name:
            raise ImportError(f"onnxopt/kinds/{info.name}/__init__.py: KIND must be a Kind named {info.name!r} "
                              "(its folder's name: the glue's KIND_ id and executor are named after it)")
        found.append(kind)
    return tuple(sorted(found, key=lambda k: (k.order, k.name)))


KINDS: tuple[Kind, ...] = _folder_kinds()

_BY_NAME = {k.name: k for k in KINDS}


def kind_of(region) -> Kind | None:
    """The folder kind whose regions `region` is one of (by its params' family), or None (a built-in kind)."""
    return _BY_NAME.get(region.params.family)


def kind_for(region) -> Kind | None:
    """The kind of any region with a kernel, folder or built-in (kinds/builtin.py); None for one without a kernel
    (a relayout passthrough)."""
    from .builtin import BUILTIN_BY_FAMILY

    return _BY_NAME.get(region.params.family) or BUILTIN_BY_FAMILY.get(region.params.family)


def all_kinds() -> tuple[Kind, ...]:
    """Every kind: the built-in ones, then the folders'."""
    from .builtin import BUILTIN_KINDS

    return BUILTIN_KINDS + KINDS


__all__ = ["KINDS", "Kind", "all_kinds", "kind_for", "kind_of"]
