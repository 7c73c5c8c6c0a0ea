"""Recurrent cells as one kernel each: an LSTM's or a GRU's input projection for all steps at once, then its steps
with the recurrent product and the gates fused, the weights packed once (find.py, lower.py, exec.c)."""

from ..base import Kind
from .find import find_regions
from .lower import build

KIND = Kind(name="recurrent", find=find_regions, build=build, order=30)
