"""The qconv executor's vector helpers (kinds/qconv/words.h, dw_plane.h), built alone: every variant of a panel's
byte sums (AVX-512BW, AVX2, SSE2, the plain loop, and the one the CPU picks), the word copies at steps 1, 2 and 3,
the interleave of 4 rows and the depthwise plane's padding and conversion to float, against numpy, on the variants
this CPU runs. The executor picks one by the CPU, so a single host would run only one."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess

import numpy as np
import pytest

import onnxopt.kinds.qconv as qconv
from onnxopt.codegen.target import HOST_LEVEL_ENV, missing_cpu_flags

PANEL = 16
HARNESS = r"""
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#define QC_PANEL 16
#include "words.h"
#include "dw_plane.h"
void dw_plane(float *out, const uint8_t *in, int64_t n, int64_t h, int64_t w, int64_t hp, int64_t wp, int64_t pt,
              int64_t pl, float za, int is_signed, int avx512) {
  qc_dw_plane(out, in, in + n, h, w, hp, wp, pt, pl, za, is_signed, avx512);
}
int dw_avx512(void) { return qc_dw_avx512(); }
#define ASUM(name, fn) \
  void name(int32_t *s, const uint8_t *p, int64_t groups, int is_signed) { fn(s, p, groups, is_signed); }
ASUM(asum_scalar, qc_asum_scalar)
ASUM(asum_dispatched, qc_words_asum)
#if defined(__x86_64__)
ASUM(asum_sse2, qc_asum_sse2)
ASUM(asum_avx2, qc_asum_avx2)
ASUM(asum_avx512, qc_asum_avx512)
#endif
void copy_words(uint32_t *o, const uint32_t *s, int n, int64_t step, uint32_t flip) {
  qc_copy_words(o, s, n, step, flip);
}
#define INTERLEAVE(name, fn) \
  void name(uint32_t *o, const uint8_t *r) { fn(o, r, r + 16, r + 32, r + 48); }
INTERLEAVE(interleave_plain, qc_interleave_plain)
INTERLEAVE(interleave_dispatched, qc_interleave)
#if defined(__x86_64__)
INTERLEAVE(interleave_vbmi, qc_interleave_vbmi)
void copy_words_avx512(uint32_t *o, const uint32_t *s, int n, int64_t step, uint32_t flip) {
  qc_copy_words_avx512(o, s, n, step, flip);
}
#endif
"""
X86 = platform.machine() in ("x86_64", "AMD64")
# variant -> the CPU flags it needs
VARIANTS = {"scalar": (), "dispatched": (), "sse2": (), "avx2": ("avx2",), "avx512": ("avx512bw",)} if X86 else \
    {"scalar": (), "dispatched": ()}


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    folder = tmp_path_factory.mktemp("words")
    src = folder / "harness.c"
    src.write_text(HARNESS)
    lib = folder / "harness.so"
    subprocess.run([cc, "-O2", "-std=c11", "-Wall", "-Werror", "-fPIC", "-shared", "-I",
                    os.path.dirname(qconv.__file__), str(src), "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("is_signed", [False, True])
@pytest.mark.parametrize("groups", [1, 3, 288])
def test_each_asum_variant_sums_every_pixels_bytes(words, variant, is_signed, groups):
    missing = missing_cpu_flags(VARIANTS[variant])
    if missing:
        pytest.skip(f"this CPU has no {', '.join(missing)}")
    rng = np.random.default_rng(groups)
    packed = rng.integers(0, 256, (groups, PANEL, 4)).astype(np.uint8)
    packed[0, 0] = 255  # the extremes: 4 x 255 (u8) and 4 x -1 (s8); 4 x 128 as s8 is -512
    packed[-1, 1] = 128
    want = (packed.view(np.int8) if is_signed else packed).astype(np.int64).sum(axis=(0, 2))
    got = np.full(PANEL, 12345, np.int32)
    getattr(words, f"asum_{variant}")(_ptr(got), _ptr(packed), ctypes.c_int64(groups), ctypes.c_int(int(is_signed)))
    np.testing.assert_array_equal(got, want)


# the AVX-512 copy takes steps 1 and 2 only: the dispatch sends the others to the plain loop
COPIES = [("dispatched", 1), ("dispatched", 2), ("dispatched", 3)] + ([("avx512", 1), ("avx512", 2)] if X86 else [])


@pytest.mark.parametrize("variant, step", COPIES)
@pytest.mark.parametrize("n", [0, 1, 4, 5, 9, 16])
def test_word_copies_take_every_steps_word_and_write_no_further(words, variant, step, n):
    if variant == "avx512":
        missing = missing_cpu_flags(("avx512f",))
        if missing:
            pytest.skip("this CPU has no avx512f")
    rng = np.random.default_rng(n * 10 + step)
    src = rng.integers(0, 2**32, max((n - 1) * step + 1, 1), dtype=np.uint64).astype(np.uint32)
    out = np.full(PANEL + 4, 7, np.uint32)
    flip = 0x80808080
    copy = words.copy_words if variant == "dispatched" else words.copy_words_avx512
    copy(_ptr(out), _ptr(src), ctypes.c_int(n), ctypes.c_int64(step), ctypes.c_uint32(flip))
    np.testing.assert_array_equal(out[:n], src[::step][:n] ^ np.uint32(flip))
    assert (out[n:] == 7).all()  # nothing written past the run


@pytest.mark.parametrize("variant", ["plain", "dispatched"] + (["vbmi"] if X86 else []))
def test_each_interleave_puts_pixel_ts_four_bytes_in_its_word(words, variant):
    if variant == "vbmi":
        missing = missing_cpu_flags(("avx512vbmi", "avx512bw"))
        if missing:
            pytest.skip(f"this CPU has no {', '.join(missing)}")
    rows = np.random.default_rng(4).integers(0, 256, (4, PANEL)).astype(np.uint8)
    out = np.zeros(PANEL + 2, np.uint32)
    getattr(words, f"interleave_{variant}")(_ptr(out), _ptr(rows))
    np.testing.assert_array_equal(out[:PANEL], np.ascontiguousarray(rows.T).view(np.uint32).reshape(-1))
    assert (out[PANEL:] == 0).all()


@pytest.mark.parametrize("avx512", [False, True] if X86 else [False])
@pytest.mark.parametrize("h, w, pt, pl, is_signed", [(5, 7, 1, 1, False), (3, 33, 2, 0, True), (4, 16, 0, 3, False)])
def test_depthwise_planes_are_padded_with_the_zero_point_as_float(words, avx512, h, w, pt, pl, is_signed,
                                                                  monkeypatch):
    with monkeypatch.context() as m:  # what the executor picks follows the CPU itself, not ONNXOPT_HOST_LEVEL's cap
        m.delenv(HOST_LEVEL_ENV, raising=False)
        assert bool(words.dw_avx512()) == (X86 and not missing_cpu_flags(("avx512f",)))
    if avx512 and missing_cpu_flags(("avx512f",)):
        pytest.skip("this CPU has no avx512f")
    rng = np.random.default_rng(h * w)
    x = rng.integers(0, 256, (h, w)).astype(np.uint8)
    za = -7.0 if is_signed else 9.0
    hp, wp = h + 2 * pt, pl + -(-w // 16) * 16 + 2  # room for a row's last 16 written whole (exec.c's rule)
    out = np.full(hp * wp + 4, 1234.5, np.float32)
    words.dw_plane(_ptr(out), _ptr(x), ctypes.c_int64(x.size), *(ctypes.c_int64(v) for v in (h, w, hp, wp, pt, pl)),
                   ctypes.c_float(za), ctypes.c_int(int(is_signed)), ctypes.c_int(int(avx512)))
    want = np.full((hp, wp), za, np.float32)
    want[pt:pt + h, pl:pl + w] = (x.view(np.int8) if is_signed else x).astype(np.float32)
    np.testing.assert_array_equal(out[:hp * wp].reshape(hp, wp), want)
    assert (out[hp * wp:] == 1234.5).all()  # nothing past the plane

