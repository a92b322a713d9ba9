"""Encoder/decoder layers equal torch.nn's reference layers loaded with the same weights."""

from __future__ import annotations

import torch
from torch import nn

from aiayn.model.layers import DecoderLayer, EncoderLayer

D, H, FF = 32, 4, 64


def _copy_attention(ours, ref: nn.MultiheadAttention) -> None:
    w_q, w_k, w_v = ref.in_proj_weight.chunk(3)
    b_q, b_k, b_v = ref.in_proj_bias.chunk(3)
    with torch.no_grad():
        for lin, w, b in ((ours.w_q, w_q, b_q), (ours.w_k, w_k, b_k), (ours.w_v, w_v, b_v)):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        ours.w_o.weight.copy_(ref.out_proj.weight)
        ours.w_o.bias.copy_(ref.out_proj.bias)


def _copy_ffn_and_norms(ours, ref, norms) -> None:
    with torch.no_grad():
        ours.ffn.w_1.weight.copy_(ref.linear1.weight)
        ours.ffn.w_1.bias.copy_(ref.linear1.bias)
        ours.ffn.w_2.weight.copy_(ref.linear2.weight)
        ours.ffn.w_2.bias.copy_(ref.linear2.bias)
        for mine, theirs in norms:
            # Non-trivial LayerNorm parameters, so a swapped norm would show.
            theirs.weight.uniform_(0.5, 1.5)
            theirs.bias.uniform_(-0.5, 0.5)
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)


def _padding_mask() -> torch.Tensor:
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True
    pad[2, 2:] = True
    return pad  # True on padding


def test_encoder_layer_matches_torch() -> None:
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True)
    ours = EncoderLayer(D, H, D // H, FF, dropout=0.0)
    _copy_attention(ours.self_attn, ref.self_attn)
    _copy_ffn_and_norms(ours, ref, [(ours.self_attn_norm, ref.norm1), (ours.ffn_norm, ref.norm2)])
    # train mode with p=0 keeps torch off its fast path, which zeroes padded rows.
    ref.train()
    ours.train()
    x = torch.randn(3, 7, D)
    pad = _padding_mask()
    expected = ref(x, src_key_padding_mask=pad)
    got = ours(x, (~pad)[:, None, None, :])
    real = ~pad
    assert (got - expected)[real].abs().max() <= 1e-5
    # Padded query rows are computed too (over the real keys) and agree as well.
    assert (got - expected).abs().max() <= 1e-5


def test_decoder_layer_matches_torch() -> None:
    torch.manual_seed(1)
    ref = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True)
    ours = DecoderLayer(D, H, D // H, FF, dropout=0.0)
    _copy_attention(ours.self_attn, ref.self_attn)
    _copy_attention(ours.cross_attn, ref.multihead_attn)
    _copy_ffn_and_norms(ours, ref, [(ours.self_attn_norm, ref.norm1), (ours.cross_attn_norm, ref.norm2),
                                    (ours.ffn_norm, ref.norm3)])
    y = torch.randn(3, 5, D)
    memory = torch.randn(3, 7, D)
    pad = _padding_mask()
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    expected = ref(y, memory, tgt_mask=causal, memory_key_padding_mask=pad)
    got, _ = ours(y, memory, (~pad)[:, None, None, :])
    assert (got - expected).abs().max() <= 1e-5


def test_pre_norm_layer_structure() -> None:
    torch.manual_seed(2)
    ref = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=True)
    ours = EncoderLayer(D, H, D // H, FF, dropout=0.0, norm="pre")
    _copy_attention(ours.self_attn, ref.self_attn)
    _copy_ffn_and_norms(ours, ref, [(ours.self_attn_norm, ref.norm1), (ours.ffn_norm, ref.norm2)])
    ref.train()
    x = torch.randn(2, 6, D)
    assert (ours(x, None) - ref(x)).abs().max() <= 1e-5
