"""Softmax and LogSoftmax as a row kernel of its own (find.py, lower.py, exec.c)."""

from ..base import Kind
from .find import find_regions
from .lower import build

KIND = Kind(name="softmax", find=find_regions, build=build)
