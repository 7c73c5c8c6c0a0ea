"""The attention kind's parameters: what the fused chain computes besides its inputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from onnxopt.fusion.params import KindParams


@dataclass(frozen=True)
class AttentionParams(KindParams):
    family: ClassVar[str] = "attention"
    scale: float  # multiplies Q K^T
    k_transposed: bool  # input 1 is K^T [..., d, L] (else K [..., L, d])
    # "none", "add" (float, added), "select" (bool: keep the score where true, else `fill`) or "fill" (bool: `fill`
    # where true, else the score: masked_fill)
    mask_kind: str
    fill: float = 0.0
    nan_guard: bool = False  # a row masked everywhere gives zeros (else NaN, as Softmax gives)
    # The head split and merge folded into the indexing: per tensor (q, k, v, out) the permutation that makes the
    # chain's logical tensor from the one in memory (logical dim i is memory dim perm[i]); () is the identity.
    perms: tuple = ((), (), (), ())
    dtype: str = "float32"  # of q, k, v, the output and an additive mask, from the graph
    min_tasks: int = 0  # the schedule (schedule.py): the fewest tasks a call is split into; 0, MIN_TASKS
    # "bfloat16" ("float16"): the two products take bf16 (fp16) operands on AMX tiles (amx.py; `--precision
    # bf16`/`auto` (`fp16`)), the float32 kernel kept for where the tiles cannot run; "float32": float32 throughout
    products: str = "float32"
    # between the products: "softmax", or a plain GEMM chain's "none" or "relu" (fusion/attention.py)
    middle: str = "softmax"
    vectors: int = 0  # the schedule: the micro-kernel's vectors a row (lower.py); 0, the target's default
    # the schedule: the floats a block of keys may take (exec.c's key blocks); 0, the data-movement model's share of
    # this machine's L2 (plan.py key_floats); -1, whole score rows always
    key_floats: int = 0

    def key(self) -> list:
        key = [repr(self.scale), self.k_transposed, self.mask_kind, repr(self.fill), self.nan_guard]
        key = key + [list(p) for p in self.perms] if any(self.perms) else key
        key = key if self.dtype == "float32" else key + [self.dtype]  # float32's op types as before the field
        key = key + ({"bfloat16": ["bf16"], "float16": ["f16"]}.get(self.products, []))
        key = key + ([f"tasks{self.min_tasks}"] if self.min_tasks else [])
        key = key + ([f"nr{self.vectors}"] if self.vectors else [])
        key = key + ([f"kf{self.key_floats}"] if self.key_floats else [])
        return key + ([self.middle] if self.middle != "softmax" else [])
