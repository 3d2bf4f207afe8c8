"""Embedding / head / router matrices read as stored (tern.kernels.kernels_stored): fp16 and
bf16 widened in registers give exactly the fp32 kernels' results on the converted matrix."""

import numba
import numpy as np
import pytest

from tern.kernels.kernels_dense import matvec_fp32_nb
from tern.kernels.kernels_stored import (
    DENSE_BF16,
    DENSE_FP16,
    DENSE_FP32,
    DENSE_INT8,
    _f16_to_f32_bits,
    dense_matvec,
    dense_row,
    router_logits,
)

SHAPES = [(1, 1), (5, 48), (97, 100), (64, 256), (300, 1000)]


def _stored(kind, rng, rows, cols):
    """(bytes as the file holds them, the exact fp32 matrix they decode to)."""
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if kind == DENSE_FP16:
        h = w.astype(np.float16)
        return h.view(np.uint8).reshape(-1), h.astype(np.float32)
    if kind == DENSE_BF16:
        b = (w.view(np.uint32) >> 16).astype(np.uint16)  # bf16: the upper 16 bits
        return b.view(np.uint8).reshape(-1), (b.astype(np.uint32) << 16).view(np.float32)
    return w.view(np.uint8).reshape(-1), w


@pytest.mark.parametrize("kind", [DENSE_FP16, DENSE_BF16, DENSE_FP32])
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_widened_matvec_is_the_fp32_kernel_bit_for_bit(kind, rows, cols):
    rng = np.random.default_rng(rows * 7 + cols)
    raw, w32 = _stored(kind, rng, rows, cols)
    x = rng.standard_normal(cols).astype(np.float32)
    want = np.zeros(rows, np.float32)
    matvec_fp32_nb(w32, x, want)
    aux = np.zeros(64, np.uint8)
    for parallel in (False, True):
        got = np.full(rows, np.nan, np.float32)
        dense_matvec(raw, aux, kind, 0, -1, rows, cols, x, got, parallel)  # address 0: the file buffer
        assert np.array_equal(got, want)
    r = rows // 2
    row = np.full(cols, np.nan, np.float32)
    dense_row(aux, raw, kind, 1, -1, r, cols, row)  # address 1: the aux buffer
    assert np.array_equal(row, w32[r])
    got_r = np.full(rows, np.nan, np.float32)  # routers: every kind in the fp32 kernel's row-dot order
    router_logits(raw, aux, kind, 0, -1, rows, cols, x, got_r)
    assert np.array_equal(got_r, want)


def test_int8_rows_and_matvec_apply_the_row_scale():
    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, size=(6, 40)).astype(np.int8)
    s = rng.uniform(0.01, 0.1, 6).astype(np.float32)
    buf = np.concatenate([q.reshape(-1).view(np.uint8), s.view(np.uint8)])
    x = rng.standard_normal(40).astype(np.float32)
    out = np.zeros(6, np.float32)
    dense_matvec(buf, buf, DENSE_INT8, 0, 2 * q.size, 6, 40, x, out, False)
    np.testing.assert_allclose(out, (q.astype(np.float64) @ x) * s, rtol=1e-5)
    row = np.zeros(40, np.float32)
    dense_row(buf, buf, DENSE_INT8, 0, 2 * q.size, 3, 40, row)
    assert np.array_equal(row, q[3].astype(np.float32) * s[3])


@pytest.mark.parametrize("rows,cols", SHAPES + [(512, 1024)])
def test_int8_router_is_the_dequantized_fp32_router_bit_for_bit(rows, cols):
    """The engine reads an int8 router's rows from the file (1 byte a weight); its logits
    equal the fp32 loop's on the reader's dequantized table (q * scale in fp32), which the
    engine dequantized at load before."""
    rng = np.random.default_rng(rows + 3 * cols)
    q = rng.integers(-127, 128, size=(rows, cols)).astype(np.int8)
    s = rng.uniform(1e-3, 0.05, rows).astype(np.float32)
    buf = np.concatenate([q.reshape(-1).view(np.uint8), s.view(np.uint8)])
    x = rng.standard_normal(cols).astype(np.float32)
    want = np.zeros(rows, np.float32)
    matvec_fp32_nb(q.astype(np.float32) * s[:, None], x, want)  # tern.packed.reader's dequantization
    got = np.full(rows, np.nan, np.float32)
    router_logits(buf, np.zeros(64, np.uint8), DENSE_INT8, 0, 2 * q.size, rows, cols, x, got)
    assert np.array_equal(got, want)


@numba.njit
def _convert_all(h, out):
    for i in range(h.size):
        out[i] = _f16_to_f32_bits(h[i])


def test_the_integer_fp16_conversion_is_exact_on_every_half():
    """The path for CPUs without F16C: all 65536 bit patterns widen exactly as numpy does
    (zeros, subnormals, normals, infinities; NaNs keep sign and payload)."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = np.zeros(h.size, np.float32)
    _convert_all(h, out)
    assert np.array_equal(out.view(np.uint32), h.view(np.float16).astype(np.float32).view(np.uint32))


def test_fp16_tables_compile_and_match_for_a_cpu_without_f16c(tmp_path):
    """numba compiling for an SSE4.2 CPU (no F16C, the commit_host.sh `noavx2` target): the
    fp16 kernels used to abort the whole process ("LLVM ERROR: Symbol not found:
    __extendhfsf2"); now they take the integer conversion (exact, tested above) and agree
    with the fp32 kernel on the converted matrix to float rounding (the summation order of
    the two loops may differ there: bit-identity holds where F16C is present)."""
    import os
    import subprocess
    import sys

    sse = "+64bit,+cmov,+cx16,+cx8,+fxsr,+mmx,+popcnt,+sahf,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3"
    env = {**os.environ, "NUMBA_CPU_NAME": "nehalem", "NUMBA_CPU_FEATURES": sse,
           "NUMBA_CACHE_DIR": str(tmp_path / "nc")}
    code = (
        "import numpy as np\n"
        "from tern.kernels import kernels_stored as ks\n"
        "from tern.kernels.kernels_dense import matvec_fp32_nb\n"
        "assert not ks.HAS_F16C\n"
        "rng = np.random.default_rng(0)\n"
        "W = rng.standard_normal((37, 300)).astype(np.float16)\n"
        "x = rng.standard_normal(300).astype(np.float32)\n"
        "out, want = np.zeros(37, np.float32), np.zeros(37, np.float32)\n"
        "ks.matvec_w16(W.view(np.uint16), x, out, False)\n"
        "matvec_fp32_nb(W.astype(np.float32), x, want)\n"
        "ref = W.astype(np.float64) @ x.astype(np.float64)\n"
        "assert np.allclose(out, want, rtol=0, atol=1e-4) and np.abs(out - ref).max() < 1e-4, (out, want)\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_rows_ahead_is_the_first_row_past_the_prefetch_distance():
    from tern.kernels.prefetch import PREFETCH_MIN_BYTES, rows_ahead

    for dtype, cols in ((np.uint16, 2048), (np.int8, 2048), (np.int8, 256), (np.float32, 4096), (np.uint16, 3)):
        W = np.zeros((2, cols), dtype)
        row = cols * W.itemsize
        a = rows_ahead(W)
        assert a >= 1 and a * row >= PREFETCH_MIN_BYTES and (a == 1 or (a - 1) * row < PREFETCH_MIN_BYTES)


def test_stored_row_kernels_prefetch_and_the_fp32_kernel_does_not():
    """fp16 / bf16 / int8 rows are prefetched ahead (measured faster from DRAM); the fp32
    kernel is left to the hardware prefetcher (measured slower with the hint):
    tern.kernels.prefetch.prefetch_row."""
    from tern.kernels import kernels_stored as ks

    x = np.ones(64, np.float32)
    out = np.empty(8, np.float32)
    cases = [(ks.matvec_w16, (np.zeros((8, 64), np.uint16), x, out, False)),
             (ks.matvec_w16_par, (np.zeros((8, 64), np.uint16), x, out, True)),
             (ks.matvec_int8w, (np.zeros((8, 64), np.int8), np.ones(8, np.float32), x, out)),
             (ks.matvec_int8w_par, (np.zeros((8, 64), np.int8), np.ones(8, np.float32), x, out)),
             (matvec_fp32_nb, (np.zeros((8, 64), np.float32), x, out))]
    for kernel, args in cases:
        opts = {k: v for k, v in kernel.targetoptions.items() if k not in ("nopython", "cache")}
        fresh = numba.njit(cache=False, **opts)(kernel.py_func)  # cached code shows no IR
        fresh(*args)
        ir = "".join(fresh.inspect_llvm().values())
        assert ("llvm.prefetch" in ir) == (kernel is not matvec_fp32_nb), kernel.__name__


def test_dense_rows_prefetch_into_l2_up_to_the_row_length_setting(tmp_path):
    """prefetch_row puts rows of at most DENSE_L2_MAX_ROW_BYTES into L2 (locality 2), longer
    ones into L1 (3): both forms are in the code, split at that constant; the setting comes
    from TERN_DENSE_PREFETCH_L2_MAX at import, is validated and is in the cache stamp."""
    import os
    import re
    import subprocess
    import sys

    from numba import njit

    from tern.kernels import prefetch as pf

    assert pf.DENSE_L2_MAX_ROW_BYTES == 2048 and f"dense_l2_max={pf.DENSE_L2_MAX_ROW_BYTES}" in pf.PREFETCH_STAMP

    @njit(cache=False)
    def touch(W):
        pf.prefetch_row(W, 1, W.shape[0])

    W = np.zeros((4, 64), np.float32)
    touch(W)
    ir = touch.inspect_llvm(touch.signatures[0])
    assert set(re.findall(r"llvm\.prefetch\.p0[^(]*\([^)]*?i32 0, i32 (\d), i32 1\)", ir)) == {"2", "3"}
    assert re.search(r"\b2048\b|\b2049\b", ir), "the row-length split is not a compiled-in constant"
    assert pf.dense_l2_setting(" 0 ") == 0
    with pytest.raises(ValueError, match="TERN_DENSE_PREFETCH_L2_MAX"):
        pf.dense_l2_setting("2k")
    env = {**os.environ, "TERN_DENSE_PREFETCH_L2_MAX": "0", "NUMBA_CACHE_DIR": str(tmp_path)}
    got = subprocess.run([sys.executable, "-c", "import tern.kernels.prefetch as P; print(P.PREFETCH_STAMP)"],
                         env=env, capture_output=True, text=True, check=True).stdout.split()[-1]
    assert "dense_l2_max=0" in got.split(";")


def test_int8_rows_prefetch_into_l2_at_every_length():
    """int8 rows (the int8 head, embedding and routers) go into L2 whatever their length;
    fp16 / bf16 rows only up to DENSE_L2_MAX_ROW_BYTES (the rule prefetch_row compiles in)."""
    from tern.kernels.prefetch import DENSE_L2_MAX_ROW_BYTES, row_into_l2

    n = DENSE_L2_MAX_ROW_BYTES
    assert row_into_l2(n, 2) and not row_into_l2(n + 2, 2) and not row_into_l2(2 * n, 4)
    assert all(row_into_l2(b, 1) for b in (64, n, n + 1, 2560, 4 * n))
