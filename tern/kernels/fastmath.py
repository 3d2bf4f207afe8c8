"""Small numba math helpers shared by the torch model's scan and the decode engine
(torch-free, so importing the engine does not import torch)."""

from __future__ import annotations

import numpy as np
from numba import njit

_LOG2E = np.float32(1.4426950408889634)
_LN2 = 0.6931471805599453


@njit(inline="always", fastmath=True, cache=True)
def fexp_nonpos(x):
    """exp(x) for float32 x <= 0 (clamped below at 2**-126); relative error < 2e-7 + 1.2e-7 |x|
    (the polynomial's 2e-7, and the float32 rounding of x * log2(e), which grows with |x|:
    ~1e-6 at x = -20)."""
    y = max(np.float32(x * _LOG2E), np.float32(-126.0))
    k = np.floor(y + np.float32(0.5))
    f = (y - k) * np.float32(_LN2)  # |f| <= ln2 / 2
    # Taylor series of exp(f) to degree 7 (remainder < 3e-9 on |f| <= 0.347)
    p = np.float32(1.0 / 5040.0)
    p = p * f + np.float32(1.0 / 720.0)
    p = p * f + np.float32(1.0 / 120.0)
    p = p * f + np.float32(1.0 / 24.0)
    p = p * f + np.float32(1.0 / 6.0)
    p = p * f + np.float32(0.5)
    p = p * f + np.float32(1.0)
    p = p * f + np.float32(1.0)
    scale = (np.int32(k) + np.int32(127)) << 23
    return p * np.int32(scale).view(np.float32)


@njit(inline="always", fastmath=True, cache=True)
def fsigmoid(x):
    """1 / (1 + exp(-x)) for float32 x from the vectorisable exp of a non-positive argument
    (relative error < 3e-7 + 1.2e-7 |x|)."""
    e = fexp_nonpos(-abs(x))
    r = np.float32(1.0) / (np.float32(1.0) + e)
    return r if x >= 0 else e * r

