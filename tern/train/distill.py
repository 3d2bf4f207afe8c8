"""Distillation losses: same-tokenizer logit KD and cross-tokenizer byte-aligned KD.

Same tokenizer ("logit"): at every position the student matches the teacher's full
next-token distribution,

    KD = τ² · mean_positions KL( softmax(t / τ) || softmax(s / τ) )

Different tokenizers ("byte": a byte-level teacher, a BPE student). The two models do
not share an output space, but both define the probability of the *next byte* at every
student token boundary:

- the student at position t predicts token t+1, whose first byte is the next byte of the
  text, so its next-byte distribution is the **first-byte marginal** of its token
  distribution: q_S(b) = Σ_{v : first_byte(v) = b} p_S(v), i.e. ``softmax(s) @ M`` with
  the 0/1 matrix M (V, 256), M[v, b] = 1 iff token v starts with byte b (tokens without
  bytes, such as specials, are dropped and q_S renormalised);
- the teacher reads the same text as bytes (the concatenated bytes of the student's
  input tokens) and its prediction at the last byte of token t is p_T(b), the next-byte
  distribution at exactly the same place in the same text.

    KD = τ² · mean_positions KL( p_T || q_S )

This is exact in the sense that both sides are distributions over the same event (the
byte that follows the boundary), computed with one teacher forward pass over the
window's bytes; its limitation is that it transfers only the first byte of each token
(about 1/3 of the bytes with BPE-1024), not the teacher's knowledge of the rest of the
token. The student loss is ``(1 − α) · CE + α · KD``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

N_BYTES = 256


def logit_kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                  temperature: float = 1.0) -> torch.Tensor:
    """τ² · mean KL(softmax(t/τ) || softmax(s/τ)); logits (..., V) with the same V."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"logit KD needs equal shapes (same tokenizer), got "
                         f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}")
    V = student_logits.shape[-1]
    log_s = F.log_softmax(student_logits.reshape(-1, V).float() / temperature, -1)  # (n, V)
    log_t = F.log_softmax(teacher_logits.reshape(-1, V).float() / temperature, -1)  # (n, V)
    kl = (log_t.exp() * (log_t - log_s)).sum(-1)  # (n,)
    return kl.mean() * temperature ** 2


@dataclass(frozen=True)
class TokenBytes:
    """Byte strings of a tokenizer's vocabulary, as tensors for the byte alignment."""

    lengths: torch.Tensor  # (V,) int64 bytes per token (0 for specials without bytes)
    first_byte: torch.Tensor  # (V,) int64 first byte, -1 when the token has no bytes
    flat: torch.Tensor  # (sum lengths,) uint8 all tokens' bytes back to back
    offsets: torch.Tensor  # (V,) int64 start of each token in ``flat``

    @classmethod
    def from_bytes(cls, token_bytes: Sequence[bytes]) -> TokenBytes:
        if not token_bytes:
            raise ValueError("TokenBytes needs a non-empty vocabulary")
        lengths = torch.tensor([len(b) for b in token_bytes], dtype=torch.int64)
        first = torch.tensor([b[0] if b else -1 for b in token_bytes], dtype=torch.int64)
        flat = torch.tensor(list(b"".join(token_bytes)), dtype=torch.uint8)
        offsets = torch.cumsum(lengths, 0) - lengths
        return cls(lengths, first, flat, offsets)

    @property
    def vocab_size(self) -> int:
        return int(self.lengths.numel())

    def first_byte_matrix(self) -> torch.Tensor:
        """M (V, 256): M[v, b] = 1 iff token v starts with byte b."""
        M = torch.zeros(self.vocab_size, N_BYTES)
        has = self.first_byte >= 0
        M[has.nonzero().squeeze(1), self.first_byte[has]] = 1.0
        return M


def first_byte_marginal(student_logits: torch.Tensor, M: torch.Tensor,
                        temperature: float = 1.0) -> torch.Tensor:
    """log q_S (..., 256): the student's next-byte log-probabilities, its token
    distribution (softmax of logits (..., V) / τ) summed by first byte (M: (V, 256))
    and renormalised over tokens that have bytes."""
    p = F.softmax(student_logits.float() / temperature, -1)  # (..., V)
    q = p @ M  # (..., 256)
    q = q / q.sum(-1, keepdim=True).clamp_min(1e-30)
    return torch.log(q.clamp_min(1e-30))


def windows_as_bytes(tokens: torch.Tensor, tb: TokenBytes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The text of each row of student tokens (B, T) as bytes.

    Returns (byte_ids (B, L) int64, zero-padded at the end; byte_len (B,);
    boundary (B, T) index of the last byte of each token in its row, -1 when the row has
    no byte yet)."""
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be (B, T), got {tuple(tokens.shape)}")
    tokens = tokens.long().cpu()
    lens = tb.lengths[tokens]  # (B, T)
    ends = torch.cumsum(lens, 1)  # (B, T) bytes up to and including token t
    byte_len = ends[:, -1] if tokens.shape[1] else torch.zeros(tokens.shape[0], dtype=torch.int64)
    L = max(int(byte_len.max()) if byte_len.numel() else 0, 1)
    out = torch.zeros(tokens.shape[0], L, dtype=torch.int64)
    for r in range(tokens.shape[0]):
        ids = tokens[r]
        idx = torch.repeat_interleave(tb.offsets[ids], lens[r]) + (
            torch.arange(int(byte_len[r])) - torch.repeat_interleave(ends[r] - lens[r], lens[r]))
        out[r, : int(byte_len[r])] = tb.flat[idx].long()
    return out, byte_len, ends - 1


def byte_kd_loss(student_logits: torch.Tensor, teacher_byte_logits: torch.Tensor,
                 boundary: torch.Tensor, M: torch.Tensor, temperature: float = 1.0,
                 teacher_byte_ids: torch.Tensor | None = None) -> torch.Tensor:
    """τ² · mean KL(p_T || q_S) over student positions with a boundary (see module doc).

    student_logits (B, T, V); teacher_byte_logits (B, L, Vt) of the byte teacher over the
    rows' bytes; boundary (B, T) from :func:`windows_as_bytes`; M (V, 256) the first-byte
    matrix; teacher_byte_ids (256,) the teacher's token id of each byte value (identity
    when None; other teacher tokens, e.g. specials, are dropped and p_T renormalised)."""
    B, T, _ = student_logits.shape
    if boundary.shape != (B, T):
        raise ValueError(f"boundary must be {(B, T)}, got {tuple(boundary.shape)}")
    tl = teacher_byte_logits.float()
    if teacher_byte_ids is not None:
        tl = tl[..., teacher_byte_ids]  # (B, L, 256)
    elif tl.shape[-1] != N_BYTES:
        raise ValueError(f"teacher has {tl.shape[-1]} outputs; pass teacher_byte_ids to pick the 256 bytes")
    valid = boundary >= 0  # (B, T)
    idx = boundary.clamp_min(0).to(tl.device)
    t_at = torch.gather(tl, 1, idx.unsqueeze(-1).expand(B, T, N_BYTES))  # (B, T, 256)
    log_t = F.log_softmax(t_at / temperature, -1)  # (B, T, 256)
    log_q = first_byte_marginal(student_logits, M.to(student_logits.device), temperature)  # (B, T, 256)
    kl = (log_t.exp() * (log_t - log_q)).sum(-1)  # (B, T)
    valid = valid.to(kl.device)
    return (kl * valid).sum() / valid.sum().clamp_min(1) * temperature ** 2


# ---- tokens as bytes ------------------------------------------------------------------------


def _unicode_to_byte() -> dict[str, int]:
    """Inverse of the GPT-2 / tokenizers ByteLevel alphabet (one printable char per byte)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def token_byte_strings(tokenizer) -> list[bytes]:
    """The exact bytes each token id of a tern tokenizer stands for (``tern.data.tokenizer``:
    the byte tokenizer, or a byte-level BPE whose vocabulary is written in the ByteLevel
    alphabet; added tokens such as the document separator are their UTF-8 bytes). Checked
    against ``tokenizer.token_bytes()`` (the byte count per token)."""
    if tokenizer.name == "byte":
        out = [bytes([i]) for i in range(256)]
    else:
        hf = getattr(tokenizer, "_tok", None)
        if hf is None:
            raise ValueError(f"tokenizer {tokenizer.name!r} exposes no vocabulary to map to bytes")
        inv = _unicode_to_byte()
        added = set(hf.get_added_tokens_decoder().values()) if hasattr(hf, "get_added_tokens_decoder") else set()
        added_text = {getattr(a, "content", str(a)) for a in added}
        out = []
        for i in range(tokenizer.vocab_size):
            tok = hf.id_to_token(i)
            if tok in added_text or not all(ch in inv for ch in tok):
                out.append(tok.encode("utf-8"))
            else:
                out.append(bytes(inv[ch] for ch in tok))
    lengths = [len(b) for b in out]
    expected = [int(n) for n in tokenizer.token_bytes()]
    if lengths != expected:
        bad = [i for i, (a, b) in enumerate(zip(lengths, expected, strict=True)) if a != b][:5]
        raise ValueError(f"tokenizer {tokenizer.name!r}: byte strings disagree with token_bytes() at ids {bad}")
    return out


# ---- training a student with a KD term ----------------------------------------------------


def run_distill(model_cfg, train_cfg, *, teacher_checkpoint: str | Path, distill: dict[str, Any],
                teacher_cfg=None, out_dir: str | Path | None = None, progress: bool = True,
                data: Any = None, token_bytes: Sequence[bytes] | None = None) -> dict[str, Any]:
    """Train a student (``model_cfg``, ``train_cfg``) with ``(1 − α) CE + α KD`` against a
    frozen teacher checkpoint written by :func:`tern.train.run_training`.

    distill: {method: "logit" (same tokenizer) | "byte" (byte teacher, any student
    tokenizer; see the module docstring), alpha, temperature}. The loop is
    :func:`tern.train.run_training`'s single-process loop (same seeds, data order,
    optimizer groups, schedule, clipping, MoE losses and final validation) plus the KD
    term; with alpha = 0 it reproduces run_training exactly (tested). Returns
    run_training's figures plus ``kd_loss`` (mean KD over the last steps, nats).
    data: a tern.train data source (default CorpusSource of the student tokenizer);
    token_bytes: the student's token byte strings (default from its tokenizer)."""
    from tern.train.batches import CorpusSource
    from tern.train.checkpoint import load_checkpoint

    method = distill.get("method", "logit")
    alpha, temp = float(distill.get("alpha", 0.5)), float(distill.get("temperature", 1.0))
    if method not in ("logit", "byte"):
        raise ValueError(f"distill method must be 'logit' or 'byte', got {method!r}")
    if not 0 <= alpha <= 1 or not temp > 0:
        raise ValueError(f"distill needs alpha in [0, 1] and temperature > 0, got {alpha}, {temp}")
    teacher, t_cfg, t_train, _ = load_checkpoint(teacher_checkpoint)
    if teacher_cfg is not None and t_cfg != teacher_cfg:
        raise ValueError(f"teacher checkpoint {teacher_checkpoint} holds another model config than the gate's")
    for p in teacher.parameters():
        p.requires_grad_(False)
    if method == "logit":
        if t_train.tokenizer != train_cfg.tokenizer or t_cfg.vocab_size != model_cfg.vocab_size:
            raise ValueError(f"logit KD needs the same tokenizer: teacher {t_train.tokenizer!r} "
                             f"(vocab {t_cfg.vocab_size}), student {train_cfg.tokenizer!r} "
                             f"(vocab {model_cfg.vocab_size}); use method 'byte'")

        def kd(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:  # x (B, T), logits (B, T, V)
            with torch.no_grad():
                t = teacher(x)  # (B, T, V)
            return logit_kd_loss(logits, t, temp)
    else:
        if t_train.tokenizer != "byte" or t_cfg.vocab_size < N_BYTES:
            raise ValueError(f"byte KD needs a byte-tokenizer teacher, got {t_train.tokenizer!r}")
        if data is None:
            data = CorpusSource(train_cfg.tokenizer)
        if token_bytes is None:
            token_bytes = token_byte_strings(data.tokenizer)
        tb = TokenBytes.from_bytes(token_bytes)
        if tb.vocab_size > model_cfg.vocab_size:
            raise ValueError(f"student tokenizer has {tb.vocab_size} tokens > vocab_size {model_cfg.vocab_size}")
        M = F.pad(tb.first_byte_matrix(), (0, 0, 0, model_cfg.vocab_size - tb.vocab_size))  # (V, 256)
        byte_ids = torch.arange(N_BYTES) if t_cfg.vocab_size > N_BYTES else None

        def kd(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
            ids, _, boundary = windows_as_bytes(x, tb)  # (B, L), -, (B, T)
            with torch.no_grad():
                t = teacher(ids.to(x.device))  # (B, L, 256)
            return byte_kd_loss(logits, t, boundary.to(x.device), M, temp, byte_ids)
    if data is None:
        data = CorpusSource(train_cfg.tokenizer)
    res = train_with_extra_loss(model_cfg, train_cfg, data, kd, alpha, teacher=teacher, progress=progress)
    res["teacher_checkpoint"] = str(teacher_checkpoint)
    if out_dir is not None:
        from tern.core.records import atomic_write_json

        atomic_write_json(Path(out_dir) / "result.json", json.loads(json.dumps(res, default=str)))
    return res


def train_with_extra_loss(model_cfg, train_cfg, data, extra, alpha: float, *, teacher=None,
                          progress: bool = True) -> dict[str, Any]:
    """run_training's single-process loop with loss = (1 − α)·CE + α·extra(x, logits) +
    the MoE balance / z losses. ``teacher`` (a module) is moved to the training device."""
    from tern.train.config import schedule
    from tern.train.environment import cpu_training_mode, make_optimizer, training_device
    from tern.train.loop import _evaluate
    from tern.train.model.lm import build_model

    tc = train_cfg
    if not tc.steps:
        raise ValueError("distillation needs a step budget (train_cfg.steps > 0)")
    if tc.seq_len > model_cfg.max_seq_len:
        raise ValueError(f"seq_len {tc.seq_len} exceeds the model's max_seq_len {model_cfg.max_seq_len}")
    dev = training_device(tc, 0)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    with cpu_training_mode(tc, dev):
        torch.manual_seed(tc.seed)
        model = build_model(model_cfg, seed=tc.seed).to(dev)
        for layer in model.layers:
            if hasattr(layer.mixer, "scan_impl"):
                layer.mixer.scan_impl = tc.scan_impl
        if teacher is not None:
            teacher.to(dev).eval()
        opt = make_optimizer(model, tc, dev)
        model.train()
        window = max(1, min(50, tc.steps // 10))
        losses: deque[float] = deque(maxlen=window)
        kds: deque[float] = deque(maxlen=window)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=tc.steps, desc="distill", unit="step", file=sys.stderr, dynamic_ncols=True)
        t_start, train_s = time.perf_counter(), 0.0
        for step in range(tc.steps):
            lr, wd = schedule(tc, step, step / tc.steps)
            for g in opt.param_groups:
                g["lr"] = lr
                g["weight_decay"] = wd if g["decays"] else 0.0
            t0 = time.perf_counter()
            xb = torch.as_tensor(data.batch(tc.seed, step, tc.batch_size, tc.seq_len)).to(dev)  # (B, T+1)
            logits = model(xb[:, :-1])  # (B, T, V)
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1))
            aux = model.aux_losses()
            kd = extra(xb[:, :-1], logits) if alpha > 0 else torch.zeros((), device=dev)
            loss = (1 - alpha) * ce + alpha * kd if alpha > 0 else ce
            loss = loss + tc.balance_weight * aux["balance"] + tc.z_weight * aux["z"]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if tc.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            opt.step()
            ce_v = float(ce.detach())
            if not math.isfinite(ce_v):
                raise ValueError(f"distillation diverged: loss is {ce_v} at step {step}")
            train_s += time.perf_counter() - t0
            losses.append(ce_v)
            kds.append(float(kd.detach()))
            if bar is not None:
                bar.set_postfix({"ce": f"{ce_v:.3f}", "kd": f"{kds[-1]:.3f}"}, refresh=False)
                bar.update(1)
        if bar is not None:
            bar.close()
        tokens = tc.steps * tc.batch_size * tc.seq_len
        model.reset_stats()
        ev = _evaluate(model, data, tc, dev, None, tc.final_eval_tokens, 0)
        return {"steps": tc.steps, "train_tokens": tokens, "tokens_per_s": tokens / max(train_s, 1e-9),
                "train_s": train_s, "final_loss": sum(losses) / len(losses),
                "kd_loss": sum(kds) / len(kds), "kd_alpha": alpha,
                "val_bpb": ev.get("bpb"), "val_nats_per_token": ev.get("nats_per_token"),
                "val_tokens": ev.get("tokens"), "val_bytes": ev.get("bytes"),
                "sparsity": model.sparsity(), "expert_load": model.expert_load(),
                "device": str(dev), "wall_s": time.perf_counter() - t_start}
