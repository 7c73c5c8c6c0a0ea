#!/usr/bin/env bash
# Runs the whole test suite on 2 workers and prints the ONNX conformance counts; on a host with AVX-512, runs the
# tests whose kernels follow the host's vector width again as an AVX2 host sees them (ONNXOPT_HOST_LEVEL=x86-64-v3);
# then the serving and fallback tests with the oldest onnxruntime that pyproject.toml admits (.venv-ort-oldest, made
# by scripts/install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
report="$(mktemp -d)/conformance.jsonl"
ONNXOPT_CONFORMANCE_REPORT="$report" python3 -m pytest -n 2 -q -p no:cacheprovider "$@"
if [ -s "$report" ]; then python3 tests/conformance/summarize.py "$report"; fi
# The AVX2 leg leaves out what does not change with the host's width, so that CI stays under 45 minutes on 2 cores:
# the whole-model corpus and the ONNX conformance cases (the same kernels end to end, half of the suite's time; an
# AVX2 host runs them natively), the AMX and aarch64 tests (their own targets, emulated tiles or qemu), the batch,
# CLI, fuzzing and hostile-input tests (processes, files and messages) and the large-model loader tests.
AVX2_LEAVES_OUT=(tests/corpus tests/conformance tests/batch tests/cli tests/fuzz tests/hostile
  tests/graph/test_large_models.py tests/kinds/test_int8_aarch64.py tests/kinds/test_attention_amx.py
  tests/kinds/test_qconv_amx.py tests/kinds/test_qmatmul_amx.py tests/codegen/test_amx_bf16.py
  tests/codegen/test_amx_conv.py tests/codegen/test_amx_fp16.py tests/codegen/test_amx_fp16_conv.py)
if grep -qw avx512f /proc/cpuinfo && [ $# -eq 0 ]; then
  echo "== the width-dependent tests again as an AVX2 host (ONNXOPT_HOST_LEVEL=x86-64-v3)"
  ONNXOPT_HOST_LEVEL=x86-64-v3 python3 -m pytest -n 2 -q -p no:cacheprovider \
    $(printf -- '--ignore=%s ' "${AVX2_LEAVES_OUT[@]}")
elif grep -qw avx512f /proc/cpuinfo; then
  echo "== the same tests again as an AVX2 host (ONNXOPT_HOST_LEVEL=x86-64-v3)"
  ONNXOPT_HOST_LEVEL=x86-64-v3 python3 -m pytest -n 2 -q -p no:cacheprovider "$@"
fi
if [ -x .venv-ort-oldest/bin/python ]; then
  echo "== serving and fallback tests with onnxruntime $(.venv-ort-oldest/bin/python -c 'import onnxruntime as o; print(o.__version__)')"
  .venv-ort-oldest/bin/python -m pytest -n 2 -q -p no:cacheprovider tests/runtime tests/emit/test_fallback_valid.py \
    tests/graph/test_quantized.py tests/cli/test_cli.py
fi
