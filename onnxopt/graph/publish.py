"""Outputs written whole or not at all, and never through a link or onto a file that is not one.

Every output of a run (the model, its `.data`, its `.so`, the report) is written under its final name into a private
folder beside the destination (`Staging`: mkdtemp, mode 0700, a name nobody can predict, on the destination's file
system), checked there as a user loads it, then renamed into place, the model last. A rename that fails puts back
what it had moved aside, so a run either publishes every file or leaves the destinations as they were. Nothing is
ever opened at a destination path: a planted symlink or FIFO there is replaced by a rename or refused, never written
through.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile

from onnxopt.errors import OnnxoptError, UsageError

# Suffixes of the files that go with a model: its external data and its kernel library.
DATA_SUFFIX = ".data"
LIBRARY_SUFFIX = ".so"
# A write that fails for want of room (a full disk, a quota, RLIMIT_FSIZE): the destination's fault, not a bug.
NO_ROOM = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def name_problem(name: str) -> str | None:
    """Why `name` cannot be an output's file name, or None. The library is named in the model by its bare file name
    (`<name>.so`), and the loader (onnxopt.runtime) refuses any name with a folder part, a backslash, a NUL or a
    drive: the same rule here, so that nothing is written that the loader would refuse."""
    if not name or name in (".", ".."):
        return "is not a file name"
    if "\0" in name or "/" in name or "\\" in name or (os.name == "nt" and ":" in name):
        return "has a character the loader refuses in a library name (NUL, '/', '\\', or ':' on Windows)"
    return None


def check_destination(path: str, what: str) -> None:
    """Refuse a destination that exists and is not a regular file (a folder, FIFO, socket or device node): a rename
    would replace it, and a plain open() would write into it (`-o /dev/full`). A symlink is fine: the rename
    replaces the link itself, and nothing follows it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot be checked ({e.strerror}); choose another output path") from None
    if stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode):
        return
    kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else
            "a socket" if stat.S_ISSOCK(st.st_mode) else "a device node" if stat.S_ISCHR(st.st_mode) or
            stat.S_ISBLK(st.st_mode) else "not a regular file")
    raise UsageError(f"{what} {path} is {kind}; onnxopt writes only regular files: choose another output path")


def output_files(model_path: str) -> list[str]:
    """The model and the files that go with it."""
    out = os.path.abspath(model_path)
    return [out, out + DATA_SUFFIX, out + LIBRARY_SUFFIX]


def check_output(model_path: str, what: str = "-o") -> None:
    """Before any work: the model's name is one the loader takes, and none of its files' destinations is a folder,
    device, FIFO or socket; the folder takes new files (tried for real: `os.access` says yes as root on /sys and on
    read-only mounts)."""
    out = os.path.abspath(model_path)
    why = name_problem(os.path.basename(out) + LIBRARY_SUFFIX)
    if why:
        raise UsageError(f"{what} {model_path}: the name {why}; choose another output name")
    for p in output_files(out):
        check_destination(p, what if p == out else "the output")
    probe_writable(os.path.dirname(out), f"{what} {model_path}")


def probe_writable(folder: str, what: str) -> None:
    """Create and remove a private folder in `folder`: what the run will do, so that an unwritable destination (a
    read-only mount, /sys, /proc, no permission) is a usage error now, naming the path, not a failure at the end."""
    try:
        probe = tempfile.mkdtemp(prefix=".onnxopt-probe-", dir=folder)
    except OSError as e:
        raise UsageError(f"{what}: cannot write in {folder} ({e.strerror or e}); choose a writable output "
                         "folder") from None
    os.rmdir(probe)


class Staging:
    """A private folder beside `destination` in which outputs are written under their final names, then published
    together (`publish`) or dropped (`discard`). Use as a context manager: it is removed on the way out."""

    def __init__(self, destination: str):
        self.destination = os.path.abspath(destination)
        self.folder = tempfile.mkdtemp(prefix=".onnxopt-", dir=os.path.dirname(self.destination))
        self._moved: list[tuple[str, str]] = []  # (destination, where its earlier file was put aside)
        self._placed: list[str] = []
        self._kept = False  # an earlier file could not be put back: the folder is left holding it

    def path(self, suffix: str = "") -> str:
        """Where the output `<destination><suffix>` is written before it is published."""
        return os.path.join(self.folder, os.path.basename(self.destination) + suffix)

    def publish(self, suffixes: list[str], remove: list[str] = ()) -> None:
        """Rename the staged `<destination><suffix>` files into place, in order (give the model, suffix "", last:
        a model never points at a library or data file that is not there yet), and remove the destinations of
        `remove` (a stale library of an earlier run). Each replaced file is first moved aside into this folder; if
        any step fails, `rollback` puts everything back and the error is raised."""
        try:
            for i, suffix in enumerate(list(suffixes) + list(remove)):
                dest = self.destination + suffix
                check_destination(dest, "the output")
                aside = os.path.join(self.folder, f".earlier-{i}")
                if os.path.lexists(dest):
                    os.rename(dest, aside)
                    self._moved.append((dest, aside))
                if i < len(suffixes):
                    os.rename(self.path(suffix), dest)
                    self._placed.append(dest)
        except BaseException:
            self.rollback()
            raise

    def rollback(self) -> None:
        """Undo `publish`: remove what it placed, put back what it moved aside (another output's publish failed)."""
        for dest in self._placed:
            _unlink(dest)
        for dest, aside in reversed(self._moved):
            try:
                os.rename(aside, dest)
            except OSError:  # something took its place meanwhile: the earlier file stays in this folder, kept
                self._kept = True
        self._placed, self._moved = [], []

    def discard(self) -> None:
        if not self._kept:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.discard()
        if isinstance(exc, OSError) and exc.errno in NO_ROOM:  # exit 2 naming the folder, not an internal error
            raise OnnxoptError(f"cannot write the outputs in {os.path.dirname(self.destination)}: "
                               f"{exc.strerror or exc} (a full disk, a quota or a file-size limit); nothing was "
                               "written") from exc


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise


def open_own(path: str, mode: str = "a"):
    """A text file of ours in a folder the user gave (a log, a lock), opened for appending ("a") or rewriting ("w")
    without following a link planted at its name, and only if it is a regular file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_APPEND if mode == "a" else 0
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UsageError(f"{path} is a symbolic link; onnxopt does not write through links: remove it") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"{path} is not a regular file; remove it or choose another output folder")
    os.set_blocking(fd, True)
    if mode == "w":
        os.ftruncate(fd, 0)
    return os.fdopen(fd, mode)


def create_new(path: str, mode: int = 0o666):
    """A new file opened for writing that cannot already exist or be a link: O_CREAT | O_EXCL | O_NOFOLLOW."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    return os.fdopen(fd, "wb")
