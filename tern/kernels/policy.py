"""The engine's dispatch policy: which kernel runs a matrix and when work is split over
threads. The engine applies it; the predictor reads it to price the same choice."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from tern.core.config import ModelConfig, param_counts

# With threads > 1 the engine splits matrices of at least PAR_MIN_WEIGHTS weights over the
# threads (and runs a token's chosen experts expert-parallel from that many weights of them).
# Tried at 64K (session 8, AMD EPYC Zen 5): same-run A/B at 2 threads with tokens back to back
# (benchmarks/op_breakdown.py --compare par_min_weights=1048576 par_min_weights=65536, quiet
# machine, twice) peers 28m 3,761 -> 4,541 / 4,608 tok/s, 86m 1,369 / 1,432 -> 1,571 / 1,578,
# sandbox 7,522 / 7,472 -> 8,172 / 8,244, but the 4m sweep models 2-4 % slower, and the
# probe's own engine runs (d_model 256 / 384, tern.probe.engine_runs) 1.5-1.8x slower at 2
# threads (138.6 / 172.7 us per token against 89.6 / 96.9 at 1): every small matrix became a
# parallel region whose worker may have gone to sleep since the last. Kept at 1M until a
# persistent per-token region replaces the per-matrix ones.
PAR_MIN_WEIGHTS = 1 << 20

# The engine's ``region=True`` option (tern.kernels.ops_region) runs a token in ONE parallel
# region: matrices of at least REGION_MIN_WEIGHTS weights are split into
# REGION_ITEMS_PER_THREAD row ranges per thread, claimed by whichever thread is free, and a
# MoE layer's chosen experts (top_k >= 2) are shared out one per item. Same-run A/B at 2
# threads (AMD EPYC Zen 5, 2 cores, session 10; 1 thread, per-matrix regions and the region
# with 1 / 2 / 4 items per thread in one process, rotating, 7 x 64 tokens), tok/s over
# 1 thread, per-matrix -> region with 1 item per thread: peers 5.6m 1.03 -> 1.27, 28m
# 0.99 -> 1.54, 86m 1.35 -> 1.64, 30m-e64-k4 1.56 -> 1.62 (2 items: 1.17 / 1.46 / 1.55 /
# 1.63; 4 items: 1.26 / 1.37 / 1.44 / 1.59); the sweep's 4m-e1 / 30m-e1 1.02 / 0.99x the
# per-matrix engine (their tokens are mostly serial work: SSM scan, activation-skip down
# projections, vector ops); DRAM-bound models even (separate processes, 3 rounds: the 1.1B
# 85-91 -> 82-86 tok/s, the 10B pick 122-138 -> 128, the 9.7B MoE 393-440 -> 373-497).
# The default since session 11, when the predictor learned to price it (tern.predict.inventory:
# matrices as "items" read off the "experts" curves against their own cache-resident start,
# the region's entry and phases timed by the probe as op "region_phase"). Session 10's two
# tries to price it had missed by 0.55-0.80: the split matrices were priced as the per-matrix
# step's (or with the "experts" curves' own parallel-region start, which items do not pay),
# and the region's frame was not priced. Same process, 5 x 256 tokens, AMD EPYC Zen 5, region
# over per-matrix at 2 threads, measured / predicted from the committed Zen 5 profile plus a
# timed frame: probe-ctx-a 1.24 / 1.23, probe-ctx-b 1.24 / 1.30, 4m-e1 1.25 / 1.21, 4m-e74
# 1.14 / 1.14, 30m-e1 1.18 / 1.22, 30m-e28 1.17 / 1.20, 30m-e64-k1 1.10 / 1.21, 30m-e64-k4
# 1.02 / 1.09. A fresh probe + sweep (25 points at 2 threads, each engine in its own pass):
# region / per-matrix measured over predicted, median 1.04 (a noisy hour: both steps ran
# at ~0.7 of that probe's predictions there, which no engine change explains). Beside one busy
# process on one of the 2 cores it ran at 0.50 / 0.71x one thread (peers 5.6m / 28m; its
# spin waits stall while the other thread is descheduled), the per-matrix engine at 1.0x;
# with the stall watch (tern.run.region_watch) 0.98 / 0.94x.
REGION_MIN_WEIGHTS = 1 << 14
REGION_ITEMS_PER_THREAD = 1
REGION_ROW_ALIGN = 16  # rows per item are a multiple of this (the 4-row passes stay whole)
# The one-region step splits an SSM layer's selective scan over its channels (one item per
# thread, then the quantization of its output as a single item) from this many weights of dt
# projection and state, Di x (dt_rank + d_state); below it the scan stays one item. Intel Xeon
# VM (session 19, 2 threads, 3 interleaved rounds against the engine before, tok/s): the 10B
# candidate d2048-L12-E64k1-h2048 (11 SSM layers of Di 4096 x (128 + 16)) 145.5 / 143.3 / 158.7
# -> 169.9 / 172.7 / 163.1, the 10B pick d1024-L24-E128k2-h1024 (21 of 2048 x (64 + 16)) 222.8 /
# 244.4 / 228.4 -> 240.1 / 255.7 / 251.5; the sandbox (512 x 32, not split) 5,435 / 4,934 / 5,253
# -> 5,215 / 5,486 / 5,290. Smaller scans were not measured split (a phase costs ~1-2 us).
REGION_SCAN_MIN_WEIGHTS = 1 << 17
# The one-region step splits an attention layer's heads over the threads (one item of whole heads per
# thread; each stores its heads' key and value and attends them, then the output's quantization is a
# single item) from this d_model on, and with at least two heads. Every item runs one compiled body
# (tern.kernels.attention.attend_heads) on its heads of the slot-major key / value caches (window,
# d_model; per head (heads, window, head_dim) from session 27 to 45), which keeps the logits identical
# at any thread count.
# 512 until session 36 (EnginePolicy.region_attn_min_d records which); at 256 the 5.6M peer (d_model 256,
# 6 attention layers of 4 heads), whose one-item attention was 19 of its 33 us a token of single-item work
# at 2 threads, went 8,307 / 8,049 / 8,507 / 8,631 -> 9,013 / 9,087 / 9,209 / 8,583 tok/s (4 alternating
# rounds, Intel Xeon VM; the 28M peer, already split, and the sandbox unchanged).
REGION_ATTN_MIN_D = 256
LEGACY_ATTN_MIN_D = 512  # the split's threshold in records that do not name one
# channels per scan item boundary: a multiple of every vector loop's step, so each channel's
# arithmetic is the same whichever item runs it (no scalar remainder loop)
REGION_SCAN_ALIGN = 64


@dataclass(frozen=True)
class EnginePolicy:
    """The engine's thread splitting, recorded with every measurement (host profiles, sweep
    rows) so that a prediction of a row prices what the engine that measured it did,
    whatever the engine does by the time the row is predicted again:
    ``par_min_weights`` (:data:`PAR_MIN_WEIGHTS`) for the per-matrix step; with ``region``
    the one-region step (tern.kernels.ops_region), which splits matrices of at least
    ``region_min_weights`` weights into ``region_items`` row ranges per thread, shares a MoE
    layer's chosen experts (top_k >= 2) out one per item at any size and, with
    ``region_skip_split`` (its SIMD skip kernel), the activation-skip down projections over
    256-output segments and, with ``region_router_split``, a MoE router's rows over items of a
    phase of their own (the top-k choice after it; engines before ran the router in the
    routing item, on one thread) and, with ``region_scan_split``, an SSM layer's selective scan
    over its channels, one item per thread, from REGION_SCAN_MIN_WEIGHTS (engines before ran
    it in one item) and, with ``region_attn_split``, an attention layer's heads over the
    threads from d_model ``region_attn_min_d`` (REGION_ATTN_MIN_D; engines before ran attention
    in one item, and before session 36 split it from LEGACY_ATTN_MIN_D). ``router_int8``: an int8 router is read from the file at 1 byte a
    weight (tern.kernels.kernels_stored.router_logits); engines before it dequantized int8
    routers to an fp32 table at load and read 4 (so their rows are priced that way).
    ``stream_prefetch``: the streaming (one-row) kernel's software prefetch, chosen per host by
    the probe (tern.core.engine_tuning); engines before it always prefetched. ``stream``: do
    DRAM-resident pools' long rows run that streaming kernel at all (else the 4-row pass), chosen
    per host by the probe as well; engines before it always streamed them. ``blocked``: row-oriented
    ternary2 matrices run in the blocked16 layout (tern.kernels.kernels_blocked; op "ternary_blocked",
    the engine's ``layout``), never the streaming kernel; engines before it read rows as stored."""

    par_min_weights: int = PAR_MIN_WEIGHTS
    region: bool = False
    region_min_weights: int = REGION_MIN_WEIGHTS
    region_items: int = REGION_ITEMS_PER_THREAD
    region_skip_split: bool = False
    router_int8: bool = False
    region_router_split: bool = False
    region_scan_split: bool = False
    region_attn_split: bool = False
    region_attn_min_d: int = LEGACY_ATTN_MIN_D
    stream_prefetch: bool = True
    stream: bool = True
    blocked: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in (bool, "bool"):
                if not isinstance(v, bool):
                    raise ValueError(f"EnginePolicy.{f.name} must be True or False, got {v!r}")
            elif not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"EnginePolicy.{f.name} must be an integer >= 0, got {v!r}")
        if self.region_items < 1:
            raise ValueError(f"EnginePolicy.region_items must be >= 1, got {self.region_items!r}")

    def to_dict(self) -> dict[str, int | bool]:
        """Every field; the per-matrix step's record is ``par_min_weights`` (as written
        before the region fields existed, so older readers still load it) and
        ``router_int8`` / ``stream_prefetch`` / ``stream`` / ``blocked`` when not their legacy values."""
        if self.region:
            return asdict(self)
        d: dict[str, int | bool] = {"par_min_weights": self.par_min_weights}
        if self.router_int8:
            d["router_int8"] = True
        if not self.stream_prefetch:
            d["stream_prefetch"] = False
        if not self.stream:
            d["stream"] = False
        if self.blocked:
            d["blocked"] = True
        return d

    @classmethod
    def of_record(cls, record: dict[str, Any] | None) -> EnginePolicy:
        """The policy a row or profile host block was measured under: its ``engine_policy``,
        else :data:`LEGACY_POLICY` (records from before the policy was recorded); a field the
        record lacks (added to the policy after it was written) takes its legacy value."""
        d = (record or {}).get("engine_policy")
        if d is None:
            return LEGACY_POLICY
        if not isinstance(d, dict) or set(d) - {f.name for f in fields(cls)}:
            raise ValueError(f"engine_policy must be a dict of {[f.name for f in fields(cls)]}, got {d!r}")
        return cls(**{**LEGACY_POLICY.to_dict(), **d})


# today's engine at threads > 1 on a CPU with AVX2 (the SIMD skip kernel splits; without AVX2
# the engine records region_skip_split=False: tern.kernels.ops_region.ENGINE_POLICY)
CURRENT_POLICY = EnginePolicy(region=True, region_skip_split=True, router_int8=True, region_router_split=True,
                              region_scan_split=True, region_attn_split=True,
                              region_attn_min_d=REGION_ATTN_MIN_D, blocked=True)
PER_MATRIX_POLICY = EnginePolicy(router_int8=True, blocked=True)  # Engine(region=False): a parallel region per large matrix
LEGACY_POLICY = EnginePolicy(par_min_weights=1 << 20)  # records from before the policy was recorded


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


def stream_row_bytes(cfg: ModelConfig, llc_bytes: int | None, stream: bool = True) -> tuple[int, int]:
    """(resident, routed): the smallest packed ternary row, in bytes, that each pool reads
    with the streaming kernel, 0 for none. A pool streams once its working set cannot stay
    in the last-level cache of ``llc_bytes`` (None / 0: unknown, no streaming): the
    resident pool when its bytes exceed it, the routed experts when resident bytes plus
    all experts do; none with ``stream`` False (EnginePolicy.stream: this host's 4-row pass
    read DRAM faster). The engine (tern.run.engine) and the roofline both use this."""
    if not llc_bytes or not stream:
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


EXPERTS_MODES = ("auto", "together", "apart")  # the engine's experts option (:func:`experts_layout`)
# "auto" keeps experts together only when they stream from DRAM: routed expert bytes over this many
# last-level caches (the predictor's DRAM side of the knee). In cache, where a jump between matrices costs
# little, the 105m sweep model (23 MiB of experts, 32 MiB L3) decoded x0.95 / x0.98 in two code A/Bs with
# some slow processes, and x0.98-1.00 alternating in one process (AMD EPYC Zen 4 VM, session 47)
EXPERTS_TOGETHER_MIN_LLCS = 2


def experts_layout(experts: str, layout: str, weights: str, kernel: str, expert_bytes: int = 0,
                   llc_bytes: int = 0) -> str:
    """Where the engine keeps the routed experts' matrices (its ``experts`` option): "together" (each
    expert's gate, up and down back to back in the engine's own buffer, so a token reads a chosen expert as
    one run) or "apart" (three tensors, as the file stores them). "auto": together where the experts
    (``expert_bytes`` in all) stream from DRAM, over EXPERTS_TOGETHER_MIN_LLCS x ``llc_bytes``, and the
    engine holds its own copy of them anyway (the weights' huge-page copy, the fp32 baseline, or the
    blocked16 layout, which re-packs the gate and up: a down projection the activation skip reads as stored
    is then copied too); apart in cache, and for the rows layout read from the memory-mapped file (together
    would copy them into memory the "map" choice set out to spare). Measured: benchmarks/README.md, "Each
    expert's matrices together"."""
    if experts != "auto":
        return experts
    own_copy = layout == "blocked16" or weights == "copy" or kernel == "fp32"
    return "together" if own_copy and expert_bytes > EXPERTS_TOGETHER_MIN_LLCS * llc_bytes else "apart"


# Base-3 (ternary_b3) matrices: the engine's default (b3="auto") reads them as stored with
# the b3 kernels (tern.kernels.kernels_b3: 1.6 bits per weight, about 1.3x the vector
# instructions per weight of the ternary2 kernel to decode, and a 64-byte block per partial
# row tail) where the model's weights cannot stay in the last-level cache AND every b3 row
# is long, else expands them to ternary2 at load. Measured on AMD EPYC Zen 5 (2 cores;
# benchmarks/ternary_matvec.py --b3, same-run, medians): in cache (4096 x 14336) the b3 kernel
# runs at 0.69x / 0.63x the ternary2 kernel's weights per second at 1 / 2 threads; from DRAM
# (74912 x 14336, 215 MB b3) at 2.1x / 2.3x (134 / 321 against 65 / 138 Gweights/s). With
# 512-column rows (103 bytes) from DRAM the two are about even at 1 thread, and the DRAM-bound
# MoE of benchmarks/dram_model.py (d_model 512) decoded 0.85x (1 thread) / 1.10x (2 threads)
# with b3 direct, the 1.1B peers shape in b3 (d_model 2048, SiLU MLP 5632, fp16 head)
# 1.34x / 1.19x: 48.7 -> 65.1 and 81.9 -> 97.7 tok/s (benchmarks/op_breakdown.py --compare
# b3=expand b3=direct). Rows of 2048 columns or more are where it was measured to win.
B3_DIRECT_MIN_COLS = 2048


def b3_row_cols(cfg: ModelConfig) -> int:
    """Inputs of the narrowest ternary matrix the engine reads row by row (what the b3
    kernels would read): d_model, d_inner with SSM layers, and the MLP / expert hidden
    sizes unless the activation-skip kernel reads the down projections transposed."""
    cols = [cfg.d_model]
    if any(cfg.mixer(i) == "ssm" for i in range(cfg.n_layers)):
        cols.append(cfg.d_inner)
    if not act_skip_applies(cfg.activation):
        dense = any(i not in cfg.moe_layers for i in range(cfg.n_layers)) and cfg.mlp_hidden
        cols += [h for h, used in ((cfg.mlp_hidden, dense), (cfg.expert_hidden, bool(cfg.moe_layers)),
                                   (cfg.shared_hidden, bool(cfg.moe_layers and cfg.n_shared))) if used and h]
    return min(cols)


def b3_direct(cfg: ModelConfig, llc_bytes: int | None) -> bool:
    """Does the engine's default (``b3="auto"``) read a model's base-3 matrices as stored?
    Yes when the resident pool plus all routed experts exceed the last-level cache of
    ``llc_bytes`` (unknown: no) and :func:`b3_row_cols` >= B3_DIRECT_MIN_COLS. The
    predictor prices the same choice."""
    if not llc_bytes or b3_row_cols(cfg) < B3_DIRECT_MIN_COLS:
        return False
    pc = param_counts(cfg)
    return pc.resident.bytes + pc.expert_bytes_total > llc_bytes


B3_MODES = ("auto", "direct", "expand")  # the engine's b3 option (tern.run.engine)
# the engine's layout option: row-oriented ternary2 matrices as stored, or in 16-row blocks (tern.kernels.kernels_blocked);
# "auto" (the default): blocked16 where it applies (:func:`layout_and_b3`)
LAYOUTS = ("rows", "blocked16")
LAYOUT_MODES = ("auto",) + LAYOUTS


def layout_and_b3(layout: str, b3: str, kernel: str, cfg: ModelConfig, llc_bytes: int | None, packing: dict,
                  blocked_here: bool) -> tuple[str, str, bool]:
    """The engine's ``layout`` and ``b3`` options resolved: ``(layout, b3 mode, b3 direct)`` (the last
    two as :func:`b3_mode`). ``layout="auto"`` is "blocked16" for the ternary kernel on a CPU where the
    blocked pass has its AVX-512 form (``blocked_here``: tern.kernels.kernels_blocked.BLOCKED_BY_DEFAULT,
    which says why not on AVX2-only CPUs yet) unless the file's base-3 rows are read as stored
    (b3 direct), else "rows"; "blocked16" re-packs ternary2 rows, so its ``b3="auto"`` expands. Same-run
    A/B on the AMD EPYC Zen 4 VM (session 42, benchmarks/README "A row-blocked layout"): 1.31-1.45x
    tok/s at 1 thread from 4M to 206M params, 1.07-1.26x on DRAM-bound models, logits identical.
    ValueError for an unknown option or a combination the kernels cannot run."""
    if layout not in LAYOUT_MODES:
        raise ValueError(f"layout must be one of {LAYOUT_MODES}, got {layout!r}")
    if layout == "blocked16":
        for bad, why in ((kernel != "ternary", "layout='blocked16' needs the ternary kernel"),
                         (b3 == "direct", "layout='blocked16' needs b3='expand' (or 'auto')")):
            if bad:
                raise ValueError(why)
        b3 = "expand" if b3 == "auto" else b3
    mode, direct = b3_mode(b3, kernel, cfg, llc_bytes, packing)
    if layout == "auto":
        layout = "blocked16" if kernel == "ternary" and not direct and blocked_here else "rows"
    return layout, mode, direct


def b3_mode(b3: str, kernel: str, cfg: ModelConfig, llc_bytes: int | None, packing: dict) -> tuple[str, bool]:
    """The engine's ``b3`` option resolved: ``(mode, direct)``, mode "direct" or "expand"
    ("auto": :func:`b3_direct`), direct True when the ternary kernel runs a file holding
    b3 matrices in that mode (then every row-oriented ternary matrix is read in the b3
    layout, ternary2 ones re-packed at load). ValueError for an unknown mode."""
    if b3 not in B3_MODES:
        raise ValueError(f"b3 must be one of {B3_MODES}, got {b3!r}")
    if b3 == "auto":
        b3 = "direct" if b3_direct(cfg, llc_bytes) else "expand"
    has_b3 = any(p.get("format") == "ternary_b3" for p in packing.values())
    return b3, kernel == "ternary" and has_b3 and b3 == "direct"
