"""The batch's results: OUT_DIR/report.json (every model's record, totals, the machine) and the summary table."""

from __future__ import annotations

import math
import platform
import subprocess

from .worker import FAILURES

# The x86 features that decide which kernels onnxopt can emit (AVX2, AVX-512 and its int8/bf16 extensions, AMX).
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl",
             "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def machine_info() -> dict:
    from onnxopt import __version__
    from onnxopt.cost_cache import _ort_version, cpu_model, usable_cpus

    model = cpu_model()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name:")), model)
    except (OSError, subprocess.SubprocessError):
        pass
    from onnxopt.codegen.target import host_cpu_flags

    flags = host_cpu_flags()
    return {"cpu": model, "isa": [f for f in ISA_FLAGS if f in flags], "cpus": usable_cpus(),
            "machine": platform.machine(), "python": platform.python_version(),
            "onnxruntime": _ort_version(), "onnxopt": __version__}


def totals(records: list[dict]) -> dict:
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    speedups = [r["bench"]["speedup"] for r in records
                if isinstance(r.get("bench"), dict) and r["bench"].get("speedup", 0) > 0]
    return {"models": len(records), "by_status": counts,
            "failures": sum(counts.get(s, 0) for s in FAILURES),
            "optimize_s": round(sum(r.get("wall_s") or 0 for r in records if r["status"] != "skipped"), 3),
            "geomean_speedup": math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else None,
            "benchmarked": len(speedups)}


def speedup_band(bench: dict) -> tuple[float, float]:
    """The band around a bench's median speedup: original p10 / optimized p90 to original p90 / optimized p10, which
    holds the median ratio whatever the spreads. (An earlier batch's record kept the ratios of the p10s and of the
    p90s, which need not: its band is recomputed from the times it kept, else widened to take the median.)"""
    a, b = bench.get("original") or {}, bench.get("optimized") or {}
    try:
        return a["p10"] / b["p90"], a["p90"] / b["p10"]
    except (KeyError, TypeError, ZeroDivisionError):
        ends = [v for v in (bench.get("speedup_low"), bench.get("speedup_high"), bench.get("speedup_p10"),
                            bench.get("speedup_p90")) if isinstance(v, (int, float))]
        return min(ends + [bench["speedup"]]), max(ends + [bench["speedup"]])


def fmt_speedup(record: dict) -> str:
    b = record.get("bench")
    if not isinstance(b, dict):
        return "-"
    if "error" in b:
        return "bench failed"
    lo, hi = speedup_band(b)
    return f"{b['speedup']:.2f}x ({lo:.2f}-{hi:.2f})"


def fmt_verified(record: dict) -> str:
    def word(v):
        return {True: "yes", False: "no", None: "-"}.get(v, str(v))
    if record.get("status") not in ("optimized", "unchanged") and record.get("previous_status") is None:
        return "-"
    return f"{word(record.get('verified_library'))}/{word(record.get('verified_fallback'))}"


def fmt_nodes(record: dict) -> str:
    if record.get("nodes_before") is None:
        return "-"
    return f"{record['nodes_before']}->{record['nodes_after']}"


def fmt_optimize_s(record: dict) -> str:
    total = (record.get("offline") or {}).get("total_s")
    return f"{total:.1f}" if isinstance(total, (int, float)) else "-"


def summary_table(records: list[dict], title: str):
    from rich.markup import escape
    from rich.table import Table

    colors = {"optimized": "green", "slower": "yellow", "unchanged": "cyan", "skipped": "dim", "failed": "red",
              "needs-input": "magenta",
              "crashed": "red", "timeout": "yellow", "out-of-memory": "yellow"}
    t = Table(title=title)
    for name, justify in (("model", "left"), ("status", "left"), ("speedup\n(band)", "right"),
                          ("verified\nlib/fallback", "center"), ("optimize\ns", "right"),
                          ("nodes\nbefore->after", "right"), ("reason", "left")):
        t.add_column(name, justify=justify, overflow="fold", min_width=10 if name in ("model", "reason") else None)
    for r in records:
        status = r["status"] + (f" ({r['previous_status']})" if r.get("previous_status") else "")
        t.add_row(escape(r["model"]), f"[{colors.get(r['status'], 'white')}]{escape(status)}[/]",
                  fmt_speedup(r), fmt_verified(r), fmt_optimize_s(r), fmt_nodes(r), escape(r.get("reason") or ""))
    return t
