"""The search's building blocks pinned to exact values: the length penalty, the length
bounds, forced prefixes, the step masks (min/max length, prefix, n-gram repeats), the
sampling filters and the bookkeeping of finished hypotheses."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.config import DecodeConfig
from aiayn.inference.search import (
    FORCED_FLOOR,
    SearchHypothesis,
    _ban_repeated_ngrams,
    _Constraints,
    _filter_top_k_top_p,
    _Finished,
    _prefix_tensor,
    length_penalty,
    max_output_lengths,
    row_topk,
    source_lengths,
)

NEG_INF = float("-inf")
CPU = torch.device("cpu")


# ------------------------------------------------------------------- length penalty


@pytest.mark.parametrize("length, alpha, style, expected", [
    (1.0, 0.6, "gnmt", 1.0),
    (4.0, 2.0, "gnmt", 2.25),  # ((5 + 4) / 6)^2
    (7.0, 0.5, "gnmt", math.sqrt(2.0)),  # ((5 + 7) / 6)^0.5
    (3.0, 2.0, "fairseq", 9.0),
    (4.0, 0.5, "fairseq", 2.0),
    (5.0, 0.0, "fairseq", 1.0),
])
def test_length_penalty_values(length: float, alpha: float, style: str, expected: float) -> None:
    assert length_penalty(length, alpha, style) == pytest.approx(expected)
    as_tensor = length_penalty(torch.tensor([length], dtype=torch.float64), alpha, style)
    assert as_tensor.tolist() == pytest.approx([expected])


def test_length_penalty_default_style_is_gnmt() -> None:
    assert length_penalty(4.0, 2.0) == pytest.approx(2.25)


@pytest.mark.parametrize("style", ["GNMT", "Fairseq", "none"])
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


# ---------------------------------------------------------------------- prefixes


def test_prefix_tensor_pads_with_minus_one() -> None:
    ids, lengths = _prefix_tensor([[4, 5], [6], []], 3, CPU)
    assert ids.dtype == torch.long and lengths.dtype == torch.long
    assert ids.tolist() == [[4, 5], [6, -1], [-1, -1]]
    assert lengths.tolist() == [2, 1, 0]


@pytest.mark.parametrize("prefix, n", [(None, 3), ([], 0), ([[], []], 2)])
def test_prefix_tensor_without_prefix(prefix: list[list[int]] | None, n: int) -> None:
    ids, lengths = _prefix_tensor(prefix, n, CPU)
    assert ids.shape == (n, 0) and ids.dtype == torch.long
    assert lengths.dtype == torch.long
    assert lengths.tolist() == [0] * n


def test_prefix_tensor_count_must_match() -> None:
    with pytest.raises(ValueError, match=r"^got 2 prefixes for 3 sentences$"):
        _prefix_tensor([[4], [5]], 3, CPU)


# -------------------------------------------------------------- n-gram blocking


def _banned_reference(hist: list[int], n: int) -> set[int]:
    """The tokens that would complete an n-gram already in ``hist``."""
    t = len(hist)
    if n <= 0:
        return set()
    if n == 1:
        return set(hist)
    suffix = hist[t - n + 1:]
    return {hist[i + n - 1] for i in range(t - n + 1) if hist[i:i + n - 1] == suffix}


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("t", range(8))
def test_ban_repeated_ngrams_equals_reference(n: int, t: int) -> None:
    g = torch.Generator().manual_seed(100 * n + t)
    hist = torch.randint(0, 3, (6, t), generator=g)  # three tokens: many repeats
    hist[0] = 1  # one row repeating a single token
    lprobs = torch.zeros(6, 5)
    _ban_repeated_ngrams(lprobs, t, hist, n)
    for r in range(6):
        banned = _banned_reference(hist[r].tolist(), n)
        assert lprobs[r].tolist() == [NEG_INF if v in banned else 0.0 for v in range(5)], (r, hist[r])


@pytest.mark.parametrize("hist, n, banned", [
    ([4, 5, 4], 2, [5]),  # "4 5" seen, the suffix is 4
    ([4, 5, 6, 4, 5], 3, [6]),
    ([4, 5, 6, 4, 7], 3, []),
    ([4, 4, 4], 2, [4]),
    ([4, 5], 2, []),  # t == n: the only bigram ends in the suffix's own token
    ([4], 2, []),  # t == n - 1: no n-gram yet
    ([4, 5, 4], 1, [4, 5]),
    ([], 1, []),
])
def test_ban_repeated_ngrams_cases(hist: list[int], n: int, banned: list[int]) -> None:
    lprobs = torch.zeros(1, 8)
    _ban_repeated_ngrams(lprobs, len(hist), torch.tensor([hist], dtype=torch.long).view(1, -1), n)
    assert [v for v in range(8) if lprobs[0, v] == NEG_INF] == banned


# ----------------------------------------------------------------- step masks

PAD, BOS, EOS = 7, 6, 5  # not the usual ids: 0-4 are ordinary tokens here


def _lprobs(rows: int = 4, vocab: int = 8) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return torch.randn(rows, vocab, generator=g).log_softmax(-1)


def _expect(orig: torch.Tensor, row: int, keep: dict[int, float] | None = None,
            drop: tuple[int, ...] = ()) -> list[float]:
    """Row ``row`` of ``orig`` with only ``keep`` (token -> value) left, or without ``drop``."""
    if keep is not None:
        return [keep.get(v, NEG_INF) for v in range(orig.size(1))]
    return [NEG_INF if v in drop else float(orig[row, v]) for v in range(orig.size(1))]


def test_constraints_free_rows_lose_pad_and_bos_only() -> None:
    cons = _Constraints(min_len=0, no_repeat_ngram_size=0, pad=PAD, bos=BOS, eos=EOS)
    orig = _lprobs()
    prefix = torch.full((4, 2), -1, dtype=torch.long)
    got = cons.apply(orig.clone(), 1, torch.zeros(4, 1, dtype=torch.long), torch.full((4,), 3), prefix)
    for r in range(4):
        assert got[r].tolist() == _expect(orig, r, drop=(PAD, BOS))


@pytest.mark.parametrize("t, min_len, eos_allowed", [(0, 0, True), (0, 1, False), (1, 2, False),
                                                     (2, 2, True), (3, 2, True)])
def test_constraints_min_len(t: int, min_len: int, eos_allowed: bool) -> None:
    cons = _Constraints(min_len=min_len, no_repeat_ngram_size=0, pad=PAD, bos=BOS, eos=EOS)
    orig = _lprobs()
    got = cons.apply(orig.clone(), t, torch.zeros(4, t, dtype=torch.long), torch.full((4,), 9),
                     torch.empty(4, 0, dtype=torch.long))
    drop = (PAD, BOS) if eos_allowed else (PAD, BOS, EOS)
    for r in range(4):
        assert got[r].tolist() == _expect(orig, r, drop=drop)


def test_constraints_max_len_prefix_and_floor() -> None:
    # t = 1 < min_len: EOS is banned for free rows, but at the maximum length it is the only
    # choice and keeps its own log-probability; a forced token overrides everything.
    cons = _Constraints(min_len=3, no_repeat_ngram_size=1, pad=PAD, bos=BOS, eos=EOS)
    orig = _lprobs(5)
    orig[4, EOS] = NEG_INF  # a row at its maximum length whose model gives EOS probability 0
    orig[1, 0] = NEG_INF  # a forced token with probability 0
    hist = torch.tensor([[2], [2], [2], [2], [2]])
    max_len = torch.tensor([1, 5, 5, 1, 0])
    prefix = torch.tensor([[1, -1, 9], [3, 0, 9], [4, -1, 9], [1, 4, 9], [1, -1, 9]])
    got = cons.apply(orig.clone(), 1, hist, max_len, prefix)
    assert got[0].tolist() == _expect(orig, 0, keep={EOS: float(orig[0, EOS])})
    assert got[1].tolist() == _expect(orig, 1, keep={0: FORCED_FLOOR})
    assert got[2].tolist() == _expect(orig, 2, drop=(PAD, BOS, EOS, 2))
    assert got[3].tolist() == _expect(orig, 3, keep={4: float(orig[3, 4])})
    assert got[4].tolist() == _expect(orig, 4, keep={EOS: FORCED_FLOOR})


def test_constraints_floor_per_row_for_logits() -> None:
    # Logits instead of log-probabilities: the floor is FORCED_FLOOR + a per-row constant.
    cons = _Constraints(min_len=0, no_repeat_ngram_size=0, pad=PAD, bos=BOS, eos=EOS)
    orig = torch.full((3, 8), NEG_INF)
    orig[:, 1] = 0.0
    floor = torch.tensor([-5.0, -6.0, -7.0])
    prefix = torch.tensor([[-1], [-1], [2]])
    got = cons.apply(orig.clone(), 0, torch.empty(3, 0, dtype=torch.long), torch.tensor([4, 0, 4]),
                     prefix, floor=floor)
    assert got[0].tolist() == _expect(orig, 0, keep={1: 0.0})
    assert got[1].tolist() == _expect(orig, 1, keep={EOS: -6.0})
    assert got[2].tolist() == _expect(orig, 2, keep={2: -7.0})


def test_constraints_prefix_ends_or_has_no_forced_row() -> None:
    cons = _Constraints(min_len=0, no_repeat_ngram_size=0, pad=PAD, bos=BOS, eos=EOS)
    orig = _lprobs(2)
    prefix = torch.tensor([[0, -1], [-1, -1]])
    for t in (1, 2, 3):  # at t = 1 no row is forced; from t = 2 on the prefix is over
        got = cons.apply(orig.clone(), t, torch.zeros(2, t, dtype=torch.long), torch.tensor([9, 9]), prefix)
        for r in range(2):
            assert got[r].tolist() == _expect(orig, r, drop=(PAD, BOS))
    got = cons.apply(orig.clone(), 0, torch.empty(2, 0, dtype=torch.long), torch.tensor([9, 9]), prefix)
    assert got[0].tolist() == _expect(orig, 0, keep={0: float(orig[0, 0])})
    assert got[1].tolist() == _expect(orig, 1, drop=(PAD, BOS))


# ------------------------------------------------------------------ sampling filters


def test_top_k_keeps_exactly_k_and_ties() -> None:
    logits = torch.tensor([[0.5, 3.0, 1.0, 2.0, -1.0], [1.0, 1.0, 0.0, 1.0, 2.0]])
    got = _filter_top_k_top_p(logits.clone(), 2, 1.0)
    assert got.tolist() == [[NEG_INF, 3.0, NEG_INF, 2.0, NEG_INF], [1.0, 1.0, NEG_INF, 1.0, 2.0]]
    for k in (0, 5, 6):  # 0 = off, k >= vocab: nothing to filter
        assert torch.equal(_filter_top_k_top_p(logits.clone(), k, 1.0), logits)


def test_top_p_one_keeps_even_negligible_tokens() -> None:
    # In float32 the first token's probability rounds to 1, so a nucleus of 1 would drop the rest.
    logits = torch.tensor([[0.0, -30.0, -30.0]])
    assert torch.equal(_filter_top_k_top_p(logits.clone(), 0, 1.0), logits)


def test_top_p_nucleus_boundaries() -> None:
    probs = [0.1, 0.5, 0.05, 0.35]
    logits = torch.tensor([probs]).log()
    for top_p, kept in [(0.49, [1]), (0.51, [1, 3]), (0.84, [1, 3]), (0.86, [0, 1, 3]), (0.99, [0, 1, 2, 3])]:
        got = _filter_top_k_top_p(logits.clone(), 0, top_p)
        assert got[0].tolist() == [float(logits[0, v]) if v in kept else NEG_INF for v in range(4)], top_p


@pytest.mark.parametrize("top_p, n_kept", [(0.25, 1), (0.5, 2), (0.75, 3), (1.0, 4)])
def test_top_p_stops_where_the_kept_tokens_reach_it(top_p: float, n_kept: int) -> None:
    # Four equal tokens: cumulated probabilities 0.25, 0.5, 0.75, 1 exactly.
    got = _filter_top_k_top_p(torch.zeros(1, 4), 0, top_p)
    assert sorted(got[0].tolist()) == [NEG_INF] * (4 - n_kept) + [0.0] * n_kept


def test_top_k_then_top_p() -> None:
    logits = torch.tensor([[0.1, 0.5, 0.05, 0.35]]).log()
    # top 3 = {1, 3, 0}: renormalised 0.5/0.95 = 0.526 < 0.6 -> token 3 stays as well
    got = _filter_top_k_top_p(logits.clone(), 3, 0.6)
    assert torch.isfinite(got).tolist() == [[False, True, False, True]]


# ---------------------------------------------------------------------- row_topk


@pytest.mark.parametrize("v, k, block", [(64, 2, 8), (67, 2, 8), (48, 3, 4), (50, 3, 4), (31, 2, 8)])
def test_row_topk_small_blocks(v: int, k: int, block: int) -> None:
    g = torch.Generator().manual_seed(v + k)
    x = torch.randn(5, v, generator=g)
    x[1, -1] = 10.0  # the best value in the partial block (when there is one)
    x[2, :block] = torch.arange(block) + 20.0  # the k best all in the first block
    vals, cols = row_topk(x, k, block=block)
    ref_vals, ref_cols = x.topk(k, dim=1)
    assert torch.equal(vals, ref_vals)
    assert torch.equal(cols, ref_cols)


# ------------------------------------------------------------- finished hypotheses


def _hyp(score: float) -> SearchHypothesis:
    return SearchHypothesis(tokens=[int(-score)], score=score, log_prob=score)


def test_finished_keeps_the_best_and_the_nbest_score() -> None:
    fin = _Finished(3, nbest=2)
    assert fin.count.tolist() == [0, 0, 0] and fin.count.dtype == torch.long
    assert fin.nbest_score.tolist() == [NEG_INF] * 3
    fin.add(1, _hyp(-3.0))
    assert fin.count.tolist() == [0, 1, 0]
    assert fin.nbest_score.tolist() == [NEG_INF] * 3  # fewer than nbest
    fin.add(1, _hyp(-1.0))
    assert fin.count.tolist() == [0, 2, 0]
    assert fin.nbest_score.tolist() == [NEG_INF, -3.0, NEG_INF]
    fin.add(1, _hyp(-2.0))
    fin.add(0, _hyp(-4.0))
    assert fin.count.tolist() == [1, 3, 0]
    assert fin.nbest_score.tolist() == [NEG_INF, -2.0, NEG_INF]
    assert [[h.score for h in hyps] for hyps in fin.results()] == [[-4.0], [-1.0, -2.0], []]
    assert [h.score for h in fin.hyps[1]] == [-1.0, -2.0, -3.0]


def test_finished_nbest_one() -> None:
    fin = _Finished(1, nbest=1)
    for s in (-2.0, -5.0, -1.0):
        fin.add(0, _hyp(s))
    assert fin.nbest_score.tolist() == [-1.0]
    assert [h.tokens for h in fin.results()[0]] == [[1]]

