"""Selective scan of the SSM mixer over a whole sequence (training / parallel forward).

    h_t = exp(dt_t * A) * h_{t-1} + (dt_t * u_t) * B_t ;   y_t = h_t @ C_t

:func:`selective_scan` uses the fused numba kernels on CPU (see ``scan_numba``) and the
torch chunked scan below elsewhere (CUDA) or on request. The torch form loops over chunks
of ``chunk`` steps; inside a chunk a Hillis-Steele scan (log2(chunk) vectorised steps,
products of decays only, so numerically stable) gives every state in closed form, and
each chunk is recomputed in the backward pass (activation checkpointing) so memory stays
O(B * T * Di) rather than O(B * T * Di * N).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK = 32


def _chunk_scan(dA: torch.Tensor, u: torch.Tensor, dt: torch.Tensor, Bm: torch.Tensor,
                Cm: torch.Tensor, h0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # dA: (B, L, Di, N) = dt*A; u, dt: (B, L, Di); Bm, Cm: (B, L, N); h0: (B, Di, N)
    a = torch.exp(dA)  # (B, L, Di, N)
    x = (dt * u).unsqueeze(-1) * Bm.unsqueeze(2)  # (B, L, Di, N)
    L = a.shape[1]
    k = 1
    while k < L:  # inclusive scan of (a, x) pairs: (a1, x1) o (a2, x2) = (a1 a2, a2 x1 + x2)
        x = torch.cat([x[:, :k], torch.addcmul(x[:, k:], a[:, k:], x[:, :-k])], 1)
        a = torch.cat([a[:, :k], a[:, k:] * a[:, :-k]], 1)
        k *= 2
    h = torch.addcmul(x, a, h0.unsqueeze(1))  # (B, L, Di, N)
    y = torch.einsum("bldn,bln->bld", h, Cm)  # (B, L, Di)
    return y, h[:, -1]


def torch_scan(u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bm: torch.Tensor,
               Cm: torch.Tensor, h0: torch.Tensor | None = None,
               chunk: int = DEFAULT_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked parallel scan in torch: y (B, T, Di), h_T (B, Di, N)."""
    nb, nt, di = u.shape
    h = h0 if h0 is not None else u.new_zeros(nb, di, A.shape[1])  # (B, Di, N)
    ys = []
    use_ckpt = torch.is_grad_enabled() and any(t.requires_grad for t in (u, dt, A, Bm, Cm))
    for s in range(0, nt, chunk):
        sl = slice(s, s + chunk)
        dA = dt[:, sl].unsqueeze(-1) * A  # (B, L, Di, N)
        args = (dA, u[:, sl], dt[:, sl], Bm[:, sl], Cm[:, sl], h)
        y, h = checkpoint(_chunk_scan, *args, use_reentrant=False) if use_ckpt else _chunk_scan(*args)
        ys.append(y)
    return torch.cat(ys, 1), h


def _numba_ok(*ts: torch.Tensor) -> bool:
    if not all(t.device.type == "cpu" and t.dtype == torch.float32 for t in ts):
        return False
    try:
        from tern.train.model import scan_numba  # noqa: F401
    except ImportError:  # numba missing: fall back to torch
        return False
    return True


def selective_scan(u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bm: torch.Tensor,
                   Cm: torch.Tensor, h0: torch.Tensor | None = None,
                   impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """y (B, T, Di) without the D skip term, and the final state h_T (B, Di, N).

    u, dt: (B, T, Di); A: (Di, N); Bm, Cm: (B, T, N); h0: (B, Di, N) or None (zeros).
    impl: "auto" (numba on CPU float32, else torch), "numba" or "torch"."""
    if impl not in ("auto", "numba", "torch"):
        raise ValueError(f"scan impl must be 'auto', 'numba' or 'torch', got {impl!r}")
    if impl == "numba" or (impl == "auto" and _numba_ok(u, dt, A, Bm, Cm)):
        from tern.train.model.scan_numba import numba_scan

        if h0 is None:
            h0 = u.new_zeros(u.shape[0], u.shape[2], A.shape[1])
        return numba_scan(u, dt, A, Bm, Cm, h0.detach())
    return torch_scan(u, dt, A, Bm, Cm, h0)
