"""Tensorized dot-product instructions (UNIT, AMOS): each one file holding its description (expr.py's tiny tensor
language) and its implementation; the inspector (inspector.py) finds how an operator's loops map onto one, the
mapper (mapping.py) enumerates and validates AMOS's loop-to-intrinsic mappings. Adding an instruction is adding a
file here and its line in INSTRUCTIONS."""

from . import arm_sdot, arm_udot, avx2_u8s8, avx512_vnni, avx_vnni, wmma_f16

# Best first, per architecture: the first available one wins (`select`).
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
    """The instructions `target` may use, best first; with `sources`, only those whose (a, b) dtypes are those."""
    return [i for i in INSTRUCTIONS if i.available(target) and (sources is None or i.source_dtypes == sources)]
