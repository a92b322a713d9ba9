"""Phrase constraints (aiayn.inference.phrase_constraints) in the search, against scripted
models whose probabilities are fixed: the best hypothesis meeting the constraints is the one
an enumeration of every output finds, every output of every search contains its phrases and
none of its excluded ones, and beam search keeps hypotheses that met more of their phrases
(dynamic beam allocation)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.inference.test_search import ScriptedModel, _src

from aiayn.config import DecodeConfig
from aiayn.inference.phrase_constraints import PhraseConstraint
from aiayn.inference.search import (
    EOS_ID,
    SearchInputs,
    _Beams,
    beam_search,
    greedy_search,
    length_penalty,
    sample,
    search,
)

TOKENS = (4, 5, 6, 7, 8, 9)  # 0-3 are PAD, UNK, BOS, EOS
VOCAB = 10


def random_table(seed: int, tokens: tuple[int, ...] = TOKENS):
    """A model over ``tokens`` and EOS whose distributions depend on (seed, sentence, prefix)."""
    def table(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
        g = torch.Generator().manual_seed(hash((seed, sent, prefix)) % (2**31))
        logits = torch.randn(len(tokens) + 1, generator=g) * 2
        logits[0] -= 1.5 - 0.5 * len(prefix)
        probs = logits.softmax(-1).tolist()
        return {EOS_ID: probs[0], **{tok: p for tok, p in zip(tokens, probs[1:])}}

    return table


def _contains(seq: tuple[int, ...], part: tuple[int, ...]) -> bool:
    return any(seq[k:k + len(part)] == part for k in range(len(seq) - len(part) + 1))


def ranked_outputs(table, sent: int, cfg: DecodeConfig, include, exclude,
                   tokens) -> list[tuple[tuple[int, ...], float]]:
    """Every output of at most max_len_b tokens (then EOS) meeting the constraints, with a
    probability above 0, best-scored first (the shorter first among equal scores)."""
    found: list[tuple[tuple[int, ...], float]] = []
    for n in range(cfg.max_len_b + 1):
        for seq in itertools.product(tokens, repeat=n):
            if not all(_contains(seq, tuple(p)) for p in include) or any(_contains(seq, tuple(p)) for p in exclude):
                continue
            log_prob = 0.0
            for t, tok in enumerate((*seq, EOS_ID)):
                p = table(sent, seq[:t]).get(tok, 0.0)
                log_prob += math.log(p) if p > 0 else -math.inf
            score = log_prob / length_penalty(float(n + 1), cfg.lenpen, cfg.lenpen_style)
            if score > -math.inf:
                found.append((seq, score))
    return sorted(found, key=lambda out: -out[1])


def brute_force(table, sent: int, cfg: DecodeConfig, include, exclude, tokens) -> tuple[tuple[int, ...], float] | None:
    """The best-scored output of at most max_len_b tokens (then EOS) meeting the constraints."""
    ranked = ranked_outputs(table, sent, cfg, include, exclude, tokens)
    return ranked[0] if ranked else None


CASES = [  # include, exclude: phrases of tokens that do not overlap one another
    ([[4]], []),
    ([[5, 6]], []),
    ([[4], [6, 5]], []),
    ([[6, 6, 4]], [[5]]),
    ([[5]], [[4, 4], [6, 5]]),
    ([], [[4], [5, 6]]),
    ([[4], [5], [6]], [[7, 7]]),
]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("include,exclude", CASES)
@pytest.mark.parametrize("lenpen", [0.0, 0.6])
def test_a_beam_as_wide_as_every_output_finds_the_best_constrained_one(seed: int, include, exclude,
                                                                       lenpen: float) -> None:
    tokens = (4, 5, 6, 7)
    table = random_table(seed, tokens)
    # Beam 400 > every output of at most 4 tokens over 4 tokens (341): no candidate is ever
    # dropped, so the search must find exactly what the enumeration finds.
    cfg = DecodeConfig(beam=400, lenpen=lenpen, max_len_a=0.0, max_len_b=4, nbest=1)
    sents = [0, 1]
    con = PhraseConstraint([include] * 2, [exclude] * 2, eos=EOS_ID)
    got = beam_search(ScriptedModel(table, vocab=VOCAB), _src(*sents), cfg, SearchInputs(constraint=con))
    for sent, hyps in zip(sents, got):
        best = brute_force(table, sent, cfg, include, exclude, tokens)
        assert best is not None
        assert tuple(hyps[0].tokens) == best[0]
        assert hyps[0].score == pytest.approx(best[1], rel=1e-5)


def test_beam_two_finds_the_best_constrained_output_that_plain_beam_search_loses() -> None:
    """The model prefers [4 4]; the phrase [6 7] starts with an unlikely token. Beam 2 without
    allocation keeps the two likelier prefixes [4] and [5] and, forced only at the end,
    would write the phrase where it is unlikely; with allocation [6] keeps a slot."""
    table = {
        (): {4: 0.55, 5: 0.4, 6: 0.05},
        (4,): {4: 0.6, 6: 0.01, 7: 0.39},
        (5,): {4: 0.6, 6: 0.01, 7: 0.39},
        (6,): {7: 0.99, 4: 0.01},
        (6, 7): {EOS_ID: 0.99, 4: 0.01},
    }

    def lookup(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
        return table.get(prefix, {EOS_ID: 0.5, 4: 0.25, 6: 0.2, 7: 0.05})

    cfg = DecodeConfig(beam=2, lenpen=0.0, max_len_a=0.0, max_len_b=4, nbest=1)
    include = [[6, 7]]
    hyp = beam_search(ScriptedModel(lookup, vocab=VOCAB), _src(0), cfg,
        SearchInputs(constraint=PhraseConstraint([include], eos=EOS_ID)))[0][0]
    best = brute_force(lookup, 0, cfg, include, [], (4, 5, 6, 7))
    assert best is not None and tuple(hyp.tokens) == best[0] == (6, 7)


def test_a_hypothesis_that_met_every_phrase_ends_among_its_own_bank() -> None:
    """[6] meets the phrase and then ends (EOS 0.99), but [4 4] and [4 5] are likelier: among
    the sentence's best candidates overall [6 EOS] is third, so with beam 2 it would never
    end. It competes only with the hypotheses that met every phrase: it ends, and it is the
    best constrained output."""
    table = {
        (): {4: 0.9, 6: 0.05, EOS_ID: 0.05},
        (6,): {EOS_ID: 0.99, 4: 0.01},
        (4,): {4: 0.5, 5: 0.45, 6: 0.05},
    }

    def lookup(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
        return table.get(prefix, {4: 0.5, 5: 0.4, 6: 0.05, EOS_ID: 0.05})

    cfg = DecodeConfig(beam=2, lenpen=0.0, max_len_a=0.0, max_len_b=4, nbest=1)
    hyps = beam_search(ScriptedModel(lookup, vocab=VOCAB), _src(0), cfg,
        SearchInputs(constraint=PhraseConstraint([[[6]]], eos=EOS_ID)))[0]
    best = brute_force(lookup, 0, cfg, [[6]], [], (4, 5, 6))
    assert best is not None and best[0] == (6,)
    assert tuple(hyps[0].tokens) == (6,)
    assert hyps[0].score == pytest.approx(math.log(0.05 * 0.99), rel=1e-6)


def test_complete_ranks_the_continuations_of_the_rows_that_met_every_token() -> None:
    lprobs = torch.full((6, VOCAB), -50.0)
    lprobs[0, 4] = -0.1  # the best continuation, of a row that has not met its phrase
    lprobs[1, EOS_ID], lprobs[1, 5] = -1.0, -2.0
    lprobs[2, 6], lprobs[2, EOS_ID] = -0.5, -4.0
    lprobs[3:, 4] = -0.1
    scores = torch.tensor([[0.0, -1.0, -2.0], [0.0, -1.0, -2.0]])
    # Sentence 0: rows 1 and 2 met all of their 2 tokens; sentence 1 (rows 3-5): none.
    state = _BankStub([[-1]] * 6, [2] * 6, {}, met_now=[1, 2, 3, 0, 1, 1])
    ending = _Beams.complete(lprobs, scores, state, 3)
    assert _picked(ending)[0] == [(1, EOS_ID, -2.0), (2, 6, -2.5), (1, 5, -3.0)]
    assert ending.scores[1].tolist() == [-math.inf] * 3
    # A vocabulary of 2: at most 2 per row.
    small = torch.tensor([[-0.1, -0.2], [-1.0, -3.0], [-0.5, -4.0]])
    assert _picked(_Beams.complete(small, scores[:1], state, 3)) == [[(1, 0, -2.0), (2, 0, -2.5), (1, 1, -4.0)]]


def test_allocation_keeps_a_slot_for_each_bank() -> None:
    """Banks by tokens met: with a two-token phrase there are three banks; beam 3 gives each
    one slot, so the candidates that advanced the phrase stay even when worse."""
    con = PhraseConstraint([[[6, 7]]], eos=EOS_ID)
    state = con.start(torch.tensor([0, 0, 0]), torch.tensor([9, 9, 9]))
    state.advance(torch.tensor([6, 4, 5]))  # row 0 has met one token of the phrase
    lprobs = torch.full((3, VOCAB), -20.0)
    lprobs[:, 4] = -0.1
    lprobs[:, 5] = -0.2
    lprobs[0, 7] = -9.0  # completing the phrase is unlikely
    scores = torch.tensor([[-5.0, -1.0, -1.5]])
    top = _Beams.best(lprobs, scores, 6)
    live = _Beams.allocated(lprobs, scores, top, state, 3, EOS_ID)
    # One per bank, the best of each: the phrase completed (2 tokens met), its first token
    # written by the best row (1), and the best candidate overall (0).
    assert set(zip(live.beam[0].tolist(), live.tok[0].tolist())) == {(0, 7), (1, 6), (1, 4)}
    # By score alone, the three best.
    by_score = top.live(top.tok == EOS_ID, 3)
    assert set(zip(by_score.beam[0].tolist(), by_score.tok[0].tolist())) == {(1, 4), (1, 5), (2, 4)}


def test_met_tokens_counts_the_met_phrases_and_the_progress_that_met_after_predicts() -> None:
    con = PhraseConstraint([[[6, 7], [5]], []], eos=EOS_ID)
    state = con.start(torch.tensor([0, 0, 0, 1]), torch.tensor([9, 9, 9, 9]))
    assert state.met_tokens().tolist() == [0, 0, 0, 0]
    met = []
    for tokens in ([6, 5, 4, 6], [7, 6, 5, 7], [5, 4, 6, 5]):
        predicted = state.met_after(torch.arange(4), torch.tensor(tokens))
        state.advance(torch.tensor(tokens))
        assert state.met_tokens().tolist() == predicted.tolist()
        met.append(predicted.tolist())
    # Row 0 writes [6, 7] then 5; row 1 writes 5, then 6 (one token of [6, 7]), then loses it;
    # row 2 writes 5, then 6; row 3 has no phrase.
    assert met == [[1, 1, 0, 0], [2, 2, 1, 0], [3, 1, 2, 0]]


def test_eos_waits_for_every_phrase_and_the_bound_forces_them_in() -> None:
    """A model that wants to stop at once still writes the phrases, just before the bound.

    The rule (PhraseConstraint): EOS is masked until every phrase has appeared; once the
    unmet phrases written whole (2 + 1 tokens) no longer fit in the tokens left after this one
    (max_len - t - 1), only the tokens that bring a phrase further are kept. So: t=0 (4 left)
    and t=1 (3 left) write the likeliest token, 4; at t=2 (2 left) only 5 is kept, at t=3 6
    completes [5 6] (and [6] inside it), and at t=4 EOS (0.9) ends the output."""
    def stop(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
        return {EOS_ID: 0.9, 4: 0.05, 5: 0.03, 6: 0.02}

    cfg = DecodeConfig(beam=1, lenpen=0.0, max_len_a=0.0, max_len_b=5, nbest=1)
    con = PhraseConstraint([[[5, 6], [6]]], eos=EOS_ID)
    hyp = greedy_search(ScriptedModel(stop, vocab=VOCAB), _src(0), cfg, SearchInputs(constraint=con))[0][0]
    assert hyp.tokens == [4, 4, 5, 6]
    assert hyp.log_prob == pytest.approx(math.log(0.05 ** 2 * 0.03 * 0.02 * 0.9), rel=1e-6)
    # An output the enumeration accepts (the likeliest one is shorter: greedy does not look ahead).
    ranked = dict(ranked_outputs(stop, 0, cfg, [[5, 6], [6]], [], (4, 5, 6)))
    assert ranked[(4, 4, 5, 6)] == pytest.approx(hyp.score, rel=1e-6)
    assert max(ranked, key=ranked.__getitem__) == (5, 6)


def test_no_output_when_the_phrases_do_not_fit_the_bound() -> None:
    cfg = DecodeConfig(beam=2, lenpen=0.0, max_len_a=0.0, max_len_b=2, nbest=1)
    con = PhraseConstraint([[[4, 5, 6]]], eos=EOS_ID)
    assert beam_search(ScriptedModel(random_table(0), vocab=VOCAB), _src(0), cfg, SearchInputs(constraint=con)) == [[]]


def test_excluded_one_token_phrase_never_appears() -> None:
    """The model's favourite token excluded: the three hypotheses are the three best outputs
    without it, as an enumeration of every output ranks them."""
    def fours(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
        return {4: 0.9, 5: 0.05, EOS_ID: 0.05}

    cfg = DecodeConfig(beam=3, lenpen=0.6, max_len_a=0.0, max_len_b=4, nbest=3)
    con = PhraseConstraint([[]], [[[4]]], eos=EOS_ID)
    hyps = beam_search(ScriptedModel(fours, vocab=VOCAB), _src(0), cfg, SearchInputs(constraint=con))[0]
    want = ranked_outputs(fours, 0, cfg, [], [[4]], (4, 5))[:3]
    assert [tuple(h.tokens) for h in hyps] == [seq for seq, _ in want] == [(), (5,), (5, 5)]
    assert [h.score for h in hyps] == pytest.approx([score for _, score in want], rel=1e-6)


phrase = st.lists(st.sampled_from((4, 5, 6)), min_size=1, max_size=3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), includes=st.lists(st.lists(phrase, max_size=3), min_size=1, max_size=3),
       excludes=st.lists(st.lists(st.lists(st.sampled_from((7, 8, 9)), min_size=1, max_size=2), max_size=2),
                         min_size=1, max_size=3),
       how=st.sampled_from(["beam", "greedy", "sample"]), beam=st.integers(1, 5), extra=st.integers(0, 4))
def test_every_output_has_every_phrase_and_no_excluded_one(seed: int, includes, excludes, how: str, beam: int,
                                                          extra: int) -> None:
    n = min(len(includes), len(excludes))
    includes, excludes = includes[:n], excludes[:n]
    longest = max(sum(len(p) for p in inc) for inc in includes)
    cfg = DecodeConfig(beam=beam, lenpen=0.6, max_len_a=0.0, max_len_b=longest + extra, nbest=1,
                       sampling=how == "sample", seed=seed)
    if how == "greedy":
        cfg = DecodeConfig(beam=1, lenpen=0.6, max_len_a=0.0, max_len_b=longest + extra, nbest=1)
    con = PhraseConstraint(includes, excludes, eos=EOS_ID)
    searcher = {"beam": beam_search, "greedy": greedy_search, "sample": sample}[how]
    if how == "beam" and beam == 1:
        searcher = search
    got = searcher(ScriptedModel(random_table(seed), vocab=VOCAB), _src(*range(n)), cfg, SearchInputs(constraint=con))
    for inc, exc, hyps in zip(includes, excludes, got):
        assert hyps, "every sentence gets an output: its phrases fit the bound"
        for hyp in hyps:
            out = tuple(hyp.tokens)
            assert len(out) <= cfg.max_len_b
            assert all(_contains(out, tuple(p)) for p in inc), (out, inc)
            assert not any(_contains(out, tuple(p)) for p in exc), (out, exc)


# ------------------------------------------------- exact values: padding, state, masks, banks

def test_pad_phrases_exact_ids_lengths_and_dtypes() -> None:
    from aiayn.inference.phrase_constraints import _pad_phrases

    ids, lengths = _pad_phrases([[[5, 6, 7], [8]], [[9]]])
    assert ids.dtype == lengths.dtype == torch.long
    assert ids.tolist() == [[[5, 6, 7], [8, -1, -1]], [[9, -1, -1], [-1, -1, -1]]]
    assert lengths.tolist() == [[3, 1], [1, 0]]
    ids, lengths = _pad_phrases([[[5]], [[6]]])  # one-token phrases: one column
    assert ids.tolist() == [[[5]], [[6]]] and lengths.tolist() == [[1], [1]]
    for sentences, shape in (([], (0, 0, 1)), ([[], []], (2, 0, 1))):
        ids, lengths = _pad_phrases(sentences)
        assert tuple(ids.shape) == shape and tuple(lengths.shape) == shape[:2]
        assert ids.dtype == lengths.dtype == torch.long
    # Integral ids given as floats (as JSON numbers may be) convert exactly, past float32's 2**24.
    ids, _ = _pad_phrases([[[16777217.0, 5.0]]])
    assert ids.tolist() == [[[16777217, 5]]]
    with pytest.raises(ValueError, match=r"^a constraint phrase has no tokens$"):
        _pad_phrases([[[5], []]])


def test_lexical_constraint_defaults_to_eos_3_and_refuses_unequal_lists() -> None:
    state = PhraseConstraint([[[5]]]).start(torch.tensor([0]), torch.tensor([9]))
    lprobs = torch.zeros(1, 6)
    state.mask(lprobs, 0)
    assert lprobs.tolist() == [[0.0, 0.0, 0.0, -math.inf, 0.0, 0.0]]
    with pytest.raises(ValueError, match=r"^2 sentences of include phrases, 1 of exclude phrases$"):
        PhraseConstraint([[[5]], [[6]]], [[[7]]])


def test_state_tensors_follow_the_device_of_max_len() -> None:
    """The meta device (shapes only) shows where each tensor is made, on a machine without GPU."""
    from aiayn.inference.phrase_constraints import _suffix_matches

    con = PhraseConstraint([[[5, 6]]], [[[7, 8, 9]]], eos=EOS_ID)
    state = con.start(torch.tensor([0, 0]), torch.tensor([5, 5], device="meta"))
    for name in ("include", "include_len", "exclude", "exclude_len", "max_len", "recent", "met", "progress"):
        assert getattr(state, name).device.type == "meta", name
    assert [m.device.type for m in _suffix_matches(state.recent, state.include, 1)] == ["meta", "meta"]


def test_suffix_matches_exact() -> None:
    from aiayn.inference.phrase_constraints import _suffix_matches

    out = _suffix_matches(torch.tensor([[-1, 5]]), torch.tensor([[[5, 6], [9, 5]]]), 2)
    assert [m.tolist() for m in out] == [[[True, True]], [[True, False]], [[False, False]]]


def test_state_keeps_the_last_tokens_as_wide_as_the_longest_phrase() -> None:
    from aiayn.inference.phrase_constraints import PhraseState

    state = PhraseConstraint([[[5]]], [[[7, 8, 9]]], eos=EOS_ID).start(torch.tensor([0]), torch.tensor([9]))
    assert state.recent.tolist() == [[-1, -1, -1]]
    state.advance(torch.tensor([7]))
    state.advance(torch.tensor([8]))
    assert state.recent.tolist() == [[-1, 7, 8]]
    lprobs = torch.zeros(1, VOCAB)
    state.mask(lprobs, 2)
    assert [i for i, v in enumerate(lprobs[0].tolist()) if v == -math.inf] == [EOS_ID, 9]
    state = PhraseConstraint([[[5]]], [[[7]]], eos=EOS_ID).start(torch.tensor([0]), torch.tensor([9]))
    assert state.recent.tolist() == [[-1]]
    none, no_len = torch.zeros(1, 0, 0, dtype=torch.long), torch.zeros(1, 0, dtype=torch.long)
    empty = PhraseState(none, no_len, none, no_len, torch.tensor([4]), EOS_ID)
    assert empty.recent.tolist() == [[-1]]


def test_progress_counts_toward_the_tokens_met() -> None:
    state = PhraseConstraint([[[5, 6, 7]]], eos=EOS_ID).start(torch.tensor([0]), torch.tensor([9]))
    state.advance(torch.tensor([5]))
    assert state._need().tolist() == [2]
    assert state.met_tokens().tolist() == [1]


def test_next_tokens_exact() -> None:
    state = PhraseConstraint([[[5, 6], [8]]], eos=EOS_ID).start(torch.tensor([0, 0]), torch.tensor([9, 9]))
    assert state.next_tokens().tolist() == [[5, -1, 8, -1]] * 2
    state.advance(torch.tensor([5, 4]))
    assert state.next_tokens().tolist() == [[5, 6, 8, -1], [5, -1, 8, -1]]
    assert state.next_tokens(torch.tensor([0])).tolist() == [[5, 6, 8, -1]]
    state.advance(torch.tensor([6, 8]))
    assert state.next_tokens().tolist() == [[-1, -1, 8, -1], [5, -1, -1, -1]]


def test_forced_mask_keeps_exactly_the_tokens_that_still_fit() -> None:
    # Room for two more tokens, three unmet: only 1 (meets [1]) and 4 (starts [4, 5]) fit.
    state = PhraseConstraint([[[1], [4, 5]]], eos=EOS_ID).start(torch.tensor([0]), torch.tensor([3]))
    lprobs = -torch.arange(1.0, 11.0, dtype=torch.float64)[None]
    state.mask(lprobs, 0)
    assert lprobs.dtype == torch.float64
    assert lprobs.tolist() == [[-math.inf, -2.0] + [-math.inf] * 2 + [-5.0] + [-math.inf] * 5]
    # A phrase of token 0 is forced like any other.
    state = PhraseConstraint([[[0]]], eos=EOS_ID).start(torch.tensor([0]), torch.tensor([1]))
    lprobs = -torch.arange(1.0, 7.0)[None]
    state.mask(lprobs, 0)
    assert lprobs.tolist() == [[-1.0] + [-math.inf] * 5]


class _BankStub:
    """An allocating state with fixed answers: next tokens (R, N), total tokens (R,), and the
    tokens met after (row, token) (0 where not listed)."""

    def __init__(self, nxt: list[list[int]], total: list[int], met: dict[tuple[int, int], int],
                 met_now: list[int] | None = None) -> None:
        self.nxt, self.total, self.met = torch.tensor(nxt), torch.tensor(total), met
        self.met_now = torch.tensor(met_now if met_now is not None else [0] * len(total))

    def met_tokens(self) -> torch.Tensor:
        return self.met_now

    def next_tokens(self) -> torch.Tensor:
        return self.nxt

    def total_tokens(self) -> torch.Tensor:
        return self.total

    def met_after(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return torch.tensor([self.met.get((r, t), 0) for r, t in zip(rows.tolist(), tokens.tolist())])


def _picked(live: _Beams) -> list[list[tuple[int, int, float]]]:
    return [list(zip(b, t, s)) for b, t, s in zip(live.beam.tolist(), live.tok.tolist(), live.scores.tolist())]


def _two_bank_case(n: int = 1):
    """Beam 0 has three good tokens (bank 0); every row offers 7 (bank 1), which is poor."""
    lprobs = torch.full((3 * n, VOCAB), -50.0)
    lprobs[0::3, 4], lprobs[0::3, 5], lprobs[0::3, 6] = -0.125, -0.25, -0.375
    lprobs[1::3, 7], lprobs[2::3, 7] = -5.0, -5.0
    scores = torch.tensor([[0.0, -1.0, -2.0]] * n)
    top = _Beams(torch.zeros(n, 3), torch.zeros(n, 3, dtype=torch.long), torch.tensor([[4, 5, 6]] * n))
    return lprobs, scores, top


@pytest.mark.parametrize("k_beam, expected", [
    # Two banks: k // 2 each, the remainder to the highest bank.
    (3, [(0, 4, -0.125), (1, 7, -6.0), (2, 7, -7.0)]),
    (4, [(0, 4, -0.125), (0, 5, -0.25), (1, 7, -6.0), (2, 7, -7.0)]),
    (1, [(1, 7, -6.0)]),  # beam 1: the one slot is the highest bank's
    # 2 + 3: bank 1's third slot goes to its poor (0, 7) before bank 0's better (0, 6)
    (5, [(0, 4, -0.125), (0, 5, -0.25), (1, 7, -6.0), (2, 7, -7.0), (0, 7, -50.0)]),
])
def test_allocated_exact_slots_per_bank(k_beam: int, expected) -> None:
    lprobs, scores, top = _two_bank_case()
    state = _BankStub([[7]] * 3, [1] * 3, {(0, 7): 1, (1, 7): 1, (2, 7): 1})
    live = _Beams.allocated(lprobs, scores, top, state, k_beam, EOS_ID)
    assert _picked(live) == [expected]


def test_allocated_banks_each_sentence_by_its_own_counts() -> None:
    lprobs, scores, top = _two_bank_case(2)
    # Sentence 1 (rows 3-5) meets nothing with 7: all of its candidates are in bank 0.
    state = _BankStub([[7]] * 6, [1] * 6, {(0, 7): 1, (1, 7): 1, (2, 7): 1})
    live = _Beams.allocated(lprobs, scores, top, state, 3, EOS_ID)
    assert _picked(live) == [[(0, 4, -0.125), (1, 7, -6.0), (2, 7, -7.0)],
                             [(0, 4, -0.125), (0, 5, -0.25), (0, 6, -0.375)]]


def test_allocated_more_banks_than_slots_and_an_empty_bank() -> None:
    lprobs, scores, top = _two_bank_case()
    # Four banks, two slots: bank 2 is empty, so the slots go to the best of banks 3 and 1,
    # not to the likelier candidates of bank 0; a third slot reaches bank 0.
    state = _BankStub([[7]] * 3, [3] * 3, {(1, 7): 3, (2, 7): 1})
    live = _Beams.allocated(lprobs, scores, top, state, 2, EOS_ID)
    assert _picked(live) == [[(1, 7, -6.0), (2, 7, -7.0)]]
    live = _Beams.allocated(lprobs, scores, top, state, 3, EOS_ID)
    assert _picked(live) == [[(0, 4, -0.125), (1, 7, -6.0), (2, 7, -7.0)]]


def test_allocated_deals_stripes_over_the_non_empty_banks() -> None:
    """Seven candidates in banks 0, 1 and 4 of six (total 5): slots go to the best of banks
    4, 1, 0, then the second best of each, whatever their scores."""
    lprobs = torch.full((3, VOCAB), -50.0)
    lprobs[0, 4], lprobs[0, 5], lprobs[0, 6] = -0.125, -0.25, -0.375
    lprobs[1, 7], lprobs[2, 7], lprobs[1, 6] = -5.0, -6.0, -9.0
    scores = torch.tensor([[0.0, -1.0, -2.0]])
    top = _Beams(torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.long), torch.tensor([[4, 5, 6]]))
    met = {(1, 7): 4, (2, 7): 1, (1, 6): 4, (0, 7): 1}
    state = _BankStub([[7], [6], [7]], [5] * 3, met)
    expected_order = [(1, 7, -6.0), (2, 7, -8.0), (0, 4, -0.125), (1, 6, -10.0), (0, 7, -50.0), (0, 5, -0.25)]
    for k_beam in range(1, 7):
        live = _Beams.allocated(lprobs, scores, top, state, k_beam, EOS_ID)
        chosen = sorted(expected_order[:k_beam], key=lambda c: -c[2])
        assert _picked(live) == [chosen], k_beam


def test_allocated_drops_eos_and_pads_and_keeps_token_0() -> None:
    lprobs = torch.full((2, 6), -50.0)
    lprobs[0, 0], lprobs[0, EOS_ID], lprobs[0, 4] = -0.5, -0.1, -1.0
    lprobs[1, 5] = -1.5
    top = _Beams(torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.long), torch.tensor([[EOS_ID, 0, 4]]))
    state = _BankStub([[-1], [-1]], [0, 0], {})
    live = _Beams.allocated(lprobs, torch.zeros(1, 2), top, state, 3, EOS_ID)
    assert _picked(live) == [[(0, 0, -0.5), (0, 4, -1.0), (1, 5, -1.5)]]


def test_allocated_keeps_pairs_of_beams_apart_in_a_large_vocabulary() -> None:
    """Two beams offering the same token of a 32768-token vocabulary are two candidates."""
    lprobs = torch.full((2, 32768), -50.0)
    lprobs[:, 32767] = -1.0
    top = _Beams(torch.zeros(1, 2), torch.tensor([[0, 1]]), torch.tensor([[32767, 32767]]))
    live = _Beams.allocated(lprobs, torch.zeros(1, 2), top, _BankStub([[-1], [-1]], [0, 0], {}), 2, EOS_ID)
    assert _picked(live) == [[(0, 32767, -1.0), (1, 32767, -1.0)]]


def test_allocated_breaks_ties_by_candidate_order() -> None:
    """Equal scores: the earlier candidate (and a pair's first copy) wins, in a list long
    enough that an unstable sort would reorder it."""
    top_tok = [0] + list(range(31, 4, -1)) * 2
    top = _Beams(torch.zeros(1, len(top_tok)), torch.zeros(1, len(top_tok), dtype=torch.long), torch.tensor([top_tok]))
    state = _BankStub([[-1] * 20], [0], {})
    live = _Beams.allocated(torch.zeros(1, 32), torch.zeros(1, 1), top, state, 6, EOS_ID)
    assert _picked(live) == [[(0, t, 0.0) for t in (0, 31, 30, 29, 28, 27)]]


def test_allocated_takes_every_finite_candidate_before_any_dropped_one() -> None:
    """One beam, four distinct finite candidates (three best tokens and a constraint token)
    and one dropped copy (the row's best token again): a beam of four takes the four finite
    ones, the worst included, and never the copy."""
    lprobs = torch.full((1, VOCAB), -50.0)
    lprobs[0, 4], lprobs[0, 5], lprobs[0, 6], lprobs[0, 7] = -0.125, -0.25, -0.375, -3.0
    scores = torch.zeros(1, 1)
    top = _Beams.best(lprobs, scores, 3)
    live = _Beams.allocated(lprobs, scores, top, _BankStub([[7]], [1], {}), 4, EOS_ID)
    assert _picked(live) == [[(0, 4, -0.125), (0, 5, -0.25), (0, 6, -0.375), (0, 7, -3.0)]]


def test_allocated_fills_the_beam_with_dropped_copies_in_candidate_order() -> None:
    """Fewer finite candidates than slots: the rest are dropped copies (score -inf), taken in
    candidate order, in a list long enough that an unstable sort would reorder them."""
    top_tok = list(range(31, 4, -1)) * 2  # 27 tokens, then a copy of each
    top = _Beams(torch.zeros(1, len(top_tok)), torch.zeros(1, len(top_tok), dtype=torch.long), torch.tensor([top_tok]))
    live = _Beams.allocated(torch.zeros(1, 32), torch.zeros(1, 1), top, _BankStub([[-1]], [0], {}), 40, EOS_ID)
    picked = _picked(live)[0]
    # 28 finite: the 27 tokens and the row's best token (0); then 12 of the 27 copies.
    assert picked[:28] == [(0, t, 0.0) for t in range(31, 4, -1)] + [(0, 0, 0.0)]
    assert picked[28:] == [(0, t, -math.inf) for t in range(31, 19, -1)]


def test_complete_builds_its_tensors_on_the_device_of_the_scores() -> None:
    """On the meta device (shapes only, no data): every tensor complete returns is there,
    none on the CPU, as on a GPU every one must be on the GPU."""
    lprobs, scores = torch.empty(6, VOCAB, device="meta"), torch.empty(2, 3, device="meta")
    ending = _Beams.complete(lprobs, scores, _BankStub([[-1]] * 6, [2] * 6, {}), 3)
    assert [t.device.type for t in (ending.scores, ending.beam, ending.tok)] == ["meta"] * 3
    assert ending.scores.shape == ending.beam.shape == ending.tok.shape == (2, 3)
