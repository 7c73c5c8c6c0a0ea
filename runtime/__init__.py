"""Serving fused models: load and check the kernel library, then hand it to onnxruntime.

    import onnxopt.runtime as rt
    sess = rt.InferenceSession("fused.onnx")          # an onnxruntime.InferenceSession
    sess.run(None, feeds)

The library is never loaded implicitly: the model's metadata must name it as a bare file name in the model's own
folder, its sha256 must match the one recorded in the model, and this CPU must have every instruction the kernels
were compiled for. Otherwise a warning says why, the library stays out, and
onnxruntime runs the model-local function bodies (the original subgraphs), which give the same answers.

Serving needs only onnxruntime: any host can do what this module does with
`SessionOptions.register_custom_ops_library(path)`. Registering a library that way trusts it completely: onnxruntime
runs its code in the serving process, with no check of its hash or of the CPU. Register only libraries you built or
whose sha256 matches the model's `onnxopt.library_sha256`.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import onnx

from onnxopt.emit.model import META_CPU_FLAGS, META_LIBRARY, META_SHA256


class LibraryNotUsedWarning(UserWarning):
    """The kernel library was left out; the model runs its function bodies instead."""


@dataclass
class LibraryCheck:
    path: str | None
    usable: bool
    reason: str
    named: bool = True  # the model names a kernel library (False: a plain model, nothing to warn about)


def _metadata(model) -> dict[str, str]:
    if isinstance(model, onnx.ModelProto):
        return {p.key: p.value for p in model.metadata_props}
    m = onnx.load(model, load_external_data=False)
    return {p.key: p.value for p in m.metadata_props}


def check_library(model_path: str, model: onnx.ModelProto | None = None, library: str | None = None) -> LibraryCheck:
    """Is the model's kernel library present, intact, and runnable on this CPU?"""
    from onnxopt.codegen.glue.library import sha256_file
    from onnxopt.codegen.target import missing_cpu_flags

    meta = _metadata(model if model is not None else model_path)
    name = meta.get(META_LIBRARY)
    if not name:
        return LibraryCheck(None, False, "the model has no onnxopt kernel library", named=False)
    if library is None and not is_bare_file_name(name):
        # A model file must never make us open a library outside its own folder (../x.so, /tmp/x.so).
        return LibraryCheck(None, False, f"the model names its kernel library {name!r}, which is not a file in the "
                                         "model's own folder; onnxopt loads only a bare file name next to the model")
    path = library or os.path.join(os.path.dirname(os.path.abspath(model_path)), name)
    if not os.path.exists(path):
        return LibraryCheck(path, False, f"kernel library {path} not found (keep it next to the model)")
    want = meta.get(META_SHA256, "")
    have = sha256_file(path)
    if have != want:
        return LibraryCheck(path, False, f"kernel library {path} does not match the model (sha256 {have[:12]}..., "
                                         f"expected {want[:12]}...); re-run onnxopt to rebuild it")
    flags = [f for f in meta.get(META_CPU_FLAGS, "").split(",") if f]
    missing = missing_cpu_flags(flags)
    if missing:
        return LibraryCheck(path, False, f"this CPU lacks {', '.join(missing)}, which the kernels in {path} need; "
                                         "re-run onnxopt with --target for this machine")
    return LibraryCheck(path, True, "ok")


def is_bare_file_name(name: str) -> bool:
    """A plain file name: no folder part, not '.' or '..', no NUL, not absolute on any platform."""
    return bool(name) and name not in (".", "..") and "\0" not in name and "/" not in name and "\\" not in name \
        and os.path.basename(name) == name and not os.path.isabs(name) and (os.name != "nt" or ":" not in name)


def session_options(model_path: str, sess_options=None, library: str | None = None, warn: bool = True):
    """SessionOptions with the model's library registered when it passes the checks."""
    import onnxruntime as ort

    so = sess_options or ort.SessionOptions()
    chk = check_library(model_path, library=library)
    if chk.usable:
        so.register_custom_ops_library(chk.path)
    elif chk.named and warn:
        warnings.warn(f"onnxopt: not using the kernel library: {chk.reason}; running the function bodies instead",
                      LibraryNotUsedWarning, stacklevel=3)
    return so


def InferenceSession(model_path, sess_options=None, providers=None, library: str | None = None, **kwargs):
    """An onnxruntime.InferenceSession for a fused model, with its kernel library when it is safe to use."""
    import onnxruntime as ort

    path = os.fspath(model_path)
    so = session_options(path, sess_options, library=library)
    return ort.InferenceSession(path, so, providers=providers or ["CPUExecutionProvider"], **kwargs)


__all__ = ["InferenceSession", "session_options", "check_library", "LibraryCheck", "LibraryNotUsedWarning"]
