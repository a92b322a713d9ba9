"""train.init_vocab: a checkpoint's vocabulary rows follow its pieces into a new vocabulary."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from aiayn.checkpoint.vocab_init import describe, load_with_vocab, remap_rows, vocab_map
from aiayn.checkpoint.weights import save_model_weights
from aiayn.config import ModelConfig
from aiayn.errors import ConfigError
from aiayn.model import build_model

SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]
OLD = SPECIALS + ["▁a", "▁b", "c", "▁dog", "s"]


def test_extend_keeps_ids_and_appends():
    m = vocab_map(OLD, OLD + ["▁cat", "▁zebra"], "extend")
    assert m.rows == list(range(len(OLD))) + [None, None]
    assert m.report() == {"old": 9, "new": 11, "kept": 9, "added": 2}


def test_remap_matches_pieces_by_string_wherever_they_are():
    new = SPECIALS + ["s", "▁cat", "▁a", "▁dog"]
    m = vocab_map(OLD, new, "remap")
    assert m.rows == [0, 1, 2, 3, 8, None, 4, 7]
    assert (m.kept, m.added) == (7, 1)


def test_modes_refuse_what_they_do_not_cover():
    with pytest.raises(ConfigError, match="id 5 is '▁x', the checkpoint's is '▁b'; use remap"):
        vocab_map(OLD, OLD[:5] + ["▁x"] + OLD[6:] + ["▁y"], "extend")
    with pytest.raises(ConfigError, match="smaller than the checkpoint's"):
        vocab_map(OLD, OLD[:-1], "extend")
    with pytest.raises(ConfigError, match="set train.init_vocab: extend"):
        vocab_map(OLD, OLD + ["▁y"], "same")
    with pytest.raises(ConfigError, match="id 4 is '▁z'"):
        vocab_map(OLD, SPECIALS + ["▁z"] + OLD[5:], "same")
    assert vocab_map(OLD, OLD, "same").added == 0


def test_remap_rows_copies_kept_rows_and_fills_new_ones_with_the_text_mean():
    old = torch.randn(9, 6, generator=torch.Generator().manual_seed(3))
    m = vocab_map(OLD, SPECIALS + ["s", "▁new", "▁a"], "remap")
    out = remap_rows(old, m)
    assert torch.equal(out[:4], old[:4]) and torch.equal(out[4], old[8]) and torch.equal(out[6], old[4])
    assert torch.equal(out[5], old[4:].mean(dim=0))  # the specials are not in the mean
    bias = remap_rows(old[:, 0].contiguous(), m)  # 1-D: the output bias
    assert bias.shape == (7,) and torch.equal(bias[5], old[4:, 0].mean())


@pytest.mark.parametrize("share", ["all", "decoder", "none"])
@pytest.mark.parametrize("mode", ["extend", "remap"])
def test_load_with_vocab_copies_kept_rows_bitwise(tmp_path, share, mode):
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1,
                      src_vocab_size=len(OLD), tgt_vocab_size=len(OLD), share_embeddings=share,
                      output_bias=share != "all")
    torch.manual_seed(0)
    old_model = build_model(cfg)
    with torch.no_grad():
        if old_model.output_bias is not None:
            old_model.output_bias.normal_()
    save_model_weights(old_model, tmp_path / "model.safetensors")
    new_pieces = OLD + ["▁cat", "▁zebra"] if mode == "extend" else SPECIALS + ["s", "▁cat", "▁a", "▁dog", "c"]
    torch.manual_seed(1)
    new_cfg = dataclasses.replace(cfg, src_vocab_size=len(new_pieces), tgt_vocab_size=len(new_pieces))
    new_model = build_model(new_cfg)
    report = load_with_vocab(new_model, tmp_path / "model.safetensors", (OLD, OLD), (new_pieces, new_pieces),
                             mode, joint=True)
    m = vocab_map(OLD, new_pieces, mode)
    assert report == {"mode": mode, "joint": m.report()}
    assert "joint vocabulary 9 -> " in describe(report)
    old_sd, new_sd = old_model.state_dict(), new_model.state_dict()
    vocab_names = {"src_embed.weight", "tgt_embed.weight", "output_projection.weight", "output_bias"}
    for name, tensor in new_sd.items():
        if name not in vocab_names:
            assert torch.equal(tensor, old_sd[name]), name
            continue
        old_t = old_sd[name]
        text_mean = old_t[4:].mean(dim=0)
        for new_id, old_id in enumerate(m.rows):
            expected = old_t[old_id] if old_id is not None else text_mean
            assert torch.equal(tensor[new_id], expected), (name, new_id)
    if share == "all":
        assert new_model.src_embed.weight is new_model.tgt_embed.weight


def test_separate_sides_are_mapped_each_with_its_own_pieces(tmp_path):
    tgt_old = SPECIALS + ["▁Hund", "e", "n"]
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1,
                      src_vocab_size=len(OLD), tgt_vocab_size=len(tgt_old), share_embeddings="none")
    old_model = build_model(cfg)
    save_model_weights(old_model, tmp_path / "m.safetensors")
    tgt_new = tgt_old + ["▁Katze"]
    new_model = build_model(dataclasses.replace(cfg, tgt_vocab_size=len(tgt_new)))
    report = load_with_vocab(new_model, tmp_path / "m.safetensors", (OLD, tgt_old), (OLD, tgt_new), "extend")
    assert report["source"] == {"old": 9, "new": 9, "kept": 9, "added": 0}
    assert report["target"] == {"old": 7, "new": 8, "kept": 7, "added": 1}
    assert torch.equal(new_model.src_embed.weight, old_model.src_embed.weight)
    assert torch.equal(new_model.output_projection.weight[:7], old_model.output_projection.weight)
    assert torch.equal(new_model.output_projection.weight[7], old_model.output_projection.weight[4:].mean(0))
