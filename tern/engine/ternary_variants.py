"""The ternary matvec variants side by side, and a quick per-host calibration.

Every variant computes the same exact integer sums (then the two scales) as
``tern.engine.kernels_ternary.ternary_matvec``; they differ in formulation and in the
layout they read, which ``prepare`` derives from the stored ternary2 array:

=========  =====================================================  ===============================
name       formulation                                            layout read (bits / weight)
=========  =====================================================  ===============================
simd       64-byte loads, shift+mask to u8 codes, vpdpbusd        ternary2 as stored (2)
           (AVX-512 VNNI) or vpmaddubsw+vpmaddwd (AVX2/AVX-512BW)
unpack     the same unpack in plain numba, int16 dot              ternary2 as stored (2)
bitplane   +1 / -1 weight bit-planes, popcount against the 8      (rows, 2, cols/64) uint64 (2)
           activation bit-planes (vpopcntq)
lut        T-MAC style: 81-entry int16 tables of partial sums     (rows, cols/4) base-3 codes (2)
           over groups of 4 activations, one lookup per 4 weights
=========  =====================================================  ===============================

The default (``kernels_ternary.DEFAULT_VARIANT``) follows a documented rule — "simd" where
the CPU has AVX2 or AVX-512, else "unpack" — because only those two read the stored layout
directly; :func:`calibrate_kernels` measures all variants on this host and records which
was fastest, so the rule can be checked (and the probe can store the figures).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import kernels_bitplane as kb
from . import kernels_lut as kl
from . import kernels_ternary as kt
from .packing import random_ternary2
from .simd import ROW_DOT_ISA


def _as_stored(packed2: np.ndarray, cols: int) -> np.ndarray:
    return packed2


@dataclass(frozen=True)
class TernaryVariant:
    name: str
    prepare: Callable[[np.ndarray, int], np.ndarray]  # (ternary2 packed, cols) -> layout array
    matvec: Callable  # (layout, row_scale, xq, x_scale, out), njit
    matvec_par: Callable  # same, rows over numba threads
    description: str


VARIANTS: dict[str, TernaryVariant] = {
    v.name: v
    for v in (
        TernaryVariant("simd", _as_stored, kt.ternary_matvec_simd, kt.ternary_matvec_simd_par,
                       f"unpack + {ROW_DOT_ISA} byte dot products (numba intrinsics)"),
        TernaryVariant("unpack", _as_stored, kt.ternary_matvec_unpack, kt.ternary_matvec_unpack_par,
                       "unpack to int8 in plain numba, int16 segment sums"),
        TernaryVariant("bitplane", kb.to_bitplanes, kb.ternary_matvec_bitplane,
                       kb.ternary_matvec_bitplane_par, "64-bit bit-planes x activation bit-planes, popcount"),
        TernaryVariant("lut", kl.to_lut81, kl.ternary_matvec_lut, kl.ternary_matvec_lut_par,
                       "T-MAC style 81-entry int16 tables over groups of 4 activations"),
    )
    if not (v.name == "simd" and ROW_DOT_ISA == "none")
}

_CALIBRATION: dict | None = None


def get_variant(name: str) -> TernaryVariant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown ternary variant {name!r}; available here: {', '.join(VARIANTS)}") from None


def random_problem(rows: int, cols: int, seed: int = 0):
    """A random ternary2 matrix with its scales and a random int8 activation vector:
    ``(packed (rows, ceil(cols/4)) uint8, row_scale (rows,) f4, xq (cols,) i1, x_scale f4)``."""
    rng = np.random.default_rng(seed)
    packed = random_ternary2(rows, cols, seed=seed)
    row_scale = (rng.random(rows, dtype=np.float32) + np.float32(0.5))  # (rows,)
    xq = rng.integers(-127, 128, size=cols, dtype=np.int8)  # (cols,)
    return packed, row_scale, xq, np.float32(0.01)


def calibrate_kernels(rows: int = 2048, cols: int = 4096, repeats: int = 5,
                      min_time_s: float = 0.02) -> dict:
    """Time every variant single-threaded on a (rows, cols) L2/L3-resident matrix (well under
    a second in total) and remember the result. Returns ``{"gops_per_s": {name: median G ops/s},
    "fastest": name, "default": kernels_ternary.DEFAULT_VARIANT, "rows", "cols"}``."""
    global _CALIBRATION
    packed, rs, xq, xs = random_problem(rows, cols)
    out = np.empty(rows, dtype=np.float32)
    gops = {}
    for name, v in VARIANTS.items():
        layout = v.prepare(packed, cols)
        v.matvec(layout, rs, xq, xs, out)  # compile / load from cache, warm caches
        samples = []
        for _ in range(repeats):
            n, t0 = 0, time.perf_counter()
            while True:
                v.matvec(layout, rs, xq, xs, out)
                n += 1
                dt = time.perf_counter() - t0
                if dt >= min_time_s:
                    break
            samples.append(2.0 * rows * cols * n / dt / 1e9)
        gops[name] = float(np.median(samples))
    _CALIBRATION = {"gops_per_s": gops, "fastest": max(gops, key=gops.get),
                    "default": kt.DEFAULT_VARIANT, "rows": rows, "cols": cols}
    return dict(_CALIBRATION)


def last_calibration() -> dict | None:
    """The result of the last :func:`calibrate_kernels` in this process (None if never run)."""
    return dict(_CALIBRATION) if _CALIBRATION is not None else None
