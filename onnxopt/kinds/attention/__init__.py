"""Attention chains (MatMul -> scale -> mask -> Softmax -> MatMul) as one kernel each (find.py, lower.py, exec.c)."""

from ..base import Kind
from .find import find_regions
from .lower import build
from .plan import report
from .schedule import space

# First: the compute rule would otherwise take the chain's two MatMuls as matmul kernels of their own.
KIND = Kind(name="attention", find=find_regions, build=build, first=True, report=report, order=10, schedule=space)
