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


# Activations whose gated-MLP hidden units are exactly zero often enough for the
# activation-skip down projection (tern.kernels.kernels_ternary.ternary_matvec_skip) to
# skip rows: dReLU = relu(g) * relu(u) and ReLU^2 = relu(g)^2 * u. SiLU has no exact zeros,
# so the skip kernel would read every row of the transposed matrix, slower than the plain
# row matvec: same-run A/B on AMD EPYC (2 cores), tern bench peers' 1.1B / 9.7B-MoE SiLU
# shapes, the row matvec 1.37x / 1.30x faster per token at 1 thread, 1.28x / 1.18x at 2
# (benchmarks/op_breakdown.py --compare "act_skip=True" "").
SKIP_ACTIVATIONS = ("drelu", "relu2")


def act_skip_applies(activation: str) -> bool:
    """Does the engine's default (``act_skip="auto"``) run the down projections of a model
    with this MLP ``activation`` through the activation-skip kernel? The predictor
    (tern.predict.inventory) prices the same choice."""
    return activation in SKIP_ACTIVATIONS


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


# The engine copies the packed file into anonymous memory on transparent huge pages
# (tern.run.weights.huge_page_copy) when the file takes at most this share of the memory
# available at load; past it the copy could push the machine into reclaim, and the engine
# reads the memory-mapped file instead.
COPY_MAX_MEMORY_FRACTION = 0.5


def copy_weights(file_bytes: int, available_bytes: int | None) -> bool:
    """Does the engine's default (``weights="auto"``) read its weights from a huge-page copy?
    Yes when the memory available is known and the file fits in COPY_MAX_MEMORY_FRACTION of it."""
    return bool(available_bytes) and file_bytes <= COPY_MAX_MEMORY_FRACTION * available_bytes
