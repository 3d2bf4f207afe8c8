"""tern.probe.timing.CompileClock: the seconds numba compiles inside a block, nested compiles
once, cache loads not at all; and the probe keeps that figure apart from its wall time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
from numba import njit

from tern.probe.timing import CompileClock


def _fresh_pair():
    """Two new dispatchers, the outer calling the inner: nothing compiled yet."""
    @njit(cache=False)
    def inner(a):
        return a.sum() * 2.0

    @njit(cache=False)
    def outer(a):
        return inner(a) + 1.0

    return outer


def test_counts_a_compile_inside_the_block_once_and_nothing_outside():
    outer = _fresh_pair()
    t0 = time.perf_counter()
    with CompileClock() as clock:
        assert clock.seconds == 0.0
        assert outer(np.ones(4)) == 9.0  # compiles outer and, nested inside it, inner
    wall = time.perf_counter() - t0
    assert 0.0 < clock.seconds <= wall  # nested compiles are not added twice
    inside = clock.seconds
    _fresh_pair()(np.ones(4))  # compiled after the block: not counted
    assert clock.seconds == inside


def test_a_block_that_compiles_nothing_reads_zero():
    outer = _fresh_pair()
    outer(np.ones(4))
    with CompileClock() as clock:
        outer(np.ones(4))
    assert clock.seconds == 0.0


def test_loads_from_numbas_cache_are_not_compiling(tmp_path):
    (tmp_path / "cached_mod.py").write_text(textwrap.dedent("""
        import numpy as np
        from numba import njit

        @njit(cache=True)
        def f(a):
            s = 0.0
            for x in a:
                s += x * x
            return s
    """))
    script = textwrap.dedent("""
        import numpy as np
        from tern.probe.timing import CompileClock
        with CompileClock() as c:
            import cached_mod
            cached_mod.f(np.ones(8))
        print(c.seconds)
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    first, second = (float(subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, check=True,
                                          capture_output=True, text=True).stdout) for _ in range(2))
    assert first > 0.0
    assert second < first / 4  # the second process loads f from the cache
