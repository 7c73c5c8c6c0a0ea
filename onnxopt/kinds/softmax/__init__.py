"""Softmax and LogSoftmax as a row kernel of its own (find.py, lower.py, exec.c)."""

from ..base import Kind
from .find import find_regions
from . import c
from .lower import build
from .schedule import space

KIND = Kind(name="softmax", find=find_regions, build=build, lowerings={"c": c.build}, schedule=space, order=20)
