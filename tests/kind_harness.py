"""Shared by the tests of the kinds in onnxopt/kinds: a model's one region of a kind, built, linked and emitted."""

from __future__ import annotations

import os

from onnxopt.codegen.glue.library import link_library
from onnxopt.codegen.target import host_target
from onnxopt.emit.model import build_fused_model


def fuse_kind(kind, model, tmp_path, name: str | None = None, target=None, params=None, convert=None):
    """(the fused model, its library's path, the region, the kernel's LLVM IR) for the one region `kind` finds in
    `model` (shapes already inferred), built for `target` (default: this host); `params(p)` changes the region's
    parameters first (another schedule, say), `convert(region)` the region itself (a blocked layout)."""
    target = target or host_target()
    regions = kind.find(model, set(), [])
    assert len(regions) == 1, regions
    region = regions[0]
    if params is not None:
        region.params = params(region.params)
    if convert is not None:
        convert(region)
    region.compute_op_type(target.name + target.llvm_features)
    obj, desc, ir_text = kind.build(region, target)
    lib = os.path.join(str(tmp_path), name or f"{kind.name}.so")
    sha = link_library([desc], [obj], target, lib)
    fused = build_fused_model(model, regions, os.path.basename(lib), sha, target.to_dict(), target.required_cpu_flags)
    return fused, lib, region, ir_text


def avx512_vnni_target():
    """The AVX-512 VNNI target (16 s32 lanes: the int8 kinds' wide tiles), or the test skips with what this CPU
    lacks to run it."""
    import pytest

    from onnxopt.codegen.target import missing_cpu_flags, parse_target

    target = parse_target("cpu=x86-64-v4,+avx512vnni")
    missing = missing_cpu_flags(target.required_cpu_flags)
    if missing:
        pytest.skip(f"this CPU cannot run AVX-512 VNNI code (no {', '.join(missing)})")
    return target
