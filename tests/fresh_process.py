"""A written model run as a user runs it: through the public loader (onnxopt.runtime) in a new Python process, with
its library's kernel calls counted there, so a test sees that the kernels ran and not the function bodies."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

SCRIPT = """
import json, sys
import numpy as np
import onnxopt.runtime as rt
from onnxopt.runtime.kernel_calls import bf16_tensors, kernel_calls
from onnxopt.runtime.matrix_engine import amx_status
model, x, out = sys.argv[1:4]
s = rt.InferenceSession(model)
lib = rt.registered_library(s, loadable=True)
assert lib, "the loader did not register the library"
feeds = dict(np.load(x)) if x.endswith(".npz") else {s.get_inputs()[0].name: np.load(x)}
np.save(out, s.run(None, feeds)[0])
chk = rt.check_library(model)
amx = amx_status(lib)
print(json.dumps({"calls": {k: v for k, v in kernel_calls(lib).items() if v}, "precision": chk.precision,
                  "detail": chk.precision_detail, "amx": amx["state"], "amx_units": amx["units"],
                  "bf16_tensors": bf16_tensors(lib)}))
"""


def run_written(model_path, x, folder, env: dict | None = None) -> tuple[np.ndarray, dict]:
    """The model's first output for `x` (its one input, or a dict of inputs by name) and what the loader said:
    {"calls": {op type: Compute calls}, "precision", "detail", "amx": whether the AMX tiles ran, or why not,
    "amx_units": {unit: "runs" or why not}, "bf16_tensors": tensors its sequences kept in bfloat16}."""
    if isinstance(x, dict):
        feeds = folder / "x.npz"
        np.savez(feeds, **x)
    else:
        feeds = folder / "x.npy"
        np.save(feeds, x)
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(model_path), str(feeds), str(folder / "got.npy")],
                       check=False, capture_output=True, text=True, cwd=str(folder), timeout=120,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr
    return np.load(folder / "got.npy"), json.loads(r.stdout.strip().splitlines()[-1])


def kernel_ran(written, op_type: str, calls: dict) -> int:
    """How many times the kernel `op_type` of the written model (an onnx.ModelProto) was called, on its own node or
    inside a sequence node (whose function calls its kernels' ops in order): `calls` is run_written's "calls"."""
    members = {f.name: {n.op_type for n in f.node} for f in written.functions}
    return calls.get(op_type, 0) + sum(v for k, v in calls.items() if op_type in members.get(k, ()))


def assert_written_model_runs(src, written_path, feeds, op_type: str, folder, rtol=1e-4, atol=1e-4) -> None:
    """The written model gives the original's first output in a fresh process through the loader, its kernel
    `op_type` ran there (on its node or inside a sequence), and its function bodies alone give the answer too."""
    import onnx
    import onnxruntime as ort

    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got, said = run_written(written_path, feeds, folder)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    assert kernel_ran(onnx.load(str(written_path)), op_type, said["calls"]), said["calls"]
    fallback = ort.InferenceSession(str(written_path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(fallback, want, rtol=rtol, atol=atol)
