"""Human-readable reports with rich: the before/after table, fused and rejected regions, predicted vs measured."""

from __future__ import annotations

import os
from collections import Counter, defaultdict

from rich.console import Console
from rich.table import Table

# Without a terminal (a pipe, a log file, CI) rich lays tables out at 80 columns and splits words across lines
# ("Optimiz" / "ed"); there the width is one no table reaches, unless COLUMNS says otherwise.
UNWRAPPED_WIDTH = 1000


def make_console(stderr: bool = False, quiet: bool = False) -> Console:
    console = Console(stderr=stderr, quiet=quiet)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(stderr=stderr, quiet=quiet, width=UNWRAPPED_WIDTH)
    return console


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


def render_optimize_report(report: dict, console: Console | None = None, verbose: bool = False) -> None:
    console = console or make_console(stderr=True)
    before, after = report.get("before", {}), report.get("after", {})
    t = Table(title="onnxopt", show_lines=False)
    t.add_column("")
    t.add_column("Original Model", justify="right")
    t.add_column("Optimized Model", justify="right")
    for op in sorted(set(before) | set(after), key=lambda k: (-before.get(k, 0), k)):
        b, a = before.get(op, 0), after.get(op, 0)
        style = "green" if a < b else ("cyan" if a > b else "")
        t.add_row(op, str(b), f"[{style}]{a}[/{style}]" if style else str(a))
    t.add_section()
    t.add_row("Nodes", str(sum(before.values())), str(sum(after.values())))
    out = report.get("output") or {}
    t.add_row("Model Size", _fmt_bytes(report.get("input", {}).get("size_bytes")), _fmt_bytes(out.get("size_bytes")))
    if out.get("library"):
        t.add_row("Kernel Library", "", f"{os.path.basename(out['library'])} ({_fmt_bytes(os.path.getsize(out['library']))})")
    t.add_row("Elapsed Time", "", f"{report.get('timings', {}).get('total_s', 0):.2f} s")
    off = report.get("offline")
    if off:  # OptiFX's Table 7 split
        t.add_row("  search / codegen / measurement", "",
                  f"{off['search_s']:.1f} / {off['codegen_s']:.1f} / {off['measurement_s']:.1f} s")
    console.print(t)
    _render_afusion(report, console)
    _render_siblings(report, console)

    regions = report.get("regions", [])
    if regions:
        rt = Table(title=f"Fused regions: {len(regions)}")
        for c in ("pattern", "count", "speedup (median)", "predicted µs", "measured µs", "GB/s", "% of level bw",
                  "G(FL)OP/s (% of peak)"):
            rt.add_column(c, justify="right" if c != "pattern" else "left")
        groups = defaultdict(list)
        for r in regions:
            groups[r["ops"]].append(r)
        for ops, rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            sp = sorted(r["speedup"] for r in rs if "speedup" in r)
            pred = sum(r.get("predicted_s", 0) for r in rs) * 1e6
            timed = [r["measured_fused_s"] for r in rs if "measured_fused_s" in r]  # none where not run here
            bw = [r["achieved_bandwidth"] for r in rs if "achieved_bandwidth" in r]
            frac = [r["bandwidth_fraction"] for r in rs if "bandwidth_fraction" in r]
            fl = [(r["achieved_flops"], r.get("peak_fraction", 0)) for r in rs if "achieved_flops" in r]
            best = max(fl) if fl else None
            # int8 kernels' integer ops against the int8 peak: GOP/s, marked
            unit = " int8" if any(r.get("arithmetic") in ("int8", "amx_int8") for r in rs) else ""
            rt.add_row(ops, str(len(rs)), f"{sp[len(sp) // 2]:.2f}x" if sp else "-", f"{pred:.1f}",
                       f"{sum(timed) * 1e6:.1f}" if timed else "-",
                       f"{max(bw) / 1e9:.1f}" if bw else "-", f"{100 * max(frac):.0f}%" if frac else "-",
                       f"{best[0] / 1e9:.1f}{unit} ({100 * best[1]:.0f}%)" if best else "-")
        console.print(rt)
    rejected = report.get("rejected", [])
    if rejected:
        reasons = Counter(r["reason"].split(" (")[0] for r in rejected)
        rj = Table(title=f"Regions not fused: {len(rejected)}")
        rj.add_column("reason")
        rj.add_column("count", justify="right")
        for reason, n in reasons.most_common(None if verbose else 10):
            rj.add_row(reason, str(n))
        console.print(rj)
    _render_precision(report.get("precision"), console, verbose)
    v = report.get("verification")
    if report.get("kernels_not_run"):
        if v and v.get("emulated"):
            console.print(f"[yellow]cross-compiled[/yellow]: {report['kernels_not_run']}; the whole model ran with "
                          f"its library under emulation ({v['emulated']})")
        else:
            console.print(f"[yellow]cross-compiled[/yellow]: {report['kernels_not_run']}. No kernel of the library "
                          "ran here; only the function bodies (the original ops) were checked"
                          + (f" ({report['emulation']})" if report.get("emulation") else ""))
    if report.get("unchanged"):
        v = None  # the written model is the original: nothing of ours to vouch for
    if v and "outputs" in v:
        worst = max((o["max_abs"] for o in v["outputs"]), default=0.0)
        how = "with the kernel library" if v.get("library") else "through the function bodies, without the library"
        if v.get("emulated"):
            how = f"with the kernel library under {v['emulated']}"
        console.print(f"[green]verified[/green] {how}: {len(v['outputs'])} outputs match the original "
                      f"(max abs diff {worst:.3g})" if v["ok"] else "[red]verification failed[/red]")
    fb = report.get("fallback_verification")
    if fb and "outputs" in fb and v and v.get("library"):
        worst = max((o["max_abs"] for o in fb["outputs"]), default=0.0)
        console.print(f"[green]verified without the library[/green] (as a host without it runs the model): "
                      f"max abs diff {worst:.3g}" if fb["ok"] else "[red]the fallback differs[/red]")
    if report.get("unchanged"):
        console.print(f"[yellow]written unchanged[/yellow]: {report['unchanged']}")


def _render_afusion(report: dict, console: Console) -> None:
    """The AFUSION pairs of the afusion plan: the search's roofline saving and the measured one (our two separate
    kernels against the fused kernel), whether or not the whole-model timing kept the plan."""
    pairs = (report.get("afusion") or {}).get("pairs") or []
    ms = (report.get("search") or {}).get("measured_search") or {}
    if "afusion_after" in ms:
        console.print(f"AFUSION groups chosen by the search on measured times: {len(ms['afusion_after'])} "
                      f"(the roofline's search chose {len(ms['afusion_before'])}; {ms['kernels_timed']} kernels "
                      f"timed, {ms['estimated_kernels']} costed by the calibrated roofline)")
    if not pairs:
        return
    plan = (report.get("whole_model") or {}).get("plan")
    at = Table(title=f"AFUSION pairs: {len(pairs)}" + (f" (emitted plan: {plan})" if plan else ""))
    for c in ("first conv", "band rows", "predicted saving µs", "measured saving µs", "vs separate",
              "vs onnxruntime"):
        at.add_column(c, justify="left" if c == "first conv" else "right", no_wrap=c == "first conv")
    for p in pairs:
        pred, meas = p.get("predicted") or {}, p.get("measured") or {}
        first = p["nodes"][0]
        at.add_row(first if len(first) <= 24 else "…" + first[-23:], str(p["band_rows"]),
                   f"{pred['saving_s'] * 1e6:.1f}" if pred else "-",
                   f"{meas['saving_s'] * 1e6:.1f}" if meas else "-",
                   f"{meas['speedup']:.2f}x" if meas else "-",
                   f"{meas['onnxruntime_s'] / meas['fused_s']:.2f}x" if meas else "-")
    console.print(at)


def _render_siblings(report: dict, console: Console) -> None:
    """The sibling groups fused (horizontal fusion): their convolutions and the measured saving."""
    groups = (report.get("horizontal") or {}).get("groups") or []
    if not groups:
        return
    plan = (report.get("whole_model") or {}).get("plan")
    t = Table(title=f"Sibling groups (horizontal fusion): {len(groups)}" + (f" (emitted plan: {plan})" if plan else ""))
    for c in ("convolutions", "measured saving µs", "vs separate", "vs onnxruntime"):
        t.add_column(c, justify="left" if c == "convolutions" else "right")
    for g in groups:
        m = g.get("measured") or {}
        names = ", ".join(g["convs"])
        t.add_row(names if len(names) <= 48 else names[:47] + "…", f"{m['saving_s'] * 1e6:.1f}" if m else "-",
                  f"{m['speedup']:.2f}x" if m else "-", f"{m['onnxruntime_s'] / m['fused_s']:.2f}x" if m else "-")
    console.print(t)


def render_bench(result: dict, console: Console | None = None) -> None:
    console = console or make_console()
    how = "spinning on, one session at a time" if result.get("spinning") else "interleaved"
    t = Table(title=f"onnxopt bench ({result['threads']} threads, {how})")
    for c in ("model", "median ms", "p10 ms", "p90 ms", "library"):
        t.add_column(c, justify="right" if c not in ("model", "library") else "left")
    for side in ("a", "b"):
        s = result[side]
        t.add_row(s["path"], f"{s['median'] * 1e3:.3f}", f"{s['p10'] * 1e3:.3f}", f"{s['p90'] * 1e3:.3f}",
                  ("yes" if s["library"] else "-")
                  + (f" ({s['precision']} weights)" if s.get("precision", "fp32") != "fp32" else ""))
    console.print(t)
    match = "outputs match" if result["outputs_match"] else "[red]outputs differ[/red]"
    console.print(f"speedup (A/B): [bold]{result['speedup']:.3f}x[/bold]  ({match}, "
                  f"max abs diff {result['max_abs_diff']:.3g})")


def _render_precision(p: dict | None, console, verbose: bool) -> None:
    """--precision: the path the target takes, the regions lowered and kept float32 (why), and the cost against the
    float32 original (onnxopt/driver/precision.py)."""
    if not p:
        return
    written = p.get("written") or {}
    console.print(f"[cyan]precision {p['requested']}[/cyan]: {p['kernels']}; "
                  f"{written.get('lowered_regions', 0)} lowered kernels written (of "
                  f"{p.get('lowered_candidates', 0)} candidates), "
                  f"{len(p.get('float32_regions', []))} written regions kept float32")
    for e in p.get("float32_regions", [])[:None if verbose else 5]:
        console.print(f"  float32: {', '.join(e['nodes'][:2])}: {e['reason']}")
    for c in p.get("cost", []):
        top1 = f", top-1 {'agrees' if c['top1_agrees'] else 'differs'}" if "top1_agrees" in c else ""
        console.print(f"  cost on {c['output']}: max rel {c['max_rel_error']:.3g}, mean rel {c['mean_rel_error']:.3g},"
                      f" cosine {c['cosine']:.6f}{top1}")
    ref = p.get("reference")
    if ref:  # the whole-model bar --precision bf16 was held to (onnxopt/driver/openvino_reference.py)
        why = f" ({ref['why']})" if "why" in ref else f" (OpenVINO {ref['openvino'].split('-')[0]})"
        console.print(f"  held to {ref['bar']}{why}")
        for o in ref.get("outputs", []):
            console.print(f"    {o['output']}: {o['max_rel_error']:.3g} against OpenVINO's "
                          f"{o['openvino_max_rel_error']:.3g} (at most {o['bar']:.3g})")
