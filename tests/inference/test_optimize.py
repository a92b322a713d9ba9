"""The inference copy of a model (aiayn.inference.optimize): its fused and transposed weights
compute the plain model's projections; optimizing never touches the model it is given; and
since the copies are built when optimizing, a translator built after an optimizer step
decodes with the updated weights."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from aiayn.config import DecodeConfig, model_preset
from aiayn.inference.adapters import IncrementalDecoder
from aiayn.inference.optimize import FusedQKVAttention, TransposedProjection, optimize_for_inference
from aiayn.inference.search import EOS_ID, beam_search, search
from aiayn.inference.translator import Translator
from aiayn.model import build_model

VOCAB = 64
CFG = DecodeConfig(beam=4, lenpen=0.6, max_len_a=1.0, max_len_b=5, nbest=2)


def _model(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(model_preset("tiny", **overrides)).eval()


def _src() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (3, 8), generator=g)
    src[:, -1] = EOS_ID
    src[1, 5:] = 0
    src[1, 4] = EOS_ID
    return src


def _self_attentions(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [layer.self_attn for layer in itertools.chain(model.encoder_layers, model.decoder_layers)]


def test_fused_qkv_and_transposed_projection_equal_the_plain_model() -> None:
    model = _model(share_embeddings="none", output_bias=True)
    with torch.no_grad():
        model.output_bias.normal_()
    optimized = optimize_for_inference(model)
    assert isinstance(optimized.step_projection, TransposedProjection)
    x = torch.randn(2, 5, model.tgt_embed.weight.size(1))
    with torch.no_grad():
        for plain, fused in zip(_self_attentions(model), _self_attentions(optimized.model)):
            assert isinstance(fused, FusedQKVAttention) and not isinstance(plain, FusedQKVAttention)
            for a, b in zip(fused.project_qkv(x), plain.project_qkv(x)):  # one matmul vs three
                assert a.shape == b.shape and (a - b).abs().max() <= 1e-6
            assert (fused(x, is_causal=True)[0] - plain(x, is_causal=True)[0]).abs().max() <= 1e-5
        h = x[:, 0]
        assert (optimized.step_projection(h) - model.project(h)).abs().max() <= 1e-5
        src, tgt = _src(), torch.randint(4, VOCAB, (3, 6))
        assert (optimized.model(src, tgt) - model(src, tgt)).abs().max() <= 1e-5


def test_fused_qkv_with_d_k_different_from_d_v_equals_the_plain_model() -> None:
    """Table 3 row (B): the fused matrix holds h*d_k query, h*d_k key and h*d_v value rows;
    the optimized copy's projections, forward pass and cached beam search equal the plain
    model's (fp32)."""
    model = _model(d_k=8, d_v=24)
    optimized = optimize_for_inference(model)
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        for plain, fused in zip(_self_attentions(model), _self_attentions(optimized.model)):
            assert isinstance(fused, FusedQKVAttention) and fused.qkv.weight.shape == (4 * (8 + 8 + 24), 64)
            for a, b in zip(fused.project_qkv(x), plain.project_qkv(x)):
                assert a.shape == b.shape and (a - b).abs().max() <= 1e-6
            assert (fused(x, is_causal=True)[0] - plain(x, is_causal=True)[0]).abs().max() <= 1e-5
        src, tgt = _src(), torch.randint(4, VOCAB, (3, 6))
        assert (optimized.model(src, tgt) - model(src, tgt)).abs().max() <= 1e-5
        got = beam_search(IncrementalDecoder(optimized), src, CFG)
        expected = beam_search(IncrementalDecoder(model), src, CFG)
    for g, e in zip(got, expected):
        assert [h.tokens for h in g] == [h.tokens for h in e]
        assert [h.score for h in g] == pytest.approx([h.score for h in e], abs=1e-5)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.int8])
def test_optimizing_leaves_the_model_untouched(dtype: torch.dtype | None) -> None:
    model = _model()
    modules = dict(model.named_modules())
    params = {name: (p, p.dtype, p.detach().clone()) for name, p in model.named_parameters()}
    state = copy.deepcopy(model.state_dict())
    optimized = optimize_for_inference(model, dtype=dtype)
    beam_search(IncrementalDecoder(optimized), _src(), CFG)
    assert dict(model.named_modules()) == modules  # the same module objects, none swapped
    assert all(type(m) is type(modules[n]) for n, m in model.named_modules())
    for name, p in model.named_parameters():
        same, dt, value = params[name]
        assert p is same and p.dtype == dt and torch.equal(p, value)
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(t, state[k]) for k, t in model.state_dict().items())
    assert not model.training and model.output_bias is None
    copied = dict(optimized.model.named_parameters())
    if dtype is None:  # fp32 shares the model's tensors: no copy of the weights
        assert all(copied[name] is p for name, p in model.named_parameters())
    elif dtype is torch.bfloat16:
        assert all(p.dtype == torch.bfloat16 for p in copied.values())
        assert optimized.model.tgt_positions.table.dtype == torch.bfloat16  # buffers too, like .to()


def test_bf16_copy_equals_casting_the_model() -> None:
    model = _model()
    expected = beam_search(IncrementalDecoder(_model().to(torch.bfloat16)), _src(), CFG)
    got = beam_search(IncrementalDecoder(optimize_for_inference(model, dtype=torch.bfloat16)), _src(), CFG)
    assert [[(h.tokens, h.score) for h in hs] for hs in got] == [[(h.tokens, h.score) for h in hs]
                                                                  for hs in expected]
    assert model.src_embed.weight.dtype == torch.float32


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
def test_translator_after_a_fused_adam_step_sees_the_updated_weights(dtype: str) -> None:
    """Fused Adam updates the weights without bumping their version counters; a translator
    built afterwards must decode exactly as one over a fresh copy of the updated weights."""
    model = _model()
    src = _src()

    def decoded(m: torch.nn.Module) -> list:
        tr = Translator(m, None, CFG, dtype=dtype)
        return [[(h.tokens, h.score, h.log_prob) for h in hs] for hs in search(tr.decoder, src, CFG)]

    before = decoded(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.05, fused=True)
    model.train()
    model(src, torch.randint(4, VOCAB, (3, 6))).logsumexp(-1).sum().backward()
    versions = [p._version for p in model.parameters()]
    opt.step()
    assert [p._version for p in model.parameters()] == versions  # the premise: no version bump
    after = decoded(model)
    fresh = _model()
    fresh.load_state_dict(copy.deepcopy(model.state_dict()))
    assert after == decoded(fresh)
    assert after != before
