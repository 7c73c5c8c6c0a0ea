"""Which models a batch optimizes, and where each one's outputs go.

A source argument is an .onnx file, a folder (searched recursively for *.onnx) or a list file (`@list.txt`, or any
`.txt`): one path per line, `#` comments, relative paths resolved against the list file's folder, and after the path
optional per-model options (`resnet.onnx --input-shape x:1,3,224,224 --timeout 600 --memory-limit 8`; also
`--measure-shape NAME:D0,D1,...` and `--check-input NAME:FILE.npy`, FILE relative to the list file too: what a model
that runs at no shape of its own needs, such as Silero VAD's `sr`: see LIST_LINE_EXAMPLE).

Outputs mirror the sources' folders under OUT_DIR, relative to the deepest folder common to every source given (a
folder argument counts as its own root), so `zoo/a/model.onnx` and `zoo/b/model.onnx` do not collide.
"""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import dataclass, field

from onnxopt.errors import UsageError

# Files the batch itself writes at the top of OUT_DIR.
STATE_FILE = "batch-state.json"
REPORT_FILE = "report.json"
HTML_FILE = "report.html"
# What the batch writes for one model: <stem>.onnx and these suffixes after OUT_DIR/<relative folder>/<stem>.
OUTPUT_SUFFIXES = (".onnx", ".onnx.so", ".onnx.data", ".report.json", ".bench.json", ".tune.json", ".log")


@dataclass
class Source:
    path: str                      # absolute path of the model
    rel: str = ""                  # OUT_DIR-relative path of its outputs, less the suffix: "sub/model"
    input_shape: list[str] = field(default_factory=list)  # from its list-file line
    measure_shape: list[str] = field(default_factory=list)  # from its list-file line
    check_input: list[str] = field(default_factory=list)  # from its list-file line: NAME:/absolute/path.npy
    timeout: float | None = None   # from its list-file line; None: the batch's
    memory_limit_gb: float | None = None

    def output(self, out_dir: str, suffix: str = ".onnx") -> str:
        return os.path.join(out_dir, self.rel + suffix)


class _LineParser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _line_parser() -> argparse.ArgumentParser:
    p = _LineParser(prog="list line", add_help=False)
    p.add_argument("path")
    p.add_argument("--input-shape", action="append", default=[])
    p.add_argument("--measure-shape", action="append", default=[])
    p.add_argument("--check-input", action="append", default=[])
    p.add_argument("--timeout", type=float)
    p.add_argument("--memory-limit", type=float, dest="memory_limit_gb")
    return p


def is_list_file(arg: str) -> bool:
    return arg.startswith("@") or (arg.lower().endswith(".txt") and not os.path.isdir(arg))


def collect_sources(args: list[str], out_dir: str) -> list[Source]:
    """The models named by `args`, each once, with their output paths planned under `out_dir`. Raises UsageError
    for a source that does not exist, a folder with no model, a malformed list file or no model at all."""
    if not args:
        raise UsageError("no sources: give .onnx files, folders or list files (@list.txt)")
    out_real = os.path.realpath(out_dir)
    found: list[tuple[Source, str]] = []  # (source, the root its output path is relative to)
    for arg in args:
        if is_list_file(arg):
            found += _from_list_file(arg[1:] if arg.startswith("@") else arg, out_real)
        else:
            found += [(s, root) for s, root in _expand(arg, out_real, where=arg)]
    seen: dict[str, Source] = {}
    roots: dict[str, str] = {}
    for s, root in found:
        key = os.path.realpath(s.path)
        if key not in seen:  # the first mention wins, with its options
            seen[key], roots[key] = s, root
    if not seen:
        raise UsageError("no .onnx models found in the sources given")
    base = os.path.commonpath(list(roots.values()))
    for key, s in seen.items():
        s.rel = os.path.splitext(os.path.relpath(s.path, base))[0]
    sources = list(seen.values())
    check_outputs(sources, out_dir)
    return sources


def _expand(arg: str, out_real: str, where: str, shapes=(), timeout=None, memory=None, measure=(), checks=()):
    path = os.path.abspath(os.path.expanduser(arg))
    make = lambda p: Source(p, input_shape=list(shapes), timeout=timeout, memory_limit_gb=memory,  # noqa: E731
                            measure_shape=list(measure), check_input=list(checks))
    if os.path.isdir(path):
        if os.path.realpath(path) == out_real:
            raise UsageError(f"{where}: the output folder is this source folder; give another -o")
        models = []
        for dirpath, dirnames, files in os.walk(path):
            # Outputs of an earlier batch inside a source folder are not sources.
            dirnames[:] = sorted(d for d in dirnames if os.path.realpath(os.path.join(dirpath, d)) != out_real)
            models += [os.path.join(dirpath, f) for f in sorted(files) if f.lower().endswith(".onnx")]
        if not models:
            raise UsageError(f"{where}: no .onnx files in this folder")
        return [(make(m), path) for m in models]
    if not os.path.exists(path):
        raise UsageError(f"{where}: no such file or folder")
    if not path.lower().endswith(".onnx"):
        raise UsageError(f"{where}: not an .onnx model, a folder or a list file (@list.txt)")
    return [(make(path), os.path.dirname(path))]


def _from_list_file(list_path: str, out_real: str):
    if not os.path.isfile(list_path):
        raise UsageError(f"{list_path}: no such list file")
    folder = os.path.dirname(os.path.abspath(list_path))
    parser = _line_parser()
    found = []
    with open(list_path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            where = f"{list_path}:{number}"
            try:
                words = shlex.split(line, comments=True)
            except ValueError as e:
                raise UsageError(f"{where}: {e}") from None
            if not words:
                continue
            try:
                a = parser.parse_args(words)
            except UsageError as e:
                raise UsageError(f"{where}: {e}") from None
            path = a.path if os.path.isabs(os.path.expanduser(a.path)) else os.path.join(folder, a.path)
            if is_list_file(path):
                raise UsageError(f"{where}: a list file inside a list file; name models or folders")
            checks = [_check_input(spec, folder, where) for spec in a.check_input]
            found += _expand(path, out_real, where, a.input_shape, a.timeout, a.memory_limit_gb, a.measure_shape,
                             checks)
    return found


# How a list file gives one model the shapes or data it needs (the batch's advice for a `needs-input` model).
LIST_LINE_EXAMPLE = "model.onnx --input-shape x:1,3,640,640 --check-input sr:sr.npy"


def _check_input(spec: str, folder: str, where: str) -> str:
    """`NAME:FILE.npy` with FILE made absolute (relative to the list file's folder); it must exist."""
    name, sep, path = spec.partition(":")
    if not sep or not name or not path:
        raise UsageError(f"{where}: --check-input {spec}: write it as NAME:FILE.npy")
    path = os.path.expanduser(path)
    path = path if os.path.isabs(path) else os.path.join(folder, path)
    if not os.path.isfile(path):
        raise UsageError(f"{where}: --check-input {spec}: no such file {path}")
    return f"{name}:{os.path.abspath(path)}"


def check_outputs(sources: list[Source], out_dir: str) -> None:
    """No output may be a source model, or lie outside OUT_DIR."""
    out_real = os.path.realpath(out_dir)
    models = {os.path.realpath(s.path): s.path for s in sources}
    for s in sources:
        for suffix in OUTPUT_SUFFIXES:
            target = os.path.realpath(s.output(out_dir, suffix))
            if os.path.commonpath([target, out_real]) != out_real:
                raise UsageError(f"{s.path}: its output {target} would lie outside {out_dir}")
            if target in models:
                raise UsageError(f"-o {out_dir}: the output {target} would overwrite the source model "
                                 f"{models[target]}; give another output folder")
