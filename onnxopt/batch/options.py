"""The optimize options a batch passes through to every model, and the checks of the batch's own numbers.

One table serves the `onnxopt batch` parser and the Python API, so both accept the same names and turn them into
the same `onnxopt MODEL ...` arguments.
"""

from __future__ import annotations

import argparse
import math

from onnxopt.driver.policy import FUSION_KINDS
from onnxopt.errors import UsageError


class OneLineParser(argparse.ArgumentParser):
    """`onnxopt batch`'s parser: a mistake on the command line is one line and exit 2, like every usage error."""

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")

# (option, kind, help): "int"/"float"/"str" take a value, "list" is repeatable, "flag" takes none.
PASS_THROUGH = (
    ("threads", "int", "intra-op threads for measuring, and for the speedup benchmark (default: all cores)"),
    ("tune_budget", "float", "seconds of Winograd/tile/band searches per model (optimize's default 12)"),
    ("search_budget", "float", "seconds of the fusion-plan search per model (optimize's default 60)"),
    ("target", "str", "CPU to compile for: native (default), x86-64-v3, x86-64-v4, aarch64, aarch64-dotprod (Armv8.2-A's "
               "int8 dot products), or cpu=NAME,+feature,... (an x86-64 or aarch64 CPU: cpu=neoverse-n1,+dotprod); "
               "c, c:x86-64-v3, c:x86-64-v4: the C backend"),
    ("skip_fusion", "list", "do not fuse regions of this kind (repeatable, or comma-separated): "
                            + ", ".join(FUSION_KINDS)),
    ("min_speedup", "float", "optimize's --min-speedup"),
    ("plan", "str", "optimize's --plan: build only this plan"),
    ("winograd", "str", "optimize's --winograd"),
    ("input_shape", "list", "NAME:D0,D1,... for every model (repeatable; a list file line may add its own)"),
    ("measure_shape", "list", "NAME:D0,D1,... to check and time every model with, its dims left symbolic"),
    ("no_verify", "flag", "skip the whole-model check (kernels are still checked)"),
    ("no_measure", "flag", "do not time kernels"),
    ("cost_cache", "str", "the measured-cost cache (SQLite) that all workers share"),
    ("no_cost_cache", "flag", "time every kernel again; no cache"),
)

METAVARS = {"threads": "N", "tune_budget": "SECONDS", "search_budget": "SECONDS", "target": "T", "skip_fusion": "KIND",
            "min_speedup": "X", "plan": "NAME", "winograd": "MODE", "input_shape": "NAME:D0,D1,...", "measure_shape": "NAME:D0,D1,...",
            "cost_cache": "PATH"}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_pass_through(parser) -> None:
    group = parser.add_argument_group("passed to each model's optimize")
    for name, kind, help_ in PASS_THROUGH:
        if kind == "flag":
            group.add_argument(flag(name), action="store_true", default=None, help=help_)
        elif kind == "list":
            group.add_argument(flag(name), action="append", metavar=METAVARS.get(name), help=help_)
        else:
            group.add_argument(flag(name), type={"int": int, "float": float, "str": str}[kind],
                               metavar=METAVARS.get(name, kind.upper()), help=help_)


def pick(values: dict) -> dict:
    """The pass-through options among `values` (an argparse namespace's dict), those set."""
    names = {n for n, _, _ in PASS_THROUGH}
    return {k: v for k, v in values.items() if k in names and v is not None and v is not False and v != []}


def optimize_argv(options: dict) -> list[str]:
    """`{"threads": 1, "skip_fusion": ["pool"], "no_verify": True}` -> ["--threads", "1", "--skip-fusion", "pool",
    "--no-verify"]; checks the values the way the batch can (a bad value would otherwise fail every model)."""
    kinds = {n: k for n, k, _ in PASS_THROUGH}
    argv: list[str] = []
    for name, value in options.items():
        if name not in kinds:
            raise UsageError(f"unknown batch option {name!r}; the options passed to optimize are "
                             f"{', '.join(kinds)}")
        kind = kinds[name]
        if value is None or value is False:
            continue
        if kind == "flag":
            argv.append(flag(name))
        elif kind == "list":
            for v in [value] if isinstance(value, str) else value:
                argv += [flag(name), str(v)]
        elif kind == "int":
            argv += [flag(name), str(positive_int(value, flag(name)))]
        elif kind == "float":
            argv += [flag(name), repr(nonneg_float(value, flag(name)))]
        else:
            argv += [flag(name), str(value)]
    if options.get("cost_cache") and options.get("no_cost_cache"):
        raise UsageError("--cost-cache and --no-cost-cache: give one of them")
    return argv


def positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{what} {value}: give a whole number, 1 or more")
    return value


def nonneg_float(value, what: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what} {value}: give a number") from None
    if not math.isfinite(x) or x < 0:
        raise UsageError(f"{what} {value}: give a finite number, 0 or more")
    return x


def positive_float(value, what: str) -> float:
    x = nonneg_float(value, what)
    if x == 0:
        raise UsageError(f"{what} {value}: give a number more than 0")
    return x
