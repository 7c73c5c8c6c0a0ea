#!/usr/bin/env bash
# Runs the whole test suite on 2 workers, then prints the ONNX conformance counts.
set -euo pipefail
cd "$(dirname "$0")/.."
report="$(mktemp -d)/conformance.jsonl"
ONNXOPT_CONFORMANCE_REPORT="$report" python3 -m pytest -n 2 -q -p no:cacheprovider "$@"
if [ -s "$report" ]; then python3 tests/conformance/summarize.py "$report"; fi
