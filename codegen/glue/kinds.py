"""The kinds the glue runs, and the C it writes from them: the KIND_ ids, the dispatch, the translation units.

Every kind has a C header that declares its descriptor (whose first member is `onnxopt_sig`, glue.h), one or more
executor files, and one function that runs an op of the kind. The runtime translation unit includes glue.h, every
kind's header, runtime.c (shared helpers), every kind's executors, the dispatch written here and register.c (the
custom-op callbacks); a library's tables include glue.h and the headers. Nothing is pasted: the C preprocessor reads
the files, so a compiler error names the real file and line.

The built-in kinds live in this folder and are listed below. A kind added as a folder of `onnxopt/kinds/` (see that
package's docstring) is found by its files, `glue.h` and `exec.c`: its id is KIND_<FOLDER> and its function
<folder>_execute.

The structs, records and limits both sides share are declared once, in Python (codegen/glue/contract.py): the units
get their generated C (typedefs, slot enums, `#define`s, `_Static_assert`s of the layout) before the kinds' headers,
the built-in kinds' `GLUE` first, then before a kind folder's glue.h the `CONTRACT` of its desc.py, if it has one.
That text is part of the runtime unit's source, so it keys the runtime object's cache with the files. `c_define`
gives a limit's value: a contract's, else a `#define NAME value` still written in a header.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from .contract import GLUE, Contract


@dataclass(frozen=True)
class GlueKind:
    name: str
    ids: tuple[str, ...]  # the KIND_ ids whose descriptors this kind runs (compute: KIND_CONV and KIND_MATMUL)
    folder: str  # where its C files are
    header: str
    executors: tuple[str, ...]
    execute: str  # OrtStatus *execute(const <its desc> *, OrtKernelContext *)


def _glue_dir() -> str:
    return str(resources.files("onnxopt.codegen.glue"))


def _plugin_root() -> str | None:
    # Found without importing onnxopt.kinds, whose kinds import this package.
    spec = importlib.util.find_spec("onnxopt.kinds")
    return spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None


def _builtin() -> list[GlueKind]:
    d = _glue_dir()
    return [
        GlueKind("elementwise", ("KIND_ELEMENTWISE",), d, "elementwise.h", ("elementwise_exec.c",), "ew_compute"),
        GlueKind("compute", ("KIND_CONV", "KIND_MATMUL"), d, "compute.h",
                 ("compute_exec.c", "conv_blocked_exec.c", "conv_blocked_prepare_exec.c", "conv_transpose_exec.c",
                  "conv_exec.c", "winograd_exec.c", "entry_exec.c"), "ct_compute"),
        GlueKind("afusion", ("KIND_AFUSION",), d, "afusion.h", ("afusion_exec.c", "afusion_chain_exec.c"),
                 "af_compute"),
        GlueKind("siblings", ("KIND_SIBLINGS",), d, "siblings.h", ("siblings_exec.c",), "sb_compute"),
        GlueKind("pool", ("KIND_POOL",), d, "pool.h", ("pool_exec.c",), "pool_compute"),
        GlueKind("copy", ("KIND_COPY",), d, "copy.h", ("copy_exec.c",), "cp_compute"),
    ]


def _sequence() -> GlueKind:
    # Last: a sequence runs the other kinds' ops through onnxopt_execute.
    return GlueKind("sequence", ("KIND_SEQUENCE",), _glue_dir(), "sequence.h", ("sequence_exec.c",), "seq_compute")


@cache
def glue_kinds() -> tuple[GlueKind, ...]:
    """Every kind, in the order of their ids: the built-in ones, the folders of onnxopt/kinds/ by name, sequences."""
    plugins = []
    root = _plugin_root()
    if root and os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            folder = os.path.join(root, name)
            if os.path.isfile(os.path.join(folder, "glue.h")) and os.path.isfile(os.path.join(folder, "exec.c")):
                plugins.append(GlueKind(name, (f"KIND_{name.upper()}",), folder, "glue.h", ("exec.c",),
                                        f"{name}_execute"))
    return tuple(_builtin() + plugins + [_sequence()])


def kind_ids() -> dict[str, int]:
    ids = [i for k in glue_kinds() for i in k.ids]
    return {name: n for n, name in enumerate(ids)}


def _inc(folder: str, name: str) -> str:
    path = os.path.join(folder, name)
    if '"' in path or "\n" in path:
        raise OSError(f"the glue cannot #include a file whose path has a quote or newline: {path!r}")
    return f'#include "{path}"\n'


def _plugin_name(folder: str | None) -> str | None:
    """The kind folder of onnxopt/kinds/ that `folder` is, or None (the glue's own folder)."""
    root = _plugin_root()
    if folder is None or root is None:
        return None
    folder = os.path.normpath(os.path.abspath(folder))
    return os.path.basename(folder) if os.path.dirname(folder) == os.path.normpath(os.path.abspath(root)) else None


def kind_contract(folder: str | None) -> Contract | None:
    """The contract of the glue's own folder (None or it: `GLUE`) or of a kind folder (its desc.py's `CONTRACT`,
    or None where it declares none)."""
    name = _plugin_name(folder)
    if name is None:
        same = folder is None or os.path.normpath(os.path.abspath(folder)) == os.path.normpath(_glue_dir())
        return GLUE if same else None
    module = f"onnxopt.kinds.{name}.desc"
    try:
        desc = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            return None
        raise
    return getattr(desc, "CONTRACT", None)


def headers_source() -> str:
    """What a library's tables and the runtime both start with: glue.h, the ids, the contracts' generated C and every
    kind's header (a kind folder's contract just before its header)."""
    ids = kind_ids()
    text = _inc(_glue_dir(), "glue.h")
    text += "enum { " + ", ".join(f"{name} = {n}" for name, n in ids.items()) + " };\n"
    text += GLUE.c_text()
    for k in glue_kinds():
        contract = kind_contract(k.folder) if _plugin_name(k.folder) else None
        if contract is not None:
            text += contract.c_text()
        text += _inc(k.folder, k.header)
    return text


def runtime_translation_unit() -> str:
    """The runtime's source: shared helpers, every kind's executors, the dispatch, the custom-op callbacks."""
    text = headers_source() + _inc(_glue_dir(), "runtime.c") + _inc(_glue_dir(), "matrix_engine.c")
    for k in glue_kinds():
        for f in k.executors:
            text += _inc(k.folder, f)
    text += "static OrtStatus *onnxopt_execute(const onnxopt_sig *sig, OrtKernelContext *ctx) {\n"
    text += "  switch (sig->kind) {\n"
    for k in glue_kinds():
        for i in k.ids:
            text += f"    case {i}: return {k.execute}((const void *)sig, ctx);\n"
    text += "  }\n  return fail(ORT_FAIL, \"onnxopt: an op of a kind this library's runtime does not know\");\n}\n"
    text += _inc(_glue_dir(), "register.c")
    return text


def source_files() -> list[str]:
    """Every C file the translation units include (their contents key the runtime's cache, with the unit's own text,
    which holds the contracts' generated C)."""
    files = [os.path.join(_glue_dir(), f) for f in ("glue.h", "runtime.c", "matrix_engine.c", "register.c")]
    for k in glue_kinds():
        named = [os.path.join(k.folder, f) for f in (k.header, *k.executors)]
        # and the folder's other headers, which its executors include by name (kinds/qconv/words.h)
        local = sorted(os.path.join(k.folder, f) for f in os.listdir(k.folder) if f.endswith(".h"))
        files += list(dict.fromkeys(named + local))
    return files


@cache
def c_define(header: str, name: str, folder: str | None = None) -> int:
    """A limit's value: the Limit of that name in the contract of `folder` (the glue's by default; contract.py), else
    the integer a `#define NAME value` in `header` there gives (the limits still declared in C)."""
    contract = kind_contract(folder)
    if contract is not None and name in contract.limits():
        return contract.limits()[name]
    path = os.path.join(folder or _glue_dir(), header)
    with open(path) as f:
        m = re.search(rf"^#define {re.escape(name)} (\d+)\b", f.read(), re.M)
    if m is None:
        raise KeyError(f"{path} defines no {name}")
    return int(m.group(1))
