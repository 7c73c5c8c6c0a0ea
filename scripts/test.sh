#!/usr/bin/env bash
# Runs the whole test suite on 2 workers and prints the ONNX conformance counts; on a host with AVX-512, runs it
# again as an AVX2 host sees it (ONNXOPT_HOST_LEVEL=x86-64-v3); then the serving and fallback tests with the oldest
# onnxruntime that pyproject.toml admits (.venv-ort-oldest, made by scripts/install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
report="$(mktemp -d)/conformance.jsonl"
ONNXOPT_CONFORMANCE_REPORT="$report" python3 -m pytest -n 2 -q -p no:cacheprovider "$@"
if [ -s "$report" ]; then python3 tests/conformance/summarize.py "$report"; fi
if grep -qw avx512f /proc/cpuinfo; then
  echo "== the suite again as an AVX2 host (ONNXOPT_HOST_LEVEL=x86-64-v3)"
  ONNXOPT_HOST_LEVEL=x86-64-v3 python3 -m pytest -n 2 -q -p no:cacheprovider "$@"
fi
if [ -x .venv-ort-oldest/bin/python ]; then
  echo "== serving and fallback tests with onnxruntime $(.venv-ort-oldest/bin/python -c 'import onnxruntime as o; print(o.__version__)')"
  .venv-ort-oldest/bin/python -m pytest -n 2 -q -p no:cacheprovider tests/runtime tests/emit/test_fallback_valid.py \
    tests/graph/test_quantized.py tests/cli/test_cli.py
fi
