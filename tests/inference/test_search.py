"""Search against a scripted model whose next-token probabilities are fixed, so the
expected hypotheses and scores are known exactly (the fairseq approach)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
import torch

from aiayn.config import DecodeConfig
from aiayn.inference.search import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SearchHypothesis,
    SearchInputs,
    _filter_top_k_top_p,
    _FinishedHypotheses,
    _prefix_tensor,
    beam_search,
    greedy_search,
    length_penalty,
    row_topk,
    sample,
    search,
    topk_block,
)

NEG_INF = float("-inf")
A, B, C = 4, 5, 6  # ordinary tokens; 0-3 are PAD, UNK, BOS, EOS
VOCAB = 8

Table = Callable[[int, tuple[int, ...]], dict[int, float]]


@dataclass
class _State:
    sents: list[int]  # the sentence of each row
    prefixes: list[tuple[int, ...]]  # what each row has generated (BOS excluded)


class ScriptedModel:
    """next-token probabilities = table(sentence, prefix); tokens not listed get 0."""

    normalized = False  # the search normalises; the tables sum to 1 anyway (but see below)

    def __init__(self, table: Table, vocab: int = VOCAB, max_steps: int | None = None, bos: int = BOS_ID) -> None:
        self.table = table
        self.vocab = vocab
        self.max_steps = max_steps
        self.bos = bos
        self.steps = 0
        self.rows_seen: list[int] = []
        self.fed: list[list[int]] = []  # the tokens of every step
        self.hints: list[bool] = []  # the same_sources hint of every reorder
        self.init_steps: list[int] = []

    def init_state(self, src: torch.Tensor, max_steps: int) -> _State:
        # The sentence id is the source's first token (minus 100), so batches can be reshuffled.
        self.init_steps.append(max_steps)
        self.src_width = src.size(1)
        return _State([int(x) - 100 for x in src[:, 0]], [() for _ in range(src.size(0))])

    def step(self, tokens: torch.Tensor, state: _State, need_attn: bool = False, vocabulary=None):
        self.steps += 1
        self.rows_seen.append(tokens.numel())
        toks = tokens.tolist()
        self.fed.append(toks)
        out = torch.full((len(toks), self.vocab), float("-inf"))
        attn = torch.zeros(len(toks), 1, 1, self.src_width) if need_attn else None
        for r, tok in enumerate(toks):
            if tok != self.bos:
                state.prefixes[r] = state.prefixes[r] + (tok,)
            for t, p in self.table(state.sents[r], state.prefixes[r]).items():
                out[r, t] = math.log(p) if p > 0 else float("-inf")
            if attn is not None:  # position-coded so that tests can check the bookkeeping
                attn[r, 0, 0, 0] = len(state.prefixes[r])
        return out, attn

    def reorder(self, state: _State, index: torch.Tensor, same_sources: bool = False) -> _State:
        idx = index.tolist()
        sents = [state.sents[i] for i in idx]
        self.hints.append(same_sources)
        if same_sources:  # the hint must be true whenever the search gives it
            assert sents == state.sents
        return _State(sents, [state.prefixes[i] for i in idx])


def _src(*sent_ids: int, length: int = 5) -> torch.Tensor:
    """A batch whose row i belongs to sentence sent_ids[i] (first token), |x| = length."""
    src = torch.full((len(sent_ids), length), 7)
    src[:, 0] = torch.tensor(sent_ids) + 100
    src[:, -1] = EOS_ID
    return src


def _cfg(**kw) -> DecodeConfig:
    base = dict(beam=2, lenpen=0.0, max_len_a=0.0, max_len_b=10, nbest=1)
    return DecodeConfig(**{**base, **kw})


# --------------------------------------------------------------- hand-computed cases

# Sentence 0: [A] is likely but ends early; [B A] is the best two-token path.
TABLE0 = {
    (): {A: 0.6, B: 0.3, EOS_ID: 0.1},
    (A,): {A: 0.1, B: 0.3, EOS_ID: 0.6},
    (B,): {A: 0.5, B: 0.1, EOS_ID: 0.4},
    (A, B): {A: 0.3, B: 0.1, EOS_ID: 0.6},
    (B, A): {A: 0.05, B: 0.05, EOS_ID: 0.9},
}


def table0(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
    return TABLE0.get(prefix, {A: 0.1, B: 0.1, EOS_ID: 0.8})


def test_beam_order_scores_and_early_termination() -> None:
    model = ScriptedModel(table0)
    # Step 0: live A (.6), B (.3). Step 1: candidates A.EOS .36, A.B .18, B.A .15, B.EOS .12:
    # A.EOS is among the 2 best -> finished; B.EOS (third) is not. The best live hypothesis
    # (.18) cannot beat .36 without a length bonus -> early termination after 2 steps.
    [[hyp]] = beam_search(model, _src(0), _cfg())
    assert hyp.tokens == [A]
    assert hyp.score == pytest.approx(math.log(0.36))
    assert hyp.log_prob == pytest.approx(math.log(0.36))
    assert model.steps == 2


def test_beam_nbest_order_and_termination_after_k_finished() -> None:
    model = ScriptedModel(table0)
    # With nbest 2 the search goes on: step 2 candidates B.A.EOS .135, A.B.EOS .108,
    # A.B.A .054, ... both EOS are among the 2 best -> 3 finished >= beam -> done.
    hyps = beam_search(model, _src(0), _cfg(nbest=2))[0]
    assert [h.tokens for h in hyps] == [[A], [B, A]]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.36), math.log(0.135)])
    assert model.steps == 3


# Scores that do not sum to 1: normalised, [A] wins (.6 then EOS 1.0 -> .6 against .4);
# taken as they are, ending at once (.2) beats [A] (.3 * .5 = .15).
def unnormalized(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
    return {A: 0.3, EOS_ID: 0.2} if not prefix else {EOS_ID: 0.5}


class NormalizedModel(ScriptedModel):
    normalized = True


def test_log_probabilities_of_a_normalized_model_are_searched_as_given() -> None:
    [[hyp]] = beam_search(ScriptedModel(unnormalized), _src(0), _cfg())
    assert hyp.tokens == [A] and hyp.log_prob == pytest.approx(math.log(0.6))
    [[hyp]] = beam_search(NormalizedModel(unnormalized), _src(0), _cfg())
    assert hyp.tokens == [] and hyp.log_prob == pytest.approx(math.log(0.2))
    [[hyp]] = greedy_search(NormalizedModel(unnormalized), _src(0), _cfg(beam=1))
    assert hyp.tokens == [A] and hyp.log_prob == pytest.approx(math.log(0.15))


# Sentence 1: ending at once (.45) beats [A] (.55 * .8 = .44) unless length is rewarded.
TABLE1 = {(): {A: 0.55, EOS_ID: 0.45}, (A,): {A: 0.2, EOS_ID: 0.8}}


def table1(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
    return TABLE1.get(prefix, {A: 0.5, EOS_ID: 0.5})


def test_length_penalty_changes_the_winner() -> None:
    hyps = beam_search(ScriptedModel(table1), _src(1), _cfg(nbest=2))[0]
    assert [h.tokens for h in hyps] == [[], [A]]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.45), math.log(0.44)])
    # GNMT, alpha 1: |Y| counts EOS, lp(1) = 1, lp(2) = 7/6.
    hyps = beam_search(ScriptedModel(table1), _src(1), _cfg(nbest=2, lenpen=1.0))[0]
    assert [h.tokens for h in hyps] == [[A], []]
    assert hyps[0].score == pytest.approx(math.log(0.44) / (7 / 6))
    assert hyps[0].log_prob == pytest.approx(math.log(0.44))
    # fairseq style, alpha 1: lp = |Y|.
    hyps = beam_search(ScriptedModel(table1), _src(1),
                       _cfg(nbest=2, lenpen=1.0, lenpen_style="fairseq"))[0]
    assert [h.tokens for h in hyps] == [[A], []]
    assert hyps[0].score == pytest.approx(math.log(0.44) / 2)


def test_min_len_blocks_eos() -> None:
    [[hyp]] = beam_search(ScriptedModel(table1), _src(1), _cfg(min_len=1))
    # EOS cannot come first; scores keep the model's own (unrenormalised) probabilities.
    assert hyp.tokens == [A]
    assert hyp.log_prob == pytest.approx(math.log(0.44))
    [[hyp]] = beam_search(ScriptedModel(table1), _src(1), _cfg(min_len=3))
    assert hyp.tokens == [A, A, A]
    assert hyp.log_prob == pytest.approx(math.log(0.55 * 0.2 * 0.5 * 0.5))


def never_ends(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
    return {A: 0.5, B: 0.5 - 1e-6, EOS_ID: 1e-6}


@pytest.mark.parametrize("searcher", [beam_search, greedy_search, sample])
def test_max_len_bound_holds_when_eos_never_wins(searcher) -> None:
    # |x| = 5, a = 1, b = 3 -> at most 8 tokens, then EOS is forced.
    cfg = _cfg(max_len_a=1.0, max_len_b=3, beam=2, nbest=2 if searcher is not greedy_search else 1)
    model = ScriptedModel(never_ends)
    hyps = searcher(model, _src(0, 1), cfg)
    for per_sent in hyps:
        assert per_sent
        for h in per_sent:
            assert len(h.tokens) == 8
    assert model.steps == 9  # 8 tokens + the forced EOS step


def test_max_len_with_zero_probability_eos_still_ends() -> None:
    model = ScriptedModel(lambda s, p: {A: 1.0})
    [[hyp]] = beam_search(model, _src(0), _cfg(max_len_b=4))
    assert hyp.tokens == [A] * 4
    assert math.isfinite(hyp.score)


def test_model_max_steps_caps_the_length() -> None:
    model = ScriptedModel(never_ends, max_steps=4)
    [[hyp]] = beam_search(model, _src(0), _cfg(max_len_b=50))
    assert len(hyp.tokens) == 3


def test_finished_sentences_leave_the_batch() -> None:
    # Sentence 1 (table1 semantics via sent id 1) ends after 2 steps, sentence 0 runs on.
    def table(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
        return table1(sent, prefix) if sent == 1 else never_ends(sent, prefix)

    model = ScriptedModel(table)
    hyps = beam_search(model, _src(0, 1), _cfg(max_len_b=6, nbest=2))
    assert [h.tokens for h in hyps[1]] == [[], [A]]
    assert all(len(h.tokens) == 6 for h in hyps[0])
    # 2 sentences x 2 beams at step 1, then only sentence 0's 2 beams.
    assert model.rows_seen[0] == 2 and model.rows_seen[1] == 4 and model.rows_seen[2:] == [2] * 5


def test_forced_prefix() -> None:
    # Force B first, then continue freely: B.A.EOS (.3*.5*.9).
    [[hyp]] = beam_search(ScriptedModel(table0), _src(0), _cfg(), SearchInputs(prefix=[[B]]))
    assert hyp.tokens == [B, A]
    assert hyp.log_prob == pytest.approx(math.log(0.3 * 0.5 * 0.9))
    # A prefix the model gives probability 0 (C) is still followed.
    [[hyp]] = beam_search(ScriptedModel(table0), _src(0), _cfg(), SearchInputs(prefix=[[C, C]]))
    assert hyp.tokens[:2] == [C, C]
    [[h1], [h2]] = greedy_search(ScriptedModel(table0), _src(0, 0), _cfg(beam=1), SearchInputs(prefix=[[B], []]))
    assert h1.tokens == [B, A] and h2.tokens == [A]


@pytest.mark.parametrize("searcher, cfg", [(beam_search, _cfg()), (greedy_search, _cfg(beam=1)),
                                           (sample, _cfg(sampling=True))])
def test_forced_prefix_longer_than_the_length_bound(searcher, cfg: DecodeConfig) -> None:
    # max_len 1, but the 3-token prefix is forced in full; C has probability 0 after B A.
    model = ScriptedModel(table0)
    [[hyp]] = searcher(model, _src(0), replace(cfg, max_len_b=1), SearchInputs(prefix=[[B, A, C]]))
    assert hyp.tokens == [B, A, C]
    assert hyp.log_prob == pytest.approx(math.log(0.3 * 0.5 * 0.8) - 1e4)
    assert model.init_steps == [4]


def test_no_repeat_ngram() -> None:
    model = ScriptedModel(lambda s, p: {A: 0.9, B: 0.09, EOS_ID: 0.01})
    [[hyp]] = greedy_search(model, _src(0), _cfg(beam=1, max_len_b=6, no_repeat_ngram_size=2))
    # A A then A A again is banned -> B; then A B repeats? "A B" is new ... each bigram once.
    bigrams = list(zip(hyp.tokens, hyp.tokens[1:]))
    assert len(bigrams) == len(set(bigrams))
    assert hyp.tokens[:3] == [A, A, B]
    [[hyp]] = beam_search(model, _src(0), _cfg(max_len_b=6, no_repeat_ngram_size=1))
    assert len(set(hyp.tokens)) == len(hyp.tokens)


def test_attention_history_follows_the_chosen_hypothesis() -> None:
    [hyps] = beam_search(ScriptedModel(table0), _src(0, length=3), _cfg(nbest=2), SearchInputs(need_attn=True))
    for h in hyps:
        # (L, H, T, S): T = tokens + EOS step; the scripted weight at step t is t.
        assert h.attention.shape == (1, 1, len(h.tokens) + 1, 3)
        assert h.attention[0, 0, :, 0].tolist() == list(range(len(h.tokens) + 1))


def test_search_dispatch_and_validation() -> None:
    assert search(ScriptedModel(table0), _src(0), _cfg(beam=1))[0][0].tokens == [A]
    with pytest.raises(Exception, match="nbest"):
        search(ScriptedModel(table0), _src(0), _cfg(beam=1, nbest=2))
    assert beam_search(ScriptedModel(table0), _src(0)[:0], _cfg()) == []


# ------------------------------------------------- a textbook reference, one sentence


def reference_beam(table: Table, sent: int, cfg: DecodeConfig, src_len: int,
                   steps: list[int] | None = None) -> list[tuple]:
    """Plain-Python beam search with the same rules, for one sentence; appends the number of
    steps it took to ``steps``."""
    max_len = int(src_len * cfg.max_len_a + cfg.max_len_b)

    def lp(n: float) -> float:
        return length_penalty(float(n), cfg.lenpen, cfg.lenpen_style)

    def lprob(prefix: tuple, tok: int, t: int) -> float:
        p = table(sent, prefix).get(tok, 0.0)
        v = math.log(p) if p > 0 else -math.inf
        if tok in (PAD_ID, BOS_ID):
            return -math.inf
        if t >= max_len:
            return max(v, -1e4) if tok == EOS_ID else -math.inf
        if tok == EOS_ID and t < cfg.min_len:
            return -math.inf
        return v

    live = [((), 0.0)]
    finished: list[tuple] = []
    for t in range(max_len + 1):
        cands = [(score + lprob(prefix, tok, t), i, tok)
                 for i, (prefix, score) in enumerate(live) for tok in range(VOCAB)]
        cands.sort(key=lambda c: -c[0])
        cands = cands[:2 * cfg.beam]
        for score, i, tok in cands[:cfg.beam]:
            if tok == EOS_ID and score > -math.inf:
                finished.append((live[i][0], score / lp(t + 1), score))
        live = [(live[i][0] + (tok,), score) for score, i, tok in cands if tok != EOS_ID][:cfg.beam]
        finished.sort(key=lambda f: -f[1])
        best_live = live[0][1] if live else -math.inf
        bound = best_live / max(lp(t + 2), lp(max_len + 1))
        if (len(finished) >= cfg.beam or best_live == -math.inf
                or (len(finished) >= cfg.nbest and finished[cfg.nbest - 1][1] >= bound)):
            break
    if steps is not None:
        steps.append(t + 1)
    return finished[:cfg.nbest]


def random_table(seed: int) -> Table:
    def table(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
        g = torch.Generator().manual_seed(hash((seed, sent, prefix)) % (2**31))
        logits = torch.randn(VOCAB - 4, generator=g) * 2
        logits[0] -= 2.5 - 0.6 * len(prefix)  # EOS grows likelier with the length
        probs = logits.softmax(-1).tolist()
        return {EOS_ID: probs[0], **{4 + i: p for i, p in enumerate(probs[1:])}}

    return table


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kw", [
    dict(beam=4, lenpen=0.6),
    dict(beam=3, lenpen=1.0, lenpen_style="fairseq", nbest=3),
    dict(beam=5, lenpen=0.0, min_len=2, nbest=2),
    dict(beam=2, lenpen=2.0, max_len_b=3),
    # alpha < 0 rewards short outputs: the bound then uses the next length, not the longest
    dict(beam=3, lenpen=-0.8, nbest=2),
    dict(beam=3, lenpen=-1.5, lenpen_style="fairseq", nbest=1),
])
def test_batched_beam_equals_reference(seed: int, kw: dict) -> None:
    table = random_table(seed)
    cfg = _cfg(**{"max_len_b": 7, **kw})
    sents = [3, 1, 4, 1, 5]
    model = ScriptedModel(table)
    got = beam_search(model, _src(*sents), cfg)
    steps: list[int] = []
    for sent, hyps in zip(sents, got):
        ref = reference_beam(table, sent, cfg, src_len=5, steps=steps)
        assert [tuple(h.tokens) for h in hyps] == [r[0] for r in ref]
        assert [h.score for h in hyps] == pytest.approx([r[1] for r in ref], rel=1e-5)
        assert [h.log_prob for h in hyps] == pytest.approx([r[2] for r in ref], rel=1e-5)
        assert all(a.score >= b.score for a, b in zip(hyps, hyps[1:]))
    assert model.steps == max(steps)  # the batch runs until its last sentence is done


@pytest.mark.parametrize("seed", range(4))
def test_beam_one_equals_greedy_scripted(seed: int) -> None:
    table = random_table(seed)
    cfg = _cfg(beam=1, lenpen=0.6)
    a = beam_search(ScriptedModel(table), _src(0, 1, 2), cfg)
    b = greedy_search(ScriptedModel(table), _src(0, 1, 2), cfg)
    assert [h[0].tokens for h in a] == [h[0].tokens for h in b]
    assert [h[0].score for h in a] == pytest.approx([h[0].score for h in b])


@pytest.mark.parametrize("seed", range(4))
def test_sentence_alone_equals_in_batch_scripted(seed: int) -> None:
    table = random_table(seed)
    cfg = _cfg(beam=3, lenpen=0.6, nbest=3)
    batch = beam_search(ScriptedModel(table), _src(0, 1, 2, 3), cfg)
    for i in range(4):
        alone = beam_search(ScriptedModel(table), _src(i), cfg)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in batch[i]]


# ------------------------------------------------------------------------- sampling


def test_sampling_is_seeded_and_filters_work() -> None:
    table = random_table(0)
    cfg = _cfg(sampling=True, nbest=4, beam=4, seed=3, lenpen=0.6)
    a = sample(ScriptedModel(table), _src(0, 1), cfg)
    b = sample(ScriptedModel(table), _src(0, 1), cfg)
    assert [[h.tokens for h in s] for s in a] == [[h.tokens for h in s] for s in b]
    for s in a:
        assert len(s) == 4
        assert all(x.score >= y.score for x, y in zip(s, s[1:]))
    others = [sample(ScriptedModel(table), _src(0, 1), replace(cfg, seed=seed)) for seed in range(5)]
    assert any([[h.tokens for h in s] for s in o] != [[h.tokens for h in s] for s in a] for o in others)
    greedy = greedy_search(ScriptedModel(table), _src(0, 1), _cfg(beam=1, lenpen=0.6))
    for filt in (dict(top_k=1), dict(top_p=1e-6), dict(temperature=1e-4)):
        got = sample(ScriptedModel(table), _src(0, 1), replace(cfg, nbest=1, **filt))
        assert [h[0].tokens for h in got] == [h[0].tokens for h in greedy]
        assert [h[0].score for h in got] == pytest.approx([h[0].score for h in greedy])


def test_top_p_keeps_the_nucleus() -> None:
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.15), math.log(0.05)]])
    kept = torch.isfinite(_filter_top_k_top_p(logits.clone(), 0, 0.8))
    assert kept.tolist() == [[True, True, False, False]]
    kept = torch.isfinite(_filter_top_k_top_p(logits.clone(), 0, 0.81))
    assert kept.tolist() == [[True, True, True, False]]
    kept = torch.isfinite(_filter_top_k_top_p(logits.clone(), 2, 1.0))
    assert kept.tolist() == [[True, True, False, False]]


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


@pytest.mark.parametrize("shape", [(7, 5000), (3, 4096), (2, 130)])
def test_row_topk_equals_torch_topk(shape: tuple[int, int]) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape).log_softmax(-1)
    x[0, :] = float("-inf")  # a row with one finite value (only EOS allowed at the maximum length)
    x[0, EOS_ID] = -3.0
    x[1, ::2] = float("-inf")  # masked columns
    x[-1, -1] = 5.0  # the best value in the last, partial block
    for k in (1, 8):
        vals, cols = row_topk(x, k)
        ref_vals, ref_cols = x.topk(k, dim=1)
        assert torch.equal(vals, ref_vals)
        finite = torch.isfinite(ref_vals)  # equal -inf values may come from other columns
        assert torch.equal(cols[finite], ref_cols[finite])
        assert torch.equal(x.gather(1, cols), vals)


def test_topk_block_balances_block_maxima_and_candidates() -> None:
    assert [topk_block(v, k) for v, k in [(8000, 8), (32000, 8), (8000, 1), (16, 8), (2, 32)]] == [64, 128, 128, 4, 1]


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


def test_beam_search_with_a_large_vocabulary_is_unchanged_by_row_topk(monkeypatch) -> None:
    import aiayn.inference.search as S
    from aiayn.config import ModelConfig
    from aiayn.inference.adapters import IncrementalDecoder
    from aiayn.model import build_model

    torch.manual_seed(3)
    model = build_model(ModelConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1, n_decoder_layers=1,
                                    src_vocab_size=5000, tgt_vocab_size=5000, max_positions=64)).eval()
    src = torch.randint(4, 5000, (3, 6))
    cfg = _cfg(beam=4, lenpen=0.6, max_len_b=8)
    with torch.inference_mode():
        fast = beam_search(IncrementalDecoder(model), src, cfg)
        monkeypatch.setattr(S, "row_topk", lambda x, k: x.topk(k, dim=1))
        plain = beam_search(IncrementalDecoder(model), src, cfg)
    assert [[h.tokens for h in hyps] for hyps in fast] == [[h.tokens for h in hyps] for hyps in plain]
    assert [[h.score for h in hyps] for hyps in fast] == [[h.score for h in hyps] for hyps in plain]


# ------------------------------------------------------------ dispatch and plumbing


def upto_four(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
    """Ends (token EOS_ID) only late; A, B, C and the ids 3 and 7 all possible."""
    return {A: 0.4, B: 0.2, C: 0.2, 7: 0.1, EOS_ID: 0.1 if len(prefix) < 4 else 0.6}


@pytest.mark.parametrize("cfg", [_cfg(beam=1, max_len_a=1.0, max_len_b=2),
                                 _cfg(beam=2, nbest=2, max_len_a=1.0, max_len_b=2),
                                 _cfg(beam=2, nbest=2, max_len_a=1.0, max_len_b=2, sampling=True, seed=5)])
def test_search_passes_every_option_on(cfg: DecodeConfig) -> None:
    # Unusual ids: pad 7 (so |x| = 2 for _src), BOS C, EOS B; EOS_ID is an ordinary token.
    inputs = SearchInputs(prefix=[[A], []], need_attn=True, pad=7, bos=C, eos=B)
    strategy = sample if cfg.sampling else greedy_search if cfg.beam == 1 else beam_search
    model, ref_model = ScriptedModel(upto_four, bos=C), ScriptedModel(upto_four, bos=C)
    got = search(model, _src(0, 1), cfg, inputs)
    ref = strategy(ref_model, _src(0, 1), cfg, inputs)
    assert model.fed == ref_model.fed and model.hints == ref_model.hints
    assert model.fed[0] == [C] * len(model.fed[0])
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in ref]
    assert [[h.score for h in hyps] for hyps in got] == [[h.score for h in hyps] for hyps in ref]
    for hyps, ref_hyps in zip(got, ref):
        assert len(hyps) == cfg.nbest
        for h, r in zip(hyps, ref_hyps):
            assert torch.equal(h.attention, r.attention)
            assert h.attention.shape == (1, 1, len(h.tokens) + 1, 2)  # |x| = 2 with pad 7
            assert len(h.tokens) <= 4 and 7 not in h.tokens and B not in h.tokens
    assert got[0][0].tokens[0] == A


def test_search_dispatch_on_beam_and_sampling() -> None:
    # Greedy never reorders a single sentence; beam search reorders after every step.
    for cfg, strategy in [(_cfg(beam=1), greedy_search), (_cfg(beam=2, nbest=2), beam_search),
                          (_cfg(beam=2, nbest=2, sampling=True), sample)]:
        model, ref_model = ScriptedModel(table0), ScriptedModel(table0)
        got = search(model, _src(0), cfg)
        ref = strategy(ref_model, _src(0), cfg)
        assert (model.fed, model.hints) == (ref_model.fed, ref_model.hints)
        assert [h.tokens for h in got[0]] == [h.tokens for h in ref[0]]
        assert [h.attention for h in got[0]] == [None] * cfg.nbest  # no attention unless asked for
    model = ScriptedModel(table0)
    search(model, _src(0), _cfg(beam=1))
    assert model.hints == []


def test_reorder_hints_and_init_steps() -> None:
    def table(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
        return table1(sent, prefix) if sent == 1 else never_ends(sent, prefix)

    model = ScriptedModel(table)
    beam_search(model, _src(0, 1), _cfg(max_len_b=6, nbest=2))
    # Step 0 creates the beams (rows move); sentence 1 leaves after step 1; then beams only
    # reshuffle within sentence 0.
    assert model.hints == [False, False, True, True, True, True]
    assert model.init_steps == [7]  # 6 tokens + EOS
    model = ScriptedModel(table)
    sample(model, _src(0, 1), _cfg(max_len_b=6, nbest=2, sampling=True))
    assert model.hints[0] is False  # the copies of each sentence
    assert model.rows_seen[0] == 4


def test_greedy_keeps_one_row_per_sentence_whatever_the_beam() -> None:
    model = ScriptedModel(never_ends)
    hyps = greedy_search(model, _src(0, 1, 2), _cfg(beam=4, nbest=3, max_len_b=3))
    assert model.rows_seen == [3, 3, 3, 3]
    assert [[h.tokens for h in s] for s in hyps] == [[[A, A, A]]] * 3


class LayoutModel(ScriptedModel):
    """Cross-attention (R, 2, S) instead of (R, L, H, S); in bf16."""

    def step(self, tokens: torch.Tensor, state: _State, need_attn: bool = False, vocabulary=None):
        out, attn = super().step(tokens, state, need_attn)
        if attn is not None:
            attn = torch.cat([attn[:, 0], 10 + attn[:, 0]], dim=1).bfloat16()
        return out, attn


@pytest.mark.parametrize("searcher, cfg", [(beam_search, _cfg(nbest=2)), (greedy_search, _cfg(beam=1)),
                                           (sample, _cfg(nbest=2, sampling=True))])
def test_attention_of_any_layout_is_trimmed_to_the_source(searcher, cfg: DecodeConfig) -> None:
    src = torch.tensor([[100, 7, 7, EOS_ID], [101, EOS_ID, PAD_ID, PAD_ID]])
    hyps = searcher(LayoutModel(table0), src, cfg, SearchInputs(need_attn=True))
    for s, src_len in zip(hyps, (4, 2)):
        assert len(s) == cfg.nbest
        for h in s:
            steps = len(h.tokens) + 1
            assert h.attention.dtype == torch.float32
            assert h.attention.shape == (2, steps, src_len)
            assert h.attention[0, :, 0].tolist() == list(range(steps))
            assert h.attention[1, :, 0].tolist() == [10.0 + i for i in range(steps)]


def test_early_termination_when_the_bound_ties_the_finished_score() -> None:
    # EOS and A equally likely at step 0: EOS finishes with exactly the best live score, and
    # nothing live can beat it (lenpen 0) -> done after one step.
    model = ScriptedModel(lambda s, p: {EOS_ID: 0.4, A: 0.4, B: 0.2})
    [[hyp]] = beam_search(model, _src(0), _cfg())
    assert hyp.tokens == [] and model.steps == 1


# ------------------------------------------------------------- finished hypotheses


def _hyp(score: float) -> SearchHypothesis:
    return SearchHypothesis(tokens=[int(-score)], score=score, log_prob=score)


def test_finished_keeps_the_best_and_the_nbest_score() -> None:
    finished = _FinishedHypotheses(3, nbest=2)
    assert finished.count.tolist() == [0, 0, 0] and finished.count.dtype == torch.long
    assert finished.nbest_score.tolist() == [NEG_INF] * 3
    finished.add(1, _hyp(-3.0))
    assert finished.count.tolist() == [0, 1, 0]
    assert finished.nbest_score.tolist() == [NEG_INF] * 3  # fewer than nbest
    finished.add(1, _hyp(-1.0))
    assert finished.count.tolist() == [0, 2, 0]
    assert finished.nbest_score.tolist() == [NEG_INF, -3.0, NEG_INF]
    finished.add(1, _hyp(-2.0))
    finished.add(0, _hyp(-4.0))
    assert finished.count.tolist() == [1, 3, 0]
    assert finished.nbest_score.tolist() == [NEG_INF, -2.0, NEG_INF]
    assert [[h.score for h in hyps] for hyps in finished.results()] == [[-4.0], [-1.0, -2.0], []]
    assert [h.score for h in finished.hyps[1]] == [-1.0, -2.0, -3.0]


def test_finished_nbest_one() -> None:
    finished = _FinishedHypotheses(1, nbest=1)
    for s in (-2.0, -5.0, -1.0):
        finished.add(0, _hyp(s))
    assert finished.nbest_score.tolist() == [-1.0]
    assert [h.tokens for h in finished.results()[0]] == [[1]]


@pytest.mark.parametrize("prefix", [None, [[5, 6], []]])
def test_prefix_tensors_are_built_on_the_given_device(prefix) -> None:
    """On the meta device (shapes only): the padded prefixes are where the search runs, as
    on a GPU they must be; the lengths stay on the CPU (read as Python numbers)."""
    ids, lengths = _prefix_tensor(prefix, 2, torch.device("meta"))
    assert ids.device.type == "meta" and ids.dtype == torch.long
    assert ids.shape == (2, 0 if prefix is None else 2)
    assert lengths.device.type == "cpu" and lengths.tolist() == ([0, 0] if prefix is None else [2, 0])


# ------------------------------------------------------- rows that every mask closes


def ends_at_three(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
    return {A: 0.7, B: 0.3} if len(prefix) < 3 else {EOS_ID: 0.8, A: 0.2}


class _Closing:
    """A constraint that masks every token of sentence s's rows from step ``at[s]`` on."""

    def __init__(self, at: dict[int, int]) -> None:
        self.at = at

    def start(self, sent: torch.Tensor, max_len: torch.Tensor) -> _ClosingState:
        return _ClosingState(self.at, sent.tolist())


class _ClosingState:
    def __init__(self, at: dict[int, int], sent: list[int]) -> None:
        self.at, self.sent = at, sent

    def mask(self, lprobs: torch.Tensor, t: int) -> None:
        for row, s in enumerate(self.sent):
            if t >= self.at.get(s, math.inf):
                lprobs[row] = NEG_INF

    def select(self, index: torch.Tensor) -> None:
        self.sent = [self.sent[i] for i in index.tolist()]

    def advance(self, tokens: torch.Tensor) -> None:
        pass


def test_greedy_drops_the_rows_every_mask_closes_and_keeps_the_others_exactly() -> None:
    """Sentences 0 and 2 closed at step 1 (two rows left), sentence 3 at step 2 (one row
    left): they get no hypothesis, and sentence 1 ends at step 3 as it does alone."""
    free = greedy_search(ScriptedModel(ends_at_three), _src(1), _cfg(beam=1))[0]
    assert [(h.tokens, h.score) for h in free] == [([A, A, A], pytest.approx(3 * math.log(0.7) + math.log(0.8)))]
    model = ScriptedModel(ends_at_three)
    got = greedy_search(model, _src(0, 1, 2, 3), _cfg(beam=1), SearchInputs(constraint=_Closing({0: 1, 2: 1, 3: 2})))
    assert got == [[], free, [], []]
    assert model.rows_seen == [4, 4, 2, 1]  # the closed rows leave once their step is masked
    everything = greedy_search(ScriptedModel(ends_at_three), _src(0, 1), _cfg(beam=1),
                               SearchInputs(constraint=_Closing({0: 1, 1: 1})))
    assert everything == [[], []]


class _RecordingVocabulary:
    """A step vocabulary that does not narrow: what the search asks of it."""

    narrows = False

    def __init__(self) -> None:
        self.started: list[int] = []
        self.selected: list[tuple[list[int], bool]] = []

    def start(self, sentences: int) -> None:
        self.started.append(sentences)

    def select(self, index: torch.Tensor, same_sources: bool = False) -> None:
        self.selected.append((index.tolist(), same_sources))


def test_the_step_vocabulary_follows_the_rows_with_the_models_hints() -> None:
    def table(sent: int, prefix: tuple[int, ...]) -> dict[int, float]:
        return table1(sent, prefix) if sent == 1 else never_ends(sent, prefix)

    model, vocabulary = ScriptedModel(table), _RecordingVocabulary()
    beam_search(model, _src(0, 1), _cfg(max_len_b=6, nbest=2), SearchInputs(vocabulary=vocabulary))
    assert vocabulary.started == [2]
    assert vocabulary.selected[0] == ([0, 0, 1, 1], False)  # the beams of each sentence
    assert [hint for _, hint in vocabulary.selected] == model.hints == [False, False, True, True, True, True]


class _Narrowing:
    narrows = True


def test_a_constraint_and_a_narrowing_vocabulary_are_refused_together() -> None:
    with pytest.raises(ValueError, match=r"^a constraint masks the whole vocabulary: it cannot drive steps that "
                                         r"narrow it$"):
        search(ScriptedModel(table0), _src(0), _cfg(), SearchInputs(constraint=_Closing({}), vocabulary=_Narrowing()))
