"""A model made ready for decoding: faster weight layouts, bfloat16 or int8, in a copy.

The paper's model (:mod:`aiayn.model`) is kept plain: three projections W_Q, W_K, W_V,
and ``F.linear`` for the pre-softmax projection. Decoding runs the same few matmuls
thousands of times, and on a CPU some are faster with the weights rearranged:

* self-attention's W_Q, W_K, W_V side by side: one matmul three times as wide costs less
  than a step's three small ones (:class:`FusedQKVAttention`);
* a decoding step's vocabulary projection as ``torch.mm`` with the weight transposed once
  to (D, V): ``F.linear`` with the (V, D) weight is slower for a 32k vocabulary
  (:class:`TransposedProjection`);
* int8: every linear layer of the stacks, and both of the above, as
  :class:`~aiayn.inference.quantize.Int8Linear`.

:func:`optimize_for_inference` builds them in a structural copy of the model, which shares
the model's parameter tensors (or holds converted ones, for another device or dtype). The
given model is never modified: the trainer hands its live model to the translator at every
validation, then goes on training it. And since the rearranged weights are built from the
weights as they are when it runs, they cannot go stale: after the weights change (an
optimizer step, ``load_state_dict``), call it again.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.inference.quantize import Int8Linear, replace_linears
from aiayn.model import Transformer
from aiayn.model.attention import MultiHeadAttention
from aiayn.model.layers import DecoderLayer, EncoderLayer


class FixedLinear(nn.Module):
    """``F.linear`` with given weight (N, K) and bias (N,) tensors, kept as plain attributes:
    unlike ``nn.Linear`` it draws no initial weights, and it adds nothing to a state dict."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.weight = weight
        self.bias = bias

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class TransposedProjection(nn.Module):
    """The vocabulary projection of one decoding step, h (R, D) -> h W^T + b (R, V), as a
    matmul with W transposed once to a contiguous (D, V) matrix (the faster layout on a CPU)."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.weight_t = weight.t().contiguous()  # (D, V)
        self.bias = bias

    def forward(self, h: Tensor) -> Tensor:
        out = torch.mm(h, self.weight_t)
        return out if self.bias is None else out.add_(self.bias)


class FusedQKVAttention(MultiHeadAttention):
    """A self-attention whose queries, keys and values come from one matmul: ``qkv``, with
    W_Q, W_K, W_V side by side (a :class:`FixedLinear` or an ``Int8Linear``): its output is
    h*d_k query, h*d_k key and h*d_v value columns (d_k and d_v may differ, Table 3 row (B)).

    It takes over ``attn``'s heads and projections rather than calling
    ``MultiHeadAttention.__init__``, which would draw fresh random weights (and advance
    torch's random generator under a training run).
    """

    def __init__(self, attn: MultiHeadAttention, qkv: nn.Module) -> None:
        nn.Module.__init__(self)
        self.n_heads, self.d_k, self.d_v, self.dropout = attn.n_heads, attn.d_k, attn.d_v, attn.dropout
        self.w_q, self.w_k, self.w_v, self.w_o = attn.w_q, attn.w_k, attn.w_v, attn.w_o
        self.qkv = qkv
        self.training = attn.training

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        qk, v_cols = self.n_heads * self.d_k, self.n_heads * self.d_v
        q, k, v = self.qkv(x).split([qk, qk, v_cols], dim=-1)  # (B, T, H*d_k) x 2, (B, T, H*d_v)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)


@dataclass(frozen=True)
class OptimizedModel:
    """A Transformer ready for decoding.

    ``model``: the copy that runs (self-attentions fused; int8 layers for int8), sharing or
    converting the given model's tensors; its state dict has the given model's keys (in
    int8, the quantized layers' weights are not in it). ``step_projection``: decoder states
    (R, D) -> logits (R, V), applied after ``model.decode_step(..., project=False)`` and to
    the last position of ``model.decode(..., project=False)``.
    """

    model: Transformer
    step_projection: nn.Module


def optimize_for_inference(model: Transformer, device: str | torch.device | None = None,
                          dtype: torch.dtype | None = None) -> OptimizedModel:
    """``model``'s inference copy on ``device`` (None: where it is).

    ``dtype``: None keeps the weights' dtype; a float dtype (``torch.bfloat16``) converts the
    copy's floating-point parameters and buffers, as ``model.to(dtype)`` would; ``torch.int8``
    quantizes the linear layers for the CPU (model in eval mode), leaving the rest as it is.
    The copy's training mode is ``model``'s; ``model`` itself is left as it is.
    """
    int8 = dtype == torch.int8
    if int8:
        if model.training:
            raise ValueError("optimize_for_inference: put the model in eval mode first (int8 is for inference)")
        if torch.device(device or next(model.parameters()).device).type != "cpu":
            raise ValueError("optimize_for_inference: int8 inference runs on the CPU")
    with torch.no_grad():  # the rearranged weights are constants, outside any autograd graph
        copied = _copy(model, device, None if int8 else dtype)
        for layer in _layers(copied):
            attn = layer.self_attn
            lins = (attn.w_q, attn.w_k, attn.w_v)
            weight, bias = torch.cat([lin.weight for lin in lins]), torch.cat([lin.bias for lin in lins])
            layer.self_attn = FusedQKVAttention(attn, Int8Linear(weight, bias) if int8 else FixedLinear(weight, bias))
            if int8:  # W_Q, W_K, W_V now live in the fused layer alone: not quantized twice
                del layer.self_attn.w_q, layer.self_attn.w_k, layer.self_attn.w_v
        if int8:  # the embeddings stay float: they are looked up (and a tied projection is one)
            replace_linears(copied.encoder_layers)
            replace_linears(copied.decoder_layers)
            projection: nn.Module = Int8Linear(copied.output_weight, copied.output_bias)
        else:
            projection = TransposedProjection(copied.output_weight, copied.output_bias)
    return OptimizedModel(copied, projection)


def _layers(model: Transformer) -> Iterable[EncoderLayer | DecoderLayer]:
    # To a type checker nn.ModuleList holds plain nn.Modules; these hold the two layer kinds.
    return cast("Iterable[EncoderLayer | DecoderLayer]", itertools.chain(model.encoder_layers, model.decoder_layers))


def _copy(model: Transformer, device: str | torch.device | None, dtype: torch.dtype | None) -> Transformer:
    """A structural copy of ``model`` whose parameters and buffers are ``model``'s own tensors
    where they already have the device and dtype asked for, converted copies elsewhere."""
    memo: dict[int, object] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        new = t.to(device, dtype if t.is_floating_point() else None)
        if new is not t and isinstance(t, nn.Parameter):
            new = nn.Parameter(new, requires_grad=t.requires_grad)
        memo[id(t)] = new
    return copy.deepcopy(model, memo)
