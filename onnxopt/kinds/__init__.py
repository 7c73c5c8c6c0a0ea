"""Fusion kinds that plug in as one folder each, plus one line in KINDS below.

A kind's folder holds:
    find.py         how it finds its regions and refuses the rest, with the reason as a sentence
    params.py       its typed parameters, a KindParams (Region.params; their key() is part of the op type)
    lower.py        its lowering to LLVM IR for the CPU backend
    desc.py         the glue's description of one op type, and its C initializer
    glue.h, exec.c  the C descriptor and the executor, found by the glue (codegen/glue/kinds.py): its id is
                    KIND_<FOLDER>, its executor <folder>_execute
    __init__.py     KIND = Kind(name, find, build) (onnxopt/kinds/base.py)

The driver asks every kind here for regions in every plan (after the compute and pool rules, or before them for a
kind with `first`; always before the elementwise one), builds their kernels with the kind's build and links their
descriptions; nothing else needs to know the kind. The kinds written before this registry (elementwise, compute, pool, copy, AFUSION, siblings) keep
their files in fusion/ and codegen/, with their parameters in fusion/params.py, and build through the driver's
BUILDERS (driver/kernels.py).
"""

from __future__ import annotations

from .base import Kind
from .attention import KIND as ATTENTION
from .layernorm import KIND as LAYERNORM
from .qconv import KIND as QCONV
from .qmatmul import KIND as QMATMUL
from .softmax import KIND as SOFTMAX

KINDS: tuple[Kind, ...] = (ATTENTION, SOFTMAX, LAYERNORM, QMATMUL, QCONV)

_BY_NAME = {k.name: k for k in KINDS}


def kind_of(region) -> Kind | None:
    """The registered kind whose regions `region` is one of (by its params' family), or None (a built-in kind)."""
    return _BY_NAME.get(region.params.family)


__all__ = ["KINDS", "Kind", "kind_of"]
