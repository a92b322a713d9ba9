"""Positional encodings follow the paper's formula; the concat layout is a permutation."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.model.embeddings import PositionalEncoding, TokenEmbedding, sinusoid_table


@pytest.mark.parametrize("pos, i", [(0, 0), (1, 0), (7, 3), (50, 10), (511, 255), (1000, 128)])
def test_interleaved_matches_formula(pos: int, i: int) -> None:
    d = 512
    table = sinusoid_table(1024, d, "interleaved")
    angle = pos / 10000 ** (2 * i / d)
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_concat_is_a_permutation_of_interleaved() -> None:
    d = 16
    inter = sinusoid_table(64, d, "interleaved")
    concat = sinusoid_table(64, d, "concat")
    perm = torch.tensor(list(range(0, d, 2)) + list(range(1, d, 2)))
    assert torch.equal(inter[:, perm], concat)
    assert concat[3, 0].item() == pytest.approx(math.sin(3.0), abs=1e-6)
    assert concat[3, d // 2].item() == pytest.approx(math.cos(3.0), abs=1e-6)


def test_positions_added_and_offset() -> None:
    pe = PositionalEncoding(8, 32, dropout=0.0)
    x = torch.zeros(2, 5, 8)
    assert torch.equal(pe(x), sinusoid_table(32, 8)[:5].expand(2, 5, 8))
    assert torch.equal(pe(x[:, :1], start=4)[0, 0], sinusoid_table(32, 8)[4])
    with pytest.raises(ValueError, match="max_positions"):
        pe(torch.zeros(1, 33, 8))


def test_learned_positions_are_parameters() -> None:
    pe = PositionalEncoding(8, 32, kind="learned", dropout=0.0)
    assert sum(p.numel() for p in pe.parameters()) == 32 * 8


def test_token_embedding_scaled_and_pad_zero() -> None:
    torch.manual_seed(0)
    emb = TokenEmbedding(10, 16, pad_id=0)
    ids = torch.tensor([[3, 0]])
    out = emb(ids)
    assert torch.allclose(out[0, 0], emb.weight[3] * 4.0)
    assert torch.equal(out[0, 1], torch.zeros(16))
    # N(0, d^-0.5): after the sqrt(d) scale, unit variance.
    big = TokenEmbedding(4000, 64, pad_id=0)
    assert big.weight.std().item() == pytest.approx(64**-0.5, rel=0.05)
