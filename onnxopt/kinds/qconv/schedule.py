"""The int8 convolution's schedule space: the output channels a tile unrolls and the parallel extent
(kinds/schedule.py); a depthwise one has its own tile."""

from ..schedule import int8_space


def space(region, target):
    return int8_space("qconv", region, target)
