"""Granular two-pool MoE (docs/MODEL.md, "MoE layer"): shared experts + routed top-k.

    logits = router.weight @ x;  p = softmax(logits)
    top = top_k largest p (ties: lower index first);  w = p[top] / sum(p[top])
    out = sum_s shared_s(x) + sum_j w_j * expert_{top_j}(x)

Dropless: every token reaches all of its k experts. Dispatch sorts the (token, expert)
assignments by expert; the experts then run as one grouped matmul pair over the sorted
rows (``torch._grouped_mm``: each expert's contiguous slice times its own weights, no
padding, one call for all experts — CPU default where torch has it; in bf16 where torch
runs it only so, as CUDA on Hopper: selectable there, not yet measured), as batched matmuls
over (E, cap, D) (cap = the busiest expert's count, padding rows dropped; CUDA default
unless padding would add more than half the rows), or as one matmul pair per expert on
its contiguous slice (the loop). All compute the same products: eval (integer dot
products) is bit-identical across modes; in training, grouped and batched multiply the
dequantized operands in fp32 whatever ``TrainConfig.cpu_matmul`` says (the loop's
``"fp32"`` form, which grouped reproduces to rounding), while the loop in mode ``"int8"``
takes the exact int8 product, equal up to fp32 rounding (tests/train/test_moe_batched.py).
On the 2-core reference host grouped trains the capacity-gate models 1.1x (8 experts) to
1.3x (64) faster than the loop (benchmarks/gate_train_speed.py). The input quantization (per token) is shared by all experts; the weighted sum of
each token's k outputs is one fused kernel on CPU (``moe_numba``). Training adds a Switch-style
balance loss ``E * sum_e f_e P_e`` (f_e: share of assignments, P_e: mean router
probability) and the router z-loss ``mean(logsumexp(logits)**2)``.
"""

from __future__ import annotations

import torch
from torch import nn

from tern.core.config import ModelConfig
from tern.train.model.mlp import ZeroStats, activation, gated_ffn
from tern.train.model.ternary import QMAX, Operand, is_ternary, prepare_input, prepare_weight

DISPATCH_MODES = ("auto", "grouped", "padded", "loop")
_GROUPED: dict[str, torch.dtype | None] = {}


def grouped_dtype(device: torch.device | str = "cpu") -> torch.dtype | None:
    """The dtype ``torch._grouped_mm`` runs in on ``device`` with its backward, in the layout
    grouped_qmatmul calls it with (each expert's weights transposed): float32 where it can
    (CPU), else bfloat16 (CUDA builds that have it only for bf16, e.g. on Hopper), else None.
    Probed once per device type on a tiny case: a private torch API that may be missing."""
    kind = torch.device(device).type
    if kind not in _GROUPED:
        _GROUPED[kind] = None
        for dt in (torch.float32, torch.bfloat16):
            try:
                a = torch.randn(48, 16, device=device, dtype=dt, requires_grad=True)
                b = torch.randn(3, 16, 16, device=device, dtype=dt).transpose(-1, -2).requires_grad_(True)
                y = torch._grouped_mm(a, b, offs=torch.tensor([16, 16, 48], dtype=torch.int32, device=device))
                y.backward(torch.ones_like(y))  # a contiguous gradient (an expanded one is refused)
                tol = 1e-5 if dt == torch.float32 else 0.05
                ok = bool(torch.allclose(y[16:].float(), (a[16:] @ b[2]).float(), atol=tol, rtol=tol)
                          and torch.count_nonzero(b.grad[1]) == 0)
            except (AttributeError, RuntimeError, TypeError, NotImplementedError):
                ok = False
            if ok:
                _GROUPED[kind] = dt
                break
    return _GROUPED[kind]


def grouped_available(device: torch.device | str = "cpu") -> bool:
    """Whether ``torch._grouped_mm`` runs with its backward on ``device`` (grouped_dtype)."""
    return grouped_dtype(device) is not None


def grouped_fits(d_model: int, hidden: int, dtype: torch.dtype = torch.float32) -> bool:
    """torch._grouped_mm wants row strides of whole 16-byte units: widths that are multiples
    of 4 (float32) or 8 (bfloat16)."""
    m = 128 // torch.finfo(dtype).bits
    return d_model % m == 0 and hidden % m == 0


def grouped_qmatmul(xin: Operand, win: Operand, offs: torch.Tensor, row_expert: torch.Tensor) -> torch.Tensor:
    """BitLinear products of rows sorted by expert with their own expert's weights, one
    grouped matmul: xin (m, in) (rows of expert e at offs[e-1]:offs[e]), win (E, out, in),
    offs (E,) int32 cumulative row counts, row_expert (m,) -> (m, out). Training: the fp32
    product of the dequantized operands (STE gradients, as the batched mode); eval: the
    integer dot product, then ``s_r * (a / 127)`` in the order tern.train.model.ternary.qmatmul
    uses, so eval is bit-identical to the per-expert loop in float32 (grouped_dtype); in bf16
    the products come back rounded to bf16, as autocast's do."""
    dt = grouped_dtype(xin.values.device)
    acc = torch._grouped_mm(xin.values.to(dt), win.values.to(dt).transpose(-1, -2), offs=offs).float()  # (m, out)
    if xin.scale is None:
        return acc
    s = win.scale.squeeze(-1).index_select(0, row_expert)  # (m, out) each row's expert's scales
    return s * (xin.scale / QMAX) * acc


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """probs (n, E), top indices (n, k) (ties: lower expert index first), weights (n, k)."""
    from tern.train.model import moe_numba, quant_numba

    p = torch.softmax(logits, dim=-1)  # (n, E)
    if quant_numba.usable(p):  # one pass a row (numba), same order as the stable sort below
        top = moe_numba.top_k_indices(p, top_k)  # (n, k)
    else:  # a stable descending sort keeps the lower index first among equal probabilities
        top = torch.sort(p, dim=-1, descending=True, stable=True).indices[:, :top_k]  # (n, k)
    pt = p.gather(1, top)  # (n, k)
    return p, top, pt / pt.sum(-1, keepdim=True)


def _combine(y_sorted: torch.Tensor, w: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """sum_j w[t, j] * (expert output of assignment (t, j)): y_sorted (n*k, D) in sorted
    order, w (n, k), order (n*k,) the flat assignment of each sorted row -> (n, D).
    Fused numba kernels on CPU float32 (``moe_numba``), torch ops elsewhere."""
    from tern.train.model import moe_numba, quant_numba

    if quant_numba.usable(y_sorted, w):
        return moe_numba.combine(y_sorted, w, order)
    n, k = w.shape
    y = torch.empty_like(y_sorted).index_copy(0, order, y_sorted).view(n, k, -1)  # (n, k, D)
    return (w.unsqueeze(-1) * y).sum(1)


class _Stacked(nn.Module):
    """Stacked expert tensors: gate (E, H, D), up (E, H, D), down (E, D, H)."""

    def __init__(self, n: int, hidden: int, d_model: int, out_std: float, ternary: bool):
        super().__init__()
        self.ternary = ternary
        self.gate = nn.Parameter(torch.randn(n, hidden, d_model) * 0.02)
        self.up = nn.Parameter(torch.randn(n, hidden, d_model) * 0.02)
        self.down = nn.Parameter(torch.randn(n, d_model, hidden) * out_std)

    def prepared(self, training: bool) -> tuple[Operand, Operand]:
        gate_up = prepare_weight(torch.cat([self.gate, self.up], 1), training, self.ternary)  # (E, 2H, D)
        return gate_up, prepare_weight(self.down, training, self.ternary)  # (E, D, H)


class _Router(nn.Module):
    def __init__(self, n: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, d_model) * 0.02)


class ExpertLoad:
    """Assignments per routed expert, accumulated until :meth:`reset` (not in state_dict)."""

    def __init__(self, n_experts: int) -> None:
        self.n = n_experts
        self.reset()

    def reset(self) -> None:
        self.counts = torch.zeros(self.n, dtype=torch.long)

    def add(self, top: torch.Tensor) -> None:
        self.counts += torch.bincount(top.detach().flatten().cpu(), minlength=self.n)

    def summary(self) -> dict:
        c = self.counts.double()
        mean = float(c.mean())
        return {"assignments": int(c.sum()), "max_over_mean": float(c.max()) / mean if mean else None,
                "min_over_mean": float(c.min()) / mean if mean else None,
                "dead_experts": int((self.counts == 0).sum()), "counts": self.counts.tolist()}


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, out_std: float = 0.02):
        super().__init__()
        D = cfg.d_model
        self.n_experts, self.top_k, self.hidden = cfg.n_experts, cfg.top_k, cfg.expert_hidden
        self.n_shared, self.shared_hidden = cfg.n_shared, cfg.shared_hidden
        self.act, self.eps = cfg.activation, cfg.norm_eps
        self.router = _Router(cfg.n_experts, D)
        if cfg.n_shared:
            self.shared = _Stacked(cfg.n_shared, cfg.shared_hidden, D, out_std, is_ternary(cfg.mlp_format))
        self.experts = _Stacked(cfg.n_experts, cfg.expert_hidden, D, out_std, is_ternary(cfg.expert_format))
        self.stats = ZeroStats()  # routed experts' hidden units
        self.shared_stats = ZeroStats()
        self.load = ExpertLoad(cfg.n_experts)
        self.aux: dict[str, torch.Tensor] = {}
        # "auto": CPU grouped (torch._grouped_mm; the loop where torch lacks it), CUDA batched
        # over experts unless padding would add > 50 % rows (else the loop); "grouped",
        # "padded", "loop": that mode always (benchmarks/gate_train_speed.py measures them)
        self.dispatch = "auto"

    def _experts_loop(self, xs, counts: list[int], tr: bool, et: bool) -> torch.Tensor:
        """One gated FFN per expert on its contiguous slice. split / unbind (not indexing):
        their backward is one cat / stack, not a zero-filled full-size gradient per expert."""
        x_e = xs.parts(lambda t: torch.split(t, counts))  # E x (n_e, D)
        gu, dn = (w.parts(lambda t: t.unbind(0)) for w in self.experts.prepared(tr))  # E x (2H, D), (D, H)
        ys = [gated_ffn(x_e[e], gu[e], dn[e], self.hidden, self.act, self.eps, tr, et, self.stats)
              for e, c in enumerate(counts) if c]
        return torch.cat(ys, 0)  # (n*k, D)

    def _experts_grouped(self, xs, counts: list[int], tr: bool, et: bool) -> torch.Tensor:
        """All experts in one grouped matmul pair over the sorted rows (no padding)."""
        dev = xs.values.device
        cnt = torch.tensor(counts, device=dev)  # (E,)
        offs = torch.cumsum(cnt, 0).to(torch.int32)  # (E,) end row of each expert
        row_expert = torch.repeat_interleave(torch.arange(self.n_experts, device=dev), cnt)  # (n*k,)
        gu_w, down_w = self.experts.prepared(tr)  # (E, 2H, D), (E, D, H)
        gu = grouped_qmatmul(xs, gu_w, offs, row_expert)  # (n*k, 2H)
        if tr and et:
            from tern.train.model import ffn_numba, quant_numba

            if quant_numba.usable(gu):  # CPU: activation + down-input quantization fused
                v, q, c = ffn_numba.gated_act_quant(gu, self.act, self.eps)  # (n*k, H) ...
                return grouped_qmatmul(Operand(v, None, q, c), down_w, offs, row_expert)
        h = activation(self.act, gu[:, :self.hidden], gu[:, self.hidden:])  # (n*k, H)
        if not tr:  # zero count in eval passes (every row is a real assignment)
            self.stats.add(h)
        return grouped_qmatmul(prepare_input(h, self.eps, tr, et), down_w, offs, row_expert)  # (n*k, D)

    def _experts_padded(self, xs, counts: list[int], tr: bool, et: bool) -> torch.Tensor:
        """All experts in batched matmuls over (E, cap, D), cap = the largest expert's
        token count; padding rows are zero and dropped afterwards (dropless)."""
        E, dev = self.n_experts, xs.values.device
        cap = max(counts)
        cnt = torch.tensor(counts, device=dev)  # (E,)
        ar = torch.arange(cap, device=dev)  # (cap,)
        valid = ar.unsqueeze(0) < cnt.unsqueeze(1)  # (E, cap)
        pos = (torch.cumsum(cnt, 0) - cnt).unsqueeze(1) + ar.unsqueeze(0)  # (E, cap) sorted row
        pos = torch.where(valid, pos, torch.zeros_like(pos)).flatten()  # padding reads row 0 ...
        m = valid.flatten().unsqueeze(1).to(xs.values.dtype)  # ... and is zeroed
        xp = (xs.values.index_select(0, pos) * m).view(E, cap, -1)  # (E, cap, D)
        ap = (xs.scale.index_select(0, pos).view(E, cap, 1) if xs.scale is not None else None)
        gu, down = self.experts.prepared(tr)  # (E, 2H, D), (E, D, H): batched fp32 products
        y = gated_ffn(Operand(xp, ap), gu, down, self.hidden, self.act, self.eps, tr, et, self.stats,
                      valid=valid)  # (E, cap, D)
        return y[valid]  # (n*k, D) in sorted order

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # (n, D)
        n, k, E, tr = x2.shape[0], self.top_k, self.n_experts, self.training
        logits = x2 @ self.router.weight.t()  # (n, E) fp32
        p, top, w = route(logits, k)  # (n, E), (n, k), (n, k)
        self.load.add(top)
        et = self.experts.ternary
        xin = prepare_input(x2, self.eps, tr, et)  # shared by every routed expert
        out = torch.zeros_like(x2)
        if self.n_shared:
            st = self.shared.ternary
            s_in = xin if st == et else prepare_input(x2, self.eps, tr, st)
            s_gu, s_down = (w.parts(lambda t: t.unbind(0)) for w in self.shared.prepared(tr))
            for s in range(self.n_shared):
                out = out + gated_ffn(s_in, s_gu[s], s_down[s], self.shared_hidden, self.act, self.eps,
                                      tr, st, self.shared_stats)
        # dispatch: assignments sorted by expert (stable: token order kept inside an expert)
        flat = top.flatten()  # (n*k,)
        if flat.device.type == "cpu":  # a stable counting sort with its counts (numba)
            from tern.train.model import moe_numba

            order, counts = moe_numba.dispatch_order(flat, E)  # (n*k,), E counts
        else:
            order = torch.sort(flat, stable=True).indices  # (n*k,)
            counts = torch.bincount(flat, minlength=E).tolist()
        tok = order // k  # token of each sorted assignment
        xs = xin.map(lambda t: t.index_select(0, tok))  # (n*k, D) sorted by expert
        mode = self.dispatch
        if mode not in DISPATCH_MODES:
            raise ValueError(f"MoE dispatch must be one of {DISPATCH_MODES}, got {mode!r}")
        if mode == "auto":
            if x2.is_cuda:  # batched unless padding adds > 50 % rows
                mode = "padded" if max(counts) * E <= 1.5 * n * k else "loop"
            else:  # measured fastest on CPU at 8-64 experts in float32 (benchmarks/gate_train_speed.py)
                ok = grouped_dtype(x2.device) == torch.float32 and grouped_fits(shape[-1], self.hidden)
                mode = "grouped" if ok else "loop"
        gdt = grouped_dtype(x2.device) if mode == "grouped" else None
        if mode == "grouped" and not (gdt is not None and grouped_fits(shape[-1], self.hidden, gdt)):
            raise ValueError(f"MoE dispatch 'grouped' needs torch._grouped_mm on {x2.device.type} "
                             f"(torch {torch.__version__}) and d_model, expert_hidden multiples of 4 "
                             f"(got {shape[-1]}, {self.hidden}; multiples of 8 in bf16); use 'loop' or 'padded'")
        experts = {"grouped": self._experts_grouped, "padded": self._experts_padded,
                   "loop": self._experts_loop}[mode]
        y_sorted = experts(xs, counts, tr, et)  # (n*k, D) in sorted order
        out = out + _combine(y_sorted, w, order)  # (n, D)
        if tr:
            f = torch.tensor(counts, dtype=p.dtype, device=p.device) / (n * k)  # (E,) share of assignments
            self.aux = {"balance": E * (f * p.mean(0)).sum(),
                        "z": torch.logsumexp(logits, dim=-1).square().mean()}
        return out.view(shape)
