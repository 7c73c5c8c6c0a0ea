"""OpenVINO's own bfloat16 error, the bar `--precision bf16` is held to where OpenVINO reads the model (issue 46,
item 5: "within 1.25x of OpenVINO's own bf16 error on the same inputs where OpenVINO reads the model, else 2%
relative plus 1% of the output's range").

The float32 original runs in OpenVINO's CPU plugin with INFERENCE_PRECISION_HINT bf16 (what it picks by default on a
CPU with bf16 instructions) on the check inputs, in a process of its own: a runtime that stops the process on a model
it cannot take must not take the optimizer with it. Its error per float output is the precision cost's
`max_rel_error` (max |got - float32| / max |float32|), and onnxopt's written model passes an output when its own error
is at most OPENVINO_FACTOR times OpenVINO's. An output OpenVINO computes as exactly as float32 (an error below the
float32 check's own tolerance) is held to that tolerance instead of to zero.

Where there is no reference (openvino not installed, a CPU on which its plugin runs no bf16, a model it cannot read
or run, ONNXOPT_OPENVINO=0), the fixed bf16 tolerance applies, and the report says which bar was used and why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from onnxopt.verify import DEFAULT_STOL

OPENVINO_FACTOR = 1.25
TIMEOUT_S = 600

_SCRIPT = r"""
import json, sys
import numpy as np
import openvino as ov
folder, threads = sys.argv[1], int(sys.argv[2])
spec = json.load(open(folder + "/spec.json"))
core = ov.Core()
if "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
    print(json.dumps({"why": "OpenVINO's CPU plugin runs no bf16 on this CPU"}))
    sys.exit(0)
feeds = dict(np.load(folder + "/feeds.npz"))
model = core.read_model(spec["model"])
model.reshape({i.get_any_name(): ov.PartialShape(list(feeds[i.get_any_name()].shape)) for i in model.inputs
               if i.get_any_name() in feeds})
compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": threads})
result = compiled.create_infer_request().infer({k: v for k, v in feeds.items()
                                                if any(k in i.get_names() for i in compiled.inputs)})
outs = {}
for n in spec["names"]:
    port = next((o for o in compiled.outputs if n in o.get_names()), None)
    if port is not None:
        outs[n] = np.asarray(result[port])
np.savez(folder + "/outputs.npz", **{f"o{i}": outs[n] for i, n in enumerate(spec["names"]) if n in outs})
print(json.dumps({"version": ov.get_version(), "outputs": [n for n in spec["names"] if n in outs],
                  "precision": compiled.get_property("INFERENCE_PRECISION_HINT").to_string()}))
"""


def openvino_bf16_outputs(model_path: str, names: list[str], feeds: dict, folder: str,
                          threads: int | None) -> tuple[list | None, dict]:
    """OpenVINO's bf16 outputs of the float32 model at `model_path` for `feeds` (None for an output it does not give),
    and what to report: {"openvino": version} or {"why": why there is none}."""
    if os.environ.get("ONNXOPT_OPENVINO", "1") == "0":
        return None, {"why": "ONNXOPT_OPENVINO=0"}
    try:
        import importlib.util

        if importlib.util.find_spec("openvino") is None:
            return None, {"why": "openvino is not installed (pip install openvino)"}
    except (ImportError, ValueError):
        return None, {"why": "openvino is not installed (pip install openvino)"}
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "spec.json"), "w") as f:
        json.dump({"model": os.path.abspath(model_path), "names": list(names)}, f)
    np.savez(os.path.join(folder, "feeds.npz"), **{k: np.asarray(v) for k, v in feeds.items()})
    try:
        r = subprocess.run([sys.executable, "-c", _SCRIPT, folder, str(threads or 2)], capture_output=True, text=True,
                           timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return None, {"why": f"OpenVINO ran past {TIMEOUT_S} s on this model"}
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        last = (r.stderr.strip().splitlines() or ["it stopped without a message"])[-1][:300]
        return None, {"why": f"OpenVINO could not read or run the model: {last}"}
    info = json.loads(lines[-1])
    if "why" in info:
        return None, info
    got = dict(np.load(os.path.join(folder, "outputs.npz")))
    given = info.pop("outputs")
    outs = [got.get(f"o{names.index(n)}") if n in given else None for n in names]
    return outs, {"openvino": info["version"], "openvino_precision": info["precision"]}


def openvino_relative(diffs, ours: list[dict], theirs: list[dict]) -> list[dict]:
    """Judge each float output in `diffs` (verify.OutputDiff, changed in place) by OpenVINO's error: ok when
    onnxopt's max_rel_error is at most OPENVINO_FACTOR x OpenVINO's (or within float32's own check where OpenVINO's
    is below it). `ours`, `theirs`: precision_cost entries. Returns the bar per output, for the report."""
    mine = {c["output"]: c["max_rel_error"] for c in ours}
    ref = {c["output"]: c["max_rel_error"] for c in theirs}
    bars = []
    for d in diffs:
        if d.name not in mine or d.name not in ref:
            continue
        bar = max(OPENVINO_FACTOR * ref[d.name], DEFAULT_STOL["float32"])
        d.ok = mine[d.name] <= bar
        if not d.ok:
            d.detail = (f"max relative error {mine[d.name]:.3g}, past {OPENVINO_FACTOR}x OpenVINO's bf16 error "
                        f"{ref[d.name]:.3g} on the same inputs")
        bars.append({"output": d.name, "openvino_max_rel_error": ref[d.name], "max_rel_error": mine[d.name],
                     "bar": bar, "ok": d.ok})
    return bars
