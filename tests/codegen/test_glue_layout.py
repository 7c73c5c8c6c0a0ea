"""The glue indexes ORT's C API table by position. Check those positions against the installed onnxruntime.

A small C program (no ORT header) loads the wheel's libonnxruntime, asks for the API version the glue asks for, and
calls the entries the glue uses in ways whose results are known: CreateStatus / GetErrorCode / GetErrorMessage /
ReleaseStatus round trip, KernelContext_ParallelFor with a NULL context (documented to fail with code 6), and the
size of the OrtCustomOp struct the glue declares.
"""

import glob
import os
import re
import shutil
import subprocess

import onnxruntime
import pytest

from onnxopt.codegen.glue import kinds
from onnxopt.codegen.glue.library import library_source
from onnxopt.codegen.target import host_target

PROBE = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <stdint.h>
typedef void *const *Table;
typedef struct { Table (*GetApi)(uint32_t); const char *(*GetVersionString)(void); } Base;
typedef void *(*create_t)(int, const char *);
typedef int (*code_t)(const void *);
typedef const char *(*msg_t)(const void *);
typedef void (*release_t)(void *);
typedef void *(*pfor_t)(const void *, void (*)(void *, size_t), size_t, size_t, void *);
static void nothing(void *u, size_t i) { (void)u; (void)i; }
int main(int argc, char **argv) {
  void *h = dlopen(argv[1], RTLD_NOW);
  if (!h) { printf("dlopen failed\n"); return 1; }
  const Base *(*get_base)(void) = (const Base *(*)(void))dlsym(h, "OrtGetApiBase");
  const Base *base = get_base();
  Table api = base->GetApi(API_VERSION);
  if (!api) { printf("no api\n"); return 1; }
  void *st = ((create_t)api[IDX_CreateStatus])(2, "probe-message");
  int code = ((code_t)api[1])(st);
  const char *msg = ((msg_t)api[2])(st);
  printf("code=%d msg=%s\n", code, msg);
  ((release_t)api[93])(st);
  void *pf = ((pfor_t)api[IDX_KernelContext_ParallelFor])(NULL, nothing, 4, 0, NULL);
  printf("pfor_code=%d\n", pf ? ((code_t)api[1])(pf) : -1);
  printf("version=%s\n", base->GetVersionString());
  return 0;
}
"""


def _glue_constants():
    src = library_source([], host_target())
    with open(os.path.join(os.path.dirname(kinds.__file__), "glue.h")) as f:
        header = f.read()  # the tables #include it
    idx = dict(re.findall(r"API_(\w+) = (\d+)", header))
    version = int(re.search(r"#define ONNXOPT_API_VERSION (\d+)", header).group(1))
    return idx, version, src


def _ort_library():
    capi = os.path.join(os.path.dirname(onnxruntime.__file__), "capi")
    libs = sorted(glob.glob(os.path.join(capi, "libonnxruntime.so*")))
    if not libs:
        pytest.skip("this onnxruntime wheel ships no libonnxruntime.so to probe")
    return libs[-1]


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_api_positions_against_installed_onnxruntime(tmp_path):
    idx, version, _ = _glue_constants()
    src = PROBE.replace("IDX_CreateStatus", idx["CreateStatus"]).replace(
        "IDX_KernelContext_ParallelFor", idx["KernelContext_ParallelFor"]).replace("API_VERSION", str(version))
    c = tmp_path / "probe.c"
    c.write_text(src)
    exe = tmp_path / "probe"
    subprocess.run(["cc", "-O0", str(c), "-o", str(exe), "-ldl"], check=True)
    out = subprocess.run([str(exe), _ort_library()], capture_output=True, text=True, check=True).stdout
    assert "code=2 msg=probe-message" in out
    assert "pfor_code=6" in out  # ORT_RUNTIME_EXCEPTION: "Invalid context"
    assert f"version={onnxruntime.__version__}" in out


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_custom_op_struct_is_208_bytes(tmp_path):
    _, _, src = _glue_constants()
    src += "\n_Static_assert(sizeof(OnnxoptCustomOp) == 208, \"OrtCustomOp layout\");\n" \
           "_Static_assert(offsetof(OnnxoptCustomOp, KernelComputeV2) == 8 * 18, \"KernelComputeV2 slot\");\n" \
           "_Static_assert(offsetof(OnnxoptCustomOp, GetMayInplace) == 8 * 22, \"GetMayInplace slot\");\n"
    c = tmp_path / "glue.c"
    c.write_text(src)
    subprocess.run(["cc", "-std=c11", "-fsyntax-only", str(c)], check=True)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_runtime_glue_is_compiled_once_and_shared(tmp_path, monkeypatch):
    """The runtime part of the glue is one cached object per source, compiler and flags (under the cache dir); each
    library compiles only its tables."""
    from onnxopt.codegen.glue.library import _cc, runtime_object

    monkeypatch.setenv("ONNXOPT_CACHE_DIR", str(tmp_path / "cache"))
    first = runtime_object(_cc(), str(tmp_path))
    assert first.startswith(str(tmp_path / "cache" / "glue")) and os.path.getsize(first) > 10_000
    stamp = os.stat(first).st_mtime_ns
    assert runtime_object(_cc(), str(tmp_path)) == first and os.stat(first).st_mtime_ns == stamp
    tables = library_source([], host_target())
    assert "onnxopt_n_ops = 0;" in tables and "RegisterCustomOps(" not in tables


def test_ops_are_registered_for_the_targets_execution_provider():
    """The glue's op_ep answers the target's provider, written into each library's tables (a GPU backend's
    target names its own)."""
    target = host_target()
    assert target.execution_provider == "CPUExecutionProvider"
    tables = library_source([], target)
    assert f'const char onnxopt_execution_provider[] = "{target.execution_provider}";' in tables
