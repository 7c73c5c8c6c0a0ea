"""int8 GEMMs of dynamically quantized models (MatMulInteger -> Cast -> scale -> bias -> ...) on the target's
dot-product instruction (codegen/instructions): find.py, lower.py, exec.c."""

from ..base import Kind
from .find import find_regions
from .lower import build
from .schedule import space

# Asked before the compute and elementwise rules, which would take the Cast -> Mul -> Add after the MatMulInteger.
KIND = Kind(name="qmatmul", schedule=space, find=find_regions, build=build, first=True, order=40)
