"""The machine model: presets, the measured model (quick mode, measured once per test session), its cache, and
the roofline helpers. Speed is never asserted tightly: only that the measurements are physically sane."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onnxopt.errors import UsageError
from onnxopt.hardware import measure
from onnxopt.hardware.machine_model import Machine, MemoryLevel
from onnxopt.hardware.presets import PRESETS, get_preset


# ---------------------------------------------------------------------------------------------------- presets


@pytest.mark.parametrize("name, balance", [
    ("rtx-6000-ada", 94.90),  # OptiFX's I_max table
    ("a6000-ada", 94.90),
    ("rtx-4090", 81.94),
    ("jetson-orin", 25.98),
])
def test_preset_balance_matches_optifx(name, balance):
    assert get_preset(name).balance("float32") == pytest.approx(balance, abs=0.01)


def test_preset_balance_matches_chimera_table_1():
    # Chimera Table I: Xeon Gold 92 FLOP/B, A100 200 FLOP/B (FP16 peaks).
    # The paper rounds down (312/1.555 = 200.6).
    assert get_preset("xeon-gold-6240").balance("float16") == pytest.approx(92, abs=1)
    assert get_preset("a100").balance("float16") == pytest.approx(200, abs=1)


def test_presets_are_well_formed():
    for name, m in PRESETS.items():
        assert m.source == "preset"
        assert m.cores > 0 and m.peak_flops and all(v > 0 for v in m.peak_flops.values()), name
        assert m.levels[-1].size_bytes is None, name
        sizes = [lv.size_bytes for lv in m.levels[:-1]]
        assert sizes == sorted(sizes), name
        bws = [lv.bandwidth for lv in m.levels]
        assert bws == sorted(bws, reverse=True), name
        assert Machine.from_dict(json.loads(json.dumps(m.to_dict()))) == m


def test_xeon_gold_6240_preset():
    m = get_preset("Xeon_Gold_6240")
    assert m.cores == 18 and m.vector_bits == 512 and m.registers == 32
    assert m.peak_flops["float32"] == pytest.approx(18 * 2.6e9 * 2 * 16 * 2)
    assert m.dram.bandwidth == pytest.approx(131e9)
    assert "avx512_vnni" in m.isa


def test_get_preset_returns_a_copy():
    m = get_preset("a100")
    m.peak_flops["float32"] = 1.0
    assert get_preset("a100").peak_flops["float32"] == pytest.approx(19.5e12)


def test_unknown_preset_lists_the_known_names():
    with pytest.raises(UsageError) as e:
        get_preset("pentium-4")
    for name in PRESETS:
        assert name in str(e.value)


# ---------------------------------------------------------------------------------------------------- roofline


def _toy() -> Machine:
    return Machine(name="toy", cores=1, isa=[], peak_flops={"float32": 100.0},
                   levels=[MemoryLevel("L1", 1000, 50.0), MemoryLevel("L2", 10_000, 20.0),
                           MemoryLevel("DRAM", None, 10.0)])


def test_attainable_is_the_roofline():
    m = _toy()
    assert m.balance() == 10.0
    assert m.attainable(1.0) == 10.0  # memory-bound: bandwidth x intensity
    assert m.attainable(10.0) == 100.0  # the ridge point
    assert m.attainable(1000.0) == 100.0  # compute-bound: the peak
    assert m.attainable(1.0, level=m.levels[0]) == 50.0
    assert m.predict_seconds(100.0, 20.0) == pytest.approx(2.0)
    assert m.predict_seconds(1000.0, 20.0) == pytest.approx(10.0)


def test_level_for_picks_the_closest_level_that_holds_the_working_set():
    m = _toy()
    assert m.level_for(10).name == "L1"
    assert m.level_for(1000).name == "L1"
    assert m.level_for(1001).name == "L2"
    assert m.level_for(10**12).name == "DRAM"
    assert m.dram.name == "DRAM"


# ---------------------------------------------------------------------------------------------------- measured


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """load_machine(quick=True) into a fresh cache dir: measures once; the other tests reuse the result."""
    d = tmp_path_factory.mktemp("onnxopt-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ONNXOPT_CACHE_DIR", str(d))
        before = measure._MEASURE_COUNT
        m = measure.load_machine(quick=True)
        assert measure._MEASURE_COUNT == before + 1
        path = measure.cache_path()
        yield {"machine": m, "dir": d, "path": path, "mtime": path.stat().st_mtime_ns}


@pytest.fixture(scope="module")
def machine(cached) -> Machine:
    return cached["machine"]


def test_measured_machine_basics(machine):
    m = machine
    assert m.source == "measured"
    assert m.cores == len(measure.usable_cpus()) >= 1
    assert m.name
    assert m.peak_flops["float32"] > 0
    assert m.details["peak_flops_1core"]["float32"] > 0
    # All cores do at least about as well as one.
    assert m.peak_flops["float32"] >= 0.8 * m.details["peak_flops_1core"]["float32"]
    assert m.vector_bits in (128, 256, 512)
    assert m.registers in (16, 32)
    if "avx512f" in m.isa:
        assert m.vector_bits == 512 and m.registers == 32


def test_measured_int8_peak(machine):
    """Measured on the best dot-product instruction the CPU has, from a kernel with no spills. How it compares with
    the float32 peak is timing, for `onnxopt machine` and the benchmarks: under load on a shared CPU it came out
    below it once."""
    if "avx2" not in machine.isa:
        pytest.skip("no AVX2 (nor VNNI) on this CPU: no int8 dot-product instruction")
    assert machine.peak_flops["int8"] > 0 and machine.details["peak_flops_1core"]["int8"] > 0
    kernel = machine.details["kernels"]["int8"]
    # the machine code holds the instruction named (VNNI's one vpdpbusd, or AVX2's vpmaddubsw sequence)
    assert kernel["asm"]["opcode"] == ("vpdpbusd" if kernel["instruction"].endswith("vnni") else "vpmaddubsw"), kernel
    assert kernel["asm"]["count"] > 0 and kernel["asm"]["spills"] == 0, kernel
    # one chain of the instruction (its latency, kinds/qconv/forms.py) cannot issue faster than the peak's chains
    per_instruction = kernel["ops_per_iter"] / kernel["accumulators"] / machine.details["peak_flops_1core"]["int8"]
    assert kernel["latency_s"] > 0.5 * per_instruction, kernel


def test_measured_levels_are_ordered(machine):
    lv = machine.levels
    assert lv[0].name == "L1" and lv[-1].name == "DRAM" and lv[-1].size_bytes is None
    sizes = [x.size_bytes for x in lv[:-1]]
    assert all(s > 0 for s in sizes) and sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    for x in lv:
        assert x.bandwidth > 0 and x.bandwidth_1core > 0, x
    assert lv[0].bandwidth >= lv[-1].bandwidth
    assert lv[0].bandwidth_1core >= lv[-1].bandwidth_1core
    # Farther levels are not much faster. The room is for a shared machine: with other processes on the cores, one
    # core's L2 figure measured 0.62x its L3 figure on an AMD EPYC (Zen 5); each level is timed once, apart.
    for near, far in zip(lv, lv[1:]):
        assert near.bandwidth_1core >= 0.5 * far.bandwidth_1core, (near, far)
        assert near.bandwidth >= 0.5 * far.bandwidth, (near, far)


def test_measured_fp32_peak_is_near_the_theoretical_peak(machine):
    """One core against 2 FMA units x lanes x 2 FLOPs x clock. The clock a VM reports is often the nominal one while
    the core turbos above it, so the upper bound is looser when only 'cpu MHz' is known."""
    mhz = machine.details.get("cpu_mhz") or {}
    if "max" in mhz:
        clock, upper = mhz["max"], 1.3
    elif "nominal" in mhz:
        clock, upper = mhz["nominal"], 1.75
    else:
        pytest.skip("the CPU clock is unknown (no 'cpu MHz' in /proc/cpuinfo, no cpufreq)")
    if clock < 500:
        pytest.skip(f"implausible clock reported: {clock} MHz")
    lanes = machine.vector_bits // 32
    theoretical = 2 * lanes * 2 * clock * 1e6
    measured = machine.details["peak_flops_1core"]["float32"]
    assert 0.15 * theoretical <= measured <= upper * theoretical, (measured / 1e9, theoretical / 1e9)


def test_machine_round_trips_through_a_dict(machine):
    assert Machine.from_dict(machine.to_dict()) == machine
    assert Machine.from_dict(json.loads(json.dumps(machine.to_dict()))) == machine


def test_cache_is_written_once_and_reused(cached):
    path = cached["path"]
    assert path.parent == cached["dir"] and path.exists()
    before = measure._MEASURE_COUNT
    again = measure.load_machine(quick=True)
    assert measure._MEASURE_COUNT == before  # not measured again
    assert path.stat().st_mtime_ns == cached["mtime"]  # not rewritten
    assert again == cached["machine"]
    assert [p.name for p in cached["dir"].iterdir()] == [path.name]  # no temporary files left behind


def test_refresh_measures_again_and_rewrites_atomically(tmp_path, monkeypatch):
    calls = []
    fake = Machine(name="fake", cores=1, isa=[], peak_flops={"float32": 1.0},
                   levels=[MemoryLevel("DRAM", None, 1.0)], source="measured", details={"quick": True})

    def fake_measure(quick=False):
        calls.append(quick)
        return fake

    monkeypatch.setenv("ONNXOPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(measure, "measure_machine", fake_measure)
    assert measure.load_machine(quick=True) == fake and calls == [True]
    assert measure.load_machine(quick=True) == fake and calls == [True]  # reused
    assert measure.load_machine(refresh=True, quick=True) == fake and calls == [True, True]
    # A cached quick measurement does not satisfy a full request.
    measure.load_machine(quick=False)
    assert calls == [True, True, False]
    # A corrupt cache file is measured again, not an error.
    measure.cache_path().write_text("{not json")
    assert measure.load_machine(quick=True) == fake and len(calls) == 4
    assert not [p for p in measure.cache_dir().iterdir() if p.suffix == ".tmp"]


def test_cache_key_depends_on_the_machine(monkeypatch):
    k = measure.machine_key()
    monkeypatch.setattr(measure, "cpu_name", lambda: "Some Other CPU")
    assert measure.machine_key() != k


def test_cache_dir_default(monkeypatch):
    monkeypatch.delenv("ONNXOPT_CACHE_DIR", raising=False)
    assert measure.cache_dir() == Path.home() / ".cache" / "onnxopt"


# ---------------------------------------------------------------------------------------------------- kernels


def test_fma_kernel_assembly_has_the_fmas_and_no_spills():
    from onnxopt.codegen.target import host_target

    t = host_target()
    if not t.triple.startswith("x86_64") or not (t.has("fma") or t.has("avx512f")):
        pytest.skip("x86 FMA check")
    text, info = measure.build_fma_kernel(t)
    asm = measure.kernel_assembly(text, t)
    assert asm.count("vfmadd") >= info["accumulators"]
    assert "Spill" not in asm and "Reload" not in asm
    reg = "zmm" if t.vector_bits == 512 else "ymm"
    assert f"%{reg}" in asm


@pytest.mark.parametrize("level,mnemonic,reg", [("x86-64-v3", "vpmaddubsw", "ymm"),
                                               ("cpu=x86-64-v4,+avx512vnni", "vpdpbusd", "zmm")])
def test_int8_kernel_assembly_uses_the_instruction(level, mnemonic, reg):
    from onnxopt.codegen.target import missing_cpu_flags, parse_target
    from onnxopt.hardware.probe_kernels import build_int8_kernel, kernel_assembly
    from onnxopt.codegen.instructions import available

    t = parse_target(level)
    text, info = build_int8_kernel(t, available(t, ("u8", "s8"))[0])
    asm = kernel_assembly(text, t)
    assert asm.count(mnemonic) >= info["accumulators"] and f"%{reg}" in asm
    assert "Spill" not in asm and "Reload" not in asm
    if not missing_cpu_flags(t.required_cpu_flags):
        kernel, run_info = measure._int8_kernel(t)
        assert run_info["asm"]["count"] >= run_info["accumulators"] and run_info["asm"]["spills"] == 0


def test_bf16_peak_kernel_and_its_peak():
    """vdpbf16ps chains for a CPU with avx512_bf16 on any host; the model has the bf16 peak where the host has the
    instruction, none elsewhere."""
    from onnxopt.codegen.target import host_target, parse_target
    from onnxopt.hardware.probe_kernels import build_bf16_kernel, kernel_assembly

    t = parse_target("cpu=znver4")
    text, info = build_bf16_kernel(t)
    asm = kernel_assembly(text, t)
    assert asm.count("vdpbf16ps") >= info["accumulators"] and "Spill" not in asm
    m = measure.measure_machine(quick=True)
    assert ("bfloat16" in m.peak_flops) == host_target().has("avx512bf16")


@pytest.mark.parametrize("name", ["tdpbusd", "tdpbf16ps", "tdpfp16ps"])
def test_amx_peak_kernel_assembly(name):
    """The tile unit's probe, for a CPU with the instruction, on any host: one tile configuration, four
    instructions on four C tiles each iteration, nothing spilled."""
    from onnxopt.codegen.instructions import amx
    from onnxopt.codegen.target import parse_target
    from onnxopt.hardware.probe_kernels import build_amx_kernel, kernel_assembly

    t = parse_target("cpu=graniterapids")
    ins = next(i for i in amx.INSTRUCTIONS if i.name == name)
    text, info = build_amx_kernel(t, ins)
    asm = kernel_assembly(text, t)
    assert asm.count("ldtilecfg") == 1 and asm.count(name) >= 4 and asm.count("tilestored") == 4
    m, n, k = ins.shape
    assert info["ops_per_iter"] == 4 * 2 * m * n * k


def test_amx_peaks_are_measured_only_where_granted():
    """On a host with AMX the model has the tile unit's peaks (or says why not); elsewhere none."""
    from onnxopt.codegen.instructions import matrix_available
    from onnxopt.codegen.target import host_target

    m = measure.measure_machine(quick=True)
    if not matrix_available(host_target()):
        assert not any(k.startswith("amx_") for k in m.peak_flops)
        return
    granted, why = measure.request_amx()
    if granted:
        assert m.peak_flops["amx_int8"] > m.peak_flops["int8"]  # tiles beat VNNI's vectors
    else:
        assert "amx_int8" not in m.peak_flops and m.details["kernels"]["amx"]["error"] == why


def test_cache_levels_from_sysfs_or_fallback():
    levels = measure.cache_levels()
    assert levels and levels[0].level == 1
    assert all(c.instance_bytes > 0 and c.instances >= 1 for c in levels)
    fb = measure._fallback_cache_levels(4)
    assert [c.level for c in fb] == [1, 2, 3] and fb[0].instances == 4 and fb[2].cpus_per_instance == 4


def test_parsers():
    assert measure._parse_size("32K") == 32 << 10
    assert measure._parse_size("1024K\n") == 1 << 20
    assert measure._parse_size("32M") == 32 << 20
    assert measure._parse_cpu_list("0-3,8,10-11\n") == frozenset({0, 1, 2, 3, 8, 10, 11})


@pytest.mark.parametrize("spec, accumulators, reg", [("x86-64-v3", 12, "ymm"), ("x86-64-v4", 16, "zmm")])
def test_fma_kernel_for_avx2_and_avx512_targets(spec, accumulators, reg):
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 targets")
    from onnxopt.codegen.target import parse_target

    t = parse_target(spec)
    text, info = measure.build_fma_kernel(t)
    asm = measure.kernel_assembly(text, t)  # compiling needs no such CPU; running would
    assert info["accumulators"] == accumulators and info["lanes"] == t.vector_bits // 32
    assert asm.count("vfmadd") >= accumulators and f"%{reg}" in asm
    assert "Spill" not in asm and "Reload" not in asm
