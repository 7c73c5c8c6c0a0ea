#!/usr/bin/env bash
# The GPU checks, run on the device machine (a CUDA GPU with CuPy): the WMMA description against tensor cores.
# onnxopt is put on the path as its package layout maps it (pyproject.toml's package-dir), without pip; pytest runs
# from outside the checkout so that the checkout's own onnxopt/ (without codegen/) is not imported instead.
set -uo pipefail
repo=$PWD
pkg=$(mktemp -d)
cp -r onnxopt "$pkg/onnxopt"
for d in codegen runtime cli models; do ln -s "$repo/$d" "$pkg/onnxopt/$d"; done
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
cd "$pkg" && PYTHONPATH="$pkg" python3 -m pytest -q -p no:cacheprovider -rs "$repo/tests/codegen/test_wmma_device.py" \
  2>&1 | tee "${OUT:-/tmp}/wmma.log"
