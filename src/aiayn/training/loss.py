"""Label-smoothed cross entropy (paper section 5.4), as fairseq's ``label_smoothed_nll_loss``.

The smoothed target puts ``1 - eps`` on the reference token and spreads ``eps`` over the
other ``V - 1`` classes. Written as fairseq does::

    loss = (1 - eps - eps / (V - 1)) * nll + eps / (V - 1) * sum_v(-log p_v)

Padding positions contribute nothing. The plain NLL is returned beside the smoothed loss
because label smoothing "hurts perplexity": perplexity must come from the NLL.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def label_smoothed_nll_loss(
    logits: Tensor,
    target: Tensor,
    epsilon: float = 0.1,
    ignore_index: int | None = 0,
    reduction: str = "sum",
) -> tuple[Tensor, Tensor]:
    """Smoothed loss and plain NLL of ``logits`` (..., V) against ``target`` (...).

    ``reduction``: ``sum`` (over non-pad tokens; the trainer divides by the token count
    of the whole update), ``mean`` (per non-pad token) or ``none`` (per position, zero
    at padding). Computed in float32 even for bf16/fp16 logits: the log-softmax over a
    large vocabulary is where reduced precision hurts.
    """
    if reduction not in ("sum", "mean", "none"):
        raise ValueError(f"reduction must be sum, mean or none, got {reduction!r}")
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (..., V)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (...)
    if epsilon > 0.0:
        vocab = lprobs.size(-1)
        smooth = -lprobs.sum(-1)  # (...)
        eps_i = epsilon / (vocab - 1)
        loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
    else:
        loss = nll
    if ignore_index is not None:
        keep = target != ignore_index
        zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
        loss = torch.where(keep, loss, zero)
        nll = torch.where(keep, nll, zero)
        n = keep.sum()
    else:
        n = torch.tensor(target.numel(), device=target.device)
    if reduction == "none":
        return loss, nll
    loss, nll = loss.sum(), nll.sum()
    if reduction == "mean":
        denom = n.clamp(min=1).to(loss.dtype)
        return loss / denom, nll / denom
    return loss, nll


# The fused loss's rows per chunk on a CPU: the (1,024, V) float32 chunk of a 32,000-word
# vocabulary (131 MB) stays within the heap the allocator reuses (aiayn.runtime.process).
CPU_CHUNK_ROWS = 1024
# On a GPU, the chunk's share of the free device memory, and its ceiling: a few large chunks
# (a few launches of each of the loss's kernels instead of one per 1,024 rows) while the
# step's peak memory grows by at most this. A 32,000-word vocabulary in bf16: 5,120 rows.
GPU_CHUNK_MEMORY_FRACTION = 4
GPU_CHUNK_MAX_BYTES = 2 << 30


def chunk_rows_for_memory(free_bytes: int, vocab: int, matmul_dtype: torch.dtype) -> int:
    """Rows per chunk whose temporaries fit in a quarter of ``free_bytes`` (at most
    ``GPU_CHUNK_MAX_BYTES``), in multiples of ``CPU_CHUNK_ROWS`` and never fewer than that.

    Per row a chunk holds the logits and the softmax in the matmul dtype and the float32
    log-probabilities, plus a float32 row of slack (the bias gradient's product)."""
    element = torch.empty((), dtype=matmul_dtype).element_size()
    per_row = vocab * (2 * element + 8)
    budget = min(free_bytes // GPU_CHUNK_MEMORY_FRACTION, GPU_CHUNK_MAX_BYTES)
    return max(CPU_CHUNK_ROWS, budget // per_row // CPU_CHUNK_ROWS * CPU_CHUNK_ROWS)


def loss_chunk_rows(device: torch.device, vocab: int, matmul_dtype: torch.dtype) -> int:
    """The fused loss's rows per chunk on ``device``, decided here only.

    A CPU: ``CPU_CHUNK_ROWS``. A GPU: from its free memory (the driver's free memory plus
    what torch's caching allocator holds unused), so that a WMT-sized batch of 25,000 target
    tokens takes one or a few chunks instead of 25 launches of each of its kernels."""
    if device.type != "cuda":
        return CPU_CHUNK_ROWS
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return chunk_rows_for_memory(free + cached, vocab, matmul_dtype)


def projected_label_smoothed_loss(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    epsilon: float = 0.1,
    ignore_index: int | None = 0,
    chunk_rows: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``label_smoothed_nll_loss(F.linear(hidden, weight, bias), target)`` with reduction
    ``sum``, without ever holding the (N, V) logits in float32.

    hidden (..., D) are the decoder states, weight (V, D) the pre-softmax projection (the
    tied embedding), target (...). The rows are processed ``chunk_rows`` at a time (None:
    :func:`loss_chunk_rows` of the device): logits
    of a chunk, their log-sum-exp, the loss, and at once the gradient of the loss with
    respect to those logits (``softmax * (a + b V) - b - a * onehot`` for the smoothed
    loss ``a * nll + b * sum_v(-log p_v)``), which is turned into the gradients of
    ``hidden``, ``weight`` and ``bias`` before the next chunk. Backward then only scales
    them. On a CPU this removes about ten passes over a 4,096 x 32,000 float32 tensor per
    step (the float copy, log-softmax forward and backward, the zero-filled gather
    gradient, the smoothing sum and its backward) and the 0.5 GB it occupies.

    Under autocast the matmuls run in the autocast dtype (as ``F.linear`` would); the
    softmax and the loss are float32. Equal to the unfused loss to float32 rounding
    (tests/training/test_loss.py).
    """
    dtype = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(hidden.device.type) \
        else hidden.dtype
    flat_h = hidden.reshape(-1, hidden.size(-1))
    flat_t = target.reshape(-1)
    if chunk_rows is None:
        chunk_rows = loss_chunk_rows(hidden.device, weight.size(0), dtype)
    with torch.autocast(hidden.device.type, enabled=False):
        return _ProjectedLoss.apply(flat_h, weight, bias, flat_t, epsilon, ignore_index, chunk_rows, dtype)


def _chunk_gradients(z: Tensor, w: Tensor, w32: Tensor, w_colsum: Tensor, hc: Tensor, tc: Tensor,
                     keep: Tensor, coefs: tuple[float, float, float],
                     grads: tuple[Tensor, Tensor, Tensor | None, Tensor]) -> None:
    """Add one chunk's part of the gradients, in place: grad_h's rows of the chunk, grad_w,
    grad_b and the sum of the kept states (for grad_w's constant part)."""
    a, c, eps_i = coefs
    grad_h_rows, grad_w, grad_b, h_sum = grads
    # The dense part of the gradient is c * softmax; the constant -eps_i and the
    # one-hot -a are rank-1 / sparse and are added below without touching (c, V).
    # From the logits, not exp of the float32 log-probabilities the forward holds: reading
    # the matmul-dtype logits once is cheaper than reading twice their bytes and converting.
    p = torch.softmax(z, dim=-1)  # in the matmul dtype (accumulated in float32)
    kf = keep[:, None].to(torch.float32)
    gh = torch.mm(p, w).float().mul_(c)  # (c, D)
    if eps_i > 0:
        gh -= eps_i * w_colsum
    gh -= a * w32[tc]
    grad_h_rows.copy_(gh * kf)
    hk32 = hc.float() * kf  # padding rows contribute nothing
    grad_w += torch.mm(p.t(), (hk32 * c).to(hc.dtype))
    h_sum += hk32.sum(0)
    grad_w.index_add_(0, tc, hk32, alpha=-a)
    if grad_b is not None:
        grad_b += c * (p.float() * kf).sum(0) - eps_i * kf.sum()
        grad_b.index_add_(0, tc, kf[:, 0], alpha=-a)


class _ProjectedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, epsilon: float,
                ignore_index: int | None, chunk_rows: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        n, vocab = h.size(0), weight.size(0)
        w = weight.to(dtype)  # (V, D), the matmul copy
        h_all = h.to(dtype)  # (N, D)
        need_grad = any(ctx.needs_input_grad[:3])
        epsilon = max(epsilon, 0.0)  # as label_smoothed_nll_loss: no smoothing below 0
        eps_i = epsilon / (vocab - 1)
        a = 1.0 - epsilon - eps_i  # weight of the NLL; eps_i weighs sum_v(-log p_v)
        c = a + eps_i * vocab  # d loss / d z = c * softmax(z) - eps_i - a * onehot(target)
        keep_all = (target != ignore_index) if ignore_index is not None else torch.ones_like(target, dtype=torch.bool)
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        nll = torch.zeros((), dtype=torch.float32, device=h.device)
        if need_grad:
            w32 = weight.float()
            w_colsum = w32.sum(0)  # (D,): the constant -eps_i of d loss / d z, times the weight
            grad_h = torch.empty_like(h_all, dtype=torch.float32)
            grad_w = torch.zeros_like(w32)
            grad_b = torch.zeros(vocab, dtype=torch.float32, device=h.device) if bias is not None else None
            h_sum = torch.zeros(h.size(1), dtype=torch.float32, device=h.device)
        for start in range(0, n, chunk_rows):
            rows = slice(start, start + chunk_rows)
            hc, tc, keep = h_all[rows], target[rows], keep_all[rows]
            z = torch.mm(hc, w.t())  # (c, V) logits, in the matmul dtype
            if bias is not None:
                z += bias.to(z.dtype)
            lp = torch.log_softmax(z, dim=-1, dtype=torch.float32)  # (c, V) float32
            lp_t = lp.gather(1, tc[:, None])[:, 0]
            nll_c = -lp_t
            if eps_i > 0:
                loss_c = a * nll_c - eps_i * lp.sum(-1)  # eps_i * sum_v(-log p_v)
            else:
                loss_c = nll_c
            loss += torch.where(keep, loss_c, 0.0).sum()
            nll += torch.where(keep, nll_c, 0.0).sum()
            if need_grad:
                _chunk_gradients(z, w, w32, w_colsum, hc, tc, keep, (a, c, eps_i),
                                 (grad_h[rows], grad_w, grad_b, h_sum))
        ctx.mark_non_differentiable(nll)
        if need_grad:
            if eps_i > 0:
                grad_w -= eps_i * h_sum  # the constant part of d loss / d z, for all V rows at once
            ctx.save_for_backward(*(t for t in (grad_h, grad_w, grad_b) if t is not None))
        ctx.h_dtype, ctx.w_dtype, ctx.has_bias = h.dtype, weight.dtype, bias is not None
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        saved = ctx.saved_tensors
        grad_h = (saved[0] * grad_loss).to(ctx.h_dtype)
        grad_w = (saved[1] * grad_loss).to(ctx.w_dtype)
        grad_b = saved[2] * grad_loss if ctx.has_bias else None
        return grad_h, grad_w, grad_b, None, None, None, None, None
