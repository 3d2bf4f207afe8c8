"""The matvec kernel registry: kernels register a setup function, the probe times them.

A kernel is registered with a setup function::

    setup_fn(rows, cols, threads, rng) -> (call, weight_bytes, ops)

that builds its inputs (random weights and activations of that shape) and returns
``call()`` running ONE matvec, the bytes of weights one call reads and the ops it does
(a multiply-add counts as 2 ops). ``threads`` > 1 asks for the kernel's parallel variant;
the benchmark sets numba's thread count around the setup and the timing.

Modules add their kernels with :func:`register_kernel` at import time; the kernel table
(tern.probe.kernel_table) imports every such module, so its listing sees them all.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tern.core.host_profile import KernelThroughput
from tern.core.records import summarize
from tern.probe.bandwidth import numba_threads
from tern.probe.timing import TimingConfig, timed_runs

SetupResult = tuple[Callable[[], None], int, int]  # (call, weight_bytes, ops)
SetupFn = Callable[[int, int, int, np.random.Generator], SetupResult]

_REGISTRY: dict[str, SetupFn] = {}


def register_kernel(name: str, setup_fn: SetupFn, *, replace: bool = False) -> None:
    """Add a kernel under ``name`` (an error if taken, unless ``replace``)."""
    if not name or not isinstance(name, str):
        raise ValueError(f"kernel name must be a non-empty string, got {name!r}")
    if not callable(setup_fn):
        raise ValueError(f"setup_fn for kernel {name!r} is not callable")
    if name in _REGISTRY and not replace and _REGISTRY[name] is not setup_fn:
        raise ValueError(f"kernel {name!r} is already registered")
    _REGISTRY[name] = setup_fn


def get_setup(name: str) -> SetupFn:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; registered: {sorted(_REGISTRY)}") from None


def measure_kernel(name: str, rows: int = 1024, cols: int = 1024, threads: int = 1,
                   timing: TimingConfig | None = None, seed: int = 0) -> KernelThroughput:
    """Throughput of one registered kernel at one shape: G ops/s (best and median over
    ``timing.repeats`` runs of >= ``timing.min_time_s`` each) and GB/s of weights read."""
    if rows < 1 or cols < 1:
        raise ValueError(f"rows and cols must be >= 1, got {rows} x {cols}")
    timing = timing or TimingConfig()
    setup = get_setup(name)
    with numba_threads(threads):
        call, weight_bytes, ops = setup(rows, cols, threads, np.random.default_rng(seed))
        if weight_bytes <= 0 or ops <= 0:
            raise ValueError(f"kernel {name!r} setup returned weight_bytes={weight_bytes}, "
                             f"ops={ops}; both must be > 0")
        call()  # compile / load from cache before timing

        def run(count: int) -> None:
            for _ in range(count):
                call()

        t = timed_runs(run, timing, fixed_cost_check=False)  # every call is one matvec
    calls_per_s = t.rates(1.0)  # one call = one matvec
    g = summarize([c * ops / 1e9 for c in calls_per_s])
    gb = summarize([c * weight_bytes / 1e9 for c in calls_per_s])
    return KernelThroughput(kernel=name, threads=threads, rows=rows, cols=cols,
                            gops_best=g["max"], gops_median=g["median"],
                            gbps_median=gb["median"], repeats=int(g["repeats"]))


# ---- the dense baselines ------------------------------------------------------------------


def _setup_fp32(rows: int, cols: int, threads: int, rng: np.random.Generator) -> SetupResult:
    from tern.kernels import kernels_dense as kd

    W = rng.standard_normal((rows, cols), dtype=np.float32)  # (rows, cols)
    x = rng.standard_normal(cols, dtype=np.float32)  # (cols,)
    out = np.empty(rows, dtype=np.float32)  # (rows,)
    kd.check_matvec_fp32(W, x, out)
    kernel = kd.matvec_fp32_nb if threads == 1 else kd.matvec_fp32_parallel_nb
    return (lambda: kernel(W, x, out)), W.nbytes, 2 * rows * cols


def _setup_int8(rows: int, cols: int, threads: int, rng: np.random.Generator) -> SetupResult:
    from tern.kernels import kernels_dense as kd

    Wq = rng.integers(-127, 128, size=(rows, cols), dtype=np.int8)  # (rows, cols)
    row_scale = rng.random(rows, dtype=np.float32) + np.float32(0.5)  # (rows,)
    xq = rng.integers(-127, 128, size=cols, dtype=np.int8)  # (cols,)
    x_scale = np.float32(0.01)
    out = np.empty(rows, dtype=np.float32)  # (rows,)
    kd.check_matvec_int8(Wq, row_scale, xq, x_scale, out)
    kernel = kd.matvec_int8_nb if threads == 1 else kd.matvec_int8_parallel_nb
    return (lambda: kernel(Wq, row_scale, xq, x_scale, out)), Wq.nbytes + row_scale.nbytes, 2 * rows * cols


register_kernel("fp32_matvec", _setup_fp32)
register_kernel("int8_matvec", _setup_int8)
