#!/usr/bin/env bash
# Installs everything onnxopt needs on a fresh Debian/Ubuntu machine: a C compiler and linker (the kernel library
# is linked with them), the aarch64 cross toolchain and emulator (scripts/aarch64_sysroot.sh), then the package with
# its test extras, then a second environment with the oldest
# onnxruntime that pyproject.toml admits (.venv-ort-oldest), where the serving and fallback tests run again.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cc >/dev/null 2>&1 || ! command -v ld >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq gcc binutils libc6-dev
fi
# --target aarch64-dotprod: the cross compiler, qemu-user and an emulated onnxruntime (tests run the kernels there)
bash scripts/aarch64_sysroot.sh
python3 -m pip install -q --upgrade pip
python3 -m pip install -q -e ".[test]"
oldest="$(sed -n 's/.*"onnxruntime>=\([0-9.]*\)".*/\1/p' pyproject.toml)"
python3 -m venv --system-site-packages .venv-ort-oldest
.venv-ort-oldest/bin/python -m pip install -q "onnxruntime==${oldest}.*"
