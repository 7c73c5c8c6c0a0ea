"""An elementwise region as plain C: the same row functions the glue calls for the LLVM kernels
(codegen/elementwise/lower.py), written as scalar loops that the C compiler vectorizes for the target.

    void <op>_m<mask>(void **ins, void **outs, int64_t n)                          one loop per broadcast mask
    void <op>_g(void **ins, void **outs, int64_t n, const int64_t *inner_strides)  any pattern
"""

from __future__ import annotations

from onnxopt.codegen.elementwise.build import describe
from onnxopt.codegen.glue.descs import EwKernelDesc
from onnxopt.fusion.region import EwProgram, Region

from . import compile_c
from .expr import C_MEMORY, body

PRELUDE = '#include "kernel.h"\n'  # libm, stdint and a vectorizable expf (kernel.h)


def _pointers(prog: EwProgram) -> list[str]:
    lines = [f"const {C_MEMORY[v.dtype]} *restrict in{i} = (const {C_MEMORY[v.dtype]} *)ins[{i}];"
             for i, v in enumerate(prog.inputs)]
    lines += [f"{C_MEMORY[v.dtype]} *restrict out{j} = ({C_MEMORY[v.dtype]} *)outs[{j}];"
              for j, v in enumerate(prog.outputs)]
    return lines


def _stores(prog: EwProgram, var: dict[str, str]) -> list[str]:
    return [f"out{j}[i] = ({C_MEMORY[v.dtype]}){var[v.name]};" for j, v in enumerate(prog.outputs)]


def program_source(prog: EwProgram, symbol: str) -> tuple[str, list[tuple[int, str]], str]:
    """(the C source, the (mask, symbol) variants, the generic loop's symbol) of one program."""
    fns, variants = [], []
    for mask in sorted(set(prog.masks)):
        name = f"{symbol}_m{mask}"
        stmts, var = body(prog, lambda i, m=mask: f"in{i}[i]" if (m >> i) & 1 else f"b{i}")
        hoisted = [f"const {C_MEMORY[v.dtype]} b{i} = in{i}[0];" for i, v in enumerate(prog.inputs)
                   if not (mask >> i) & 1]
        fns.append(f"void {name}(void **ins, void **outs, int64_t n) {{\n  "
                   + "\n  ".join(_pointers(prog) + hoisted)
                   + "\n  for (int64_t i = 0; i < n; i++) {\n    "
                   + "\n    ".join(stmts + _stores(prog, var)) + "\n  }\n}\n")
        variants.append((mask, name))
    generic = f"{symbol}_g"
    stmts, var = body(prog, lambda i: f"in{i}[i * st[{i}]]")
    fns.append(f"void {generic}(void **ins, void **outs, int64_t n, const int64_t *st) {{\n  "
               + "\n  ".join(_pointers(prog))
               + "\n  for (int64_t i = 0; i < n; i++) {\n    "
               + "\n    ".join(stmts + _stores(prog, var)) + "\n  }\n}\n")
    return PRELUDE + "\n".join(fns), variants, generic


def build(region: Region, target) -> tuple[bytes, EwKernelDesc, str]:
    """Returns (object code, the glue's description, C source)."""
    source, variants, generic = program_source(region.program, region.op_type)
    return compile_c(source, target), describe(region, variants, generic), source
