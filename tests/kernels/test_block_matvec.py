"""tern.kernels.kernels_dense.column_blocks / block_matvec: the column-blocked dense matvec of the
SSM's dt projection (right sums at every shape, a stored fp16 matrix sums as its fp32 conversion bit
for bit), and tern.kernels.ssm_step.selective_scan_step on it: channel ranges at block boundaries
give the whole step's values, and the step matches a float64 reference of docs/MODEL.md's scan."""

import numba
import numpy as np
import pytest

from tern.kernels.kernels_dense import COLUMN_BLOCK, block_matvec, column_blocks
from tern.kernels.policy import REGION_SCAN_ALIGN
from tern.kernels.ssm_step import selective_scan_step


@numba.njit
def _run(Wb, x, rows):  # every block of Wb (float32, or fp16 as uint16 bits) times x
    acc, out = np.empty(COLUMN_BLOCK, np.float32), np.empty(Wb.shape[0] * COLUMN_BLOCK, np.float32)
    for b in range(Wb.shape[0]):
        block_matvec(Wb, b, x, acc)
        out[b * COLUMN_BLOCK:(b + 1) * COLUMN_BLOCK] = acc
    return out[:rows]


def test_column_blocks_layout_and_padding():
    W = np.arange(130 * 3, dtype=np.float32).reshape(130, 3)
    Wb = column_blocks(W)
    assert Wb.shape == (3, 3, COLUMN_BLOCK) and Wb.flags.c_contiguous
    for r in range(130):
        assert np.array_equal(Wb[r // COLUMN_BLOCK, :, r % COLUMN_BLOCK], W[r])
    assert not Wb[2, :, 130 - 128:].any()  # rows past 130: zero
    with pytest.raises(ValueError, match="2-D"):
        column_blocks(np.zeros(5, np.float32))


@pytest.mark.parametrize("rows, cols", [(1, 1), (63, 2), (64, 160), (130, 7), (200, 33), (640, 160)])
def test_block_matvec_sums(rows, cols):
    rng = np.random.default_rng(rows * 1000 + cols)
    W = rng.standard_normal((rows, cols)).astype(np.float32)
    x = rng.standard_normal(cols + 5).astype(np.float32)  # longer than cols: the extra values are never read
    out = _run(column_blocks(W), x, rows)
    ref = W.astype(np.float64) @ x[:cols].astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.sqrt(cols))


@pytest.mark.parametrize("rows, cols", [(64, 160), (100, 9)])
def test_block_matvec_fp16_sums_as_its_fp32_conversion(rows, cols):
    rng = np.random.default_rng(cols)
    W16 = (0.1 * rng.standard_normal((rows, cols))).astype(np.float16)
    x = rng.standard_normal(cols).astype(np.float32)
    a = _run(column_blocks(W16.view(np.uint16)), x, rows)
    b = _run(column_blocks(W16.astype(np.float32)), x, rows)
    assert np.array_equal(a, b)


def _scan_problem(di, R, N, seed):
    rng = np.random.default_rng(seed)
    f = np.float32
    return dict(dtw=(0.1 * rng.standard_normal((di, R))).astype(f), dtb=(0.1 * rng.standard_normal(di)).astype(f),
                AT=-np.abs(rng.standard_normal((N, di))).astype(f), Dp=rng.standard_normal(di).astype(f),
                hT=rng.standard_normal((N, di)).astype(f), dbc=rng.standard_normal(R + 2 * N).astype(f),
                uc=rng.standard_normal(di).astype(f), z=rng.standard_normal(di).astype(f))


def _scan(p, ranges):
    di = p["dtb"].shape[0]
    hT, dt, y = p["hT"].copy(), np.zeros(di, np.float32), np.zeros(di, np.float32)
    Wb = column_blocks(p["dtw"])
    for i0, i1 in ranges:
        selective_scan_step(Wb, p["dtb"], p["AT"], p["Dp"], hT, p["dbc"], p["uc"], p["z"], dt, y, i0, i1)
    return hT, y


@pytest.mark.parametrize("di", [48, 200, 320])
def test_scan_step_channel_ranges_equal_the_whole(di):
    assert REGION_SCAN_ALIGN % COLUMN_BLOCK == 0  # the one-region step splits channels at these multiples
    p = _scan_problem(di, 7, 4, seed=di)
    whole = _scan(p, [(0, di)])
    cuts = list(range(0, di, COLUMN_BLOCK)) + [di]
    parts = _scan(p, list(zip(cuts[:-1], cuts[1:], strict=True))[::-1])  # any order: channels are independent
    for a, b in zip(whole, parts, strict=True):
        assert np.array_equal(a, b)


def test_scan_step_matches_a_float64_reference():
    di, R, N = 130, 9, 4
    p = _scan_problem(di, R, N, seed=1)
    hT, y = _scan(p, [(0, di)])
    d = {k: v.astype(np.float64) for k, v in p.items()}
    dt = np.logaddexp(0.0, d["dtw"] @ d["dbc"][:R] + d["dtb"])  # softplus
    B, C = d["dbc"][R:R + N], d["dbc"][R + N:]
    h = np.exp(dt[None, :] * d["AT"]) * d["hT"] + (dt * d["uc"])[None, :] * B[:, None]  # (N, Di)
    ref_y = (C @ h + d["Dp"] * d["uc"]) * (d["z"] / (1.0 + np.exp(-d["z"])))
    np.testing.assert_allclose(hT, h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y, ref_y, rtol=1e-4, atol=1e-4)
