"""The machine model: what the roofline needs to know about a machine.

Peak compute per dtype, bandwidth of each memory level (with the level's size), core count and ISA. A measured model
comes from `onnxopt.hardware.measure` (microbenchmarks with generated kernels, cached on disk); presets for the parts
the papers used live in `onnxopt.hardware.presets`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class MemoryLevel:
    name: str  # "L1", "L2", "L3", "DRAM" (GPUs: "shared", "L2", "HBM")
    size_bytes: int | None  # capacity seen by the whole machine (None: unbounded, i.e. DRAM)
    bandwidth: float  # bytes/s, all cores together
    bandwidth_1core: float | None = None  # bytes/s from one core, when measured
    # Read + write (y = a*x over two buffers), bytes read plus bytes written per second, all cores. This is the
    # ceiling for a kernel that reads its inputs and writes its outputs once: stores cost a line fill (write
    # allocate) as well, so it sits below the read-only `bandwidth`.
    stream_bandwidth: float | None = None
    stream_bandwidth_1core: float | None = None


@dataclass
class Machine:
    name: str
    cores: int
    isa: list[str]
    peak_flops: dict[str, float]  # dtype ("float32", "float16", "int8") -> op/s, all cores (a multiply-add is 2)
    levels: list[MemoryLevel]  # from the closest to the farthest; the last one is main memory
    vector_bits: int = 0
    registers: int = 0  # vector registers per core
    source: str = "preset"  # "measured" or "preset"
    details: dict = field(default_factory=dict)

    @property
    def dram(self) -> MemoryLevel:
        return self.levels[-1]

    def balance(self, dtype: str = "float32") -> float:
        """I_max: the intensity (FLOP/byte) where the roofline turns from memory- to compute-bound."""
        return self.peak_flops[dtype] / self.dram.bandwidth

    def level_for(self, working_set_bytes: int, one_core: bool = False, fill: float = 1.0) -> MemoryLevel:
        """The closest level whose capacity holds the working set.

        `one_core`: judge by what one core can use (its private caches, a shared level whole), as for a kernel that
        runs on one thread. `fill`: the fraction of a cache the working set may take and still live there (the
        rest holds code, stack and other tensors).
        """
        buffers = self.details.get("buffers", {})
        for lvl in self.levels:
            cap = buffers.get(lvl.name, {}).get("instance_bytes", lvl.size_bytes) if one_core else lvl.size_bytes
            if cap is None or working_set_bytes <= fill * cap:
                return lvl
        return self.levels[-1]

    def attainable(self, intensity: float, dtype: str = "float32", level: MemoryLevel | None = None) -> float:
        """Roofline (OptiFX Eq.2): min(peak, bandwidth * intensity)."""
        bw = (level or self.dram).bandwidth
        return min(self.peak_flops[dtype], bw * intensity)

    def predict_seconds(self, flops: float, bytes_moved: float, dtype: str = "float32",
                        level: MemoryLevel | None = None) -> float:
        bw = (level or self.dram).bandwidth
        return max(flops / self.peak_flops[dtype], bytes_moved / bw)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Machine":
        d = dict(d)
        d["levels"] = [MemoryLevel(**lv) for lv in d["levels"]]
        return cls(**d)
