"""How long an output may be and how its length is scored: the length penalty of both
styles, the source lengths and the per-sentence bound on output tokens."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.config import DecodeConfig
from aiayn.inference.search import length_penalty, max_output_lengths, source_lengths

# ------------------------------------------------------------------- length penalty


@pytest.mark.parametrize("length, alpha, style, expected", [
    (1.0, 0.6, "gnmt", 1.0),
    (4.0, 2.0, "gnmt", 2.25),  # ((5 + 4) / 6)^2
    (7.0, 0.5, "gnmt", math.sqrt(2.0)),  # ((5 + 7) / 6)^0.5
    (3.0, 2.0, "fairseq", 9.0),
    (4.0, 0.5, "fairseq", 2.0),
    (5.0, 0.0, "fairseq", 1.0),
    (10.0, 0.6, "gnmt", (15 / 6) ** 0.6),
    (10.0, 0.6, "fairseq", 10 ** 0.6),
])
def test_length_penalty_values(length: float, alpha: float, style: str, expected: float) -> None:
    assert length_penalty(length, alpha, style) == pytest.approx(expected)
    as_tensor = length_penalty(torch.tensor([length], dtype=torch.float64), alpha, style)
    assert as_tensor.tolist() == pytest.approx([expected])


def test_length_penalty_default_style_is_gnmt() -> None:
    assert length_penalty(4.0, 2.0) == pytest.approx(2.25)
    assert length_penalty(1.0, 0.6) == pytest.approx(1.0)


@pytest.mark.parametrize("style", ["GNMT", "Fairseq", "none", "other"])
def test_length_penalty_unknown_style(style: str) -> None:
    with pytest.raises(ValueError, match=f"^unknown length penalty style '{style}'$"):
        length_penalty(3.0, 1.0, style)


# ----------------------------------------------------------------- length bounds


def test_source_lengths_count_non_pad_ids() -> None:
    src = torch.tensor([[5, 6, 3, 0], [5, 3, 0, 0], [7, 7, 7, 3]])
    assert source_lengths(src).tolist() == [3, 2, 4]
    assert source_lengths(src, pad=7).tolist() == [4, 4, 1]


@pytest.mark.parametrize("a, b, model_steps, prefix, expected", [
    (1.5, 2, None, None, [2, 6, 17, 2]),  # int(1.5 * |x| + 2): 4.5 + 2 -> 6
    (1.0, 0, None, None, [0, 3, 10, 0]),
    (0.0, 0, None, None, [0, 0, 0, 0]),
    (1.5, 2, 10, None, [2, 6, 9, 2]),  # model positions: one stays for EOS
    (1.5, 2, 1, None, [0, 0, 0, 0]),
    (1.5, 2, None, [0, 8, 3, 1], [2, 8, 17, 2]),  # at least the forced prefix
    (1.5, 2, 10, [0, 8, 12, 1], [2, 8, 9, 2]),  # ... but never past the model's positions
])
def test_max_output_lengths(a: float, b: int, model_steps: int | None, prefix: list[int] | None,
                            expected: list[int]) -> None:
    cfg = DecodeConfig(max_len_a=a, max_len_b=b)
    prefix_len = None if prefix is None else torch.tensor(prefix)
    got = max_output_lengths(torch.tensor([0, 3, 10, 0]), cfg, model_steps, prefix_len)
    assert got.dtype == torch.long
    assert got.tolist() == expected


def test_max_output_lengths_of_no_sentence_is_an_empty_int64_tensor() -> None:
    cfg = DecodeConfig(max_len_a=1.0, max_len_b=5)
    for prefix_len in (None, torch.zeros(0, dtype=torch.long)):
        got = max_output_lengths(torch.zeros(0, dtype=torch.long), cfg, 64, prefix_len)
        assert got.dtype == torch.long and got.shape == (0,)
