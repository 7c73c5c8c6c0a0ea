"""The corpus's transformer models, whole, batch 1: onnxruntime, its transformers optimizer, OpenVINO and onnxopt.

    pip install -e ".[bench]"      # OpenVINO (the bench extra); without it that column stays empty
    python benchmarks/transformer_models.py [--list /tmp/corpus/transformers.txt] [--seqs 128,512] [--threads 2]
        [--min-time 6] [--only all_minilm_l6_v2,vit_tiny] [--out DIR] [--fused DIR] [--json results.json]

The list is a batch list file (`benchmarks/corpus.py` gathers the models): one model a line, relative to the list's
folder, with its `--input-shape NAME:DIMS` options. A text model (an input named like input_ids, attention_mask or
token_type_ids) whose sequence dim is symbolic runs at each --seqs length: the second dim of those inputs' shapes is
replaced by it. Any other model (pixel_values, input_features, or a text model exported at a fixed length) runs once,
at its listed or static shape ("fixed shape"). Quantized models (`int8` or `qdq` in the file name) are skipped: the
bars are for float32.

Per model and length, four ways of running it:

1. the original through onnxruntime (CPUExecutionProvider, ORT_ENABLE_ALL, --threads intra-op threads, spinning
   off: `onnxopt.timing.make_session`, as the project times everything);
2. the original after `onnxruntime.transformers.optimizer.optimize_model` (model_type bert for the BERT-like
   encoders and anything else, gpt2 for GPT-2, vit / swin where this onnxruntime has them; num_heads and hidden_size
   detected; the model type's default opt_level, 0 if that fails), once per model, through onnxruntime as in 1;
   the table gives the Attention-like nodes it fused;
3. OpenVINO (`openvino` from PyPI), the model read, reshaped to the timed static shape and compiled for CPU with
   INFERENCE_NUM_THREADS = --threads, INFERENCE_PRECISION_HINT f32 and the LATENCY hint;
4. onnxopt: `python -m onnxopt MODEL -o OUT --measure-shape ... --threads N` (checked and timed at the row's
   shapes, the model written with its symbolic dims still symbolic: one fused model serves every length; kernel
   measurement on, the default; the
   cost cache is the default one, so a rerun is faster offline: `--onnxopt-args=--no-cost-cache` times a first
   run), or the model `--fused DIR` already holds, run through onnxruntime with its library registered.

1, 2 and 4 are timed interleaved in one process (`onnxopt.timing.time_interleaved`: warmed blocks of runs, each side
in turn, --min-time seconds in all, the median block); OpenVINO right after, in the same process, on the same feeds,
with the same blocks (as many runs a block, each block warmed) for its share of --min-time (a third). Every output is
compared with the original's on those feeds (max abs diff; a "WRONG" flag past onnxopt's own default tolerance:
rtol 1e-3, atol 1e-4 plus 1e-5 of the output's largest magnitude).

Printed: the CPU, the versions, a markdown table (milliseconds; the ratios are the competitor's time over onnxopt's,
above 1 = onnxopt faster), the geomean of original / onnxopt per sequence length and overall, and the number of rows
where onnxopt is slower than each competitor: the issue's bars are a geomean of 1.3x or more at each length and no
row slower than any of the three. Files in --out (default: a temporary folder): `<stem>_seq<N>.onnx` (`<stem>_fixed`
for a fixed-shape model) with its `.so`, `.report.json` and `.log`, and `<stem>.ortopt.onnx`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import onnx

from onnxopt.runtime import written_session
from onnxopt.timing import make_session, time_interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus_sources import random_inputs  # noqa: E402

SEQ_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
QUANTIZED = ("int8", "qdq")
# onnxopt's own whole-model check (README: --rtol, --atol, --scale-tol defaults for float32)
RTOL, ATOL, SCALE_TOL = 1e-3, 1e-4, 1e-5


# ---------------------------------------------------------------- the list and the runs it asks for

def read_list(path: str) -> list[dict]:
    """The list file's entries: {stem, path, shapes: {input: dims}} (options other than --input-shape ignored)."""
    folder = os.path.dirname(os.path.abspath(path))
    entries = []
    with open(path) as f:
        for line in f:
            words = shlex.split(line, comments=True)
            if not words:
                continue
            shapes = {}
            rest = words[1:]
            for k, w in enumerate(rest):
                spec = None
                if w == "--input-shape" and k + 1 < len(rest):
                    spec = rest[k + 1]
                elif w.startswith("--input-shape="):
                    spec = w.split("=", 1)[1]
                if spec:
                    name, dims = spec.rsplit(":", 1)
                    shapes[name] = [int(d) for d in dims.split(",")] if dims else []
            file = words[0] if os.path.isabs(words[0]) else os.path.join(folder, words[0])
            stem = os.path.basename(file)[:-5] if file.endswith(".onnx") else os.path.basename(file)
            entries.append({"stem": stem, "path": file, "shapes": shapes})
    return entries


def graph_inputs(path: str) -> list[tuple[str, list]]:
    """(name, dims) of the model's real inputs; a symbolic or unknown dim is its name or None."""
    m = onnx.load(path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    out = []
    for i in m.graph.input:
        if i.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None)
                for d in i.type.tensor_type.shape.dim]
        out.append((i.name, dims))
    return out


def runs_for(entry: dict, seqs: list[int]) -> list[dict]:
    """The (sequence length, input shapes) a model runs at: {seq, label, shapes (every input, static), specs (the
    --input-shape options that fix them), fixed (bool)}."""
    inputs = graph_inputs(entry["path"])
    given = entry["shapes"]
    base = {n: list(given.get(n) or [d if isinstance(d, int) else 1 for d in dims]) for n, dims in inputs}
    symbolic = {n for n, dims in inputs if any(not isinstance(d, int) for d in dims)}
    text = [n for n, _ in inputs if any(s in n for s in SEQ_INPUTS)]
    dyn_seq = [n for n, dims in inputs if n in text and len(dims) >= 2 and not isinstance(dims[1], int)]

    def run(seq, shapes, fixed):
        specs = [f"{n}:{','.join(map(str, d))}" for n, d in shapes.items() if n in given or n in symbolic]
        label = f"seq{seq}" if seq else "fixed"
        return {"seq": seq, "label": label, "shapes": shapes, "specs": specs, "fixed": fixed}

    if dyn_seq:
        out = []
        for s in seqs:
            shapes = {n: (d[:1] + [s] + d[2:] if n in text and len(d) >= 2 else d) for n, d in base.items()}
            out.append(run(s, shapes, False))
        return out
    seq = base[text[0]][1] if text and len(base[text[0]]) >= 2 else None
    return [run(seq, base, True)]


# ---------------------------------------------------------------- the competitors

def transformers_model_type(stem: str) -> str:
    """The optimizer's model type: gpt2 for GPT-2, vit / swin where this onnxruntime has them, else bert (BERT,
    RoBERTa, DistilBERT, MiniLM, and the rest)."""
    from onnxruntime.transformers.optimizer import MODEL_TYPES

    s = stem.lower()
    for key, kind in (("gpt2", "gpt2"), ("vit", "vit"), ("swin", "swin")):
        if key in s and kind in MODEL_TYPES and not (key == "vit" and "mobilevit" in s):
            return kind
    return "bert"


def ort_transformers_optimize(src: str, dst: str, stem: str) -> dict:
    """optimize_model on the original, saved to dst: {path, model_type, opt_level, fused (op: count), attention,
    seconds} or {error}. The model type's default opt_level first (ORT basic optimizations, then the fusions),
    opt_level 0 (the fusions alone) if that raises."""
    try:
        from onnxruntime.transformers.optimizer import MODEL_TYPES, optimize_model
    except Exception as e:  # noqa: BLE001
        return {"error": f"onnxruntime.transformers.optimizer: {type(e).__name__}: {e}"}
    kind = transformers_model_type(stem)
    errors = []
    for level in dict.fromkeys([MODEL_TYPES[kind][2], 0]):
        t = time.perf_counter()
        logging.disable(logging.WARNING)  # its per-fusion warnings; what it fused is in the table
        try:
            m = optimize_model(src, model_type=kind, num_heads=0, hidden_size=0, opt_level=level, use_gpu=False)
            try:
                stats = dict(m.get_fused_operator_statistics())
            except Exception:  # noqa: BLE001  (not every optimizer class counts)
                stats = {}
            try:
                big = m.model.ByteSize() >= 2**31 - 1
            except Exception:  # noqa: BLE001
                big = True
            for stale in (dst, dst + ".data"):
                if os.path.exists(stale):
                    os.remove(stale)
            m.save_model_to_file(dst, use_external_data_format=big)
        except Exception as e:  # noqa: BLE001
            errors.append(f"opt_level {level}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        finally:
            logging.disable(logging.NOTSET)
        stats = {k: int(v) for k, v in stats.items() if v}
        return {"path": dst, "model_type": kind, "opt_level": level, "fused": stats, "errors_before": errors,
                "attention": sum(v for k, v in stats.items() if "Attention" in k), "seconds": time.perf_counter() - t}
    return {"error": "; ".join(errors), "model_type": kind}


def onnxopt_build(src: str, dst: str, specs: list[str], threads: int, extra: list[str]) -> dict:
    """The CLI on src: {path, library, seconds, emitted} or {error}."""
    for stale in (dst, dst + ".so", dst + ".data"):
        if os.path.exists(stale):
            os.remove(stale)
    cmd = [sys.executable, "-m", "onnxopt", src, "-o", dst, "--threads", str(threads), "--report",
           dst + ".report.json"]
    for s in specs:  # measured at this length, written dynamic (the list's own shapes are fixed: --input-shape)
        cmd += ["--measure-shape", s]
    cmd += extra
    t = time.perf_counter()
    with open(dst + ".log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    wall = time.perf_counter() - t
    if rc != 0 or not os.path.exists(dst):
        with open(dst + ".log") as f:
            last = [x for x in f.read().splitlines() if x.strip()][-1:] or [""]
        return {"error": f"onnxopt exit {rc}: {last[0].strip()} (log: {dst}.log)", "seconds": wall,
                "command": shlex.join(cmd)}
    return {**fused_files(dst), "seconds": wall, "command": shlex.join(cmd)}


def fused_files(path: str) -> dict:
    """A written model, its library (None when it was written unchanged) and what its report says was emitted."""
    out = {"path": path, "library": os.path.abspath(path + ".so") if os.path.exists(path + ".so") else None,
           "emitted": "-"}
    try:
        with open(path + ".report.json") as f:
            report = json.load(f)
    except (OSError, ValueError):
        return out
    w = report.get("whole_model") or {}
    if report.get("unchanged"):
        out["emitted"] = "unchanged: " + str(report["unchanged"]).split(";")[0][:80]
    elif report.get("fused_regions"):
        out["emitted"] = f"{w.get('plan', '-')} ({report['fused_regions']} kernels)"
    out["report_seconds"] = (report.get("timings") or {}).get("total_s")
    return out


_OV = {}


def openvino_module():
    """openvino, or None (said once)."""
    if "ov" not in _OV:
        try:
            import openvino as ov

            _OV["ov"] = ov
        except Exception as e:  # noqa: BLE001
            print(f"openvino is not importable ({type(e).__name__}: {e}): its column stays empty "
                  "(pip install -e '.[bench]')", flush=True)
            _OV["ov"] = None
    return _OV["ov"]


def openvino_compile(src: str, shapes: dict, threads: int):
    """The model compiled for CPU at these static input shapes, f32, `threads` threads, one latency stream."""
    ov = openvino_module()
    core = _OV.setdefault("core", ov.Core())
    model = core.read_model(src)
    model.reshape({n: ov.PartialShape(d) for n, d in shapes.items()})
    try:
        config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
        compiled = core.compile_model(model, "CPU", config)
    except Exception:  # noqa: BLE001  (older names: the properties API)
        import openvino.properties as props
        import openvino.properties.hint as hints

        config = {props.inference_num_threads: threads, hints.inference_precision: ov.Type.f32,
                  hints.performance_mode: hints.PerformanceMode.LATENCY}
        compiled = core.compile_model(model, "CPU", config)
    got = {}
    for key in ("INFERENCE_NUM_THREADS", "INFERENCE_PRECISION_HINT", "NUM_STREAMS"):
        try:
            got[key] = str(compiled.get_property(key))
        except Exception:  # noqa: BLE001
            pass
    return compiled, got


def openvino_outputs(compiled, request, names: list[str]) -> dict:
    """The request's outputs under the original's output names (by tensor name, else by position)."""
    outs = {}
    for k, port in enumerate(compiled.outputs):
        value = np.array(request.get_output_tensor(k).data)
        match = [n for n in names if n in port.get_names()]
        outs[match[0] if match else (names[k] if k < len(names) else f"#{k}")] = value
    return outs


def time_openvino(compiled, feeds: dict, runs_per_block: int, min_time: float, min_blocks: int = 5) -> dict:
    """time_interleaved's scheme for one side: blocks of `runs_per_block` runs, each block warmed by one run, until
    min_time and min_blocks; median, p10, p90, mean seconds per run over the blocks."""
    request = compiled.create_infer_request()
    request.infer(feeds, share_inputs=True)
    samples = []
    start = time.perf_counter()
    while len(samples) < min_blocks or time.perf_counter() - start < min_time:
        request.infer(feeds, share_inputs=True)  # warm
        t0 = time.perf_counter()
        for _ in range(runs_per_block):
            request.infer(feeds, share_inputs=True)
        samples.append((time.perf_counter() - t0) / runs_per_block)
    a = np.array(samples)
    return {"median": float(np.median(a)), "p10": float(np.percentile(a, 10)), "p90": float(np.percentile(a, 90)),
            "mean": float(a.mean()), "blocks": len(samples), "runs_per_block": runs_per_block}


# ---------------------------------------------------------------- checks

def compare(ref: dict, got: dict) -> dict:
    """Max abs diff over the original's outputs, and whether it is within onnxopt's default tolerance."""
    worst, ok, missing = 0.0, True, []
    for name, r in ref.items():
        if name not in got:
            missing.append(name)
            ok = False
            continue
        g = np.asarray(got[name])
        if g.shape != r.shape:
            missing.append(f"{name} shape {g.shape} != {r.shape}")
            ok = False
            continue
        if not np.issubdtype(r.dtype, np.number) or r.size == 0:
            ok = ok and np.array_equal(r, g)
            continue
        d = np.abs(g.astype(np.float64) - r.astype(np.float64))
        worst = max(worst, float(np.nanmax(d)) if d.size else 0.0)
        scale = float(np.nanmax(np.abs(r))) if r.size else 0.0
        ok = ok and bool(np.all(d <= ATOL + RTOL * np.abs(r) + SCALE_TOL * scale)) and not np.isnan(g).any()
    return {"max_abs": worst, "ok": ok, "missing": missing}


def run_outputs(session, feeds: dict) -> dict:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


# ---------------------------------------------------------------- one row

def bench_one(entry: dict, run: dict, a, work: str, ortopt: dict) -> dict:
    stem, src = entry["stem"], entry["path"]
    name = f"{stem}_{run['label']}"
    row = {"model": stem, "seq": run["seq"], "label": run["label"], "fixed": run["fixed"], "shapes": run["shapes"],
           "specs": run["specs"], "notes": []}
    if run["fixed"]:
        row["notes"].append("fixed shape")

    # onnxopt: an earlier build, or a new one
    fused = None
    if a.fused and os.path.exists(os.path.join(a.fused, name + ".onnx")):
        fused = fused_files(os.path.join(a.fused, name + ".onnx"))
        fused["seconds"] = fused.get("report_seconds")
        row["notes"].append(f"fused from {a.fused}")
    else:
        if a.fused:
            row["notes"].append(f"no {name}.onnx in --fused: built")
        fused = onnxopt_build(src, os.path.join(work, name + ".onnx"), run["specs"], a.threads,
                              shlex.split(a.onnxopt_args or ""))
    row["onnxopt"] = {k: v for k, v in fused.items() if k != "report_seconds"}
    if "error" in fused:
        row["notes"].append(fused["error"])

    # the onnxruntime sessions: original, transformers optimizer, onnxopt
    sessions, labels = [make_session(src, a.threads)], ["ort"]
    if "path" in ortopt:
        try:
            sessions.append(make_session(ortopt["path"], a.threads))
            labels.append("ortopt")
        except Exception as e:  # noqa: BLE001
            row["notes"].append(f"ORT-optimizer model does not load: {type(e).__name__}: {str(e)[:120]}")
    if "path" in fused:
        try:
            sessions.append(written_session(fused["path"], a.threads))  # as a user loads it
            labels.append("onnxopt")
        except Exception as e:  # noqa: BLE001
            row["notes"].append(f"onnxopt model does not load: {type(e).__name__}: {str(e)[:120]}")
    feeds = random_inputs(sessions[0], run["specs"], np.random.default_rng(0))
    ref = run_outputs(sessions[0], feeds)
    row["check"] = {}
    for label, s in zip(labels[1:], sessions[1:]):
        row["check"][label] = compare(ref, run_outputs(s, feeds))
    stats = time_interleaved(sessions, feeds, min_time=a.min_time, max_blocks=1_000_000, warm_below_s=math.inf)
    row["times"] = {label: st for label, st in zip(labels, stats)}
    runs_per_block = stats[0]["runs_per_block"]
    del sessions

    # OpenVINO, right after, on the same feeds and blocks
    if openvino_module() is not None:
        try:
            compiled, props = openvino_compile(src, run["shapes"], a.threads)
            request = compiled.create_infer_request()
            request.infer(feeds)
            row["check"]["openvino"] = compare(ref, openvino_outputs(compiled, request, list(ref)))
            del request
            row["times"]["openvino"] = time_openvino(compiled, feeds, runs_per_block, a.min_time / len(labels))
            row["openvino"] = props
            del compiled
        except Exception as e:  # noqa: BLE001
            row["openvino"] = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"}
            row["notes"].append("OpenVINO: " + row["openvino"]["error"])
    return row


def ms(row: dict, side: str) -> float | None:
    t = row.get("times", {}).get(side)
    return t["median"] * 1e3 if t else None


def fmt(x, spec=".2f", suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


def print_row(row: dict) -> None:
    ours = ms(row, "onnxopt")
    parts = [f"{row['model']} {row['label']}:"]
    for side, label in (("ort", "onnxruntime"), ("ortopt", "ORT-optimizer"), ("openvino", "OpenVINO"),
                        ("onnxopt", "onnxopt")):
        t = ms(row, side)
        ratio = f" ({t / ours:.3f}x)" if t and ours and side != "onnxopt" else ""
        parts.append(f"{label} {fmt(t)} ms{ratio},")
    chk = row.get("check", {}).get("onnxopt")
    parts.append(f"onnxopt max abs diff {fmt(chk['max_abs'], '.3g') if chk else '-'}"
                 + ("" if not chk or chk["ok"] else " WRONG"))
    if row["onnxopt"].get("seconds") is not None:
        parts.append(f"; optimize {row['onnxopt']['seconds']:.0f} s, {row['onnxopt'].get('emitted', '-')}")
    print(" ".join(parts), flush=True)
    for n in row["notes"]:
        print(f"    note: {n}", flush=True)


def summarize(rows: list[dict], threads: int) -> dict:
    print()
    print("| model | seq | ORT ms | ORT-optimizer ms (attention fused) | OpenVINO ms | onnxopt ms | orig/onnxopt | "
          "optimizer/onnxopt | openvino/onnxopt | max abs diff: onnxopt / optimizer / openvino | optimize s | "
          "onnxopt emitted |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "times" not in r:
            print(f"| {r['model']} | {r.get('label', '-')} | " + "- | " * 9 + f"{r.get('error', '-')} |")
            continue
        o = ms(r, "onnxopt")
        t = {s: ms(r, s) for s in ("ort", "ortopt", "openvino")}
        ratio = {s: (t[s] / o if t[s] and o else None) for s in t}
        att = r.get("ortopt", {}).get("attention")
        diffs = []
        for s in ("onnxopt", "ortopt", "openvino"):
            c = r.get("check", {}).get(s)
            diffs.append("-" if not c else f"{c['max_abs']:.2g}" + ("" if c["ok"] else " WRONG"))
        seq = str(r["seq"]) + (" (fixed shape)" if r["fixed"] else "") if r["seq"] else "fixed shape"
        print(f"| {r['model']} | {seq} | {fmt(t['ort'])} | {fmt(t['ortopt'])}"
              f"{'' if att is None else f' ({att})'} | {fmt(t['openvino'])} | {fmt(o)} | "
              f"{fmt(ratio['ort'], '.3f', 'x')} | {fmt(ratio['ortopt'], '.3f', 'x')} | "
              f"{fmt(ratio['openvino'], '.3f', 'x')} | {' / '.join(diffs)} | "
              f"{fmt(r['onnxopt'].get('seconds'), '.0f')} | {r['onnxopt'].get('emitted', '-')} |")
    timed = [r for r in rows if ms(r, "onnxopt") and ms(r, "ort")]
    groups = {}
    for r in timed:
        groups.setdefault(f"seq {r['seq']}" if r["seq"] else "fixed shape", []).append(r)  # a fixed-length text model
        # counts at its length
    summary = {"geomean_original_over_onnxopt": {}, "slower_than": {}, "rows": len(rows), "timed": len(timed)}
    print()
    for key in sorted(groups, key=lambda k: (k == "fixed shape", int(k.split()[1]) if k.startswith("seq ") else 0)):
        g = geomean([ms(r, "ort") / ms(r, "onnxopt") for r in groups[key]])
        summary["geomean_original_over_onnxopt"][key] = g
        print(f"geomean original / onnxopt, {key}: {g:.3f}x ({len(groups[key])} models)")
    overall = geomean([ms(r, "ort") / ms(r, "onnxopt") for r in timed])
    summary["geomean_original_over_onnxopt"]["overall"] = overall
    print(f"geomean original / onnxopt, all rows: {fmt(overall, '.3f', 'x')} ({len(timed)} rows, {threads} threads, "
          "batch 1)")
    for side, label in (("ort", "the original (onnxruntime)"), ("ortopt", "the ORT transformers optimizer"),
                        ("openvino", "OpenVINO")):
        both = [r for r in timed if ms(r, side)]
        slower = [f"{r['model']} {r['label']}" for r in both if ms(r, "onnxopt") > ms(r, side)]
        summary["slower_than"][side] = {"rows": slower, "compared": len(both)}
        print(f"onnxopt slower than {label}: {len(slower)} of {len(both)} rows"
              + (f" ({', '.join(slower)})" if slower else ""))
    wrong = [f"{r['model']} {r['label']}" for r in rows if not r.get("check", {}).get("onnxopt", {"ok": True})["ok"]]
    summary["onnxopt_wrong"] = wrong
    print(f"onnxopt outputs past tolerance: {len(wrong)}" + (f" ({', '.join(wrong)})" if wrong else ""))
    failed = [f"{r['model']} {r.get('label', '')}".strip() for r in rows if "times" not in r or not ms(r, "onnxopt")]
    if failed:
        print(f"rows without an onnxopt time: {', '.join(failed)}")
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--list", default="/tmp/corpus/transformers.txt", help="the models (a batch list file)")
    p.add_argument("--only", help="comma-separated model stems")
    p.add_argument("--seqs", default="128,512", help="sequence lengths of the text models")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=6.0,
                   help="seconds of the interleaved onnxruntime timing per model and length (its three sessions "
                        "share them); OpenVINO is timed for a third of it")
    p.add_argument("--out", help="work folder (default: a temporary one)")
    p.add_argument("--fused", help="use the fused models already in this folder (<stem>_seq<N>.onnx, "
                                   "<stem>_fixed.onnx, with their .so), building only the missing ones")
    p.add_argument("--json", help="write every row and the summary here")
    p.add_argument("--onnxopt-args", default="", help="more options for the onnxopt CLI (one string)")
    a = p.parse_args(argv)
    seqs = [int(s) for s in a.seqs.split(",") if s]
    entries = read_list(a.list)
    if a.only:
        want = set(a.only.split(","))
        unknown = want - {e["stem"] for e in entries}
        if unknown:
            p.error(f"--only: not in {a.list}: {', '.join(sorted(unknown))}")
        entries = [e for e in entries if e["stem"] in want]

    import onnxruntime as ort

    import onnxopt

    ov = openvino_module()
    versions = {"onnxruntime": ort.__version__, "openvino": ov.__version__ if ov else None,
                "onnx": onnx.__version__, "onnxopt": getattr(onnxopt, "__version__", "?"),
                "python": platform.python_version()}
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical cores); {a.threads} threads, batch 1, f32")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = a.out or tmp
        os.makedirs(work, exist_ok=True)
        for e in entries:
            stem = e["stem"]
            if any(q in os.path.basename(e["path"]).lower() for q in QUANTIZED):
                print(f"skip {stem}: quantized (int8 / QDQ in the name); the bars are for float32 models", flush=True)
                continue
            if not os.path.exists(e["path"]):
                print(f"skip {stem}: {e['path']} is missing (benchmarks/corpus.py gathers it)", flush=True)
                rows.append({"model": stem, "label": "-", "error": "missing", "onnxopt": {}})
                continue
            try:
                runs = runs_for(e, seqs)
                ortopt = ort_transformers_optimize(e["path"], os.path.join(work, f"{stem}.ortopt.onnx"), stem)
                if "error" in ortopt:
                    print(f"{stem}: the ORT transformers optimizer ({ortopt.get('model_type')}) failed: "
                          f"{ortopt['error']}", flush=True)
                else:
                    print(f"{stem}: ORT transformers optimizer, model_type {ortopt['model_type']}, opt_level "
                          f"{ortopt['opt_level']}: fused {ortopt['fused'] or 'nothing'} "
                          f"({ortopt['seconds']:.0f} s)", flush=True)
            except Exception as ex:  # noqa: BLE001
                print(f"{stem}: failed: {type(ex).__name__}: {ex}", flush=True)
                rows.append({"model": stem, "label": "-", "error": f"{type(ex).__name__}: {ex}", "onnxopt": {}})
                continue
            for run in runs:
                try:
                    row = bench_one(e, run, a, work, ortopt)
                except Exception as ex:  # noqa: BLE001
                    traceback.print_exc()
                    row = {"model": stem, "label": run["label"], "seq": run["seq"], "fixed": run["fixed"],
                           "error": f"{type(ex).__name__}: {str(ex)[:200]}", "onnxopt": {}, "notes": []}
                    print(f"{stem} {run['label']}: failed: {row['error']}", flush=True)
                    rows.append(row)
                    continue
                row["ortopt"] = {k: v for k, v in ortopt.items() if k != "path"}
                rows.append(row)
                print_row(row)
        summary = summarize(rows, a.threads)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu_model(), "threads": a.threads, "versions": versions, "min_time": a.min_time,
                       "rows": rows, "summary": summary}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
