"""The ternary matvec variants side by side, and a quick per-host calibration.

Every variant computes the same exact integer sums (then the two scales) as
``tern.kernels.kernels_ternary.ternary_matvec``; they differ in formulation and in the
layout they read, which ``prepare`` derives from the stored ternary2 array:

=========  =====================================================  ===============================
name       formulation                                            layout read (bits / weight)
=========  =====================================================  ===============================
simd       64-byte loads, shift+mask to u8 codes, vpdpbusd        ternary2 as stored (2)
           (AVX-512 VNNI) or vpmaddubsw+vpmaddwd (AVX2/AVX-512BW)
stream     "simd" one row per pass: a single sequential read      ternary2 as stored (2)
           stream (the engine's kernel for long rows from DRAM)
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
Importing this module registers every variant with tern.probe.kernel_registry as ``ternary_<name>``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tern.kernels import kernels_bitplane as kb
from tern.kernels import kernels_lut as kl
from tern.kernels import kernels_ternary as kt
from tern.kernels.packing import random_ternary2
from tern.kernels.simd import ROW_DOT_ISA
from tern.probe.kernel_registry import measure_kernel, register_kernel
from tern.probe.timing import TimingConfig


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
        TernaryVariant("stream", _as_stored, kt.ternary_matvec_simd_stream, kt.ternary_matvec_simd_stream_par,
                       "simd, one row per pass: one sequential read stream"),
        TernaryVariant("unpack", _as_stored, kt.ternary_matvec_unpack, kt.ternary_matvec_unpack_par,
                       "unpack to int8 in plain numba, int16 segment sums"),
        TernaryVariant("bitplane", kb.to_bitplanes, kb.ternary_matvec_bitplane,
                       kb.ternary_matvec_bitplane_par, "64-bit bit-planes x activation bit-planes, popcount"),
        TernaryVariant("lut", kl.prepare_lut, kl.ternary_matvec_lut, kl.ternary_matvec_lut_par,
                       "T-MAC style 81-entry int16 tables over groups of 4 activations"
                       + (" (vpermi2b, 64 rows at once)" if kl.HAS_VBMI else " (scalar lookups)")),
    )
    if not (v.name in ("simd", "stream") and ROW_DOT_ISA == "none")
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


def _bench_setup(name: str):
    """tern.probe.kernel_registry setup for variant ``name``: weight bytes = layout + row scales."""

    def setup(rows: int, cols: int, threads: int, rng: np.random.Generator):
        packed, rs, xq, xs = random_problem(rows, cols, seed=int(rng.integers(2**31)))
        v = VARIANTS[name]
        layout = v.prepare(packed, cols)
        del packed
        out = np.empty(rows, dtype=np.float32)  # (rows,)
        fn = v.matvec if threads == 1 else v.matvec_par
        return (lambda: fn(layout, rs, xq, xs, out)), layout.nbytes + rs.nbytes, 2 * rows * cols

    return setup


KERNEL_NAMES = {name: f"ternary_{name}" for name in VARIANTS}  # names in tern.probe.kernel_registry
for _name in VARIANTS:
    register_kernel(KERNEL_NAMES[_name], _bench_setup(_name), replace=True)


def calibrate_kernels(rows: int = 2048, cols: int = 4096, repeats: int = 3,
                      min_time_s: float = 0.02) -> dict:
    """Time every variant single-threaded on a (rows, cols) cache-resident matrix with
    tern.probe.kernel_registry (about a second in total) and remember the result. Returns
    ``{"gops_per_s": {name: median G ops/s}, "fastest": name,
    "default": kernels_ternary.DEFAULT_VARIANT, "rows": rows, "cols": cols}``."""
    global _CALIBRATION
    timing = TimingConfig(min_time_s=min_time_s, repeats=repeats, warmup_s=min_time_s / 2)
    gops = {name: measure_kernel(KERNEL_NAMES[name], rows, cols, 1, timing).gops_median
            for name in VARIANTS}
    _CALIBRATION = {"gops_per_s": gops, "fastest": max(gops, key=gops.get),
                    "default": kt.DEFAULT_VARIANT, "rows": rows, "cols": cols}
    return dict(_CALIBRATION)


def last_calibration() -> dict | None:
    """The result of the last :func:`calibrate_kernels` in this process (None if never run)."""
    return dict(_CALIBRATION) if _CALIBRATION is not None else None
