"""Machine models of the parts the seed papers ran on, for planning without the machine at hand.

Each number says where it comes from: the paper's own figure or the vendor's datasheet
or whitepaper. Cache bandwidths that neither gives are derived from documented per-clock figures and say so; GPU
levels without a published bandwidth are left out rather than guessed. On GPUs `cores` counts SMs.
"""

from __future__ import annotations

import copy

from onnxopt.errors import UsageError
from onnxopt.hardware.machine_model import Machine, MemoryLevel

KiB, MiB = 1 << 10, 1 << 20
G, T = 1e9, 1e12


def _xeon_gold_6240() -> Machine:
    cores, ghz = 18, 2.6  # Intel ARK: 18 cores, 2.6 GHz base; AVX-512 with 2 FMA units per core
    return Machine(
        name="Intel Xeon Gold 6240",
        cores=cores,
        isa=["sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512cd", "avx512bw",
             "avx512vl", "avx512_vnni"],
        peak_flops={
            # Datasheet-derived: 18 cores x 2.6 GHz x 2 FMA units x 16 lanes x 2 = 2.995 TFLOP/s (the AVX-512
            # all-core clock is lower than base, so the real peak is lower still).
            "float32": cores * ghz * G * 2 * 16 * 2,
            # Chimera (HPCA 2023), Table I ("FP16 peak" of the Xeon Gold AVX-512 CPU): 12 TFLOP/s, balance 92 FLOP/B.
            "float16": 12 * T,
            # Heron (ASPLOS 2023), platforms: Xeon Gold 6240 DL Boost (VNNI), 18 cores, 23 TOPS.
            "int8": 23 * T,
        },
        levels=[
            # Chimera (HPCA 2023) (Evaluation, hardware): L1/L2/L3 totals 1.125/18/24.75 MB. The 1.125 MB of L1 is
            # 18 x (32 KiB data + 32 KiB instruction); the data part is used here.
            # Bandwidths: Intel's optimization manual per-cycle figures for Skylake-SP (L1: two 64 B loads per
            # cycle; L2: ~52 B/cycle sustained; L3: ~15 B/cycle per core sustained) x 2.6 GHz; derived, not
            # measured, not from a note.
            MemoryLevel("L1", cores * 32 * KiB, cores * 128 * ghz * G, 128 * ghz * G),
            MemoryLevel("L2", 18 * MiB, cores * 52 * ghz * G, 52 * ghz * G),
            MemoryLevel("L3", int(24.75 * MiB), cores * 15 * ghz * G, 15 * ghz * G),
            # Chimera (HPCA 2023), Table I: 131 GB/s.
            MemoryLevel("DRAM", None, 131 * G),
        ],
        vector_bits=512,
        registers=32,
        source="preset",
        details={"kind": "cpu", "clock_ghz": ghz, "fma_units": 2,
                 "paper_balance": {"float16": 92}, "sources": ["Chimera (HPCA 2023) Table I", "Heron (ASPLOS 2023)",
                                                               "Intel ARK", "Intel optimization manual"]},
    )


def _a100() -> Machine:
    sms, ghz = 108, 1.41  # A100 SXM4 40 GB: 108 SMs, 1.41 GHz boost (NVIDIA A100 whitepaper)
    return Machine(
        name="NVIDIA A100 SXM4 40GB",
        cores=sms,
        isa=["sm_80", "tensor_core", "fp16", "bf16", "tf32", "int8"],
        peak_flops={
            # Chimera (HPCA 2023), Table I: 312 TFLOP/s (FP16 tensor core), balance 200 FLOP/B.
            "float16": 312 * T,
            "bfloat16": 312 * T,  # datasheet (tensor core, dense)
            "tf32": 156 * T,  # datasheet (tensor core, dense)
            "float32": 19.5 * T,  # datasheet (CUDA cores)
            "int8": 624 * T,  # datasheet (tensor core, dense)
        },
        levels=[
            # Chimera (HPCA 2023): up to 164 KB shared memory per SM. Bandwidth derived from the whitepaper's
            # 128 B/clock per SM x 108 SMs x 1.41 GHz = 19.5 TB/s.
            MemoryLevel("shared", sms * 164 * KiB, sms * 128 * ghz * G, 128 * ghz * G),
            # Chimera (HPCA 2023): 40.96 MB L2 (40 x 1024 KB). Bandwidth from the whitepaper's 5120 B/clock L2 read
            # bandwidth x 1.41 GHz = 7.2 TB/s (derived).
            MemoryLevel("L2", 40 * MiB, 5120 * ghz * G),
            # Chimera (HPCA 2023), Table I: 1555 GB/s.
            MemoryLevel("HBM", None, 1555 * G),
        ],
        source="preset",
        details={"kind": "gpu", "sm": "sm_80", "clock_ghz": ghz, "paper_balance": {"float16": 200},
                 "sources": ["Chimera (HPCA 2023) Table I", "NVIDIA A100 datasheet and whitepaper"]},
    )


def _ada_or_orin(name: str, sm: str, sms: int, ghz: float, fp32_tflops: float, dram_gbs: float, l2_bytes: int,
                 smem_per_sm: int, dram_name: str, paper_balance: float, datasheet: str) -> Machine:
    return Machine(
        name=name,
        cores=sms,
        isa=[sm, "tensor_core", "fp16", "bf16", "int8"],
        # OptiFX (Eq.1-3): P_max in TFLOP/s (fp32, the precision OptiFX's Eq.3 counts bytes for).
        peak_flops={"float32": fp32_tflops * T},
        levels=[
            # Shared memory: datasheet SM count x the 128 B/clock per SM of NVIDIA's tuning guides x boost clock
            # (derived); capacity the per-SM maximum shared memory (datasheet/tuning guide).
            MemoryLevel("shared", sms * smem_per_sm, sms * 128 * ghz * G, 128 * ghz * G),
            # L2 capacity from the datasheet; NVIDIA publishes no L2 bandwidth for this part, so the L2 level
            # carries the DRAM bandwidth as a floor (a conservative roofline, not a measurement).
            MemoryLevel("L2", l2_bytes, dram_gbs * G),
            # OptiFX: M_max in GB/s.
            MemoryLevel(dram_name, None, dram_gbs * G),
        ],
        source="preset",
        details={"kind": "gpu", "sm": sm, "clock_ghz": ghz, "paper_balance": {"float32": paper_balance},
                 "sources": ["OptiFX (I_max table)", datasheet]},
    )


def _rtx_6000_ada() -> Machine:
    # OptiFX: "A6000 Ada" 91.1 TFLOP/s, 960 GB/s, I_max 94.90. The part is the RTX 6000 Ada Generation:
    # 142 SMs, 2.505 GHz boost, 96 MB L2, 100 KB shared memory per SM (datasheet / Ada tuning guide).
    return _ada_or_orin("NVIDIA RTX 6000 Ada Generation", "sm_89", 142, 2.505, 91.1, 960, 96 * MiB, 100 * KiB,
                        "GDDR6", 94.90, "NVIDIA RTX 6000 Ada datasheet")


def _rtx_4090() -> Machine:
    # OptiFX: RTX 4090 82.6 TFLOP/s, 1008 GB/s, I_max 81.94. 128 SMs, 2.52 GHz boost, 72 MB L2,
    # 100 KB shared memory per SM (datasheet / Ada tuning guide).
    return _ada_or_orin("NVIDIA GeForce RTX 4090", "sm_89", 128, 2.52, 82.6, 1008, 72 * MiB, 100 * KiB,
                        "GDDR6X", 81.94, "NVIDIA Ada GPU architecture whitepaper")


def _jetson_orin() -> Machine:
    # OptiFX: Orin 5.32 TFLOP/s, 204.8 GB/s, I_max 25.98 (Jetson AGX Orin 64GB). 16 SMs (2048 CUDA
    # cores), 1.3 GHz, 4 MB L2, 164 KB shared memory per SM (datasheet / Ampere tuning guide for sm_87).
    return _ada_or_orin("NVIDIA Jetson AGX Orin 64GB", "sm_87", 16, 1.3, 5.32, 204.8, 4 * MiB, 164 * KiB,
                        "LPDDR5", 25.98, "NVIDIA Jetson AGX Orin datasheet")


PRESETS: dict[str, Machine] = {
    "xeon-gold-6240": _xeon_gold_6240(),
    "a100": _a100(),
    "rtx-6000-ada": _rtx_6000_ada(),
    "rtx-4090": _rtx_4090(),
    "jetson-orin": _jetson_orin(),
}

# Other spellings people use for the same parts (the papers' own names included).
ALIASES = {
    "a6000-ada": "rtx-6000-ada",
    "rtx-a6000-ada": "rtx-6000-ada",
    "6000-ada": "rtx-6000-ada",
    "4090": "rtx-4090",
    "geforce-rtx-4090": "rtx-4090",
    "orin": "jetson-orin",
    "jetson-agx-orin": "jetson-orin",
    "xeon-6240": "xeon-gold-6240",
    "gold-6240": "xeon-gold-6240",
    "a100-40gb": "a100",
    "nvidia-a100": "a100",
}


def _normalize(name: str) -> str:
    return "-".join(name.strip().lower().replace("_", " ").replace("-", " ").split())


def get_preset(name: str) -> Machine:
    """A copy of the named preset (case, spaces and '_' do not matter). Unknown names raise UsageError."""
    key = _normalize(name)
    key = ALIASES.get(key, key)
    if key not in PRESETS:
        raise UsageError(f"unknown machine preset '{name}': use one of {', '.join(sorted(PRESETS))} "
                         f"(or measure this machine with onnxopt.hardware.measure.load_machine())")
    return copy.deepcopy(PRESETS[key])
