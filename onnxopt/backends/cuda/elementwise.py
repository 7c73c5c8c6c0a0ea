"""An elementwise chain as a CUDA kernel: one thread per element over a grid-stride loop, the program evaluated with
the C backend's expressions (backends/c/expr.py), one kernel per broadcast mask as on the CPU.

    extern "C" __global__ void <op>_m<mask>(void *const *ins, void *const *outs, long long n)
"""

from __future__ import annotations

from onnxopt.backends.c.expr import C_MEMORY, body
from onnxopt.fusion.region import EwProgram


def program_source(prog: EwProgram, symbol: str) -> tuple[str, list[tuple[int, str]]]:
    """(the CUDA source, the (mask, kernel name) variants)."""
    kernels, variants = [], []
    for mask in sorted(set(prog.masks)) or [(1 << len(prog.inputs)) - 1]:
        name = f"{symbol}_m{mask}"
        ptrs = [f"const {C_MEMORY[v.dtype]} *__restrict__ in{i} = (const {C_MEMORY[v.dtype]} *)ins[{i}];"
                for i, v in enumerate(prog.inputs)]
        ptrs += [f"{C_MEMORY[v.dtype]} *__restrict__ out{j} = ({C_MEMORY[v.dtype]} *)outs[{j}];"
                 for j, v in enumerate(prog.outputs)]
        stmts, var = body(prog, lambda i, m=mask: f"in{i}[i]" if (m >> i) & 1 else f"in{i}[0]")
        stores = [f"out{j}[i] = ({C_MEMORY[v.dtype]}){var[v.name]};" for j, v in enumerate(prog.outputs)]
        kernels.append(
            f'extern "C" __global__ void {name}(void *const *ins, void *const *outs, long long n) {{\n  '
            + "\n  ".join(ptrs)
            + "\n  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;"
              " i += (long long)gridDim.x * blockDim.x) {\n    "
            + "\n    ".join(stmts + stores) + "\n  }\n}\n")
        variants.append((mask, name))
    return "#include <stdint.h>\n#include <math.h>\n" + "\n".join(kernels), variants
