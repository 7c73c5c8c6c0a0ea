"""The `onnxopt` command.

    onnxopt model.onnx -o fused.onnx [options]     optimize (writes fused.onnx and fused.onnx.so)
    onnxopt inspect model.onnx                     the annotated graph
    onnxopt machine                                the machine model
    onnxopt bench original.onnx fused.onnx         both through onnxruntime, interleaved
    onnxopt batch SRC... -o OUT_DIR                many models, each in its own process

Exit codes: 0 ok, 1 verification failed, 2 bad usage or unreadable input, 3 an internal error (a bug: please report
it), 130 interrupted (Ctrl-C, SIGTERM). Errors print one line, no traceback (`--verbose` shows it above the line);
warnings one line each.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import traceback
import warnings

from onnxopt import __version__
from onnxopt.errors import OnnxoptError, UsageError
from onnxopt.driver.policy import FUSION_KINDS
from onnxopt.pipeline import WINOGRAD_MODES

SUBCOMMANDS = ("inspect", "machine", "bench", "optimize", "batch", "tune")
# The other commands, for the top-level help (a test checks that it names every one of SUBCOMMANDS).
OTHER_COMMANDS = {
    "inspect": ("MODEL", "the annotated graph: FLOPs, bytes, intensity, predicted time per node"),
    "machine": ("", "the machine model (measured peaks and bandwidths), or a preset's"),
    "bench": ("A B", "time two models through onnxruntime, interleaved, and compare their outputs"),
    "batch": ("SRC... -o OUT_DIR", "optimize many models, each in its own process, resumable, with an HTML report"),
    "tune": ("MODEL", "search each matmul's schedule (CGA + XGBoost on measurements) into the cost cache's records"),
}
TARGET_HELP = ("CPU to compile for: native (default), x86-64-v3, x86-64-v4, aarch64, aarch64-dotprod (Armv8.2-A's "
               "int8 dot products), or cpu=NAME,+feature,... (an x86-64 or aarch64 CPU: cpu=neoverse-n1,+dotprod); "
               "c, c:x86-64-v3, c:x86-64-v4: the C backend (elementwise and row kinds as C through the system compiler)")
SKIP_FUSION_HELP = f"do not fuse regions of this kind (repeatable, or comma-separated): {', '.join(FUSION_KINDS)}"


def _optimize_parser() -> argparse.ArgumentParser:
    width = max(len(f"onnxopt {c} {a}") for c, (a, _) in OTHER_COMMANDS.items()) + 2
    others = "\n".join(f"  {f'onnxopt {c} {a}'.ljust(width)}{h}" for c, (a, h) in OTHER_COMMANDS.items())
    p = argparse.ArgumentParser(prog="onnxopt", description="Fuse an ONNX model into native kernels served by "
                                "onnxruntime (`onnxopt optimize MODEL -o OUT` is the same).\nOther commands: onnxopt "
                                f"{' | '.join(OTHER_COMMANDS)} (listed at the end).",
                                epilog=f"other commands (see onnxopt COMMAND --help):\n{others}",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="the model to optimize (.onnx)")
    p.add_argument("-o", "--output", required=True, help="where to write the optimized model; its kernel library "
                   "goes next to it as <output>.so")
    p.add_argument("--input-shape", action="append", metavar="NAME:D0,D1,...",
                   help="fix an input's symbolic dims (repeatable)")
    p.add_argument("--measure-shape", action="append", metavar="NAME:D0,D1,...",
                   help="check and time with this input shape, but keep its symbolic dims symbolic in the output "
                   "(repeatable): a transformer measured at the sequence it will serve, and still dynamic")
    p.add_argument("--target", default="native", help=TARGET_HELP)
    p.add_argument("--check-input", action="append", metavar="NAME:FILE.npy",
                   help="verify on this input instead of random data (repeatable)")
    p.add_argument("--rtol", action="append", metavar="[DTYPE:]X", help="relative tolerance of the check "
                   "(default float32:1e-3)")
    p.add_argument("--atol", action="append", metavar="[DTYPE:]X", help="absolute tolerance (default float32:1e-4)")
    p.add_argument("--scale-tol", action="append", metavar="[DTYPE:]X", help="tolerance as a fraction of the output's "
                   "largest magnitude, for values near zero that come from cancelling terms (default float32:1e-5; "
                   "0 for the plain rtol/atol check)")
    p.add_argument("--skip-fusion", action="append", metavar="KIND", help=SKIP_FUSION_HELP)
    p.add_argument("--no-afusion", action="store_true", help="no AFUSION kernels (two or three convolutions, or a "
                   "convolution and its pool, in one kernel); the same as --skip-fusion afusion")
    p.add_argument("--no-sequences", action="store_true", help="one custom op per fused region: do not merge runs "
                   "of them into sequence ops that run in one parallel section (profiles then show each kernel)")
    p.add_argument("--search-budget", type=float, default=60.0, metavar="SECONDS",
                   help="time limit of the backtracking search over fusion plans (default 60)")
    p.add_argument("--no-prune", action="store_true", help="keep every legal fusion candidate instead of pruning "
                   "those the roofline predicts no gain for (OptiFX's theta_opt = 1.05)")
    p.add_argument("--threads", type=int, help="intra-op threads for measuring (default: all cores)")
    p.add_argument("--min-speedup", type=float, default=1.0,
                   help="emit a kernel only if it is at least this much faster than onnxruntime on its region; the "
                   "whole fused model must be 2%% faster than this too (0: keep every correct kernel)")
    p.add_argument("--plan", help="build only this whole-graph plan instead of timing them all: compute, "
                   "compute-dense, compute-blocked (tensors between fused convolutions in the blocked layout), afusion "
                   "(the blocked plan with convolution pairs fused into one kernel each), pool or elementwise")
    p.add_argument("--no-measure", action="store_true", help="do not time kernels (emit every correct kernel)")
    p.add_argument("--no-verify", action="store_true", help="skip the whole-model check (kernels are still checked)")
    p.add_argument("--verify-fallback", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the written model without its kernel library (its function bodies, as a host "
                   "without the library or with another CPU does) and compare; a model whose fallback does not load "
                   "or differs is never written (default on)")
    p.add_argument("--emulate", action=argparse.BooleanOptionalAction, default=True,
                   help="for a target of another architecture (--target aarch64-dotprod on x86-64), run the written "
                   "model with its library in onnxruntime under qemu and compare, where scripts/aarch64_sysroot.sh "
                   "set that up (default on)")
    p.add_argument("--cost-cache", metavar="PATH", help="the measured-cost cache, an SQLite file shared across runs "
                   "(default $ONNXOPT_CACHE_DIR/costs.sqlite, else $XDG_CACHE_HOME/onnxopt/costs.sqlite, else "
                   "~/.cache/onnxopt/costs.sqlite)")
    p.add_argument("--no-cost-cache", action="store_true", help="time every kernel again; read and write no cache")
    p.add_argument("--no-tile-search", action="store_true", help="use the target's default register tile for "
                   "compute kernels instead of timing a few")
    p.add_argument("--tune-budget", type=float, default=12.0, metavar="SECONDS",
                   help="time for the Winograd choices (first), then the register-tile and AFUSION band-height "
                   "searches (what is left, at least a third), largest regions first; the "
                   "rest keep the machine model's choice (default 12; tiles found are kept in the cost cache, so a "
                   "second run searches further)")
    p.add_argument("--winograd", choices=list(WINOGRAD_MODES), default="auto",
                   help="Winograd tiles for stride-1 3x3, 5x5, 1x7, 7x1, 1x3 and 3x1 convolutions on the blocked "
                   "kernel: auto (timed per convolution against the direct kernel, the faster kept), off, or a tile "
                   "length m (on every one whose kernel offers it: 3x3 2 or 4, 5x5 2, 1x7 2 or 4, 1x3 4 or 6). "
                   "F(4x4, 3x3) differs from the direct sum by about 4e-6 of the output's scale")
    # Validated by optimize() (driver/precision.py), so a bad value is its one-line usage error.
    p.add_argument("--precision", default="fp32", metavar="fp32|bf16|fp16|auto",
                   help="the fused GEMMs' and convolutions' constant weights in bf16 or fp16 (float32 sums; bf16 on "
                   "AMX tiles or vdpbf16ps where the target has them, else widened in registers; fp16 on AMX-FP16 "
                   "tiles, else stored in fp16 and widened when a session loads the model), checked against the "
                   "float32 original at 2%% relative plus 1%% of the output's scale; auto: bf16 per GEMM while the "
                   "model stays within --accuracy-budget. Default fp32: nothing lowered")
    p.add_argument("--accuracy-budget", default=None, metavar="X",
                   help="with --precision auto: the largest error allowed on any output, as a fraction of that "
                   "output's largest magnitude (default 0.01)")
    p.add_argument("--report", metavar="FILE.json", help="write the full report as JSON")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("-v", "--version", action="version", version=f"onnxopt {__version__}")
    return p


def cmd_optimize(argv) -> int:
    from onnxopt.pipeline import optimize
    from onnxopt.report import make_console, render_optimize_report

    a = _optimize_parser().parse_args(argv)
    console = make_console(stderr=True, quiet=a.quiet)
    if a.report:
        check_report_path(a.report, [a.output, a.output + ".so", a.output + ".data"])
    result = optimize(a.input, a.output, input_shape=a.input_shape, measure_shape=a.measure_shape, target=a.target,
                      check_input=a.check_input,
                      rtol=a.rtol, atol=a.atol, scale_tol=a.scale_tol, threads=a.threads,
                      skip_fusion=(a.skip_fusion or []) + (["afusion"] if a.no_afusion else []),
                      verify=not a.no_verify, measure=not a.no_measure, min_speedup=a.min_speedup, seed=a.seed, plan=a.plan,
                      cost_cache=False if a.no_cost_cache else a.cost_cache, tile_search=not a.no_tile_search,
                      search_budget=a.search_budget, prune=not a.no_prune, sequences=not a.no_sequences,
                      tune_budget=a.tune_budget,
                      winograd=a.winograd, verify_fallback=a.verify_fallback, emulate=a.emulate,
                      precision=a.precision, accuracy_budget=a.accuracy_budget,
                      report_file=a.report,
                      progress=(lambda m: console.print(f"[dim]{m}[/dim]")) if a.verbose else None,
                      _cli=True)
    render_optimize_report(result.report, console, verbose=a.verbose)
    return 0


def check_report_path(path: str, outputs: list[str]) -> None:
    """A report path that cannot be written is an error before the run, not after it."""
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise UsageError(f"--report {path} is a folder; give a file name such as {os.path.join(path, 'report.json')}")
    if not os.path.isdir(os.path.dirname(full)):
        raise UsageError(f"--report {path}: the folder {os.path.dirname(full)} does not exist")
    if not os.access(os.path.dirname(full), os.W_OK):
        raise UsageError(f"--report {path}: the folder {os.path.dirname(full)} is not writable")
    if any(os.path.abspath(o) == full for o in outputs):
        raise UsageError(f"--report {path} is one of the outputs; give the report a name of its own")
    from onnxopt.graph.publish import check_destination, probe_writable

    check_destination(full, "--report")
    probe_writable(os.path.dirname(full), f"--report {path}")  # /sys, /proc, read-only mounts: access() says yes


def cmd_inspect(argv) -> int:
    from onnxopt.annotate.graph import annotate
    from onnxopt.graph.load import load_model, parse_input_shapes
    from onnxopt.hardware.measure import load_machine
    from onnxopt.report import make_console

    p = argparse.ArgumentParser(prog="onnxopt inspect", description="The annotated graph: FLOPs, bytes, "
                                "intensity, compute- or memory-bound, predicted time per node.")
    p.add_argument("input")
    p.add_argument("--input-shape", action="append", metavar="NAME:D0,D1,...")
    p.add_argument("--top", type=int, default=25, help="rows to show (0: all)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)
    loaded = load_model(a.input, parse_input_shapes(a.input_shape))
    g = annotate(loaded.model, load_machine(quick=True))
    if a.json:
        print(json.dumps(g.to_dict(), indent=1, default=str))
    else:
        g.render_table(make_console(), limit=a.top or None)
    return 0


def cmd_tune(argv) -> int:
    from onnxopt.codegen.target import parse_target
    from onnxopt.cost_cache import open_cost_cache
    from onnxopt.graph.load import parse_input_shapes
    from onnxopt.tune.heron.tune_model import tune_model

    p = argparse.ArgumentParser(prog="onnxopt tune", description="Heron's constrained search (CGA with an XGBoost "
                                "cost model) for the schedule of every distinct matmul with a constant B in the model, "
                                "each candidate built, checked and timed; the measurements go to the cost cache's "
                                "tuning records, which later optimizations of any model with the same matmuls reuse "
                                "without measuring.")
    p.add_argument("input", help="the model (.onnx)")
    p.add_argument("--trials", type=int, default=500, help="measured candidates per matmul (default 500)")
    p.add_argument("--threads", type=int, help="threads the kernels run on (default: every usable core, as "
                   "onnxruntime's default; optimize with the same --threads to use the records)")
    p.add_argument("--input-shape", action="append", metavar="NAME:D0,D1,...",
                   help="fix an input's symbolic dims (repeatable), as the optimization will")
    p.add_argument("--target", default="native", help="the CPU to compile for (only the host's kernels can be timed)")
    p.add_argument("--cost-cache", metavar="PATH", help="the SQLite file the records go to (default: the cost "
                   "cache optimize reads)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--retune", action="store_true", help="search again the matmuls the cost cache has tuning records "
                   "of already (by default they are reused: another model, or a batch, tuned them)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)
    if a.trials < 1:
        raise UsageError(f"--trials {a.trials}: give 1 or more")
    if a.threads is not None and a.threads < 1:
        raise UsageError(f"--threads {a.threads}: give 1 or more")
    target = parse_target(None if a.target == "native" else a.target)
    from onnxopt.hardware.cpu import cpu_flags

    missing = [f for f in target.required_cpu_flags if f not in cpu_flags()]
    if target.foreign or missing:
        raise UsageError(f"--target {a.target}: tuning times kernels, and this CPU cannot run them "
                         f"({'another architecture' if target.foreign else 'no ' + ', '.join(missing)}); tune on "
                         "the machine that will serve, or give --target native")
    cache = open_cost_cache(a.cost_cache)
    if cache is None or not cache.enabled:
        raise UsageError(f"the cost cache cannot be opened ({cache.warning if cache else 'off'}): give "
                         "--cost-cache PATH in a writable folder")

    def show(r):
        if a.json:
            return
        items, M, K, N = r.shape
        if r.skipped:
            print(f"matmul {M}x{K}x{N}: skipped ({r.skipped})")
            return
        if r.reused:
            print(f"matmul {M}x{K}x{N}: tuned before, its records reused (best {2.0 * M * K * N / 1e9 / r.best_s:.1f} "
                  "GFLOP/s; --retune searches again)")
            return
        gf = 2.0 * M * K * N / 1e9
        print(f"matmul {M}x{K}x{N}: default {gf / r.default_s:.1f} GFLOP/s, tuned {gf / r.best_s:.1f} GFLOP/s "
              f"({r.default_s / r.best_s:.2f}x) after {r.trials} trials in {r.seconds:.0f} s", flush=True)

    results = tune_model(a.input, target, a.threads, a.trials, cache, parse_input_shapes(a.input_shape),
                         a.seed, on_problem=show, retune=a.retune)
    if a.json:
        print(json.dumps({"cost_cache": cache.path, "problems": [r.to_dict() for r in results]}, indent=1))
    elif not results:
        print("no matmul with a constant B to tune in this model")
    else:
        print(f"records written to {cache.path}")
    cache.close()
    return 0


def cmd_machine(argv) -> int:
    from rich.table import Table

    from onnxopt.hardware.measure import load_machine
    from onnxopt.hardware.presets import PRESETS, get_preset
    from onnxopt.report import make_console

    p = argparse.ArgumentParser(prog="onnxopt machine", description="The machine model: measured peaks and "
                                "bandwidths (cached after the first run), ISA, caches; or a preset.")
    p.add_argument("--preset", help=f"show a preset instead: {', '.join(PRESETS)}")
    p.add_argument("--refresh", action="store_true", help="measure again")
    p.add_argument("--quick", action="store_true", help="shorter, less precise measurement")
    p.add_argument("--json", action="store_true")
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)
    m = get_preset(a.preset) if a.preset else load_machine(refresh=a.refresh, quick=a.quick)
    if a.json:
        print(json.dumps(m.to_dict(), indent=1, default=str))
        return 0
    t = Table(title=f"{m.name} ({m.source})")
    t.add_column("")
    t.add_column("value", justify="right")
    t.add_row("cores", str(m.cores))
    t.add_row("vector bits / registers", f"{m.vector_bits} / {m.registers}")
    for dt, v in m.peak_flops.items():
        t.add_row(f"peak {dt}", f"{v / 1e9:.1f} GFLOP/s")
    amx = ((m.details or {}).get("kernels") or {}).get("amx")
    if amx and amx.get("error"):  # the CPU has AMX but this process may not use it
        t.add_row("AMX", amx["error"])
    for lv in m.levels:
        size = "-" if lv.size_bytes is None else f"{lv.size_bytes / 1024:.0f} KiB"
        one = f", 1 core {lv.bandwidth_1core / 1e9:.1f}" if lv.bandwidth_1core else ""
        t.add_row(f"{lv.name} ({size})", f"{lv.bandwidth / 1e9:.1f} GB/s{one}")
    t.add_row("balance (fp32 FLOP/byte, DRAM)", f"{m.balance('float32'):.2f}")
    t.add_row("ISA", " ".join(m.isa))
    make_console().print(t)
    return 0


def cmd_bench(argv) -> int:
    from onnxopt.runtime.bench import bench
    from onnxopt.report import make_console, render_bench

    p = argparse.ArgumentParser(prog="onnxopt bench", description="Time two models through onnxruntime in one "
                                "process: same threads, interleaved A B A B, medians, p10/p90 and the ratio.")
    p.add_argument("a", help="the original model (with --kernels: the optimized model)")
    p.add_argument("b", nargs="?", help="the optimized model")
    p.add_argument("--kernels", action="store_true", help="benchmark each fused kernel of one optimized model "
                   "against the machine's measured bandwidth")
    p.add_argument("--threads", type=int, help="intra-op threads (default: all cores)")
    p.add_argument("--min-time", type=float, default=2.0, help="seconds of timing per side (default 2)")
    p.add_argument("--input", action="append", metavar="NAME:FILE.npy", help="real inputs instead of random ones")
    p.add_argument("--dim", action="append", metavar="SYMBOL=N", help="the value of a symbolic dim in the random "
                   "inputs (repeatable; `onnxopt batch` passes the ones the optimizer checked at)")
    p.add_argument("--spinning", action="store_true", help="onnxruntime's intra-op spinning on (its default), as "
                   "many hosts serve; sessions are then timed one at a time in rounds (default: off, interleaved)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)
    if a.kernels:
        return _bench_kernels(a)
    if not a.b:
        p.error("give two models (original and optimized), or one with --kernels")
    dims = {}
    for spec in a.dim or ():
        name, sep, value = spec.rpartition("=")
        if not sep or not name or not value.isdigit() or int(value) < 1:
            raise UsageError(f"--dim {spec}: give SYMBOL=N with N a whole number, 1 or more")
        dims[name] = int(value)
    r = bench(a.a, a.b, threads=a.threads, min_time=a.min_time, inputs=a.input, spinning=a.spinning,
              bindings=dims or None)
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        render_bench(r, make_console())
    return 0


def _bench_kernels(a) -> int:
    from rich.table import Table

    from onnxopt.report import make_console
    from onnxopt.runtime.kernel_bench import bench_kernels

    rows = bench_kernels(a.a, threads=a.threads, min_time=min(a.min_time, 1.0))
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    t = Table(title=f"fused kernels of {a.a} (ceiling: the level's read+write stream bandwidth)")
    for c in ("kernel", "shape", "bytes", "µs", "GB/s", "level", "cores", "ceiling GB/s", "% of ceiling"):
        t.add_column(c, justify="left" if c in ("kernel", "shape", "level") else "right")
    for r in rows:
        t.add_row(r["op_type"], "x".join(map(str, r["shape"])), f"{r['bytes']:,}", f"{r['seconds'] * 1e6:.1f}",
                  f"{r['bandwidth'] / 1e9:.1f}", r["level"], str(r["cores"]), f"{r['level_bandwidth'] / 1e9:.1f}",
                  f"{100 * r['fraction']:.0f}%")
    make_console().print(t)
    return 0


def cmd_batch(argv) -> int:
    from onnxopt.batch import run_batch
    from onnxopt.batch.options import OneLineParser, add_pass_through, pick
    from onnxopt.report import make_console

    p = OneLineParser(prog="onnxopt batch", description="Optimize many models, each in its own process, into one "
                       "folder that mirrors the sources' folders; resumable; writes OUT_DIR/report.json and a "
                       "self-contained OUT_DIR/report.html. Exit 0 if every model was optimized, left unchanged or "
                       "skipped (done before), 1 if any failed, crashed, timed out or ran out of memory.")
    p.add_argument("sources", nargs="*", metavar="SRC", help=".onnx files, folders (searched recursively) or list "
                   "files (@list.txt or .txt: one path per line, # comments, paths relative to the list file, "
                   "optional --input-shape/--measure-shape/--check-input NAME:FILE.npy/--timeout/--memory-limit "
                   "after the path)")
    p.add_argument("-o", "--output", required=True, metavar="OUT_DIR", help="the output folder (created if missing)")
    p.add_argument("--jobs", type=int, default=1, help="models optimized at once (default 1: timings are only "
                   "trustworthy with one)")
    p.add_argument("--timeout", type=float, default=1800.0, metavar="SECONDS",
                   help="wall time per model; past it the model's processes are killed (default 1800)")
    p.add_argument("--memory-limit", type=float, metavar="GB", help="address-space limit (RLIMIT_AS) of each "
                   "model's process (default: none)")
    p.add_argument("--retry-failed", action="store_true", help="also run again the models that failed, crashed, "
                   "timed out or ran out of memory in an earlier run (finished ones are always skipped)")
    p.add_argument("--no-bench", action="store_true", help="do not measure the speedup of each optimized model")
    p.add_argument("--bench-time", type=float, default=2.0, metavar="SECONDS",
                   help="seconds of timing per side in `onnxopt bench` (default 2)")
    p.add_argument("--ray", metavar="auto|ADDRESS", help="run the models as tasks of a Ray cluster (needs "
                   "onnxopt[ray]; OUT_DIR must be on a file system every node shares)")
    p.add_argument("--tune", type=int, metavar="TRIALS", help="before optimizing each model, run `onnxopt tune` on "
                   "it (TRIALS measured candidates a matmul) into the cost cache its optimization reads; a matmul "
                   "another model of the batch tuned already is reused, not searched again (with --ray, give a "
                   "--cost-cache on a file system every node shares)")
    add_pass_through(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, no summary table")
    p.add_argument("--verbose", action="store_true", help="a traceback with an error of the batch itself")
    a = p.parse_args(argv)
    try:
        result = run_batch(a.sources, a.output, jobs=a.jobs, timeout=a.timeout, memory_limit_gb=a.memory_limit,
                           retry_failed=a.retry_failed, bench=not a.no_bench, bench_time=a.bench_time, ray=a.ray,
                           tune=a.tune,
                           quiet=a.quiet, console=make_console(stderr=True, quiet=a.quiet), **pick(vars(a)))
    except KeyboardInterrupt:
        print(f"onnxopt: interrupted; the models finished so far are recorded in {a.output}/batch-state.json "
              "(run the same command again to go on)", file=sys.stderr)
        return 130
    return result.exit_code


def _quiet_onnxruntime() -> None:
    """onnxruntime logs its errors to stderr as well as raising them; we report each in one line of our own."""
    try:
        import onnxruntime as ort

        ort.set_default_logger_severity(4)
    except Exception:  # noqa: BLE001 - an onnxruntime without it, or none: the CLI says so where it needs one
        pass


def _interrupt_on_signals() -> dict:
    """SIGTERM and SIGHUP end the run like Ctrl-C: the cleanup code runs (temporary folders and half-written files
    are removed) instead of the process vanishing with them on disk. Returns the handlers to put back (and the
    unraisable hook, under None).

    Where Python drops exceptions (a fork's at-fork hooks, a finalizer) the KeyboardInterrupt raised there would be
    lost and the run go on: the unraisable hook sends the signal again, to land in the run's own code."""
    received: list[int] = []

    def stop(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt

    previous_hook = sys.unraisablehook

    def unraisable(u):
        if u.exc_type is KeyboardInterrupt and received:
            # from another thread, a moment later: sent from here, the handler would run inside this hook, which
            # drops exceptions as well
            again = threading.Timer(0.05, os.kill, (os.getpid(), received[-1]))
            again.daemon = True
            again.start()
            return
        previous_hook(u)

    before = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            before[sig] = signal.signal(sig, stop)
        except (ValueError, OSError):  # not the main thread, or no such signal here
            pass
    if before:
        sys.unraisablehook = unraisable
        before[None] = previous_hook
    return before


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """A warning in one line, like our errors: warnings.warn's default also prints the source line that warned."""
    what = "" if category.__module__.startswith("onnxopt") else f"{category.__name__}: "
    print(f"onnxopt: warning: {what}{' '.join(str(message).split())}", file=file or sys.stderr)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd, rest = ("optimize", argv)
    if argv and argv[0] in SUBCOMMANDS:
        cmd, rest = argv[0], argv[1:]
    handler = {"optimize": cmd_optimize, "inspect": cmd_inspect, "machine": cmd_machine, "bench": cmd_bench,
               "batch": cmd_batch, "tune": cmd_tune}[cmd]
    handlers = _interrupt_on_signals()
    verbose = "--verbose" in argv
    if not verbose:
        _quiet_onnxruntime()
    show_warning, warnings.showwarning = warnings.showwarning, _show_warning
    try:
        return handler(rest)
    except OnnxoptError as e:
        if verbose:  # the traceback, then a blank line, then the error's own line
            traceback.print_exc()
            print(file=sys.stderr)
        print(f"onnxopt: error: {' '.join(str(e).split())}", file=sys.stderr)  # one line, whatever it quotes
        return e.exit_code
    except KeyboardInterrupt:
        print("onnxopt: interrupted; nothing was written", file=sys.stderr)
        return 130
    except MemoryError:
        print("onnxopt: error: out of memory; nothing was written. Fix symbolic dims smaller with --input-shape, or "
              "run on a machine with more memory", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a bug of ours: one line and a distinct code, the traceback on request
        if verbose:
            traceback.print_exc()
            print(file=sys.stderr)
        first = (str(e).splitlines() or [""])[0][:300]
        print(f"onnxopt: internal error: {type(e).__name__}: {first}; nothing was written. Please report it"
              + (" with the traceback above" if verbose else " (--verbose shows the traceback)"), file=sys.stderr)
        return 3
    finally:
        warnings.showwarning = show_warning
        for sig, h in handlers.items():
            if sig is None:
                sys.unraisablehook = h
            else:
                signal.signal(sig, h)


if __name__ == "__main__":
    sys.exit(main())
