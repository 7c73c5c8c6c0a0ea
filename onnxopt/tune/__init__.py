"""Measured tuning: searches over a kernel's parameters, pruned by the machine model and decided by timing.

Today: the register tile of compute kernels (`tile_search.search_tile`), the band height of AFUSION kernels
(`band_search.search_band`) and Winograd or direct for 3x3 convolutions (`winograd_search.search_winograd`). A tuner takes a region, the model it
comes from, the target, the thread count and the cost cache, and returns a `TileSearchResult`; the pipeline applies
the choice (`fusion.compute.apply_tile`) before it builds the kernels. A bigger tuner (Heron's constrained search)
plugs in behind the same call.
"""

from .tile_search import MIN_SEARCH_FLOPS, TileSearchResult, search_space, search_tile

__all__ = ["MIN_SEARCH_FLOPS", "TileSearchResult", "search_space", "search_tile"]
