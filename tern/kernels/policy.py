"""The engine's dispatch policy: which kernel runs a matrix and when work is split over
threads. The engine applies it; the predictor reads it to price the same choice."""

from __future__ import annotations

from tern.core.config import ModelConfig, param_counts

PAR_MIN_WEIGHTS = 1 << 20  # with threads > 1 the engine splits matrices of at least this many weights


# Ternary matrices whose pool comes from DRAM and whose packed rows hold STREAM_MIN_ROW_BYTES
# .. STREAM_MAX_ROW_BYTES bytes (1,280 .. 16,384 columns) run the streaming kernel (one row
# per pass, one sequential read stream; tern.kernels.kernels_ternary._rows_stream). Measured
# on Zen 4 at >= 256 MiB (benchmarks/ternary_matvec.py --row-length, 1 thread): at 128-256 B
# rows both forms read 20-24 GB/s; from 320 B to 4 KB the 4-row pass falls to 7-17 GB/s
# while one row per pass reads 17-29; from 6 KB rows on the activation vector (>= 24 KB)
# no longer stays in L1 beside the stream and the one-row pass drops to 10-12 GB/s
# against 16-19 for the 4-row pass, which reuses each activation load 4 times.
STREAM_MIN_ROW_BYTES = 320


STREAM_MAX_ROW_BYTES = 4096


SEGMENT_COLS = 256  # columns per segment of the ternary2 layout (tern.kernels.packing)


def stream_row_bytes(cfg: ModelConfig, llc_bytes: int | None) -> tuple[int, int]:
    """(resident, routed): the smallest packed ternary row, in bytes, that each pool reads
    with the streaming kernel, 0 for none. A pool streams once its working set cannot stay
    in the last-level cache of ``llc_bytes`` (None / 0: unknown, no streaming): the
    resident pool when its bytes exceed it, the routed experts when resident bytes plus
    all experts do. The engine (tern.run.engine) and the roofline both use this."""
    if not llc_bytes:
        return 0, 0
    pc = param_counts(cfg)
    res = STREAM_MIN_ROW_BYTES if pc.resident.bytes > llc_bytes else 0
    routed = (STREAM_MIN_ROW_BYTES if pc.expert_bytes_total
              and pc.resident.bytes + pc.expert_bytes_total > llc_bytes else 0)
    return res, routed


SEGMENT_COLS = 256  # columns per full segment of the ternary2 layout
