"""Scaled dot-product and multi-head attention (paper section 3.2)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.model.dropout import dropout


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False,
    dropout_p: float = 0.0, need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q K^T / sqrt(d_k)) V.

    q: (B, H, T, d_k); k: (B, H, S, d_k); v: (B, H, S, d_v); mask: bool, broadcastable to (B, H, T, S),
    True where a query may attend. Without ``need_weights`` this is PyTorch's fused
    kernel (flash / memory-efficient on GPUs); with it, the explicit formula, returning
    the output (B, H, T, d_v) and the probabilities (B, H, T, S) as well (0 on masked keys, rows summing to 1).

    On a CPU the explicit formula also serves when no weights are wanted in bf16/fp16
    (PyTorch's CPU flash kernel is slower there for translation-length sequences, forward
    and backward, while two batched matmuls run on the bf16 matrix units) and in fp32
    without gradients (decoding: the flash kernel's per-block overhead dominates a step's
    few queries). fp32 training keeps the flash kernel, faster forward and backward.
    """
    if not need_weights and not _explicit_is_faster(q):
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal and mask is None
        )
        return out, None
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if is_causal:
        t, s = scores.shape[-2:]
        causal = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=s - t)
        mask = causal if mask is None else mask & causal
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    dropped = dropout(probs, dropout_p) if dropout_p > 0 else probs
    return torch.matmul(dropped, v), (probs if need_weights else None)


def _explicit_is_faster(q: Tensor) -> bool:
    # Decoding steps included (one query per row; a beam's K over shared cross-attention
    # keys): the CPU flash kernel is slower there in every dtype.
    if q.device.type != "cpu":
        return False
    return q.dtype in (torch.bfloat16, torch.float16) or not q.requires_grad


class MultiHeadAttention(nn.Module):
    """h heads with projections W_Q, W_K (d_model -> h*d_k), W_V (d_model -> h*d_v) and the
    output W_O (h*d_v -> d_model), section 3.2.2. The paper's models use d_k = d_v = d_model/h;
    Table 3 row (B) shrinks d_k alone, so ``d_v`` (None: d_k) can differ."""

    def __init__(self, d_model: int, n_heads: int, d_k: int, d_v: int | None = None,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.d_k = d_k
        self.d_v = d_k if d_v is None else d_v
        self.w_q = nn.Linear(d_model, n_heads * self.d_k)
        self.w_k = nn.Linear(d_model, n_heads * self.d_k)
        self.w_v = nn.Linear(d_model, n_heads * self.d_v)
        self.w_o = nn.Linear(n_heads * self.d_v, d_model)
        self.dropout = dropout
        for lin in (self.w_q, self.w_k, self.w_v, self.w_o):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        # (B, T, H*d) -> (B, H, T, d), d = d_k or d_v
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, -1).transpose(1, 2)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of x: (B, S, D) -> (B, H, S, d_k), (B, H, S, d_v). Cached by the decoder."""
        return self.split_heads(self.w_k(x)), self.split_heads(self.w_v(x))

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of x (B, T, D) -> 2 x (B, H, T, d_k), (B, H, T, d_v)."""
        return self.split_heads(self.w_q(x)), *self.project_kv(x)

    def attend(
        self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
        is_causal: bool = False, need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Queries from x (B, T, D) over given keys/values -> (B, T, D), weights (B, H, T, S)."""
        return self.attend_heads(self.split_heads(self.w_q(x)), k, v, mask, is_causal, need_weights)

    def attend_heads(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
        is_causal: bool = False, need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Projected queries q (B, H, T, d_k) over keys/values -> (B, T, D), weights (B, H, T, S)."""
        p = self.dropout if self.training else 0.0
        out, weights = scaled_dot_product_attention(q, k, v, mask, is_causal, p, need_weights)
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, self.n_heads * self.d_v)  # (B, T, H*d_v)
        return self.w_o(out), weights

    def forward(
        self, x: Tensor, memory: Tensor | None = None, mask: Tensor | None = None,
        is_causal: bool = False, need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Self-attention (memory None) or attention over memory (B, S, D)."""
        if memory is None:
            return self.attend_heads(*self.project_qkv(x), mask, is_causal, need_weights)
        k, v = self.project_kv(memory)
        return self.attend(x, k, v, mask, is_causal, need_weights)
