"""The whole model: causality, padding invariance, the KV cache, parameter counts."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
import torch

from aiayn.config import ModelConfig, model_preset
from aiayn.model import build_model, count_parameters


def _model(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(model_preset("tiny", **overrides)).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 50, (3, 9), generator=g)
    src[1, 6:] = 0
    src[2, 3:] = 0
    tgt = torch.randint(4, 64, (3, 7), generator=g)
    return src, tgt


VARIANTS = [
    {},
    {"norm": "pre"},
    {"positions": "learned"},
    {"sinusoid_layout": "concat", "activation": "gelu"},
    {"share_embeddings": "none", "src_vocab_size": 50, "activation": "swish", "output_bias": True},
    {"share_embeddings": "decoder", "d_head": 8, "n_heads": 2},
    {"d_k": 8, "d_v": 24},  # Table 3 row (B): d_k != d_v
]


@pytest.mark.parametrize("overrides", VARIANTS)
def test_causality(overrides: dict) -> None:
    model = _model(**overrides)
    src, tgt = _batch()
    logits = model(src, tgt)
    for t in range(tgt.size(1) - 1):
        changed = tgt.clone()
        changed[:, t + 1:] = torch.randint(4, 50, changed[:, t + 1:].shape)
        again = model(src, changed)
        assert torch.allclose(logits[:, : t + 1], again[:, : t + 1], atol=1e-5)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_padding_invariance(overrides: dict) -> None:
    model = _model(**overrides)
    src, tgt = _batch()
    logits = model(src, tgt)
    # More padding on both sides changes nothing at real positions.
    src_more = torch.cat([src, torch.zeros(3, 5, dtype=torch.long)], dim=1)
    tgt_more = torch.cat([tgt, torch.zeros(3, 4, dtype=torch.long)], dim=1)
    assert torch.allclose(model(src_more, tgt_more)[:, :7], logits, atol=1e-5)
    # A sentence alone equals the same sentence inside the padded batch.
    alone = model(src[2:3, :3], tgt[2:3])
    assert torch.allclose(alone, logits[2:3], atol=1e-5)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_cache_reproduces_full_decode(overrides: dict) -> None:
    model = _model(**overrides)
    src, tgt = _batch()
    with torch.no_grad():
        memory, mask = model.encode(src)
        full, full_attn = model.decode(tgt, memory, mask, need_attn=True)
        cache = model.init_cache(memory, mask, max_len=tgt.size(1))
        for t in range(tgt.size(1)):
            step, attn = model.decode_step(tgt[:, t], cache, need_attn=True)
            assert (step - full[:, t]).abs().max() <= 1e-5
            assert (attn - full_attn[:, :, :, t]).abs().max() <= 1e-5
    assert cache.length == tgt.size(1)
    with pytest.raises(RuntimeError, match="cache full"):
        model.decode_step(tgt[:, 0], cache)


def test_cache_grows_past_its_first_buffer_and_keeps_every_position() -> None:
    """40 steps with beam-like reorders before, at and after each doubling (16 -> 32 -> 40
    positions) equal the full decode of the reordered rows."""
    model = _model()
    g = torch.Generator().manual_seed(3)
    src = _batch()[0]
    tgt = torch.randint(4, 64, (3, 40), generator=g)
    with torch.no_grad():
        memory, mask = model.encode(src)
        cache = model.init_cache(memory, mask, max_len=40)
        assert cache.layers[0].self_k.size(2) == 16
        rows = torch.arange(3)  # which original row each cache row now follows
        sizes = []
        for t in range(40):
            if t in (5, 16, 17, 32):
                index = torch.tensor([2, 0, 1])
                cache.reorder(index)
                rows = rows[index]
            fed = tgt[rows]
            full, _ = model.decode(fed[:, :t + 1], memory[rows], mask[rows])
            step, _ = model.decode_step(fed[:, t], cache)
            assert (step - full[:, t]).abs().max() <= 1e-5, t
            sizes.append(cache.layers[0].self_k.size(2))
    assert sizes[15] == 16 and sizes[16] == 32 and sizes[31] == 32 and sizes[32] == 40
    assert all(c.self_k.size(2) == 40 and c.self_v.size(2) == 40 for c in cache.layers)


def test_cache_reserve_holds_the_asked_positions_at_most_max_len() -> None:
    model = _model()
    src = _batch()[0]
    with torch.no_grad():
        memory, mask = model.encode(src)
        short = model.init_cache(memory, mask, max_len=6)
        long = model.init_cache(memory, mask, max_len=100)
        model.decode_step(torch.tensor([5, 6, 7]), long)
        kept = long.layers[1].self_v[:, :, :1].clone()
        long.reserve(50)
        short.reserve(50)
    assert short.layers[0].self_k.size(2) == 6  # never past max_len
    assert [c.self_k.size(2) for c in long.layers] == [50] * len(long.layers)
    assert torch.equal(long.layers[1].self_v[:, :, :1], kept)
    assert not long.layers[1].self_v[:, :, 1:].any()  # zeros past the filled prefix


def test_decode_step_without_projection_returns_the_decoder_states() -> None:
    model = _model(share_embeddings="none", output_bias=True)
    src, tgt = _batch()
    with torch.no_grad():
        memory, mask = model.encode(src)
        states, _ = model.decode(tgt, memory, mask, project=False)  # (B, T, D)
        caches = [model.init_cache(memory, mask, max_len=2) for _ in range(2)]
        for t in range(2):
            logits, attn = model.decode_step(tgt[:, t], caches[0], need_attn=True)
            h, h_attn = model.decode_step(tgt[:, t], caches[1], need_attn=True, project=False)
            assert h.shape == (3, model.tgt_embed.weight.size(1))
            assert (h - states[:, t]).abs().max() <= 1e-5
            assert torch.equal(model.project(h), logits) and torch.equal(h_attn, attn)


def test_reorder_permutes_and_shrinks_hypotheses() -> None:
    model = _model()
    src, tgt = _batch()
    with torch.no_grad():
        memory, mask = model.encode(src)
        full, _ = model.decode(tgt, memory, mask)
        cache = model.init_cache(memory, mask, max_len=8)
        for t in range(3):
            model.decode_step(tgt[:, t], cache)
        index = torch.tensor([2, 0])  # drop row 1, swap the others
        cache.reorder(index)
        step, _ = model.decode_step(tgt[index, 3], cache)
    assert cache.batch_size == 2
    assert (step - full[index, 3]).abs().max() <= 1e-5


def test_attention_weights_from_decode() -> None:
    model = _model()
    src, tgt = _batch()
    memory, mask = model.encode(src)
    _, attn = model.decode(tgt, memory, mask, need_attn=True)
    assert attn.shape == (3, 2, 4, 7, 9)  # (B, L, H, T, S)
    assert torch.allclose(attn.sum(-1), torch.ones_like(attn.sum(-1)), atol=1e-5)
    assert torch.all(attn[2, ..., 3:] == 0) and torch.all(attn[1, ..., 6:] == 0)


def test_tied_projection_has_no_bias_and_shares_storage() -> None:
    model = _model()
    assert model.src_embed is model.tgt_embed
    assert model.output_projection is None and model.output_bias is None
    untied = _model(share_embeddings="none", src_vocab_size=50)
    assert untied.output_projection.bias is None
    assert untied.src_embed.weight.shape == (50, 64)


def _count(cfg: ModelConfig) -> int:
    with torch.device("meta"):
        return count_parameters(build_model(cfg))["parameters"]


def test_base_parameter_count_exact() -> None:
    assert _count(model_preset("base", src_vocab_size=37000, tgt_vocab_size=37000)) == 63_082_496


def _closed_form(n: int, d: int, ff: int, v: int, inner: int | None = None, inner_v: int | None = None) -> int:
    inner = inner or d  # h * d_k
    inner_v = inner_v or inner  # h * d_v
    # W_Q, W_K (d x h d_k), W_V (d x h d_v), W_O (h d_v x d), biases
    attn = 2 * (d * inner + inner) + (d * inner_v + inner_v) + (inner_v * d + d)
    ffn = 2 * d * ff + ff + d
    enc = n * (attn + ffn + 2 * 2 * d)
    dec = n * (2 * attn + ffn + 3 * 2 * d)
    return v * d + enc + dec


@pytest.mark.parametrize("preset, v", itertools.product(["base", "big"], [32000, 37000]))
def test_closed_form_counts(preset: str, v: int) -> None:
    cfg = model_preset(preset, src_vocab_size=v, tgt_vocab_size=v)
    assert _count(cfg) == _closed_form(6, cfg.d_model, cfg.d_ff, v)
    assert _count(model_preset(preset, src_vocab_size=v, tgt_vocab_size=v, d_head=32)) == _closed_form(
        6, cfg.d_model, cfg.d_ff, v, inner=cfg.n_heads * 32)
    assert _count(model_preset(preset, src_vocab_size=v, tgt_vocab_size=v, d_k=16, d_v=64)) == _closed_form(
        6, cfg.d_model, cfg.d_ff, v, inner=cfg.n_heads * 16, inner_v=cfg.n_heads * 64)


def test_big_count_value() -> None:
    assert _count(model_preset("big", src_vocab_size=37000, tgt_vocab_size=37000)) == 214_245_376


def test_model_info_cli() -> None:
    out = subprocess.run([sys.executable, "-m", "aiayn", "model-info", "--preset", "base", "--vocab-size",
                          "37000", "--json"], capture_output=True, text=True, check=True).stdout
    info = json.loads(out)
    assert info["parameters"] == 63_082_496
    assert info["embeddings"] + info["encoder"] + info["decoder"] == info["parameters"]
    out = subprocess.run([sys.executable, "-m", "aiayn", "model-info", "--preset", "base", "--vocab-size",
                          "37000", "--json", "model.n_heads=16"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["model"]["n_heads"] == 16
    bad = subprocess.run([sys.executable, "-m", "aiayn", "model-info", "model.n_heads=7"],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert "model.n_heads: d_model=512 is not divisible" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_reorder_grows_for_beams_then_shrinks() -> None:
    model = _model()
    src, tgt = _batch()
    with torch.no_grad():
        memory, mask = model.encode(src)
        full, _ = model.decode(tgt, memory, mask)
        cache = model.init_cache(memory, mask, max_len=8)
        model.decode_step(tgt[:, 0], cache)
        grow = torch.tensor([0, 0, 1, 1, 2, 2])  # one row per beam, as beam search expands
        cache.reorder(grow)
        step, _ = model.decode_step(tgt[grow, 1], cache)
        assert (step - full[grow, 1]).abs().max() <= 1e-5
        shrink = torch.tensor([5, 2])
        cache.reorder(shrink)
        step, _ = model.decode_step(tgt[grow[shrink], 2], cache)
    assert (step - full[grow[shrink], 2]).abs().max() <= 1e-5


def test_reorder_within_sentences_leaves_cross_attention() -> None:
    """same_sources: beams moved within their sentence; the result equals a full reorder."""
    model = _model()
    src, tgt = _batch()
    grow = torch.tensor([0, 0, 1, 1, 2, 2])
    with torch.no_grad():
        memory, mask = model.encode(src[grow])
        caches = [model.init_cache(memory, mask, max_len=8) for _ in range(2)]
        for cache in caches:
            model.decode_step(tgt[grow, 0], cache)
            model.decode_step(tgt[grow, 1], cache)
        within = torch.tensor([1, 1, 2, 3, 5, 4])  # each row keeps its sentence
        caches[0].reorder(within)
        caches[1].reorder(within, same_sources=True)
        a, _ = model.decode_step(tgt[grow, 2], caches[0])
        b, _ = model.decode_step(tgt[grow, 2], caches[1])
    assert torch.equal(a, b)


def test_beam_rows_share_one_copy_of_cross_attention_keys() -> None:
    """Rows in equal runs of one source (beam search's layout) attend over one copy of that
    source's keys/values; any other order falls back to a copy per row. Either way the
    logits and attention equal the full decoder's."""
    model = _model()
    src, tgt = _batch()
    with torch.no_grad():
        memory, mask = model.encode(src)
        full, full_attn = model.decode(tgt, memory, mask, need_attn=True)
        cache = model.init_cache(memory, mask, max_len=8)
        model.decode_step(tgt[:, 0], cache)
        rows = torch.arange(3)
        for t, (index, group, copies) in enumerate([
            ([0, 0, 1, 1, 2, 2], 2, 3),  # beams created: 2 rows per sentence, 3 copies
            ([2, 3, 5, 4], 2, 2),  # sentence 0 done; beams swapped within sentence 2
            ([3, 0], 1, 2),  # sentence 2, then 1: one row each
            ([1, 1, 1], 3, 1),  # one sentence, three rows
        ], start=1):
            rows = rows[torch.tensor(index)]
            cache.reorder(torch.tensor(index))
            assert (cache.group_size, cache.layers[0].cross_k.size(0)) == (group, copies)
            step, attn = model.decode_step(tgt[rows, t], cache, need_attn=True)
            assert (step - full[rows, t]).abs().max() <= 1e-5
            assert (attn - full_attn[rows, :, :, t]).abs().max() <= 1e-5
