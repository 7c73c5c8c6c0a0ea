"""Schedule -> LLVM module text -> object code, with the shared compile helpers."""

from __future__ import annotations

from dataclasses import dataclass, field

from llvmlite import ir

from ..compile import compile_assembly, compile_object, new_module
from ..target import Target, host_target
from .codegen import FunctionEmitter
from .lower import LoweredNest, lower
from .schedule import Schedule
from .te import Tensor


@dataclass
class Kernel:
    """One compiled-to-IR loop nest: `void name(ptr args..., i64 begin, i64 end)`."""

    name: str
    ir: str  # the LLVM module, as emitted (not yet optimized)
    nest: LoweredNest
    target: Target
    notes: list[str] = field(default_factory=list)  # loops that stayed scalar although vectorized, and why

    @property
    def args(self) -> list[Tensor]:
        """The buffers the function takes, in order: inputs, then the output."""
        return self.nest.buffers

    @property
    def range_extent(self) -> int:
        """Iterations of the range loop: call with 0 <= begin <= end <= range_extent."""
        return self.nest.range_extent

    @property
    def parallel(self) -> bool:
        """Whether the schedule asked for the range loop to be split between threads."""
        return self.nest.parallel

    def object_code(self) -> bytes:
        return compile_object(self.ir, self.target)

    def assembly(self) -> str:
        return compile_assembly(self.ir, self.target)


def emit_function(module: ir.Module, schedule: Schedule, name: str, target: Target,
                  inputs: list[Tensor] | None = None) -> tuple[LoweredNest, list[str]]:
    """Add the kernel function `name` to an existing module; returns the lowered nest and the codegen notes."""
    nest = lower(schedule, inputs)
    emitter = FunctionEmitter(module, nest, name, target.float32_lanes)
    emitter.emit()
    return nest, emitter.notes


def build(schedule: Schedule, target: Target | None = None, name: str | None = None,
          inputs: list[Tensor] | None = None) -> Kernel:
    """Lower and emit a schedule as a module of its own. `inputs` fixes the argument order of the placeholders
    (default: the placeholders the compute reads, in creation order)."""
    target = target or host_target()
    name = name or schedule.tensor.name
    module = new_module(target, name)
    nest, notes = emit_function(module, schedule, name, target, inputs)
    return Kernel(name, str(module), nest, target, notes)
