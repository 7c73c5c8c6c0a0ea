#!/usr/bin/env bash
# Installs everything onnxopt needs on a fresh Debian/Ubuntu machine: a C compiler and linker (the kernel library
# is linked with them), then the package with its test extras.
set -euo pipefail
if ! command -v cc >/dev/null 2>&1 || ! command -v ld >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq gcc binutils libc6-dev
fi
python3 -m pip install -q --upgrade pip
python3 -m pip install -q -e ".[test]"
