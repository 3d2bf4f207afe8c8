"""The engine's weights in a huge-page copy or the memory-mapped file (tern.run.weights)."""

import sys

import numpy as np
import pytest
from conftest import SMALL

from tern.packed.writer import random_model
from tern.run.engine import Engine
from tern.run.weights import HUGE_PAGE, available_memory_bytes, huge_page_copy, mapping_stats


def test_huge_page_copy_is_an_aligned_read_only_copy():
    src = np.random.default_rng(0).integers(0, 256, size=3 * HUGE_PAGE + 12345, dtype=np.uint8)
    src.flags.writeable = False
    out = huge_page_copy(src)
    assert np.array_equal(out, src) and out.ctypes.data % HUGE_PAGE == 0
    assert not out.flags.writeable and out.ctypes.data != src.ctypes.data
    assert huge_page_copy(src[:0]).size == 0
    if sys.platform == "linux":
        st = mapping_stats(out)
        assert st["rss_bytes"] >= src.size and 0 <= st["huge_page_bytes"] <= st["rss_bytes"]
        assert available_memory_bytes() > 0


def test_engine_weights_modes_compute_the_same_logits(tmp_path):
    path = random_model(SMALL, tmp_path / "w.tern", seed=5, progress=False)
    tokens = np.arange(25) * 3 % SMALL.vocab_size
    logits = {}
    for mode in ("map", "copy", "auto"):
        eng = Engine(path, weights=mode)
        assert eng.describe()["weights"] == (mode if mode != "auto" else "copy")  # a small file: copied
        assert (eng.buf.ctypes.data == eng.model.buffer.ctypes.data) == (mode == "map")
        eng.reset()
        logits[mode] = np.stack([eng.step(int(t)) for t in tokens])
    assert np.array_equal(logits["map"], logits["copy"]) and np.array_equal(logits["map"], logits["auto"])
    with pytest.raises(ValueError, match="weights"):
        Engine(path, weights="huge")
