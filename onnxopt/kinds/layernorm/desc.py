"""The glue's description of one layernorm op type (exec.c runs it), and its C initializer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LayerNormKernelDesc:
    op_type: str
    in_types: list[int]
    out_types: list[int]
    residual: bool
    sum_output: bool
    has_bias: bool
    rows: str  # the generated function (glue.h layernorm_rows_fn)

    def c_source(self, prefix: str) -> str:
        """Declarations and the descriptor `<prefix>_desc` (onnxopt_layernorm_desc, glue.h)."""
        ins = ", ".join(str(t) for t in self.in_types)
        outs = ", ".join(str(t) for t in self.out_types)
        return (f"extern void {self.rows}(const float *, const float *, const float *, const float *, float *, "
                f"float *, int64_t, int64_t);\n"
                f"static const int {prefix}_in_types[] = {{{ins}}};\n"
                f"static const int {prefix}_out_types[] = {{{outs}}};\n"
                f'static const onnxopt_layernorm_desc {prefix}_desc = {{{{"{self.op_type}", KIND_LAYERNORM, '
                f"{len(self.in_types)}, {len(self.out_types)}, {prefix}_in_types, {prefix}_out_types}}, "
                f"{int(self.residual)}, {int(self.sum_output)}, {int(self.has_bias)}, {self.rows}}};\n")
