"""Tensorized dot-product instructions (UNIT, AMOS): each one file holding its description (expr.py's tiny tensor
language) and its implementation; the inspector (inspector.py) finds how an operator's loops map onto one, the
mapper (mapping.py) enumerates and validates AMOS's loop-to-intrinsic mappings. Adding an instruction is adding a
file here, its line in INSTRUCTIONS, and its name in the rows of codegen/isa.py that may use it.

Matrix instructions (2-D tiles: AMX) are described in matrix.py, listed in amx.py, and run as tile programs
(tile_program.py) that the reference interpreter checks on any host."""

from . import amx, arm_sdot, arm_udot, avx2_u8s8, avx512_vnni, avx_vnni, wmma_f16

# Best first, per architecture. Which of them a target uses is its ISA row's (codegen/isa.py `dot_instructions`).
INSTRUCTIONS = (
    avx512_vnni.INSTRUCTION,
    avx_vnni.INSTRUCTION,
    avx2_u8s8.INSTRUCTION,
    arm_sdot.INSTRUCTION,
    arm_udot.INSTRUCTION,
    wmma_f16.INSTRUCTION,
)


def by_name(name: str):
    return next(i for i in INSTRUCTIONS if i.name == name)


def available(target, sources: tuple[str, str] | None = None) -> list:
    """The instructions `target` may use, best first (its ISA row's, each passing its own `available` check); with
    `sources`, only those whose (a, b) dtypes are those."""
    from ..isa import isa_of  # the table imports the instructions' files

    return [i for i in map(by_name, isa_of(target).dot_instructions)
            if sources is None or i.source_dtypes == sources]


MATRIX_INSTRUCTIONS = amx.INSTRUCTIONS


def matrix_available(target, sources: tuple[str, str] | None = None) -> list:
    """The matrix instructions `target` may use (its ISA row's), best first; with `sources`, only those whose (a, b)
    dtypes are those."""
    from ..isa import isa_of

    by = {i.name: i for i in MATRIX_INSTRUCTIONS}
    return [by[n] for n in isa_of(target).matrix_instructions if sources is None or by[n].source_dtypes == sources]
