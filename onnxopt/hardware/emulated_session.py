"""Runs onnxruntime sessions inside the emulated aarch64 Python (emulator.py starts it under qemu-aarch64).

Standalone on purpose: the emulated side has only numpy and onnxruntime. argv[1] is a folder holding jobs.json, a
list of {"model", "library" (or null), "inputs": {name: .npy file}, "outputs": [.npy file per model output],
"threads", "optimization" ("all" or "none")}; each job's outputs are written there, and the files name the
folder's own paths."""

import json
import os
import sys

import numpy as np
import onnxruntime as ort


def run(folder: str) -> None:
    with open(os.path.join(folder, "jobs.json")) as f:
        jobs = json.load(f)
    for job in jobs:
        so = ort.SessionOptions()
        so.intra_op_num_threads = job["threads"]
        so.inter_op_num_threads = 1
        if job["optimization"] == "none":
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if job["library"]:
            so.register_custom_ops_library(job["library"])
        sess = ort.InferenceSession(job["model"], so, providers=["CPUExecutionProvider"])
        feeds = {name: np.load(os.path.join(folder, path)) for name, path in job["inputs"].items()}
        for path, value in zip(job["outputs"], sess.run(None, feeds)):
            np.save(os.path.join(folder, path), value)


if __name__ == "__main__":
    run(sys.argv[1])
