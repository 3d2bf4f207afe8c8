"""The decode Engine: a packed model file, preallocated state, one numba call per token.

    eng = Engine("model.tern")             # validated, memory-mapped
    logits = eng.step(token)               # (V,) float32
    for tok in eng.generate(prompt_ids, 100, temperature=0.8, top_p=0.95, seed=0): ...

Options select the rungs of the ablation ladder (``tern bench ladder``); every combination
computes the same model (docs/MODEL.md):

- ``kernel="fp32"``: BitLinear matrices dequantized to fp32 at load, dense fp32 matvecs
  (the baseline); ``"ternary"`` (default): the packed ternary2 kernels on the file's bytes.
- ``act_skip``: down projections read transposed, skipping the columns of hidden units that
  are exactly zero (tern.kernels.kernels_ternary.ternary_matvec_skip). ``"auto"`` (default)
  applies it where it can skip: the ternary kernel and an activation with exact zeros
  (dReLU, ReLU², tern.kernels.policy.act_skip_applies); a SiLU model's down projections
  are then plain row matvecs. ``True`` / ``False`` force it on / off (same sums).
- ``moe_skip``: only the top_k routed experts are computed (else all, weight 0 for the rest).
- ``fused``: the whole token runs in one numba function (else Python loops over layers).
- ``threads > 1``: ``region`` "auto" (default, with the fused step) / ``True``: the token
  in ONE parallel region (tern.kernels.ops_region; rules and measurements in
  tern.kernels.policy), falling back to the one-thread step while it stalls on a busy core
  (tern.run.region_watch); ``False``: a numba parallel region per matrix of at least
  ``par_min_weights`` weights, its rows split over the threads (smaller ones stay serial:
  starting a region costs more than they do), and expert-parallel MoE layers. Every
  reduction keeps its order: logits are identical to ``threads=1`` either way.
- ``stream``: ternary matrices with long rows (STREAM_MIN_ROW_BYTES .. STREAM_MAX_ROW_BYTES packed bytes) in a
  pool that cannot stay in the last-level cache are read one row per pass, a single sequential stream
  (tern.kernels.policy.stream_row_bytes); "auto" (default) applies that rule with this machine's LLC size where
  ``tern probe`` found it faster than the 4-row pass at this thread count (tern.core.engine_tuning; else it
  streams), "dram" the rule whatever the probe found, "on" streams every long-row matrix, "off" none. Same sums.
- ``stream_prefetch``: software prefetch in that streaming kernel (True / False); "auto" (default): this CPU's choice.
- ``dense16``: fp16 / bf16 embedding, head and router matrices are read as stored, widened
  to fp32 in registers (``"direct"``, default: tern.kernels.kernels_stored), or converted to
  fp32 at load (``"expand"``: twice the bytes per token, the comparison). Same logits.
- ``b3``: base-3 (1.6-bit) matrices read as stored (``"direct"``, tern.kernels.kernels_b3) or
  expanded to ternary2 at load (``"expand"``); ``"auto"``: tern.kernels.policy.b3_mode. Same logits.
- ``layout``: row-oriented ternary matrices ``"rows"`` as stored or ``"blocked16"``: re-packed at load
  into 16-row blocks, each one stream with no per-row sums (tern.kernels.kernels_blocked; load time; b3 files
  expanded; the skip kernel's transposed down projections unchanged); ``"auto"`` (default): blocked16 where
  it applies (tern.kernels.policy.layout_and_b3). Same logits.
- ``weights``: where the token step reads the file's bytes: ``"copy"``, a copy in
  anonymous memory on transparent huge pages (tern.run.weights: fewer TLB misses; costs a
  pass over the file at load and its size in resident memory), ``"map"``, the
  memory-mapped file itself, or ``"auto"`` (default): the copy when the file fits in half
  the memory available (tern.kernels.policy.copy_weights). Same logits.
- ``experts``: where the routed experts' matrices lie: ``"together"``, each expert's gate, up and down back
  to back in the engine's own buffer (tern.run.weights.experts_together: a token reads each chosen expert as
  one run), or ``"apart"``, three tensors as the file stores them (three runs in three places per expert);
  ``"auto"`` (default): together where the experts stream from DRAM and the engine holds its own copy of
  them anyway (tern.kernels.policy.experts_layout). Same logits.
- ``check``: how the file is validated at load (tern.packed.reader.load_packed). "full" (default)
  reads every byte: tensor crc32s, ternary codes, finite weights. "header" checks only the structure
  (flipped bits, NaN weights and invalid codes pass, then decode garbage): only for a file that passed "full".

Context length: no hard limit. No positional encodings; each attention layer keeps a ring buffer of its
last ``attn_window`` keys / values (slot ``position % attn_window``), each SSM layer a fixed-size state, so
nothing overflows past ``max_seq_len``. But that is the longest context the model was trained on: beyond it
the SSM states (and attention, when ``attn_window > max_seq_len``) see longer contexts than training did, so the
engine warns once (:class:`PastMaxSeqLenWarning`); attention layers alone with ``attn_window <= max_seq_len`` do not.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numba
import numpy as np

from tern.core.config import param_counts, tensor_specs
from tern.core.engine_tuning import llc_bytes_here, tuning_choices
from tern.kernels import ops, ops_region, region_items
from tern.kernels.kernels_blocked import BLOCKED_BY_DEFAULT
from tern.kernels.kernels_dense import column_blocks
from tern.kernels.kernels_stored import DENSE_KINDS
from tern.kernels.policy import (
    EXPERTS_MODES,
    PAR_MIN_WEIGHTS,
    REGION_ITEMS_PER_THREAD,
    REGION_MIN_WEIGHTS,
    STREAM_MAX_ROW_BYTES,
    STREAM_MIN_ROW_BYTES,
    act_skip_applies,
    copy_weights,
    experts_layout,
    layout_and_b3,
    stream_row_bytes,
)
from tern.kernels.region import phase_counters, thread_count_reader
from tern.packed.format import TERNARY_FORMATS
from tern.packed.reader import PackedModel, load_packed, to_float32
from tern.run import decode
from tern.run import weights as wbuf  # AuxBuffer, huge_page_buffer / _copy, kernel_matrix, ...
from tern.run.region_watch import RegionRunner

KERNELS = ("ternary", "fp32")
STREAM_MODES = ("auto", "dram", "on", "off")  # streaming kernel for long rows of DRAM-resident pools
WEIGHTS_MODES = ("auto", "copy", "map")  # huge-page copy of the file, or the memory map
DENSE16_MODES = ("direct", "expand")  # fp16 / bf16 tables read as stored, or converted to fp32 at load
ACT_CODES = {"drelu": ops.ACT_DRELU, "relu2": ops.ACT_RELU2, "silu": ops.ACT_SILU}
FP32_BASELINE_MAX_BYTES = 8 * 2**30  # the fp32 rung dequantizes every matrix into RAM


class PastMaxSeqLenWarning(UserWarning):
    """An Engine is decoding past its model's max_seq_len (see the module docstring)."""


class Engine:
    """Numba decode engine over a packed model file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike | PackedModel, threads: int = 1, kernel: str | None = None,
                 act_skip: bool | str = "auto", moe_skip: bool = True, fused: bool = True,
                 check: str = "full", trace_experts: bool = False, par_min_weights: int = PAR_MIN_WEIGHTS,
                 stream: str = "auto", dense16: str = "direct", weights: str = "auto", b3: str = "auto",
                 region: bool | str = "auto", stream_prefetch: bool | str = "auto", layout: str = "auto",
                 experts: str = "auto"):
        if not isinstance(threads, (int, np.integer)) or isinstance(threads, bool) or threads < 1:
            raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
        if threads > numba.config.NUMBA_NUM_THREADS:
            raise ValueError(f"threads={threads} exceeds numba's {numba.config.NUMBA_NUM_THREADS} threads")
        # Launch numba's threading layer now: the per-token functions link parallel kernels,
        # and calling them before the layer is up crashes (fused_call users included).
        self._numba_threads = thread_count_reader()  # launches it; read before every token (no locks)
        kernel = kernel or "ternary"
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        if not (isinstance(act_skip, (bool, np.bool_)) or (isinstance(act_skip, str) and act_skip == "auto")):
            raise ValueError(f"act_skip must be True, False or 'auto', got {act_skip!r}")
        if kernel == "fp32" and act_skip != "auto" and act_skip:
            raise ValueError("act_skip needs the ternary kernel (the fp32 baseline has no skip)")
        self.model = path if isinstance(path, PackedModel) else load_packed(path, check=check)
        self.cfg = self.model.cfg
        self.path = Path(self.model.path)
        self.threads = int(threads)
        if act_skip == "auto":
            act_skip = kernel == "ternary" and act_skip_applies(self.cfg.activation)
        self.kernel, self.act_skip, self.moe_skip, self.fused = kernel, bool(act_skip), bool(moe_skip), bool(fused)
        self.trace_experts = bool(trace_experts)
        if not isinstance(par_min_weights, (int, np.integer)) or par_min_weights < 0:
            raise ValueError(f"par_min_weights must be an integer >= 0, got {par_min_weights!r}")
        self.par_min_weights = int(par_min_weights)
        if not (isinstance(region, (bool, np.bool_)) or (isinstance(region, str) and region == "auto")):
            raise ValueError(f"region must be True, False or 'auto', got {region!r}")
        if region is True and not fused:
            raise ValueError("region=True needs the fused token step (fused=True)")
        region = fused if region == "auto" else region  # the default: one region per token
        self.region = bool(region) and self.threads > 1  # one thread: the plain token step
        if stream not in STREAM_MODES:
            raise ValueError(f"stream must be one of {STREAM_MODES}, got {stream!r}")
        self.stream = stream
        if not (isinstance(stream_prefetch, (bool, np.bool_)) or stream_prefetch == "auto"):
            raise ValueError(f"stream_prefetch must be True, False or 'auto', got {stream_prefetch!r}")
        tuned = tuning_choices(self.threads)  # this CPU's probe choices: one read of the tuning file
        self.stream_prefetch = tuned["stream_prefetch"] if stream_prefetch == "auto" else bool(stream_prefetch)
        self.stream_dram = stream in ("on", "dram") or (stream == "auto" and tuned["stream"])  # EnginePolicy.stream
        if dense16 not in DENSE16_MODES:
            raise ValueError(f"dense16 must be one of {DENSE16_MODES}, got {dense16!r}")
        self.dense16 = dense16
        self.llc_bytes = llc_bytes_here(tuned)  # its rules' LLC: the probe's (a VM's slice of a big L3), else the OS's
        self.layout, self.b3, self._b3_direct = layout_and_b3(layout, b3, kernel, self.cfg, self.llc_bytes,
                                                              self.model.packing, BLOCKED_BY_DEFAULT)
        if weights not in WEIGHTS_MODES:
            raise ValueError(f"weights must be one of {WEIGHTS_MODES}, got {weights!r}")
        if weights == "auto":
            weights = "copy" if copy_weights(self.model.file_bytes, wbuf.available_memory_bytes()) else "map"
        self.weights = weights
        if experts not in EXPERTS_MODES:
            raise ValueError(f"experts must be one of {EXPERTS_MODES}, got {experts!r}")
        self.experts = experts_layout(experts, self.layout, weights, kernel,
                                      param_counts(self.cfg).expert_bytes_total, self.llc_bytes)
        self.stream_row_bytes = (stream_row_bytes(self.cfg, self.llc_bytes, self.stream_dram) if stream in ("auto", "dram")
                                 else (STREAM_MIN_ROW_BYTES,) * 2 if stream == "on" else (0, 0))
        self._build_tables()
        self._alloc_state()
        # the first token past max_seq_len, where the SSM states or a longer attention window see more than in training
        longer = self.n_ssm or (self.n_attn and self.cfg.attn_window > self.cfg.max_seq_len)
        self._warn_at = self.cfg.max_seq_len if longer else 2**62
        self.reset()

    # ---- set-up --------------------------------------------------------------------------
    def _file_addr(self, stored: str) -> int:
        return self.model.offsets[stored] * 2

    def _matrix_data(self, name: str, orientation: str) -> tuple[np.ndarray | None, int]:
        """(the matrices of a BitLinear spec in this engine's kernel format: fp32 dequantized (..., rows, cols) or
        ternary2 / b3 / blocked16 bytes in ``orientation``; None where that is the file's own bytes, scale address)."""
        p = self.model.packing[name]
        if p["format"] not in TERNARY_FORMATS:
            raise ValueError(f"{name}: the engine needs a ternary format, the file stores {p['format']}")
        if self.kernel == "fp32":
            wt, s = self.model.ternary(name)  # (..., rows, cols), (..., rows)
            return wt.astype(np.float32) * s[..., None], self._file_addr(f"{name}.scale")
        b3 = self._b3_direct and orientation == "rows"  # G_B3: row matrices in the b3 layout
        return (wbuf.kernel_matrix(self.model, name, orientation, b3, self.layout == "blocked16" and orientation == "rows"),
                self._file_addr(f"{name}.scale"))

    def _matrix(self, aux: wbuf.AuxBuffer, name: str, orientation: str) -> tuple[int, int]:
        """(matrix address, scale address) of a BitLinear spec (:meth:`_matrix_data`)."""
        flat, s_addr = self._matrix_data(name, orientation)
        (self._file_read if flat is None else self._file_unread).add(f"{name}.packed")  # the weights copy skips unread
        return (self._file_addr(f"{name}.packed") if flat is None else aux.add(flat)), s_addr  # None: as stored

    def _experts(self, aux: wbuf.AuxBuffer, prefix: str, orients: tuple[str, ...]) -> tuple[list[int], int]:
        """(T's routed-expert fields F_EG .. F_ED_S, F_E_STEP: ops.routed_steps) of one layer: its gate, up and
        down tensors apart (step -1), or (experts="together") each expert's three matrices back to back in aux."""
        names = [f"{prefix}.{m}" for m in ("gate", "up", "down")]
        if self.experts == "apart":
            return [a for n, o in zip(names, orients, strict=True) for a in self._matrix(aux, n, o)], -1
        data = [self._matrix_data(n, o) for n, o in zip(names, orients, strict=True)]
        mats = [self.model.tensors[f"{n}.packed"] if m is None else m for n, (m, _) in zip(names, data, strict=True)]
        self._file_unread.update(f"{n}.packed" for n in names)
        E = self.cfg.n_experts
        addr = aux.add(wbuf.experts_together(mats, E))
        gb, ub = (m.nbytes // E for m in mats[:2])
        return ([addr, data[0][1], addr + 2 * gb, data[1][1], addr + 2 * (gb + ub), data[2][1]],
                2 * sum(m.nbytes for m in mats) // E)

    def _dense(self, aux: wbuf.AuxBuffer, name: str) -> tuple[int, int, int]:
        """(address, scale address, stored kind: kernels_stored.DENSE_*) of an embedding /
        head / router matrix: fp32, int8 and (dense16 "direct") fp16 / bf16 straight from
        the file, else fp16 / bf16 converted to fp32 at load."""
        fmt = self.model.packing[name]["format"]
        if fmt == "int8":
            return self._file_addr(f"{name}.q"), self._file_addr(f"{name}.scale"), DENSE_KINDS[fmt]
        if fmt == "fp32" or (fmt in ("fp16", "bf16") and self.dense16 == "direct"):
            return self._file_addr(name), -1, DENSE_KINDS[fmt]
        if fmt in ("fp16", "bf16"):
            return aux.add(to_float32(self.model.tensors[name], fmt)), -1, DENSE_KINDS["fp32"]
        raise ValueError(f"{name}: format {fmt} is not supported by the engine")

    def _build_tables(self) -> None:
        cfg, m = self.cfg, self.model
        if self.kernel == "fp32":
            est = sum(s.numel * 4 for s in tensor_specs(cfg) if m.packing[s.name]["format"] in TERNARY_FORMATS)
            if est > FP32_BASELINE_MAX_BYTES:
                raise ValueError(f"the fp32 baseline would dequantize ~{est / 2**30:.1f} GiB of weights "
                                 f"(limit {FP32_BASELINE_MAX_BYTES / 2**30:.0f} GiB); use kernel='ternary'")
        aux, self._file_read, self._file_unread = wbuf.AuxBuffer(), set(), set()
        L = cfg.n_layers
        T = np.full((L, ops.N_FIELDS), -1, np.int64)
        LI = np.full((L, ops.N_LINTS), -1, np.int64)
        down_orient = "transposed" if (self.kernel == "ternary" and self.act_skip) else "rows"
        n_ssm = n_attn = n_moe = 0
        hmax, router_kind = 1, DENSE_KINDS["fp32"]
        for i in range(L):
            p = f"layers.{i}"
            T[i, ops.F_NORM1] = self._file_addr(f"{p}.norm1.weight")
            if cfg.mixer(i) == "ssm":
                LI[i, ops.L_KIND], LI[i, ops.L_STATE] = ops.KIND_SSM, n_ssm
                n_ssm += 1
                T[i, ops.F_IN], T[i, ops.F_IN_S] = self._matrix(aux, f"{p}.mixer.in_proj.weight", "rows")
                T[i, ops.F_XP], T[i, ops.F_XP_S] = self._matrix(aux, f"{p}.mixer.x_proj.weight", "rows")
                T[i, ops.F_OUT], T[i, ops.F_OUT_S] = self._matrix(aux, f"{p}.mixer.out_proj.weight", "rows")
                T[i, ops.F_CONV_W] = aux.add(m.tensors[f"{p}.mixer.conv.weight"].T)  # (K, Di)
                T[i, ops.F_CONV_B] = self._file_addr(f"{p}.mixer.conv.bias")
                dt = f"{p}.mixer.dt_proj.weight"  # (Di, R) re-packed in column blocks (ops.scan_channels)
                T[i, ops.F_DT_W] = aux.add(column_blocks(m.tensors[dt]))
                self._file_unread.add(dt)  # the file's copy is never read
                T[i, ops.F_DT_B] = self._file_addr(f"{p}.mixer.dt_proj.bias")
                T[i, ops.F_D] = self._file_addr(f"{p}.mixer.D")
                A_log = m.tensors[f"{p}.mixer.A_log"]
                T[i, ops.F_A] = aux.add((-np.exp(A_log.astype(np.float32))).T)  # A = -exp(A_log), (N, Di)
            else:
                LI[i, ops.L_KIND], LI[i, ops.L_STATE] = ops.KIND_ATTN, n_attn
                n_attn += 1
                T[i, ops.F_IN], T[i, ops.F_IN_S] = self._matrix(aux, f"{p}.mixer.qkv.weight", "rows")
                T[i, ops.F_OUT], T[i, ops.F_OUT_S] = self._matrix(aux, f"{p}.mixer.out_proj.weight", "rows")
            LI[i, ops.L_NSH], LI[i, ops.L_HSH] = 0, 0
            if cfg.is_moe(i):
                T[i, ops.F_NORM2] = self._file_addr(f"{p}.norm2.weight")
                LI[i, ops.L_MOE], LI[i, ops.L_E] = n_moe, cfg.n_experts
                LI[i, ops.L_HE], LI[i, ops.L_TOPK] = cfg.expert_hidden, cfg.top_k
                n_moe += 1
                rname = f"{p}.ffn.router.weight"
                # routing math is fp32 on the exact dequantized / widened router (docs/MODEL.md):
                # int8 rows straight from the file, dequantized a row at a time in the kernel
                # (kernels_stored.router_logits), fp32, or fp16 / bf16 widened exactly (_dense)
                T[i, ops.F_ROUTER], T[i, ops.F_ROUTER_S], router_kind = self._dense(aux, rname)
                if cfg.n_shared:
                    LI[i, ops.L_NSH], LI[i, ops.L_HSH] = cfg.n_shared, cfg.shared_hidden
                    hmax = max(hmax, cfg.shared_hidden)
                    T[i, ops.F_SG], T[i, ops.F_SG_S] = self._matrix(aux, f"{p}.ffn.shared.gate", "rows")
                    T[i, ops.F_SU], T[i, ops.F_SU_S] = self._matrix(aux, f"{p}.ffn.shared.up", "rows")
                    T[i, ops.F_SD], T[i, ops.F_SD_S] = self._matrix(aux, f"{p}.ffn.shared.down", down_orient)
                hmax = max(hmax, cfg.expert_hidden)
                T[i, ops.F_EG:ops.F_ED_S + 1], T[i, ops.F_E_STEP] = self._experts(aux, f"{p}.ffn.experts",
                                                                                 ("rows", "rows", down_orient))
            elif cfg.mlp_hidden:  # a dense MLP is computed as one always-on shared expert
                T[i, ops.F_NORM2] = self._file_addr(f"{p}.norm2.weight")
                LI[i, ops.L_NSH], LI[i, ops.L_HSH] = 1, cfg.mlp_hidden
                hmax = max(hmax, cfg.mlp_hidden)
                T[i, ops.F_SG], T[i, ops.F_SG_S] = self._matrix(aux, f"{p}.ffn.gate.weight", "rows")
                T[i, ops.F_SU], T[i, ops.F_SU_S] = self._matrix(aux, f"{p}.ffn.up.weight", "rows")
                T[i, ops.F_SD], T[i, ops.F_SD_S] = self._matrix(aux, f"{p}.ffn.down.weight", down_orient)
        G = np.zeros(ops.N_GLOBALS, np.int64)
        G[ops.G_D], G[ops.G_DI], G[ops.G_N] = cfg.d_model, cfg.d_inner, cfg.d_state
        G[ops.G_R], G[ops.G_K], G[ops.G_V] = cfg.dt_rank_eff, cfg.d_conv, cfg.vocab_size
        G[ops.G_WIN], G[ops.G_NH], G[ops.G_NL] = cfg.attn_window, cfg.n_heads, L
        G[ops.G_HMAX], G[ops.G_EMAX] = hmax, max(cfg.n_experts, 1)
        G[ops.G_ACT] = ACT_CODES[cfg.activation]
        G[ops.G_KERNEL] = ops.KERNEL_FP32 if self.kernel == "fp32" else ops.KERNEL_TERNARY
        G[ops.G_ACT_SKIP], G[ops.G_MOE_SKIP] = int(self.act_skip), int(self.moe_skip)
        G[ops.G_PAR] = int(self.threads > 1)
        G[ops.G_PAR_MIN] = self.par_min_weights
        G[ops.G_THREADS], G[ops.G_TOPK_MAX] = self.threads, max(cfg.top_k, 1)
        G[ops.G_STREAM_RB] = self.stream_row_bytes[0]
        G[ops.G_STREAM_RB_MAX], G[ops.G_STREAM_PF] = STREAM_MAX_ROW_BYTES, int(self.stream_prefetch)
        G[ops.G_EMBED], G[ops.G_EMBED_S], G[ops.G_EMBED_KIND] = self._dense(aux, "embed.weight")
        head = "embed.weight" if cfg.tie_embeddings else "head.weight"
        G[ops.G_HEAD], G[ops.G_HEAD_S], G[ops.G_HEAD_KIND] = self._dense(aux, head)
        G[ops.G_ROUTER_KIND], G[ops.G_DT_KIND] = router_kind, DENSE_KINDS[cfg.dt_format]  # dt: ops.scan_channels
        G[ops.G_B3], G[ops.G_BLOCKED] = int(self._b3_direct), int(self.layout == "blocked16")
        G[ops.G_ATTN_BLOCKS] = region_items.attn_items(G, cfg.d_model, cfg.n_heads) if self.region else 1  # the caches' head blocks
        G[ops.G_NORM_F] = self._file_addr("norm_f.weight")
        routed = G.copy()  # ops.routed_globals: the routed experts' row
        routed[ops.G_STREAM_RB] = self.stream_row_bytes[1]
        G = np.concatenate([G, routed])
        self.G, self.T, self.LI = G, T, LI
        self.aux = aux.build()
        self.buf = (wbuf.huge_page_copy(m.buffer, wbuf.tensor_ranges(m, self._file_unread - self._file_read))
                    if self.weights == "copy" else m.buffer)
        self.n_ssm, self.n_attn, self.n_moe = n_ssm, n_attn, n_moe
        self.eps = float(cfg.norm_eps)

    def _alloc_state(self) -> None:
        cfg = self.cfg
        Di, N, K, D, W = cfg.d_inner, cfg.d_state, cfg.d_conv, cfg.d_model, cfg.attn_window
        self.ssm_h = np.zeros((self.n_ssm, N, Di), np.float32)  # SSM states, transposed
        self.conv = np.zeros((self.n_ssm, K - 1, Di), np.float32)  # conv tails (oldest first)
        self.kc, self.vc = (wbuf.huge_page_buffer(self.n_attn * W * D * 4).view(np.float32).reshape(self.n_attn, W * D)
                            for _ in ("keys", "values"))  # ring buffers: tern.kernels.attention; rows on cache lines
        self.pos = np.zeros(1, np.int64)  # tokens seen since reset
        nf, ni = ops.work_sizes(self.G)
        self.work = np.zeros(nf, np.float32)
        self.iwork = np.zeros(ni, np.int8)
        self.counts = np.zeros((self.n_moe, max(cfg.n_experts, 1)), np.int64)
        self.last = np.zeros((self.n_moe, max(cfg.top_k, 1)), np.int64)
        self.logits = np.zeros(cfg.vocab_size, np.float32)
        self.expert_trace: list[np.ndarray] = []
        self._before = (self.buf, self.aux, self.G, self.T, self.LI, self.eps)
        self._after = (self.ssm_h, self.conv, self.kc, self.vc, self.pos, self.work, self.iwork, self.counts,
                       self.last, self.logits)
        if self.region:  # ops_region.token_step_region's extra arguments
            g_serial = self.G.copy()
            g_serial[ops.G_PAR] = g_serial[ops.N_GLOBALS + ops.G_PAR] = 0
            self.region_params = np.array([REGION_MIN_WEIGHTS, REGION_ITEMS_PER_THREAD], np.int64)
            self._after += (g_serial, self.region_params, phase_counters(ops_region.phases_bound(self.LI)),
                            np.zeros(4, np.float32))
            self.region_runner = RegionRunner(self._before, self._after)

    # ---- public API --------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the context: zero SSM states, conv tails, attention caches, expert counts."""
        for a in (self.ssm_h, self.conv, self.kc, self.vc, self.pos, self.counts, self.last):
            a[...] = 0
        self.expert_trace = []

    @property
    def position(self) -> int:
        """Tokens processed since the last reset."""
        return int(self.pos[0])

    @property
    def expert_counts(self) -> np.ndarray:
        """(n_moe_layers, n_experts) int64: how often each routed expert was chosen since
        reset (per-token choices in :attr:`expert_trace` when ``trace_experts``)."""
        return self.counts.copy()

    def check_token(self, token: Any) -> int:
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
            raise ValueError(f"token id must be an integer, got {token!r}")
        if not 0 <= token < self.cfg.vocab_size:
            raise ValueError(f"token id {int(token)} is out of range 0..{self.cfg.vocab_size - 1}")
        return int(token)

    def fused_call(self) -> tuple[Any, tuple, tuple]:
        """``(fn, before, after)`` with ``fn(*before, token, *after)`` the bare numba
        per-token call (ops.token_step) on this engine's buffers - no checks, for timing
        the Python overhead of :meth:`step` against it."""
        return (ops_region.token_step_region if self.region else ops.token_step), self._before, self._after

    def _past_max_seq_len(self) -> None:
        self._warn_at = 2**62  # once per Engine
        cfg = self.cfg
        who = " and ".join(([f"the {self.n_ssm} SSM layers' states"] if self.n_ssm else [])
                           + ([f"attention (window {cfg.attn_window} > max_seq_len)"]
                              if self.n_attn and cfg.attn_window > cfg.max_seq_len else []))
        warnings.warn(f"{self.path}: decoding past max_seq_len={cfg.max_seq_len} tokens, the longest "
                      f"context the model was trained on: nothing overflows (no positional encoding, "
                      f"attention ring buffers of {cfg.attn_window} positions), but {who} now see longer "
                      f"contexts than in training; quality there is not measured",
                      PastMaxSeqLenWarning, stacklevel=5)

    def _run(self, token: int) -> None:
        if self.pos[0] >= self._warn_at:
            self._past_max_seq_len()
        if self._numba_threads() != self.threads:  # the engine's count, whatever the caller set since
            numba.set_num_threads(self.threads)
        if self.region:  # the region step, or one thread while it falls back (tern.run.region_watch)
            self.region_runner(token)
        elif self.fused:
            ops.token_step(*self._before, token, *self._after)
        else:
            buf, aux, G, T, LI, eps = self._before
            ops.embed_step(buf, aux, G, token, self.work)
            for layer in range(self.cfg.n_layers):
                ops.mixer_step(buf, aux, G, T, LI, layer, eps, self.ssm_h, self.conv, self.kc, self.vc,
                               self.pos, self.work, self.iwork)
                ops.ffn_step(buf, aux, G, T, LI, layer, eps, self.work, self.iwork, self.counts, self.last)
            ops.head_step(buf, aux, G, T, eps, self.work, self.iwork, self.logits)
            self.pos[0] += 1
        if self.trace_experts and self.n_moe:
            self.expert_trace.append(self.last.copy())

    def feed(self, token: int) -> None:
        """Feed one token (checked); the next-token logits are then in :attr:`logits` (no copy)."""
        self._run(self.check_token(token))

    def step(self, token: int) -> np.ndarray:
        """Feed one token; returns the next-token logits (V,) float32 (a copy)."""
        self.feed(token)
        return self.logits.copy()

    def generate(self, prompt_ids: Sequence[int], n: int, **sampling: Any) -> Iterator[int]:
        """Stream ``n`` sampled token ids after ``prompt_ids``: :func:`tern.run.decode.generate` (temperature,
        top_k, top_p, repetition_penalty, seed, reset, penalty_window). Deterministic for a given seed."""
        return decode.generate(self, prompt_ids, n, **sampling)

    def nll_sum(self, x: np.ndarray, y: np.ndarray) -> float:
        """Summed NLL (nats) of ``y`` given ``x`` (B, T), rows from an empty state: :func:`tern.run.decode.nll_sum`."""
        return decode.nll_sum(self, x, y)

    def close(self) -> None:
        self.model.close()

    def describe(self) -> dict[str, Any]:
        """The engine's settings (for benchmark rows)."""
        return {"model": str(self.path), "config": self.cfg.name, "threads": self.threads,
                "kernel": self.kernel, "act_skip": self.act_skip, "moe_skip": self.moe_skip,
                "fused": self.fused, "region": self.region, "par_min_weights": self.par_min_weights, "stream": self.stream, "stream_dram": self.stream_dram, "stream_prefetch": self.stream_prefetch, "dense16": self.dense16, "weights": self.weights, "experts": self.experts, "b3": self.b3, "b3_direct": self._b3_direct, "layout": self.layout,
                "stream_row_bytes": list(self.stream_row_bytes), "llc_bytes": self.llc_bytes, "aux_bytes": int(self.aux.size), "file_bytes": int(self.model.file_bytes)}
