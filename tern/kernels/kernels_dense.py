"""Dense matvec baselines: fp32 and int8 (int8 weights x int8 activations, int32 sums).

These are the decode engine's baseline kernels and the compute roof the probe measures
(``tern.probe.kernel_table``). Orientation: W is (rows, cols) = (output units, inputs).

    matvec_fp32:  out[r] = sum_c W[r, c] * x[c]
    matvec_int8:  out[r] = row_scale[r] * x_scale * sum_c Wq[r, c] * xq[c]   (sum exact, int32)

The ``*_nb`` functions are ``@njit(cache=True)`` kernels for numba callers (the engine);
they assume validated, C-contiguous inputs. The functions without ``_nb`` validate and
raise ``ValueError`` naming the problem. ``*_parallel`` variants split output rows over
numba's threads (``prange``). The int32 sum is exact while cols * 127 * 127 < 2**31
(cols < 133 000), which :func:`matvec_int8` checks.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

INT8_MAX_COLS = (2**31 - 1) // (127 * 127)  # int32 sums of int8 x int8 products stay exact


@njit(fastmath=True, cache=True)
def _dot_fp32(W, x, r):
    """sum_c W[r, c] * x[c]; fastmath lets LLVM keep several vector FMA accumulators."""
    s = np.float32(0.0)
    for c in range(x.shape[0]):
        s += W[r, c] * x[c]
    return s


@njit(cache=True)
def _dot_int8(Wq, xq, r):
    """sum_c Wq[r, c] * xq[c] in int32. The explicit int32 casts keep numba from widening
    to int64, so LLVM emits sign-extend + vpmaddwd (16-bit multiply, 32-bit pair sums)."""
    s = np.int32(0)
    for c in range(xq.shape[0]):
        s = np.int32(s + np.int32(Wq[r, c]) * np.int32(xq[c]))
    return s


@njit(fastmath=True, cache=True)
def matvec_fp32_nb(W, x, out):
    """out (rows,) f4 = W (rows, cols) f4 @ x (cols,) f4; one thread."""
    for r in range(W.shape[0]):
        out[r] = _dot_fp32(W, x, r)


@njit(fastmath=True, cache=True, parallel=True)
def matvec_fp32_parallel_nb(W, x, out):
    """As :func:`matvec_fp32_nb`, output rows split over numba's threads."""
    for r in prange(W.shape[0]):
        out[r] = _dot_fp32(W, x, r)


@njit(cache=True)
def matvec_int8_nb(Wq, row_scale, xq, x_scale, out):
    """out (rows,) f4 = row_scale (rows,) f4 * x_scale * (Wq (rows, cols) i1 @ xq (cols,) i1)."""
    for r in range(Wq.shape[0]):
        out[r] = np.float32(_dot_int8(Wq, xq, r)) * row_scale[r] * x_scale


@njit(cache=True, parallel=True)
def matvec_int8_parallel_nb(Wq, row_scale, xq, x_scale, out):
    """As :func:`matvec_int8_nb`, output rows split over numba's threads."""
    for r in prange(Wq.shape[0]):
        out[r] = np.float32(_dot_int8(Wq, xq, r)) * row_scale[r] * x_scale


# ---- validating wrappers --------------------------------------------------------------------


def _need(name: str, a: object, dtype: type, ndim: int) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != np.dtype(dtype) or a.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D {np.dtype(dtype).name} array, "
                         f"got {a.ndim}-D {a.dtype}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use np.ascontiguousarray)")
    return a


def _check_matvec(w_name: str, W: np.ndarray, w_dtype: type, x_name: str, x: np.ndarray,
                  x_dtype: type, per_row: dict[str, np.ndarray]) -> int:
    """W (rows, cols), x (cols,) and float32 (rows,) arrays ``per_row``; returns cols."""
    _need(w_name, W, w_dtype, 2)
    _need(x_name, x, x_dtype, 1)
    rows, cols = W.shape
    if x.shape[0] != cols:
        raise ValueError(f"{x_name} has {x.shape[0]} elements but {w_name} has {cols} columns")
    for name, a in per_row.items():
        _need(name, a, np.float32, 1)
        if a.shape[0] != rows:
            raise ValueError(f"{name} has {a.shape[0]} elements but {w_name} has {rows} rows")
    return cols


def check_matvec_fp32(W: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """Raise ValueError unless W (rows, cols) f4, x (cols,) f4, out (rows,) f4 fit."""
    _check_matvec("W", W, np.float32, "x", x, np.float32, {"out": out})


def check_matvec_int8(Wq: np.ndarray, row_scale: np.ndarray, xq: np.ndarray, x_scale: float,
                      out: np.ndarray) -> None:
    """Raise ValueError unless Wq (rows, cols) i1, row_scale (rows,) f4, xq (cols,) i1,
    a finite x_scale and out (rows,) f4 fit, with cols small enough for exact int32 sums."""
    cols = _check_matvec("Wq", Wq, np.int8, "xq", xq, np.int8, {"row_scale": row_scale, "out": out})
    if cols > INT8_MAX_COLS:
        raise ValueError(f"{cols} columns can overflow the int32 sum (at most {INT8_MAX_COLS})")
    if not np.isfinite(x_scale):
        raise ValueError(f"x_scale must be finite, got {x_scale}")


def matvec_fp32(W: np.ndarray, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = W @ x (fp32, one thread), validated; returns out."""
    check_matvec_fp32(W, x, out)
    matvec_fp32_nb(W, x, out)
    return out


def matvec_fp32_parallel(W: np.ndarray, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = W @ x (fp32, rows over numba's threads), validated; returns out."""
    check_matvec_fp32(W, x, out)
    matvec_fp32_parallel_nb(W, x, out)
    return out


def matvec_int8(Wq: np.ndarray, row_scale: np.ndarray, xq: np.ndarray, x_scale: float,
                out: np.ndarray) -> np.ndarray:
    """out = row_scale * x_scale * (Wq @ xq) with an exact int32 sum (one thread); returns out."""
    check_matvec_int8(Wq, row_scale, xq, x_scale, out)
    matvec_int8_nb(Wq, row_scale, xq, np.float32(x_scale), out)
    return out


def matvec_int8_parallel(Wq: np.ndarray, row_scale: np.ndarray, xq: np.ndarray, x_scale: float,
                         out: np.ndarray) -> np.ndarray:
    """As :func:`matvec_int8`, output rows over numba's threads; returns out."""
    check_matvec_int8(Wq, row_scale, xq, x_scale, out)
    matvec_int8_parallel_nb(Wq, row_scale, xq, np.float32(x_scale), out)
    return out
