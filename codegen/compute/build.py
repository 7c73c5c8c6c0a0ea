"""One compute region (a convolution or matmul with its epilogue) -> native object and the glue's description."""

from __future__ import annotations

from onnxopt.fusion.region import Region

from ..target import Target
from .describe import describe_compute
from .tile_sets import TileSetRequest, compile_tile_set, tile_set_object


def build_compute(region: Region, target: Target) -> tuple[tuple[bytes, ...], object]:
    """Returns (object code: one object per tile set the kernel uses, glue description). The tile sets are shared
    with every other kernel that needs the same ones (codegen/compute/tile_sets.py)."""
    if region.compute.op == "afusion":  # two convolutions in one kernel (codegen/compute/afusion.py)
        from .afusion import describe_afusion as describe
    elif region.compute.op == "siblings":  # convolutions of one input in one kernel (codegen/compute/siblings.py)
        from .siblings import describe_siblings as describe
    else:
        describe = describe_compute
    desc, sets = describe(region, region.op_type, target)
    objects = tuple(dict.fromkeys(tile_set_object(s, target) for s in sets))
    return objects, desc


def compute_tile_sets(region: Region, target: Target) -> list[TileSetRequest]:
    """The tile sets the kernel of a compute region (a plain, AFUSION or sibling one) uses."""
    if region.compute.op in ("afusion", "siblings"):
        return [s for part in region.compute.parts for s in compute_tile_sets(part, target)]
    return describe_compute(region, region.op_type, target)[1]


def tile_sets_of(regions: list[Region], target: Target) -> list[TileSetRequest]:
    """The tile sets of the compute regions among `regions`, to prebuild (tile_sets.prebuild). A region that cannot
    be described is left out: building its kernel reports why."""
    sets: list[TileSetRequest] = []
    for r in regions:
        if r.compute is None:
            continue
        try:
            sets += compute_tile_sets(r, target)
        except Exception:  # noqa: BLE001, S112 - reported by the kernel's own build
            continue
    return sets


def compute_ir(region: Region, target: Target) -> str:
    """The LLVM IR of the tile sets of a compute region's kernel, for inspection."""
    return "\n".join(compile_tile_set(s, target)[1] for s in compute_tile_sets(region, target))
