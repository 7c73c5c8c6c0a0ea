"""Chimera's register tile for the outer-product matmul micro-kernel.

The kernel keeps C in MI x NI vector registers, loads NI vectors of B per k and broadcasts MII values of A at a
time. Per k step it moves MI + NI values and performs MI * NI vector FMAs, so over KI steps its arithmetic intensity
is

    AI = MI * NI * KI / (KI * (MI + NI) + 2 * MI * NI)          (C read and written once)

subject to the register limit MI * NI + NI + MII <= registers.

The formula alone prefers a square tile (5 x 5 on 32 registers). Chimera's digest notes that the implementation
needs tie-breaks; we use the ones that make the tile usable by the kernels that call it:
- MII >= 2 (two broadcasts in flight hide the load latency of the A values) and MI divisible by MII;
- NI * lanes divides the pixel/column block of 64 floats, so a row of vectors covers whole cache lines.
On 32 zmm registers this gives (MI, NI, MII) = (6, 4, 2); on 16 ymm registers (6, 2, 2), the classic 6 x 16 tile,
except that AVX2's masked loads hold their masks in ymm registers too (AVX-512 has k registers for them): counting
those, AVX2 gets (4, 2, 2).
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_FLOATS = 64


@dataclass(frozen=True)
class RegisterTile:
    mi: int  # rows of C (broadcast A values)
    ni: int  # vectors of C per row (B vectors per k)
    mii: int  # A broadcasts in flight
    lanes: int  # floats per vector

    @property
    def columns(self) -> int:
        return self.ni * self.lanes

    def registers(self) -> int:
        return self.mi * self.ni + self.ni + self.mii


def intensity(mi: int, ni: int, ki: int) -> float:
    return mi * ni * ki / (ki * (mi + ni) + 2 * mi * ni)


def solve_register_tile(registers: int, lanes: int, ki: int = 64, tie_breaks: bool = True,
                        mask_registers: bool = False) -> RegisterTile:
    """The (MI, NI, MII) of highest intensity that fits the register file.

    `mask_registers`: the ISA keeps load/store masks in vector registers (AVX2's vmaskmov), one per B vector, so
    they count against the limit too; AVX-512 keeps them in k registers."""
    best = None
    for ni in range(1, registers):
        if tie_breaks and (BLOCK_FLOATS % (ni * lanes) != 0):
            continue
        for mi in range(1, registers):
            for mii in range(1, mi + 1):
                if mi * ni + ni + mii + (ni if mask_registers else 0) > registers:
                    break
                if tie_breaks and (mii < min(2, mi) or mi % mii != 0):
                    continue
                # Equal intensity: fewer broadcast registers, then the squarer tile.
                key = (intensity(mi, ni, ki), -mii, -abs(mi - ni))
                if best is None or key > best[0]:
                    best = (key, RegisterTile(mi, ni, mii, lanes))
    if best is None:
        raise ValueError(f"no register tile fits {registers} registers of {lanes} lanes")
    return best[1]


def candidate_tiles(registers: int, lanes: int, mask_registers: bool = False, limit: int = 4, ki: int = 64,
                    max_ni: int = 4) -> list[RegisterTile]:
    """The register tiles worth timing: every (MI, NI) that fits the register file under the solver's legality
    rules (MII >= 2 where MI >= 2, MI divisible by MII, NI * lanes dividing the 64-float block, MI * NI + NI + MII,
    plus NI masks where they live in vector registers, within `registers`), ranked by Chimera's intensity, the
    best `limit` kept. The solver's tile is always first. One MII per (MI, NI): the smallest legal one (the
    solver's tie-break). `max_ni` is the glue's limit on vectors per tile (CT_NV_MAX).

    This is the machine model's pruning of the measured search (onnxopt/tune/tile_search.py): a handful of tiles
    out of the hundreds that fit, and the formula's order decides which handful."""
    best = solve_register_tile(registers, lanes, ki, mask_registers=mask_registers)
    ranked = []
    for ni in range(1, max_ni + 1):
        if BLOCK_FLOATS % (ni * lanes) != 0:
            continue
        for mi in range(1, registers):
            fits = False
            for mii in range(min(2, mi), mi + 1):
                if mi * ni + ni + mii + (ni if mask_registers else 0) > registers:
                    break
                fits = True
                if mi % mii != 0:
                    continue
                ranked.append(((intensity(mi, ni, ki), -mii, -abs(mi - ni)), RegisterTile(mi, ni, mii, lanes)))
                break
            if not fits:
                break
    ranked.sort(key=lambda kt: kt[0], reverse=True)
    out = [best] + [t for _, t in ranked if (t.mi, t.ni) != (best.mi, best.ni)]
    return out[:max(1, limit)]
