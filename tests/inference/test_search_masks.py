"""What a step may emit: forced target prefixes, n-gram repeats banned, and the step masks
that combine them with the length bounds (min/max length, prefix, n-gram repeats), each
checked against exact expected log-probabilities."""

from __future__ import annotations

import pytest
import torch

from aiayn.inference.search import FORCED_FLOOR, _ban_repeated_ngrams, _prefix_tensor, _StepMasks

NEG_INF = float("-inf")
CPU = torch.device("cpu")


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


def test_step_masks_free_rows_lose_pad_and_bos_only() -> None:
    masks = _StepMasks(min_len=0, no_repeat_ngram_size=0, pad=PAD, bos=BOS, eos=EOS)
    orig = _lprobs()
    prefix = torch.full((4, 2), -1, dtype=torch.long)
    got = masks.apply(orig.clone(), 1, torch.zeros(4, 1, dtype=torch.long), torch.full((4,), 3), prefix)
    for r in range(4):
        assert got[r].tolist() == _expect(orig, r, drop=(PAD, BOS))


@pytest.mark.parametrize("t, min_len, eos_allowed", [(0, 0, True), (0, 1, False), (1, 2, False),
                                                     (2, 2, True), (3, 2, True)])
def test_step_masks_min_len(t: int, min_len: int, eos_allowed: bool) -> None:
    masks = _StepMasks(min_len=min_len, no_repeat_ngram_size=0, pad=PAD, bos=BOS, eos=EOS)
    orig = _lprobs()
    got = masks.apply(orig.clone(), t, torch.zeros(4, t, dtype=torch.long), torch.full((4,), 9),
                     torch.empty(4, 0, dtype=torch.long))
    drop = (PAD, BOS) if eos_allowed else (PAD, BOS, EOS)
    for r in range(4):
        assert got[r].tolist() == _expect(orig, r, drop=drop)


def test_step_masks_max_len_prefix_and_floor() -> None:
    # t = 1 < min_len: EOS is banned for free rows, but at the maximum length it is the only
    # choice and keeps its own log-probability; a forced token overrides everything.
    masks = _StepMasks(min_len=3, no_repeat_ngram_size=1, pad=PAD, bos=BOS, eos=EOS)
    orig = _lprobs(5)
    orig[4, EOS] = NEG_INF  # a row at its maximum length whose model gives EOS probability 0
    orig[1, 0] = NEG_INF  # a forced token with probability 0
    hist = torch.tensor([[2], [2], [2], [2], [2]])
    max_len = torch.tensor([1, 5, 5, 1, 0])
    prefix = torch.tensor([[1, -1, 9], [3, 0, 9], [4, -1, 9], [1, 4, 9], [1, -1, 9]])
    got = masks.apply(orig.clone(), 1, hist, max_len, prefix)
    assert got[0].tolist() == _expect(orig, 0, keep={EOS: float(orig[0, EOS])})
    assert got[1].tolist() == _expect(orig, 1, keep={0: FORCED_FLOOR})
    assert got[2].tolist() == _expect(orig, 2, drop=(PAD, BOS, EOS, 2))
    assert got[3].tolist() == _expect(orig, 3, keep={4: float(orig[3, 4])})
    assert got[4].tolist() == _expect(orig, 4, keep={EOS: FORCED_FLOOR})


def test_step_masks_floor_per_row_for_logits() -> None:
    # Logits instead of log-probabilities: the floor is FORCED_FLOOR + a per-row constant.
    masks = _StepMasks(min_len=0, no_repeat_ngram_size=0, pad=PAD, bos=BOS, eos=EOS)
    orig = torch.full((3, 8), NEG_INF)
    orig[:, 1] = 0.0
    floor = torch.tensor([-5.0, -6.0, -7.0])
    prefix = torch.tensor([[-1], [-1], [2]])
    got = masks.apply(orig.clone(), 0, torch.empty(3, 0, dtype=torch.long), torch.tensor([4, 0, 4]),
                     prefix, floor=floor)
    assert got[0].tolist() == _expect(orig, 0, keep={1: 0.0})
    assert got[1].tolist() == _expect(orig, 1, keep={EOS: -6.0})
    assert got[2].tolist() == _expect(orig, 2, keep={2: -7.0})


def test_step_masks_prefix_ends_or_has_no_forced_row() -> None:
    masks = _StepMasks(min_len=0, no_repeat_ngram_size=0, pad=PAD, bos=BOS, eos=EOS)
    orig = _lprobs(2)
    prefix = torch.tensor([[0, -1], [-1, -1]])
    for t in (1, 2, 3):  # at t = 1 no row is forced; from t = 2 on the prefix is over
        got = masks.apply(orig.clone(), t, torch.zeros(2, t, dtype=torch.long), torch.tensor([9, 9]), prefix)
        for r in range(2):
            assert got[r].tolist() == _expect(orig, r, drop=(PAD, BOS))
    got = masks.apply(orig.clone(), 0, torch.empty(2, 0, dtype=torch.long), torch.tensor([9, 9]), prefix)
    assert got[0].tolist() == _expect(orig, 0, keep={0: float(orig[0, 0])})
    assert got[1].tolist() == _expect(orig, 1, drop=(PAD, BOS))
