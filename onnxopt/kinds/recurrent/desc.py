"""The glue's description of one recurrent op type (exec.c runs it), and its C initializer."""

from __future__ import annotations

from dataclasses import dataclass

from ..base import c_signature
from .params import RecurrentParams


@dataclass
class RecurrentKernelDesc:
    op_type: str
    in_types: list[int]
    out_types: list[int]
    params: RecurrentParams
    proj: str  # the generated functions (glue.h recurrent_proj_fn, recurrent_step_fn)
    step: str

    def c_source(self, prefix: str) -> str:
        """Declarations and the descriptor `<prefix>_desc` (onnxopt_recurrent_desc, glue.h)."""
        p = self.params
        decls, sig = c_signature(prefix, self.op_type, "KIND_RECURRENT", self.in_types, self.out_types)
        weight_bytes = 2 if p.weights == "bfloat16" else 4
        fields = [p.gates, weight_bytes, p.directions, int(p.reverse), p.hidden, p.input_size, int(p.has_h0),
                  int(p.has_c0)]
        fields += [int(o) for o in p.outputs] + [int(p.serpentine)]
        return (f"extern void {self.proj}(const float *, const void *, const float *, float *, int64_t, int64_t, "
                f"int64_t, int64_t, int64_t);\n"
                f"extern void {self.step}(const void *, const float *, int64_t, const float *, float *, float *, "
                f"int64_t, int64_t, int64_t, int64_t, int64_t);\n{decls}"
                f"static const onnxopt_recurrent_desc {prefix}_desc = {{{sig}, "
                f"{', '.join(str(v) for v in fields)}, {self.proj}, {self.step}}};\n")
