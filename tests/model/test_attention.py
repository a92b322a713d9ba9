"""Scaled dot-product attention: fused and explicit paths agree; weights are a distribution."""

from __future__ import annotations

import math

import torch

from aiayn.model.attention import MultiHeadAttention, scaled_dot_product_attention


def test_explicit_path_matches_formula_and_fused_kernel() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False
    fused, none = scaled_dot_product_attention(q, k, v, mask)
    explicit, w = scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    assert none is None
    assert torch.allclose(fused, explicit, atol=1e-6)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    scores = scores.masked_fill(~mask, float("-inf"))
    assert torch.allclose(w, scores.softmax(-1), atol=1e-6)


def test_weights_sum_to_one_and_zero_on_padding() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, 4)
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)[:, None, None, :]
    _, w = mha(x, memory, mask=mask, need_weights=True)
    assert w.shape == (2, 4, 3, 5)
    assert torch.allclose(w.sum(-1), torch.ones(2, 4, 3), atol=1e-6)
    assert torch.all(w[1, :, :, 2:] == 0)


def test_causal_explicit_equals_fused() -> None:
    torch.manual_seed(0)
    q = torch.randn(1, 2, 5, 4)
    fused, _ = scaled_dot_product_attention(q, q, q, is_causal=True)
    explicit, w = scaled_dot_product_attention(q, q, q, is_causal=True, need_weights=True)
    assert torch.allclose(fused, explicit, atol=1e-6)
    assert torch.all(w.triu(diagonal=1) == 0)


def test_bf16_cpu_uses_explicit_path_with_same_result() -> None:
    """On a CPU in bf16 the explicit formula replaces the (slow) flash kernel; same numbers."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[0, ..., 5:] = False
    ref, _ = scaled_dot_product_attention(q, k, v, mask)
    out, w = scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
    assert w is None and out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), ref, atol=3e-2)
    causal_ref, _ = scaled_dot_product_attention(q, q, q, is_causal=True)
    causal, _ = scaled_dot_product_attention(q.bfloat16(), q.bfloat16(), q.bfloat16(), is_causal=True)
    assert torch.allclose(causal.float(), causal_ref, atol=3e-2)


def test_bf16_cpu_decoding_step_skips_the_flash_kernel(monkeypatch) -> None:
    """A decoding step's single query row in bf16 on a CPU takes the explicit formula too
    (the flash kernel is slower for a single query row there), with the fp32 numbers."""
    torch.manual_seed(0)
    q, k, v = torch.randn(6, 4, 1, 8), torch.randn(6, 4, 9, 8), torch.randn(6, 4, 9, 8)
    ref, _ = scaled_dot_product_attention(q, k, v)

    def flash(*args, **kwargs):
        raise AssertionError("the fused kernel was called")

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", flash)
    out, _ = scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert torch.allclose(out.float(), ref, atol=3e-2)


def test_d_k_different_from_d_v() -> None:
    """Table 3 row (B): W_Q, W_K project to h*d_k, W_V to h*d_v, W_O from h*d_v; the fused
    kernel and the explicit formula agree, and scores are scaled by sqrt(d_k)."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, d_k=2, d_v=6)
    assert (mha.w_q.weight.shape, mha.w_k.weight.shape) == ((8, 16), (8, 16))
    assert (mha.w_v.weight.shape, mha.w_o.weight.shape) == ((24, 16), (16, 24))
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)[:, None, None, :]
    q, k, v = mha.project_qkv(x)
    assert (q.shape, k.shape, v.shape) == ((2, 4, 3, 2), (2, 4, 3, 2), (2, 4, 3, 6))
    fused, _ = mha(x, memory, mask=mask)
    explicit, w = mha(x, memory, mask=mask, need_weights=True)
    assert fused.shape == (2, 3, 16) and torch.allclose(fused, explicit, atol=1e-6)
    k, v = mha.project_kv(memory)
    scores = (mha.split_heads(mha.w_q(x)) @ k.transpose(-1, -2) / math.sqrt(2)).masked_fill(~mask, float("-inf"))
    heads = scores.softmax(-1) @ v  # (B, H, T, d_v)
    assert torch.allclose(w, scores.softmax(-1), atol=1e-6)
    assert torch.allclose(explicit, mha.w_o(heads.transpose(1, 2).reshape(2, 3, 24)), atol=1e-6)
