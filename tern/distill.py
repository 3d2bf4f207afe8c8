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

from collections.abc import Sequence
from dataclasses import dataclass

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
