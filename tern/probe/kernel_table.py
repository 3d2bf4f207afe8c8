"""The probe's kernel table: every registered matvec kernel timed at the probe's shapes
(the compute roof of the plain roofline). Importing it loads every module that registers
kernels (add yours below: one import).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

from tern.core.host_profile import KernelThroughput
from tern.probe import ternary_variants  # noqa: F401  (registers ternary_simd, _unpack, _bitplane, _lut)
from tern.probe.kernel_registry import get_setup, measure_kernel, register_kernel  # noqa: F401  (the table's API)
from tern.probe.timing import TimingConfig

DEFAULT_SIZES: tuple[tuple[int, int], ...] = ((1024, 1024),)  # (rows, cols), cache-resident

def registered_kernels() -> list[str]:
    from tern.probe.kernel_registry import _REGISTRY

    return sorted(_REGISTRY)


def measure_kernels(names: Iterable[str] | None = None,
                    sizes: Sequence[tuple[int, int]] = DEFAULT_SIZES,
                    thread_counts: Sequence[int] = (1,), timing: TimingConfig | None = None,
                    progress: bool = True) -> list[KernelThroughput]:
    """Every (kernel, size, threads) combination; all registered kernels by default."""
    from tqdm import tqdm

    names = list(names) if names is not None else registered_kernels()
    for n in names:
        get_setup(n)
    jobs = [(n, r, c, t) for n in names for (r, c) in sizes for t in thread_counts]
    out = []
    for n, r, c, t in tqdm(jobs, desc="kernels", unit="kernel", disable=not progress, leave=False,
                           file=sys.stderr):
        out.append(measure_kernel(n, r, c, t, timing))
    return out
