"""int8 GEMMs of dynamically quantized models (MatMulInteger -> Cast -> scale -> bias -> ...) on the target's
dot-product instruction (codegen/instructions): find.py, lower.py, exec.c."""

from ..base import Kind
from .find import find_regions
from .lower import build
from .schedule import space

# Asked before the compute and elementwise rules, which would take the Cast -> Mul -> Add after the MatMulInteger.
# The int8 kinds' dtypes are their activations': u8 or s8 in, requantized to them or dequantized to float32.
KIND = Kind(name="qmatmul", find=find_regions, build=build, first=True, find_takes_target=True, order=40,
            schedule=space, dtypes=("uint8", "int8"))
