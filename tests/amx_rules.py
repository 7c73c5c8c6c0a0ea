"""What AMX's bf16 tiles compute, for the tests of the kernels that run on them (GEMMs, convolutions, attention)."""

from __future__ import annotations

import numpy as np

from onnxopt.fusion.compute import bfloat16_values


def tile_rule(a: np.ndarray, w: np.ndarray, dtype: str = "bf16") -> np.ndarray:
    """tdpbf16ps's sums (tdpfp16ps's with dtype "f16"): A [rows, K] and B [K, n] rounded to bfloat16 (float16;
    values already of that type stay as they are), each product (exact in float32) added in K order, each add
    rounded to float32."""
    if dtype == "f16":
        a16, w16 = (np.asarray(x, np.float32).astype(np.float16).astype(np.float32) for x in (a, w))
    else:
        a16, w16 = bfloat16_values(a), bfloat16_values(w)
    acc = np.zeros((a.shape[0], w.shape[1]), np.float32)
    for k in range(a.shape[1]):
        acc = (acc + a16[:, k, None] * w16[None, k, :]).astype(np.float32)
    return acc


def within_accumulation_bound(a: np.ndarray, w: np.ndarray, got: np.ndarray) -> bool:
    """got is a @ w over bf16-rounded operands, summed in float32 in some order: |error| <= (K + 1) u sum |a||w|."""
    a16, w16 = bfloat16_values(a).astype(np.float64), bfloat16_values(w).astype(np.float64)
    bound = (a.shape[1] + 1) * 2.0**-24 * (np.abs(a16) @ np.abs(w16))
    return bool(np.all(np.abs(got - a16 @ w16) <= bound))
