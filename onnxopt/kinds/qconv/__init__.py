"""int8 convolutions on the target's dot-product instruction (codegen/instructions): onnxruntime's dynamically
quantized ConvInteger -> Cast -> scale -> bias ..., and static QDQ units DequantizeLinear -> Conv -> [Relu | Clip]
-> QuantizeLinear with their requantization. find.py, lower.py, exec.c; layout.py: int8 tensors passed blocked."""

from ..base import Kind
from .find import find_regions
from .layout import assign
from .lower import build
from .schedule import space



def report(region, feeds, desc) -> dict:
    """The elementwise tail its tables run (lookup.py), by the nodes' outputs, how weights with a zero point
    reach the tile (find.py signed_weights), and which form AMOS's model chose (forms.py)."""
    out = {"tail": list(region.params.tail)} if region.params.lut else {}
    if region.params.weights_note:
        out["weights"] = region.params.weights_note
    if region.params.form_note:
        out["form"] = region.params.form_note
    return out


# Asked before the compute and elementwise rules, which would take the Cast -> Mul -> Add after a ConvInteger.
# The int8 kinds' dtypes are their activations': u8 or s8 in, requantized to them or dequantized to float32.
KIND = Kind(name="qconv", find=find_regions, build=build, first=True, find_takes_target=True, layouts=assign,
            report=report, order=50, schedule=space, dtypes=("uint8", "int8"))
