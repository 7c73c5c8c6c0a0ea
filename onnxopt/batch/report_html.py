"""OUT_DIR/report.html: one self-contained page (inline CSS, inline SVG drawn here; no script, font or style is
fetched from anywhere) with the machine, the totals, two charts and a table of every model.

Every string that comes from a model or a log (names, reasons, paths) goes through html.escape.
"""

from __future__ import annotations

import html
import math
import os

from .report import fmt_nodes, fmt_optimize_s, fmt_speedup, fmt_verified, speedup_band

PHASES = (("search_s", "search", "#4e79a7"), ("codegen_s", "code generation", "#f28e2b"),
          ("measurement_s", "measurement", "#59a14f"), ("other_s", "other (load, fold, write)", "#bab0ac"))
STATUS_COLORS = {"optimized": "#2e7d32", "slower": "#ef6c00", "unchanged": "#00838f", "skipped": "#757575",
                 "failed": "#c62828", "crashed": "#c62828", "timeout": "#ef6c00", "out-of-memory": "#ef6c00",
                 "needs-input": "#6a1b9a"}
LABEL_W, ROW_H, PLOT_W = 230, 22, 520

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.status { font-weight: 600; }
.small { color: #666; font-size: 12px; }
"""

e = html.escape


def _label(name: str, width: int = 30) -> str:
    return name if len(name) <= width else "\u2026" + name[-(width - 1):]


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return (f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="{e(title)}" font-size="11" font-family="sans-serif">' + "".join(body) + "</svg>")


def speedup_chart(records: list[dict]) -> str:
    """Horizontal bars of the median speedup on a log axis from 1x, whiskers over its band (report.speedup_band)."""
    rows = [r for r in records if isinstance(r.get("bench"), dict) and r["bench"].get("speedup", 0) > 0]
    if not rows:
        return '<p class="small">No speedups measured (no model optimized, or --no-bench).</p>'
    bands = [speedup_band(r["bench"]) for r in rows]
    values = [v for r, band in zip(rows, bands) for v in (*band, r["bench"]["speedup"])]
    lo, hi = math.log(min(min(values), 1.0) / 1.1), math.log(max(max(values), 1.0) * 1.1)
    x = lambda v: LABEL_W + (math.log(v) - lo) / (hi - lo) * PLOT_W  # noqa: E731
    height = 30 + ROW_H * len(rows) + 30
    body = []
    for t in _ticks(math.exp(lo), math.exp(hi)):
        body.append(f'<line x1="{x(t):.1f}" y1="20" x2="{x(t):.1f}" y2="{height - 25}" stroke="#ddd"/>'
                    f'<text x="{x(t):.1f}" y="{height - 10}" text-anchor="middle">{t:g}x</text>')
    body.append(f'<line x1="{x(1):.1f}" y1="15" x2="{x(1):.1f}" y2="{height - 25}" stroke="#333"/>')
    for i, (r, (low, high)) in enumerate(zip(rows, bands)):
        b, y = r["bench"], 25 + i * ROW_H
        x0, x1 = sorted((x(1.0), x(b["speedup"])))
        color = "#2e7d32" if b["speedup"] >= 1 else "#c62828"
        tip = e(f"{r['model']}: {b['speedup']:.3f}x (band {low:.3f}-{high:.3f})")
        body.append(f'<text x="{LABEL_W - 6}" y="{y + 14}" text-anchor="end">{e(_label(r["model"]))}</text>'
                    f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(x1 - x0, 1):.1f}" height="{ROW_H - 6}" '
                    f'fill="{color}" opacity="0.75"><title>{tip}</title></rect>')
        w0, w1 = x(low), x(high)
        cy = y + ROW_H / 2
        body.append(f'<line x1="{w0:.1f}" y1="{cy}" x2="{w1:.1f}" y2="{cy}" stroke="#111"/>'
                    f'<line x1="{w0:.1f}" y1="{cy - 5}" x2="{w0:.1f}" y2="{cy + 5}" stroke="#111"/>'
                    f'<line x1="{w1:.1f}" y1="{cy - 5}" x2="{w1:.1f}" y2="{cy + 5}" stroke="#111"/>'
                    f'<text x="{max(x1, w1) + 5:.1f}" y="{y + 14}">{b["speedup"]:.2f}x</text>')
    return _svg(LABEL_W + PLOT_W + 70, height, body, "speedup per model")


def _ticks(lo: float, hi: float) -> list[float]:
    """Round values between lo and hi for a log axis: 1-2-5 steps per decade, thinned to about eight."""
    out = [m * 10.0 ** k for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
           for m in (1, 1.1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8)]
    out = [t for t in out if lo <= t <= hi]
    step = max(1, math.ceil(len(out) / 8))
    return sorted(set(out[::step]) | ({1.0} if lo <= 1 <= hi else set()))


def phase_chart(records: list[dict]) -> str:
    """Horizontal stacked bars of each model's optimize time by phase (report["offline"])."""
    rows = [r for r in records if (r.get("offline") or {}).get("total_s")]
    if not rows:
        return '<p class="small">No optimize timings (no model finished).</p>'
    longest = max(sum(r["offline"].get(k, 0.0) for k, _, _ in PHASES) for r in rows) or 1.0
    height = 30 + ROW_H * len(rows) + 30
    body = []
    left = LABEL_W
    for key, name, color in PHASES:  # the legend, about 6.5 px per character
        body.append(f'<rect x="{left}" y="4" width="10" height="10" fill="{color}"/>'
                    f'<text x="{left + 14}" y="13">{e(name)}</text>')
        left += 14 + int(6.5 * len(name)) + 14
    for i, r in enumerate(rows):
        y, left = 25 + i * ROW_H, float(LABEL_W)
        body.append(f'<text x="{LABEL_W - 6}" y="{y + 14}" text-anchor="end">{e(_label(r["model"]))}</text>')
        for key, name, color in PHASES:
            w = r["offline"].get(key, 0.0) / longest * PLOT_W
            if w > 0:
                tip = e(f"{r['model']}: {name} {r['offline'][key]:.2f} s")
                body.append(f'<rect x="{left:.1f}" y="{y + 3}" width="{w:.1f}" height="{ROW_H - 6}" '
                            f'fill="{color}"><title>{tip}</title></rect>')
                left += w
        body.append(f'<text x="{left + 5:.1f}" y="{y + 14}">{r["offline"]["total_s"]:.1f} s</text>')
    body.append(f'<text x="{LABEL_W}" y="{height - 8}" class="small">bar length: seconds, the longest '
                f'{longest:.1f} s</text>')
    return _svg(LABEL_W + PLOT_W + 70, height, body, "optimize time by phase")


def _ops(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted((counts or {}).items())) or "-"


def _bench_cells(r: dict) -> list[str]:
    b = r.get("bench")
    if not isinstance(b, dict) or "error" in b:
        return [e(b["error"]) if isinstance(b, dict) else "-", "-", "-"]
    def times(side):
        if not isinstance(side, dict) or not {"median", "p10", "p90"} <= set(side):
            return "-"
        return f"{_seconds(side['median'])} ({_seconds(side['p10'])}-{_seconds(side['p90'])})"
    return [e(fmt_speedup(r)), times(b.get("original")), times(b.get("optimized"))]


def _seconds(t: float) -> str:
    """A run's time with three significant digits in a unit that suits it: 19.2 µs, 4.31 ms, 1.20 s."""
    unit, v = ("s", t) if t >= 1 else ("ms", t * 1e3) if t >= 1e-3 else ("\u00b5s", t * 1e6)
    return f"{v:.{2 if v < 10 else 1 if v < 100 else 0}f} {unit}"


def _link(path: str | None, out_dir: str) -> str:
    if not path:
        return "-"
    rel = os.path.relpath(path, out_dir)
    return f'<a href="{e(rel)}">{e(rel)}</a>'


def model_table(records: list[dict], out_dir: str) -> str:
    head = ["model", "status", "reason", "speedup (band)", "original per run (p10-p90)", "optimized per run (p10-p90)",
            "verified lib/fallback", "optimize s"] + [n for _, n, _ in PHASES] + \
        ["nodes before->after", "ops before", "ops after", "output", "log"]
    rows = []
    for r in records:
        status = r["status"] + (f" ({r['previous_status']})" if r.get("previous_status") else "")
        phases = [f"{(r.get('offline') or {}).get(k, 0.0):.2f}" if r.get("offline") else "-" for k, _, _ in PHASES]
        cells = [e(r["model"]),
                 f'<span class="status" style="color:{STATUS_COLORS.get(r["status"], "#222")}">{e(status)}</span>',
                 e(r.get("reason") or ""), *_bench_cells(r), e(fmt_verified(r)), e(fmt_optimize_s(r)), *phases,
                 e(fmt_nodes(r)), e(_ops(r.get("ops_before"))), e(_ops(r.get("ops_after"))),
                 _link(r.get("output"), out_dir), _link(r.get("log"), out_dir)]
        numeric = {3, 4, 5, 7, 8, 9, 10, 11, 12}
        rows.append("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                     for i, c in enumerate(cells)) + "</tr>")
    return ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>")


def render_html(report: dict, out_dir: str) -> str:
    m, t, records = report["machine"], report["totals"], report["models"]
    machine = (f"{m['cpu']} ({m['cpus']} CPUs; {' '.join(m['isa']) or 'no AVX'}), onnxruntime {m['onnxruntime']}, "
               f"onnxopt {m['onnxopt']}, Python {m['python']}")
    counts = ", ".join(f"{n} {s}" for s, n in sorted(t["by_status"].items()))
    geo = f"; geometric mean speedup {t['geomean_speedup']:.3f}x over {t['benchmarked']} models" \
        if t.get("geomean_speedup") else ""
    note = report.get("bench_note")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>onnxopt batch: {e(report['out_dir'])}</title>", f"<style>{_CSS}</style></head><body>",
        f"<h1>onnxopt batch</h1><p>{t['models']} models: {e(counts)}{e(geo)}. Exit code {report['exit_code']}.</p>",
        f'<p class="small">Machine: {e(machine)}. Finished {e(report["finished_at"])}.</p>',
        f'<p class="small">{e(note)}</p>' if note else "",
        "<h2>Speedup over onnxruntime</h2>",
        '<p class="small">Bars: the ratio of the original\'s median time to the optimized model\'s (onnxopt bench, '
        "interleaved runs); whiskers: its band, from the original\'s p10 over the optimized model\'s p90 to the "
        "original\'s p90 over the optimized model\'s p10 (the spread of both sides). Log scale.</p>",
        speedup_chart(records),
        "<h2>Optimize time by phase</h2>", phase_chart(records),
        "<h2>Models</h2>", model_table(records, out_dir),
        "</body></html>", ""])
