"""Serving fused models: load and check the kernel library, then hand it to onnxruntime.

    import onnxopt.runtime as rt
    sess = rt.InferenceSession("fused.onnx")          # an onnxruntime.InferenceSession
    sess.run(None, feeds)
    rt.registered_library(sess)                       # the library it registered, or None

The library is never loaded implicitly: the model's metadata must name it as a bare file name in the model's own
(real) folder, not a symbolic link; the library and that folder must be written by no one but you (or root); its
sha256 must match the one recorded in the model; and this CPU must have every instruction the kernels were compiled
for. Otherwise a warning says why, the library stays out, and onnxruntime runs the model-local function bodies (the
original subgraphs), which give the same answers.

The checks read one open descriptor, and onnxruntime loads that same descriptor (`/proc/self/fd/N`; without /proc,
a private copy of the checked bytes), so a file swapped at the path after the check is never loaded.

Loading a model's library runs its author's code in this process, as loading any custom-op library does: the
sha256 proves the library is the one the model was written with, not who wrote it. Serving needs only onnxruntime:
any host can do what this module does with `SessionOptions.register_custom_ops_library(path)`, which trusts the
library completely (no check of its hash, owner or CPU).
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import warnings
from dataclasses import dataclass

import onnx

from onnxopt.emit.model import META_CPU_FLAGS, META_LIBRARY, META_PRECISION, META_PRECISION_DETAIL, META_SHA256

from .kernel_calls import bf16_tensors, kernel_calls
from .matrix_engine import amx_status


class LibraryNotUsedWarning(UserWarning):
    """The kernel library was left out; the model runs its function bodies instead."""


@dataclass
class LibraryCheck:
    path: str | None
    usable: bool
    reason: str
    named: bool = True  # the model names a kernel library (False: a plain model, nothing to warn about)
    # What to register or dlopen when usable: a name bound to the very file that was checked for the rest of this
    # process (/proc/self/fd/N, or a private copy), never the path, which may have been swapped since.
    load_path: str | None = None
    # The precision the model's fused GEMMs were built in (its metadata; "fp32" when it records none), and what ran
    # them, in words: a bf16 model's answers differ from the float32 original's by the bf16 tolerance.
    precision: str = "fp32"
    precision_detail: str = ""
    # After a session registered the library: {"state", "why"} of its AMX tiles (runtime/matrix_engine.py)
    amx: dict | None = None


def _metadata(model) -> dict[str, str]:
    if isinstance(model, onnx.ModelProto):
        return {p.key: p.value for p in model.metadata_props}
    m = onnx.load(model, load_external_data=False)
    return {p.key: p.value for p in m.metadata_props}


def check_library(model_path: str, model: onnx.ModelProto | None = None, library: str | None = None) -> LibraryCheck:
    """Is the model's kernel library present, intact, safe to trust and runnable on this CPU? `library`: a path the
    caller chose, anywhere, instead of the model's own; it passes the same checks."""
    meta = _metadata(model if model is not None else model_path)
    chk = _check_library(meta, model_path, library)
    chk.precision = meta.get(META_PRECISION, "fp32")
    chk.precision_detail = _precision_words(meta)
    return chk


def _precision_words(meta: dict[str, str]) -> str:
    """The metadata's precision record in words (emit/model.py META_PRECISION_DETAIL), "" without one."""
    import json

    try:
        d = json.loads(meta.get(META_PRECISION_DETAIL, ""))
        return (f"{d['precision']} weights in {d['lowered_regions']} GEMM or convolution kernels ({d['kernels']}), "
                f"{d['float32_compute_regions']} compute kernels float32; asked: {d['requested']}")
    except (ValueError, KeyError, TypeError):
        return ""


def _check_library(meta: dict[str, str], model_path: str, library: str | None) -> LibraryCheck:
    name = meta.get(META_LIBRARY)
    if not name:
        return LibraryCheck(None, False, "the model has no onnxopt kernel library", named=False)
    if library is None:
        if not is_bare_file_name(name):
            # A model file must never make us open a library outside its own folder (../x.so, /tmp/x.so).
            return LibraryCheck(None, False, f"the model names its kernel library {name!r}, which is not a file in "
                                             "the model's own folder; onnxopt loads only a bare file name next to "
                                             "the model")
        folder = os.path.dirname(os.path.realpath(os.fspath(model_path)))
    else:
        folder, name = os.path.split(os.path.realpath(os.fspath(library)))
    path = os.path.join(folder, name)
    fd, why = _open_library(folder, name, path)
    if fd is None:
        return LibraryCheck(path, False, why)
    pinned = False
    try:
        want = meta.get(META_SHA256, "")
        have = _sha256_fd(fd)
        if have != want:
            return LibraryCheck(path, False, f"kernel library {path} does not match the model (sha256 "
                                             f"{have[:12]}..., expected {want[:12]}...); re-run onnxopt to rebuild "
                                             "it")
        from onnxopt.codegen.target import missing_cpu_flags

        missing = missing_cpu_flags([f for f in meta.get(META_CPU_FLAGS, "").split(",") if f])
        if missing:
            return LibraryCheck(path, False, f"this CPU lacks {', '.join(missing)}, which the kernels in {path} "
                                             "need; re-run onnxopt with --target for this machine")
        try:
            load_path, pinned = _loadable(fd, have, name)
        except (OSError, ValueError) as e:
            return LibraryCheck(path, False, f"kernel library {path} could not be prepared for loading ({e})")
        return LibraryCheck(path, True, "ok", load_path=load_path)
    finally:
        if not pinned:
            os.close(fd)


def _open_library(folder: str, name: str, path: str) -> tuple[int | None, str]:
    """An open descriptor of `name` directly in `folder` (no symbolic link followed at the last step), when both
    pass the ownership and mode checks; else None and the reason."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    try:
        dfd = os.open(folder, flags | getattr(os, "O_DIRECTORY", 0))
    except OSError as e:
        return None, f"kernel library {path} not found (its folder cannot be opened: {e.strerror})"
    try:
        why = _untrusted(os.fstat(dfd), f"the folder {folder} of kernel library {path}")
        if why:
            return None, why
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return None, f"kernel library {path} not found (keep it next to the model)"
        if stat.S_ISLNK(st.st_mode):
            return None, (f"kernel library {path} is a symbolic link; onnxopt loads only a regular file in the "
                          "model's own folder (copy the library there)")
        if not stat.S_ISREG(st.st_mode):
            return None, f"kernel library {path} is not a regular file"
        try:  # O_NOFOLLOW: a link planted since the stat is refused, O_NONBLOCK: a FIFO planted since never blocks
            fd = os.open(name, flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0), dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                return None, f"kernel library {path} is a symbolic link; onnxopt loads only a regular file"
            return None, f"kernel library {path} cannot be opened ({e.strerror})"
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    why = None if stat.S_ISREG(st.st_mode) else f"kernel library {path} is not a regular file"
    why = why or _untrusted(st, f"kernel library {path}")
    if why:
        os.close(fd)
        return None, why
    return fd, "ok"


def _untrusted(st: os.stat_result, what: str) -> str | None:
    """The sha256 proves integrity, not authorship: whoever can write the library or its folder chooses the code
    that runs here. A folder may be writable by others with the sticky bit (as /tmp), which keeps them from
    replacing our files in it."""
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    if uid is not None and st.st_uid not in (uid, 0):
        return f"{what} is owned by another user (uid {st.st_uid}), not by you (uid {uid}) or root; not loading it"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return (f"{what} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); not loading it "
                "(chmod go-w it)")
    return None


def _sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    offset = 0
    while block := os.pread(fd, 1 << 20, offset):
        h.update(block)
        offset += len(block)
    return h.hexdigest()


# (st_dev, st_ino, sha256) -> the name that loads that file. glibc's dlopen returns an already loaded library whose
# name matches before it opens anything, so a /proc/self/fd/N once loaded must keep meaning that file: its descriptor
# stays open for the life of the process (one per library file), never closed and reused by another file. Keyed by
# the file, not only its content, so that the library's real path also resolves to the loaded handle (ctypes).
_LOADABLE: dict[tuple[int, int, str], str] = {}
_LOCK = threading.Lock()
_PROC_FD = "/proc/self/fd"
_PRIVATE_DIR: list[str] = []


def _loadable(fd: int, sha: str, name: str) -> tuple[str, bool]:
    """A name dlopen resolves to the checked file, and whether `fd` was kept open for it."""
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino, sha)
    with _LOCK:
        if key in _LOADABLE:
            return _LOADABLE[key], False
        proc = f"{_PROC_FD}/{fd}"
        try:
            here = os.stat(proc)
            pinned = (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)
        except OSError:
            pinned = False
        _LOADABLE[key] = proc if pinned else _private_copy(fd, sha, name)
        return _LOADABLE[key], pinned


def _private_copy(fd: int, sha: str, name: str) -> str:
    """Without /proc: the descriptor's bytes, copied into this process's own 0700 folder (removed at exit), and
    checked again there."""
    if not _PRIVATE_DIR:
        _PRIVATE_DIR.append(tempfile.mkdtemp(prefix="onnxopt-libs-"))
        atexit.register(shutil.rmtree, _PRIVATE_DIR[0], True)
    dest = os.path.join(_PRIVATE_DIR[0], f"{len(_LOADABLE)}-{name}")  # one per entry, under _LOCK
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o500)
    h, offset = hashlib.sha256(), 0
    try:
        while block := os.pread(fd, 1 << 20, offset):
            h.update(block)
            os.write(out, block)
            offset += len(block)
    finally:
        os.close(out)
    if h.hexdigest() != sha:
        os.unlink(dest)
        raise ValueError("it changed while it was being read")
    return dest


def is_bare_file_name(name: str) -> bool:
    """A plain file name: no folder part, not '.' or '..', no NUL, not absolute on any platform. The writer refuses
    the same names (graph/publish.py `name_problem`: one rule), so it never writes a model the loader refuses."""
    from onnxopt.graph.publish import name_problem

    return name_problem(name) is None and os.path.basename(name) == name and not os.path.isabs(name)


def _options(model_path: str, sess_options, library: str | None, warn: bool) -> tuple[object, LibraryCheck]:
    import onnxruntime as ort

    so = sess_options or ort.SessionOptions()
    chk = check_library(model_path, library=library)
    if chk.usable:
        so.register_custom_ops_library(chk.load_path)  # onnxruntime dlopens it here, the checked file itself
    elif chk.named and warn:
        warnings.warn(f"onnxopt: not using the kernel library: {chk.reason}; running the function bodies instead",
                      LibraryNotUsedWarning, stacklevel=3)
    return so, chk


def session_options(model_path: str, sess_options=None, library: str | None = None, warn: bool = True):
    """SessionOptions with the model's library registered when it passes the checks."""
    return _options(model_path, sess_options, library, warn)[0]


def InferenceSession(model_path, sess_options=None, providers=None, library: str | None = None, **kwargs):
    """An onnxruntime.InferenceSession for a fused model, with its kernel library when it is safe to use."""
    import onnxruntime as ort

    path = os.fspath(model_path)
    so, chk = _options(path, sess_options, library, warn=True)
    sess = ort.InferenceSession(path, so, providers=providers or ["CPUExecutionProvider"], **kwargs)
    sess._onnxopt_library = chk if chk.usable else None
    if chk.usable:  # registered now: whether its AMX tiles run here, and why not (glue/matrix_engine.c)
        chk.amx = amx_status(chk.load_path)
    return sess


def written_session(model_path, threads: int | None = None, spinning: bool = False, provider: str | None = None):
    """A session on a model file as a user serves it (`InferenceSession`), with onnxopt's timing settings
    (`onnxopt.timing.session_options`): what benchmarks and checks time. A model that names a kernel library the
    loader does not pick up is an error (RuntimeError with the loader's reason), never timed as if it ran its kernels:
    its function bodies would run instead."""
    from onnxopt.timing import CPU, session_options as timing_options

    so = timing_options(threads, spinning=spinning)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LibraryNotUsedWarning)
        sess = InferenceSession(model_path, so, providers=[provider or CPU])
    named = bool(_metadata(os.fspath(model_path)).get(META_LIBRARY))
    if named and registered_library(sess) is None:
        why = "; ".join(str(w.message) for w in caught) or "no reason given"
        raise RuntimeError(f"{model_path}: its kernel library is not used ({why})")
    return sess


def registered_library(session, loadable: bool = False) -> str | None:
    """The real path of the kernel library `InferenceSession` registered for `session` (None: none). `loadable`:
    instead the name it was loaded by, which ctypes.CDLL resolves to the same loaded library for the life of the
    process, even if the file at the real path has been replaced since."""
    chk = getattr(session, "_onnxopt_library", None)
    if chk is None:
        return None
    return chk.load_path if loadable else chk.path


__all__ = ["InferenceSession", "session_options", "check_library", "registered_library", "kernel_calls", "bf16_tensors",
           "amx_status",
           "written_session", "LibraryCheck",
           "LibraryNotUsedWarning"]
