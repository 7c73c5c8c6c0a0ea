"""The qconv kind's parameters: the int8 convolution's geometry, its zero-point terms and its epilogue."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from onnxopt.fusion.params import KindParams

PANEL = 16  # output pixels per packed panel of activations: two AVX2 vectors of 8 s32 lanes, one AVX-512 vector
POSITION, CHANNEL, SCALAR = 0, 1, 3  # how a float epilogue input broadcasts (fusion/compute.py's kinds)
BLOCK = 4  # channels a group of the blocked int8 layout: the 4 bytes of K the dot-product instructions take
FLOAT, QUANT = 0, 1  # the epilogue: a float program (ConvInteger -> Cast -> ...) or a requantization (QDQ unit)


@dataclass(frozen=True)
class QConvParams(KindParams):
    family: ClassVar[str] = "qconv"
    cin: int
    cout: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]  # top, left, bottom, right
    dilations: tuple[int, int]
    k4: int  # the reduction of a group (cin / group * kh * kw, or kh * kw with one input channel a group) padded
    group: int  # input and output channels in `group` independent groups (depthwise: cin)
    mode: int  # FLOAT or QUANT
    has_asum: bool  # a row term d[r] * (the pixel's sum of activations): weights with a zero point, or u8 weights
    has_fix: bool  # weights split so that no pair saturates (avx2_u8s8.split_pairs): their corrections are inputs
    act_signed: bool = False  # s8 activations: packed as u8 (+128, a flip of the sign bit) with their zero point
    implicit: bool = False  # stride 1: the tile reads a channel-grouped copy of the input per tap (exec.c), no im2col
    # which form AMOS's model chose and its predictions (forms.py), for the report; "" where only one runs
    form_note: str = field(default="", compare=False, hash=False)
    depthwise: bool = False  # one input channel per output channel: its own tile, on the padded input (lower.py)
    int_bias: bool = False  # FLOAT: an int32 bias per channel added to the sums before the Cast (older quantizers')
    extra_kinds: tuple[int, ...] = ()  # FLOAT: per epilogue input, POSITION / CHANNEL / SCALAR
    out_signed: bool = False  # QUANT: an s8 output (else u8)
    clamp: tuple[int, int] = (0, 255)  # QUANT: the output's range after the Relu or Clip folded into it
    out_zero: int = 0  # QUANT: the output's zero point
    # QUANT: the requantized value (+ lut_offset, 128 for an s8 one) indexes a table of 256 bytes a channel, the
    # elementwise tail after it (lookup.py); out_signed is then the tail's output type
    lut: bool = False
    lut_offset: int = 0
    # QUANT: a float per channel added after the scale, the part of a float bias below the sums' step
    # (graph/quantized_weights.py bias_in_sum_steps): a bias the quantizer left float is added at float precision
    bias_rest: bool = False
    mr: int = 4  # the schedule (onnxopt/tune/int8_schedule.py): output channels a tile (the unrolled rows)
    tasks: int = 16  # the schedule: most tasks a call is split into (the parallel extent)
    # int8 tensors between qconv kernels (layout.py): [N, ceil(C / 4), H, W, 4], channels past C zero
    in_blocked: bool = False
    out_blocked: bool = False
    # how weights with a zero point (u8 ones) reach the tile, for the report (find.py signed_weights); "" for s8
    # weights of zero point 0
    weights_note: str = field(default="", compare=False, hash=False)
    body: tuple = field(default=(), compare=False, hash=False)  # the function fallback's nodes (find.py)
    tail: tuple = field(default=(), compare=False, hash=False)  # the outputs of the nodes its tables run

    def runs_as_onnxruntime(self) -> tuple:
        return self.tail

    def key(self) -> list:
        return [self.cin, self.cout, list(self.kernel), list(self.strides), list(self.pads), list(self.dilations),
                self.k4, self.group, self.mode, self.has_asum, self.has_fix, self.act_signed, self.implicit,
                self.depthwise, self.int_bias,
                list(self.extra_kinds),
                self.out_signed, list(self.clamp), self.out_zero, self.mr, self.tasks, self.in_blocked,
                self.out_blocked, self.lut, self.lut_offset, self.bias_rest]

    def tensor_lanes(self) -> int:
        return BLOCK if self.in_blocked or self.out_blocked else 0

    def blocked_io(self) -> tuple[bool, bool]:
        return self.in_blocked, self.out_blocked

    def fallback_body(self) -> list:
        return list(self.body)
