"""The int8 GEMM's schedule space: the rows of A a tile unrolls and the parallel extent (kinds/schedule.py)."""

from ..schedule import int8_space


def space(region, target):
    return int8_space("qmatmul", region, target)
