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
