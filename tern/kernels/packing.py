"""Ternary weight quantization and packing (2-bit "ternary2" and base-3 "ternary_b3").

Layouts (one packed row per output row, rows independent, no row padding; the packed
file stores exactly these arrays):

``ternary2`` — 2 bits per weight, ``ternary2_row_bytes(cols) = ceil(cols / 4)`` bytes per
row. A weight ``w`` in {-1, 0, +1} is stored as the code ``c = w + 1`` in {0, 1, 2}
(code 3 is invalid). Columns are cut into segments of 256 (the last one shorter);
a segment of ``L`` columns starting at column ``s`` and byte ``b`` uses ``G = ceil(L/4)``
bytes (64 for a full segment) and stores column ``s + G*k + j`` in bits ``2k..2k+1`` of
byte ``b + j`` (``j < G``, ``k < 4``); slots past the end of the row hold code 1 (zero).
So one 64-byte load and four shift+mask steps give 4 x 64 contiguous weights, which is
what the int8 / VNNI kernel wants.

``ternary_b3`` — base 3, 5 weights per byte (1.6 bits/weight),
``ternary_b3_row_bytes(cols) = ceil(cols / 5)``: byte ``i`` of a row is
``sum_k (w[5i + k] + 1) * 3**k`` (``k < 5``; missing weights count as 0, code 1), so
valid bytes are 0..242. :func:`expand_b3_to_ternary2` converts to the 2-bit layout
(e.g. at load time).

Weight quantization follows docs/MODEL.md "BitLinear": per output row absmean scale.
"""

from __future__ import annotations

import numpy as np

from tern.kernels.policy import SEGMENT_COLS

SEGMENT_BYTES = SEGMENT_COLS // 4  # 64 bytes = one zmm load
CODE_ZERO = 1  # code of a zero weight (and of padding slots)
B3_TRITS = 5
B3_MAX_BYTE = 3**B3_TRITS - 1  # 242
SCALE_MIN = 1e-8  # absmean clamp of docs/MODEL.md
_CHUNK_ELEMS = 1 << 24  # rows are processed in chunks of about this many weights
_VALID_BYTES = np.array([a | b << 2 | c << 4 | d << 6 for d in range(3) for c in range(3)
                         for b in range(3) for a in range(3)], dtype=np.uint8)  # the 81 valid bytes


def ternary2_row_bytes(cols: int) -> int:
    """Bytes per packed row of ``cols`` ternary weights in the ternary2 layout."""
    _check_cols(cols)
    return (cols + 3) // 4


def ternary_b3_row_bytes(cols: int) -> int:
    """Bytes per packed row of ``cols`` ternary weights in the base-3 layout."""
    _check_cols(cols)
    return (cols + B3_TRITS - 1) // B3_TRITS


def ternary2_segments(cols: int) -> list[tuple[int, int, int, int]]:
    """Segments of a ternary2 row: ``(first_col, n_cols, first_byte, n_bytes)``."""
    _check_cols(cols)
    segs = []
    s = 0
    while s < cols:
        n = min(SEGMENT_COLS, cols - s)
        segs.append((s, n, s // 4, (n + 3) // 4))
        s += n
    return segs


def _check_cols(cols: int) -> None:
    if not isinstance(cols, (int, np.integer)) or isinstance(cols, bool) or cols < 1:
        raise ValueError(f"cols must be a positive integer, got {cols!r}")


def _chunk_rows(cols: int) -> int:
    return max(1, _CHUNK_ELEMS // max(1, cols))


def check_ternary(wt: np.ndarray, name: str = "wt") -> None:
    """ValueError unless ``wt`` is a 2-D int8 array with values in {-1, 0, 1}."""
    if not isinstance(wt, np.ndarray) or wt.dtype != np.int8 or wt.ndim != 2:
        raise ValueError(f"{name} must be a 2-D int8 array of ternary weights, got "
                         f"{getattr(wt, 'dtype', type(wt))} with shape {getattr(wt, 'shape', None)}")
    if wt.shape[0] < 1 or wt.shape[1] < 1:
        raise ValueError(f"{name} must have at least one row and one column, got shape {wt.shape}")
    for r0 in range(0, wt.shape[0], _chunk_rows(wt.shape[1])):
        blk = wt[r0:r0 + _chunk_rows(wt.shape[1])]
        if blk.min() < -1 or blk.max() > 1:
            raise ValueError(f"{name} has values outside {{-1, 0, 1}} (rows from {r0})")


def _check_packed(packed: np.ndarray, row_bytes: int, name: str) -> None:
    if not isinstance(packed, np.ndarray) or packed.dtype != np.uint8 or packed.ndim != 2:
        raise ValueError(f"{name} must be a 2-D uint8 array, got "
                         f"{getattr(packed, 'dtype', type(packed))} with shape {getattr(packed, 'shape', None)}")
    if packed.shape[1] != row_bytes or packed.shape[0] < 1:
        raise ValueError(f"{name} has shape {packed.shape}; expected (rows >= 1, {row_bytes}) bytes per row")


# ---- ternary2 -------------------------------------------------------------------------------


def pack_ternary2(wt: np.ndarray) -> np.ndarray:
    """Pack ternary ``wt`` (rows, cols) int8 into the ternary2 layout: (rows, ceil(cols/4)) uint8."""
    check_ternary(wt)
    rows, cols = wt.shape
    out = np.empty((rows, ternary2_row_bytes(cols)), dtype=np.uint8)
    step = _chunk_rows(cols)
    for r0 in range(0, rows, step):
        codes = (wt[r0:r0 + step] + CODE_ZERO).astype(np.uint8)  # (r, cols) in {0,1,2}
        o = out[r0:r0 + step]
        for s, n, b, g in ternary2_segments(cols):
            seg = np.full((codes.shape[0], 4 * g), CODE_ZERO, dtype=np.uint8)  # (r, 4G)
            seg[:, :n] = codes[:, s:s + n]
            seg = seg.reshape(codes.shape[0], 4, g)  # (r, k, j): column s + G*k + j
            o[:, b:b + g] = seg[:, 0] | (seg[:, 1] << 2) | (seg[:, 2] << 4) | (seg[:, 3] << 6)
    return out


def unpack_ternary2(packed: np.ndarray, cols: int) -> np.ndarray:
    """Inverse of :func:`pack_ternary2`: (rows, cols) int8 in {-1, 0, 1}."""
    _check_packed(packed, ternary2_row_bytes(cols), "packed (ternary2)")
    rows = packed.shape[0]
    out = np.empty((rows, cols), dtype=np.int8)
    step = _chunk_rows(cols)
    for r0 in range(0, rows, step):
        p = packed[r0:r0 + step]
        o = out[r0:r0 + step]
        for s, n, b, g in ternary2_segments(cols):
            byt = p[:, b:b + g]  # (r, G)
            codes = np.stack([(byt >> (2 * k)) & 3 for k in range(4)], axis=1)  # (r, 4, G)
            codes = codes.reshape(p.shape[0], 4 * g)[:, :n]
            if codes.max() > 2:
                raise ValueError(f"packed (ternary2) holds the invalid code 3 (rows from {r0})")
            o[:, s:s + n] = codes.astype(np.int8) - CODE_ZERO
    return out


def random_ternary2(rows: int, cols: int, seed: int = 0, p_zero: float = 1 / 3) -> np.ndarray:
    """A random ternary matrix packed in the ternary2 layout, made row-chunk by chunk
    (never more than ~16M weights at once): P(0) = ``p_zero``, P(+1) = P(-1)."""
    _check_cols(cols)
    _check_cols(rows)
    if not 0.0 <= p_zero <= 1.0:
        raise ValueError(f"p_zero must be in [0, 1], got {p_zero!r}")
    rng = np.random.default_rng(seed)
    rb = ternary2_row_bytes(cols)
    full = (cols // SEGMENT_COLS) * SEGMENT_BYTES  # bytes of complete segments
    p_pm = (1.0 - p_zero) / 2
    cdf = np.array([p_pm, p_pm + p_zero], dtype=np.float32)  # code 0 (-1), 1 (0), 2 (+1)
    uniform = abs(p_zero - 1 / 3) < 1e-12
    out = np.empty((rows, rb), dtype=np.uint8)
    step = max(1, _CHUNK_ELEMS // max(1, cols))
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        if full and uniform:  # every byte is 4 independent uniform codes: one of 81 bytes
            out[r0:r0 + n, :full] = _VALID_BYTES[rng.integers(0, 81, size=(n, full), dtype=np.uint8)]
        elif full:
            u = rng.random((n, full, 4), dtype=np.float32)  # (r, bytes, 4)
            codes = (u >= cdf[0]).astype(np.uint8) + (u >= cdf[1])  # (r, bytes, 4) in {0,1,2}
            out[r0:r0 + n, :full] = codes[..., 0] | (codes[..., 1] << 2) | (codes[..., 2] << 4) | (codes[..., 3] << 6)
        if full < rb:  # the partial segment goes through pack_ternary2 (padding slots)
            u = rng.random((n, cols - 4 * full), dtype=np.float32)  # (r, tail cols)
            wt = ((u >= cdf[0]).astype(np.int8) + (u >= cdf[1])) - CODE_ZERO
            out[r0:r0 + n, full:] = pack_ternary2(wt.astype(np.int8))
    return out


# ---- base 3 ---------------------------------------------------------------------------------


def pack_ternary_b3(wt: np.ndarray) -> np.ndarray:
    """Pack ternary ``wt`` (rows, cols) int8 at 5 weights per byte: (rows, ceil(cols/5)) uint8."""
    check_ternary(wt)
    rows, cols = wt.shape
    rb = ternary_b3_row_bytes(cols)
    out = np.empty((rows, rb), dtype=np.uint8)
    step = _chunk_rows(cols)
    for r0 in range(0, rows, step):
        blk = wt[r0:r0 + step]
        codes = np.full((blk.shape[0], rb * B3_TRITS), CODE_ZERO, dtype=np.uint8)  # (r, 5*rb)
        codes[:, :cols] = blk + CODE_ZERO
        codes = codes.reshape(blk.shape[0], rb, B3_TRITS)  # (r, rb, 5)
        val = np.zeros((blk.shape[0], rb), dtype=np.uint16)
        for k in range(B3_TRITS - 1, -1, -1):
            val = val * 3 + codes[:, :, k]
        out[r0:r0 + step] = val.astype(np.uint8)
    return out


def unpack_ternary_b3(packed: np.ndarray, cols: int) -> np.ndarray:
    """Inverse of :func:`pack_ternary_b3`: (rows, cols) int8 in {-1, 0, 1}."""
    rb = ternary_b3_row_bytes(cols)
    _check_packed(packed, rb, "packed (ternary_b3)")
    rows = packed.shape[0]
    out = np.empty((rows, cols), dtype=np.int8)
    step = _chunk_rows(cols)
    for r0 in range(0, rows, step):
        p = packed[r0:r0 + step]
        if p.max() > B3_MAX_BYTE:
            raise ValueError(f"packed (ternary_b3) holds a byte > {B3_MAX_BYTE} (rows from {r0})")
        v = p.astype(np.int16)
        codes = np.empty((p.shape[0], rb, B3_TRITS), dtype=np.int8)  # (r, rb, 5)
        for k in range(B3_TRITS):
            codes[:, :, k] = v % 3
            v = v // 3
        out[r0:r0 + step] = codes.reshape(p.shape[0], rb * B3_TRITS)[:, :cols] - CODE_ZERO
    return out


def expand_b3_to_ternary2(packed_b3: np.ndarray, cols: int) -> np.ndarray:
    """Convert a base-3 packed matrix to the ternary2 layout (row chunk by chunk)."""
    _check_packed(packed_b3, ternary_b3_row_bytes(cols), "packed (ternary_b3)")
    rows = packed_b3.shape[0]
    out = np.empty((rows, ternary2_row_bytes(cols)), dtype=np.uint8)
    step = _chunk_rows(cols)
    for r0 in range(0, rows, step):
        out[r0:r0 + step] = pack_ternary2(unpack_ternary_b3(packed_b3[r0:r0 + step], cols))
    return out


# ---- weight quantization --------------------------------------------------------------------


def quantize_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """BitLinear weight quantization of ``w`` (rows, cols) float32 (docs/MODEL.md):
    ``s_r = max(mean_c |w[r, c]|, 1e-8)`` (mean accumulated in float64, stored float32),
    ``wt = clamp(rint(w / s_r), -1, 1)``. Returns ``(wt int8 (rows, cols), s float32 (rows,))``."""
    if not isinstance(w, np.ndarray) or w.dtype != np.float32 or w.ndim != 2:
        raise ValueError(f"quantize_weights: w must be a 2-D float32 array, got "
                         f"{getattr(w, 'dtype', type(w))} with shape {getattr(w, 'shape', None)}")
    if w.shape[0] < 1 or w.shape[1] < 1:
        raise ValueError(f"quantize_weights: w must be non-empty, got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError("quantize_weights: w has non-finite values")
    s = np.abs(w).mean(axis=1, dtype=np.float64).astype(np.float32)  # (rows,)
    s = np.maximum(s, np.float32(SCALE_MIN))
    wt = np.clip(np.rint(w / s[:, None]), -1, 1).astype(np.int8)  # (rows, cols)
    return wt, s
