"""Encoder and decoder layers (paper section 3.1, 3.3).

Each sub-layer is wrapped as ``LayerNorm(x + Dropout(Sublayer(x)))`` (``norm="post"``,
the paper) or ``x + Dropout(Sublayer(LayerNorm(x)))`` (``norm="pre"``; the stack then
ends with a final LayerNorm, see :mod:`aiayn.model.transformer`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.model.attention import MultiHeadAttention
from aiayn.model.cache import KVCache
from aiayn.model.dropout import Dropout

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "swish": F.silu,
}


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2 (section 3.3), inner size d_ff."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu",
                 activation_dropout: float = 0.0) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.activation = ACTIVATIONS[activation]
        self.dropout = Dropout(activation_dropout)
        for lin in (self.w_1, self.w_2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        # (B, T, D) -> (B, T, d_ff) -> (B, T, D)
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class _Sublayers(nn.Module):
    """Shared residual wiring of encoder and decoder layers."""

    def __init__(self, norm: str, dropout: float) -> None:
        super().__init__()
        self.pre_norm = norm == "pre"
        self.dropout = Dropout(dropout)

    def residual(self, x: Tensor, norm: nn.LayerNorm, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(norm(x)))
        return norm(x + self.dropout(sublayer(x)))


class EncoderLayer(_Sublayers):
    """Self-attention, then the feed-forward network."""

    def __init__(self, d_model: int, n_heads: int, d_k: int, d_ff: int,
                 dropout: float = 0.1, attention_dropout: float = 0.0,
                 activation_dropout: float = 0.0, activation: str = "relu",
                 norm: str = "post", eps: float = 1e-5, d_v: int | None = None) -> None:
        super().__init__(norm, dropout)
        self.self_attn = MultiHeadAttention(d_model, n_heads, d_k, d_v, attention_dropout)
        self.self_attn_norm = nn.LayerNorm(d_model, eps=eps)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, activation, activation_dropout)
        self.ffn_norm = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x: Tensor, src_mask: Tensor | None) -> Tensor:
        # x: (B, S, D); src_mask: (B, 1, 1, S) bool, True on real tokens
        x = self.residual(x, self.self_attn_norm, lambda h: self.self_attn(h, mask=src_mask)[0])
        return self.residual(x, self.ffn_norm, self.ffn)


class DecoderLayer(_Sublayers):
    """Masked self-attention, attention over the encoder output, feed-forward."""

    def __init__(self, d_model: int, n_heads: int, d_k: int, d_ff: int,
                 dropout: float = 0.1, attention_dropout: float = 0.0,
                 activation_dropout: float = 0.0, activation: str = "relu",
                 norm: str = "post", eps: float = 1e-5, d_v: int | None = None) -> None:
        super().__init__(norm, dropout)
        self.self_attn = MultiHeadAttention(d_model, n_heads, d_k, d_v, attention_dropout)
        self.self_attn_norm = nn.LayerNorm(d_model, eps=eps)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, d_k, d_v, attention_dropout)
        self.cross_attn_norm = nn.LayerNorm(d_model, eps=eps)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, activation, activation_dropout)
        self.ffn_norm = nn.LayerNorm(d_model, eps=eps)

    def forward(self, y: Tensor, memory: Tensor, src_mask: Tensor | None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Whole target at once. y: (B, T, D), memory: (B, S, D) -> (B, T, D), (B, H, T, S)."""
        # Causal masking alone suffices: target padding only ever sits after the real
        # tokens, which the causal mask already hides from them.
        y = self.residual(y, self.self_attn_norm,
                          lambda h: self.self_attn(h, is_causal=True)[0])
        weights = None

        def cross(h: Tensor) -> Tensor:
            nonlocal weights
            out, weights = self.cross_attn(h, memory, mask=src_mask, need_weights=need_weights)
            return out

        y = self.residual(y, self.cross_attn_norm, cross)
        return self.residual(y, self.ffn_norm, self.ffn), weights

    def step(self, y: Tensor, cache: KVCache, index: int,
             need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """One new position. y: (R, 1, D) -> (R, 1, D), cross weights (R, H, 1, S)."""

        def self_attn(h: Tensor) -> Tensor:
            q, k, v = self.self_attn.project_qkv(h)  # (R, H, 1, d_k) x 2, (R, H, 1, d_v)
            k, v = cache.append(index, k, v)  # (R, H, t+1, d_k), (R, H, t+1, d_v)
            return self.self_attn.attend_heads(q, k, v)[0]

        y = self.residual(y, self.self_attn_norm, self_attn)
        layer = cache.layers[index]
        weights = None
        rows, g = y.size(0), cache.group_size

        def cross(h: Tensor) -> Tensor:
            # The g rows of a source group are g queries over its one copy of the keys:
            # (R, 1, D) -> (R/g, g, D), weights (R/g, H, g, S) -> (R, H, 1, S).
            nonlocal weights
            out, w = self.cross_attn.attend(h.view(rows // g, g, -1), layer.cross_k, layer.cross_v,
                                            mask=cache.src_mask, need_weights=need_weights)
            if w is not None:
                weights = w.transpose(1, 2).reshape(rows, w.size(1), 1, w.size(-1))
            return out.view(rows, 1, -1)

        y = self.residual(y, self.cross_attn_norm, cross)
        return self.residual(y, self.ffn_norm, self.ffn), weights
