#!/usr/bin/env bash
# The aarch64 cross toolchain and emulated runtime (`--target aarch64`, onnxopt/hardware/emulator.py):
#   - Debian's gcc-aarch64-linux-gnu (links the kernel library) and qemu-user (runs aarch64 code on this host);
#   - an aarch64 sysroot with Debian's Python 3.11 and the aarch64 wheels of numpy and onnxruntime, where an
#     onnxruntime session loads an aarch64 library under qemu-aarch64.
# Idempotent: a complete sysroot (its stamp names the versions) is left as it is.
# onnxruntime 1.29 and newer segfault at import under Debian 12's qemu 7.2; 1.26 is the newest that imports there.
set -euo pipefail
ORT_VERSION="${ONNXOPT_AARCH64_ORT:-1.26.0}"
NUMPY_VERSION="2.3.5"
DEST="${ONNXOPT_AARCH64_SYSROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/onnxopt/aarch64}"
STAMP="python3.11 onnxruntime-${ORT_VERSION} numpy-${NUMPY_VERSION}"
if [ -f "$DEST/stamp" ] && [ "$(cat "$DEST/stamp")" = "$STAMP" ]; then
  exit 0
fi
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ! command -v qemu-aarch64 >/dev/null 2>&1 || ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null
fi
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64
fi
$SUDO apt-get update -qq
rm -rf "$DEST.part" && mkdir -p "$DEST.part/debs" "$DEST.part/root" "$DEST.part/site" "$DEST.part/wheels"
chmod 777 "$DEST.part/debs"  # apt-get download drops root to _apt where it can
(cd "$DEST.part/debs" && apt-get download -qq python3.11-minimal:arm64 libpython3.11-minimal:arm64 \
  libpython3.11-stdlib:arm64 zlib1g:arm64 libexpat1:arm64 libffi8:arm64 libstdc++6:arm64 libgcc-s1:arm64 \
  libc6:arm64 2>/dev/null)
for deb in "$DEST.part"/debs/*.deb; do dpkg -x "$deb" "$DEST.part/root"; done
python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_aarch64 \
  --platform manylinux2014_aarch64 --python-version 3.11 -d "$DEST.part/wheels" \
  "onnxruntime==${ORT_VERSION}" "numpy==${NUMPY_VERSION}"
for whl in "$DEST.part"/wheels/*.whl; do python3 -m zipfile -e "$whl" "$DEST.part/site"; done
rm -rf "$DEST.part/debs" "$DEST.part/wheels"
qemu-aarch64 -L "$DEST.part/root" -E PYTHONPATH="$DEST.part/site" "$DEST.part/root/usr/bin/python3.11" \
  -c "import numpy, onnxruntime; assert onnxruntime.__version__ == '${ORT_VERSION}'"
echo "$STAMP" > "$DEST.part/stamp"
rm -rf "$DEST" && mv "$DEST.part" "$DEST"
