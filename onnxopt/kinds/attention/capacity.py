"""The data-movement model's capacity for the attention kernel's key blocks (plan.py sizes the blocks from it,
lower.py puts it in the kernel's descriptor).

Chimera's multi-level cost: where a head's K^T and V panels do not fit a core's L2, whole score rows read them
again from L3 for every micro-kernel block of `mr` query rows, mr / 2 flops a byte (2 mr (d + dv) flops for each
key's d + dv floats); blocks of keys that fit L2 read them once a task but pay a merge and re-read the queries. So
blocks pay only where L3 cannot feed the arithmetic at that intensity: where the machine's L3 balance (peak float32
flops over L3 bandwidth) is above mr / 2. Measured on a Zen 4 (balance 1.3): whole rows with K^T and V streaming
from L3 ran as fast as the best blocks (benchmarks/attention_key_blocks.py, BENCHMARKS.md), so there the capacity is
0, whole rows always. Below, the capacity is a share of one core's L2."""

from __future__ import annotations

# The share of one core's L2 the float32 kernel's key block (its K^T and V panels and score rows) may take: the rest
# holds the task's query and output rows, a block's output and the stack.
KEY_SHARE = 0.5


def core_cache_bytes(level: int = 2, levels: dict | None = None) -> int:
    """One core's share of cache level `level`: from `levels` ({"L2": bytes}) where given, else this machine's."""
    if levels is not None:
        return int(levels[f"L{level}"])
    from onnxopt.hardware.cpu import cache_levels

    found = {c.level: c.instance_bytes // max(1, c.cpus_per_instance) for c in cache_levels()}
    return found.get(level, 1 << 20)


def l3_balance(machine) -> float | None:
    """Peak float32 flops over L3 bandwidth (flops a byte), or None where the model lacks either."""
    if machine is None:
        return None
    level = next((lv for lv in machine.levels if lv.name == "L3"), None)
    peak = machine.peak_flops.get("float32")
    return peak / level.bandwidth if level is not None and level.bandwidth and peak else None


def key_floats(mr: int, levels: dict | None = None, machine=None) -> int:
    """The model's capacity for a key block, in floats: 0 (whole rows always) where `machine`'s L3 feeds whole rows
    of `mr` query rows as fast as they compute, else KEY_SHARE of one core's L2 (`levels`, else this machine's).
    `machine`: else this machine's cached model; with none measured yet, the capacity alone decides."""
    if machine is None:
        from onnxopt.hardware.measure import cached_machine

        machine = cached_machine()
    balance = l3_balance(machine)
    if balance is not None and balance <= mr / 2:
        return 0
    return int(KEY_SHARE * core_cache_bytes(2, levels)) // 4
