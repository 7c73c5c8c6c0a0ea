"""The CUDA backend's offline compile (onnxopt/backends/cuda), here where nvcc is and no GPU is: an elementwise
chain's kernels, generated with the C backend's expressions, compile to a fat binary with the target's SASS and
PTX for older GPUs; the device check reads the driver at run time and says what is missing."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from onnxopt.backends import backend_named, parse_target
from onnxopt.backends.cuda import PTX_ARCH, device_problems, nvcc
from onnxopt.backends.cuda.elementwise import program_source
from onnxopt.fusion.region import EwOp, EwProgram, Value

pytestmark = pytest.mark.skipif(not shutil.which("nvcc") and not shutil.which("/usr/local/cuda/bin/nvcc"),
                                reason="no nvcc on this machine (the CUDA toolkit compiles the kernels)")


def _program():
    return EwProgram([Value("x", "float32"), Value("b", "float32")], {"half": (0.5, "float32")},
                     [EwOp("Add", ("x", "b"), "a", "float32"),
                      EwOp("Gelu", ("a",), "g", "float32", (("approximate", "tanh"),)),
                      EwOp("Mul", ("g", "half"), "y", "float32")],
                     [Value("y", "float32")], masks=[3, 1])


@pytest.mark.parametrize("sm", ["sm_80", "sm_90"])
def test_an_elementwise_chain_compiles_to_sass_and_ptx(sm, tmp_path):
    target = parse_target(f"cuda:{sm}")
    source, variants = program_source(_program(), "ew_k")
    assert [v for _, v in variants] == ["ew_k_m1", "ew_k_m3"]
    fatbin = backend_named("cuda").compile(source, target)
    path = tmp_path / "k.fatbin"
    path.write_bytes(fatbin)
    assert fatbin[:4] == bytes.fromhex("50ed55ba")  # a fat binary's magic
    # Both kernels are in it, for the target's SASS and as PTX (cuobjdump lists them where the toolkit has it).
    for name in ("ew_k_m1", "ew_k_m3"):
        assert name.encode() in fatbin
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        listed = subprocess.run([cuobjdump, "--list-elf", "--list-ptx", str(path)], capture_output=True,
                                text=True).stdout
        assert sm in listed and PTX_ARCH.replace("compute_", "sm_") in listed


def test_a_compile_error_is_a_toolchain_error():
    from onnxopt.errors import ToolchainError

    with pytest.raises(ToolchainError, match="nvcc"):
        backend_named("cuda").compile("this is not CUDA", parse_target("cuda:sm_90"))


def test_the_device_check_says_what_is_missing():
    problems = device_problems(parse_target("cuda:sm_90"))
    assert isinstance(problems, list)
    for p in problems:  # here: no driver; on a GPU machine: [] or the compute capability
        assert p.startswith("a ")


def test_nvcc_is_found():
    assert nvcc().endswith("nvcc")
