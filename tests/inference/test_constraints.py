"""The tree grammar (aiayn.inference.tree_grammar) in every search: a scripted model that
"wants" an ill-formed tree gets the best well-formed one (checked against brute force), and
over random scores every output of beam search, greedy search and sampling is a tree over
exactly the sentence's words."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiayn.config import DecodeConfig
from aiayn.data.trees import as_placeholders, is_well_formed
from aiayn.inference.search import SearchInputs, beam_search, greedy_search, length_penalty, sample
from aiayn.inference.tree_grammar import TreeGrammar, TreeVocab
from aiayn.vocab import EOS_ID

# ids 0-3: pad, unk, bos, eos; then the tree symbols and one stray word piece.
PIECES = ["<pad>", "<unk>", "<s>", "</s>", "XX", "(S", ")S", "(NP", ")NP", "dog"]
VOCAB = TreeVocab.from_pieces(PIECES, "XX", EOS_ID)


class TableModel:
    """Next-token log-probabilities that depend on the step only: ``table`` (T, V)."""

    max_steps = None
    normalized = False

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table

    def init_state(self, src: torch.Tensor, max_steps: int) -> dict:
        return {"t": 0}

    def step(self, tokens: torch.Tensor, state: dict, need_attn: bool = False, vocabulary=None):
        t = min(state["t"], self.table.size(0) - 1)
        state["t"] += 1
        return self.table[t].expand(tokens.numel(), -1).clone(), None

    def reorder(self, state: dict, index: torch.Tensor, same_sources: bool = False) -> dict:
        return state


def _pieces(tokens: list[int]) -> list[str]:
    return [PIECES[i] for i in tokens if i != EOS_ID]


def _src(n_sent: int, length: int) -> torch.Tensor:
    return torch.full((n_sent, length), 5, dtype=torch.long)


def _cfg(**kw) -> DecodeConfig:
    base = dict(beam=4, lenpen=0.0, max_len_a=0.0, max_len_b=8, nbest=1)
    base.update(kw)
    return DecodeConfig(**base)


def test_the_model_wants_an_ill_formed_tree_and_gets_the_best_well_formed_one() -> None:
    # Unconstrained, this model says "(S XX )S" then EOS: one word too few for 2 words.
    table = torch.full((8, len(PIECES)), -6.0)
    for t, piece in enumerate(["(S", "XX", ")S", "</s>", "</s>", "</s>", "</s>", "</s>"]):
        table[t, PIECES.index(piece)] = -0.1
    table[:, PIECES.index("dog")] = -0.05  # a word piece: never legal in a tree
    lprobs = table.log_softmax(-1)
    model = TableModel(lprobs)
    free = beam_search(model, _src(1, 3), _cfg(max_len_b=7))[0][0]
    assert not is_well_formed(_pieces(free.tokens), 2)
    got = beam_search(model, _src(1, 3), _cfg(beam=16, max_len_b=7),
        SearchInputs(constraint=TreeGrammar(VOCAB, [2])))[0][0]
    assert _pieces(got.tokens) == _best_well_formed(lprobs, n_words=2, max_len=7)
    assert math.isfinite(got.score)


def _best_well_formed(lprobs: torch.Tensor, n_words: int, max_len: int) -> list[str]:
    """Brute force over every symbol sequence up to ``max_len``: the best well-formed one
    (score = log-probability incl. EOS; lenpen 0)."""
    symbols = ["XX", "(S", ")S", "(NP", ")NP"]
    best, best_score = None, -math.inf
    for length in range(1, max_len + 1):
        for seq in itertools.product(symbols, repeat=length):
            if not is_well_formed(list(seq), n_words):
                continue
            score = sum(float(lprobs[t, PIECES.index(p)]) for t, p in enumerate(seq)) + float(lprobs[length, EOS_ID])
            if score > best_score:
                best, best_score = list(seq), score
    assert best is not None
    return best


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), n_words=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       beam=st.integers(1, 6), extra=st.integers(2, 10), how=st.sampled_from(["beam", "greedy", "sample"]))
def test_every_output_is_a_tree_over_the_words(seed: int, n_words: list[int], beam: int, extra: int,
                                               how: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    max_len = max(n_words) + extra
    table = (torch.randn(max_len + 2, len(PIECES), generator=gen) * 3).log_softmax(-1)
    model = TableModel(table)
    cfg = _cfg(beam=beam, max_len_b=max_len, nbest=beam if how != "greedy" else 1, sampling=how == "sample",
               seed=seed % 1000)
    search = {"beam": beam_search, "greedy": greedy_search, "sample": sample}[how]
    out = search(model, _src(len(n_words), 3), cfg, SearchInputs(constraint=TreeGrammar(VOCAB, n_words)))
    assert len(out) == len(n_words)
    for hyps, n in zip(out, n_words):
        assert hyps, "a sentence lost every hypothesis: some row had no legal token"
        for h in hyps:
            assert is_well_formed(_pieces(h.tokens), n), _pieces(h.tokens)
            assert math.isfinite(h.score)


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), sentences=st.lists(st.lists(st.sampled_from(["dog", "XX"]), min_size=1,
                                                                  max_size=4), min_size=1, max_size=3),
       beam=st.integers(1, 6), how=st.sampled_from(["beam", "greedy", "sample"]), any_word=st.booleans())
def test_a_target_that_spells_its_words_gets_exactly_those_words(seed: int, sentences: list[list[str]],
                                                                 beam: int, how: str, any_word: bool) -> None:
    """``word_ids``: each word slot takes that word's own token (XX for a word the vocabulary
    lacks), in order; the model's scores favour the other word and stray brackets."""
    gen = torch.Generator().manual_seed(seed)
    max_len = 4 + 8
    table = (torch.randn(max_len + 2, len(PIECES), generator=gen) * 3).log_softmax(-1)
    cfg = _cfg(beam=beam, max_len_b=max_len, nbest=beam if how != "greedy" else 1, sampling=how == "sample",
               seed=seed % 1000)
    ids = [[PIECES.index(w) for w in words] for words in sentences]
    search = {"beam": beam_search, "greedy": greedy_search, "sample": sample}[how]
    out = search(TableModel(table), _src(len(ids), 3), cfg,
        SearchInputs(constraint=TreeGrammar(VOCAB, [len(w) for w in ids], word_ids=ids, any_word=any_word)))
    for hyps, words in zip(out, sentences):
        assert hyps
        for h in hyps:
            pieces = _pieces(h.tokens)
            assert [p for p in pieces if p[0] not in "()"] == words
            assert is_well_formed(as_placeholders(pieces), len(words)), pieces


def test_any_word_scores_a_given_word_by_the_belief_that_a_word_comes_next() -> None:
    # The model wants "(S cat )S" for the one-word sentence "dog". Scored by its belief in
    # "dog" itself (-8), a word loses to opening brackets (-3); scored as "a word here"
    # (cat + dog + ...), the given word goes where the model expects a word.
    pieces = [*PIECES, "cat"]
    vocab = TreeVocab.from_pieces(pieces, "XX", EOS_ID)
    table = torch.full((6, len(pieces)), -12.0)
    table[0, pieces.index("(S")] = -0.01
    table[1:, pieces.index("(NP")] = -3.0
    table[1:, pieces.index("cat")] = -0.01
    table[1:, pieces.index("dog")] = -8.0
    table[2:, pieces.index(")S")] = -0.5
    table[2:, pieces.index(")NP")] = -0.5
    table[3:, EOS_ID] = -0.01
    model = TableModel(table.log_softmax(-1))
    dog = [[pieces.index("dog")]]

    def best(any_word: bool) -> list[str]:
        out = greedy_search(model, _src(1, 3), _cfg(beam=1, max_len_b=5),
            SearchInputs(constraint=TreeGrammar(vocab, [1], word_ids=dog, any_word=any_word)))
        return [pieces[i] for i in out[0][0].tokens if i != EOS_ID]

    assert best(any_word=True) == ["(S", "dog", ")S"]
    assert best(any_word=False) == ["(S", "(NP", "dog", ")NP", ")S"]


def test_word_ids_must_match_the_word_counts() -> None:
    with pytest.raises(ValueError, match="one id per word"):
        TreeGrammar(VOCAB, [2], word_ids=[[9]])


def test_a_best_output_that_is_already_a_tree_is_kept_with_its_score() -> None:
    # Random scores around a preferred well-formed tree "(S XX )S" for one word: the
    # constraint removes only illegal continuations and leaves legal scores as they are.
    gen = torch.Generator().manual_seed(3)
    table = torch.randn(8, len(PIECES), generator=gen) - 4.0
    for t, piece in enumerate(["(S", "XX", ")S"] + ["</s>"] * 5):
        table[t, PIECES.index(piece)] = 0.0
    model = TableModel(table.log_softmax(-1))
    free = beam_search(model, _src(2, 3), _cfg())
    tree = beam_search(model, _src(2, 3), _cfg(), SearchInputs(constraint=TreeGrammar(VOCAB, [1, 1])))
    assert [_pieces(s[0].tokens) for s in free] == [["(S", "XX", ")S"]] * 2
    assert [(s[0].tokens, s[0].score) for s in tree] == [(s[0].tokens, s[0].score) for s in free]
    # Below the best, the unconstrained n-best holds ill-formed outputs; the constrained, none.
    free_nbest = beam_search(model, _src(1, 3), _cfg(nbest=4))[0]
    tree_nbest = beam_search(model, _src(1, 3), _cfg(nbest=4), SearchInputs(constraint=TreeGrammar(VOCAB, [1])))[0]
    assert [is_well_formed(_pieces(h.tokens), 1) for h in free_nbest] == [True, False, False, False]
    assert all(is_well_formed(_pieces(h.tokens), 1) for h in tree_nbest)


def test_the_length_bound_leaves_room_to_finish() -> None:
    # The tightest bound: 3 words need "(S XX XX XX )S" = 5 tokens; the model prefers opening more.
    table = torch.full((8, len(PIECES)), -5.0)
    table[:, PIECES.index("(NP")] = -0.01
    out = beam_search(TableModel(table.log_softmax(-1)), _src(1, 3), _cfg(beam=3, max_len_b=5),
        SearchInputs(constraint=TreeGrammar(VOCAB, [3])))[0]
    assert _pieces(out[0].tokens) in (["(S", "XX", "XX", "XX", ")S"], ["(NP", "XX", "XX", "XX", ")NP"])
    assert length_penalty(6.0, 0.0) == 1.0


def test_a_vocabulary_without_tree_symbols_is_refused() -> None:
    with pytest.raises(ValueError, match="no tree symbols"):
        TreeVocab.from_pieces(["<pad>", "<unk>", "<s>", "</s>", "hello"], "XX", EOS_ID)


def test_parser_with_the_constraint_repairs_nothing(parsing_checkpoint_for_constraints: Path) -> None:
    from aiayn.inference.parser import Parser

    parser = Parser.from_checkpoint(parsing_checkpoint_for_constraints)
    sentences = ["Ms. Haag plays Elianti .", "The cat sat on the mat .", "He said it rained .", "a man"]
    free = parser.parse(sentences, constrained=False, beam=3, max_len_b=40)
    constrained = parser.parse(sentences, beam=3, max_len_b=40)
    assert sum(r.repaired for r in free) > 0  # random weights: free decoding needs repairs
    assert [r.repaired for r in constrained] == [False] * len(sentences)
    for r, s in zip(constrained, sentences):
        assert r.tree is not None and r.tree.leaves() == s.split()


@pytest.fixture(scope="module")
def parsing_checkpoint_for_constraints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from aiayn.checkpoint.directory import save_checkpoint
    from aiayn.config import Config, model_preset
    from aiayn.data.trees import linearize, parse_tree
    from aiayn.model import build_model
    from aiayn.text.tokenizer import train_tokenizer

    gold = [parse_tree(t) for t in (
        "(S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) (. .))",
        "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))",
        "(S (NP (PRP He)) (VP (VBD said) (SBAR (S (NP (PRP it)) (VP (VBD rained))))) (. .))",
        "(NP (NP (DT a) (NN man)) (PP (IN with) (NP (DT a) (NN dog))))")]
    root = tmp_path_factory.mktemp("constraints")
    tok = train_tokenizer([" ".join(t.leaves()) for t in gold] * 20, [" ".join(linearize(t)) for t in gold] * 20,
                          root / "spm", vocab_size=60, joint=False, model_type="bpe", tgt_model_type="word",
                          num_threads=1)
    cfg = Config(model=model_preset("tiny", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                                    share_embeddings="decoder", max_positions=128),
                 decode=DecodeConfig(batch_tokens=64))
    torch.manual_seed(0)
    return save_checkpoint(root / "ckpt", build_model(cfg.model).eval(), cfg, tokenizer=tok, state={"step": 1})


def test_a_dead_row_extended_by_illegal_tokens_keeps_a_valid_state() -> None:
    state = TreeGrammar(VOCAB, [2], max_depth=3).start(torch.tensor([0]), torch.tensor([10]))
    close = torch.tensor([PIECES.index(")S")])
    for _ in range(10):  # closings with nothing open: what a dead beam may be extended by
        state.advance(close)
    opening = torch.tensor([PIECES.index("(NP")])
    for _ in range(10):  # more openings than max_depth
        state.advance(opening)
    lprobs = torch.zeros(1, len(PIECES))
    state.mask(lprobs, 0)  # no IndexError
    assert int(state.depth[0]) == 3


def test_tree_vocab_from_pieces() -> None:
    # Labels sorted (NP before S); the word-boundary mark is ignored; "(" and ")" alone,
    # a bracket without its partner, and the word piece are no labels.
    pieces = ["<pad>", "<unk>", "<s>", "</s>", "\u2581XX", "\u2581(S", ")S", "(NP", "\u2581)NP", "(", ")", "(VP",
              ")PP", "dog"]
    assert TreeVocab.from_pieces(pieces, "XX", EOS_ID) == TreeVocab((7, 5), (8, 6), 4, EOS_ID, 14)
    assert VOCAB == TreeVocab((7, 5), (8, 6), 4, EOS_ID, len(PIECES))


@pytest.mark.parametrize("pieces", [
    ["<pad>", "<unk>", "<s>", "</s>", "hello"],  # no brackets, no placeholder
    ["<pad>", "<unk>", "<s>", "</s>", "(S", ")S"],  # brackets without the placeholder
    ["<pad>", "<unk>", "<s>", "</s>", "XX", "(S", ")NP"],  # no label with both brackets
])
def test_a_vocabulary_without_every_tree_symbol_is_refused(pieces: list[str]) -> None:
    with pytest.raises(ValueError, match=r"^the target vocabulary has no tree symbols \('XX', '\(X', '\)X'\)$"):
        TreeVocab.from_pieces(pieces, "XX", EOS_ID)


def test_word_ids_error_message() -> None:
    with pytest.raises(ValueError, match=r"^word_ids must hold one id per word of each sentence$"):
        TreeGrammar(VOCAB, [1, 2], word_ids=[[9], [9]])


def test_slots_hold_each_sentences_words_and_a_spare_placeholder_column() -> None:
    assert torch.equal(TreeGrammar(VOCAB, [2, 1]).slots, torch.tensor([[4, 4, 4], [4, 4, 4]]))
    spelled = TreeGrammar(VOCAB, [2, 1], word_ids=[[9, 4], [9]])
    assert torch.equal(spelled.slots, torch.tensor([[9, 4, 4], [9, 4, 4]]))
    assert torch.equal(spelled.n_words, torch.tensor([2, 1]))
    empty = TreeGrammar(VOCAB, [])
    assert empty.n_words.dtype == empty.slots.dtype == torch.long
    assert empty.n_words.tolist() == [] and empty.slots.tolist() == [] and empty.slots.shape == (0, 1)


def _legal(n_words: int, prefix: list[str], max_len: int = 40, **kw) -> dict[str, float]:
    """The tokens left legal (with their scores) after ``prefix`` was advanced, token by token."""
    state = TreeGrammar(VOCAB, [n_words], **kw).start(torch.tensor([0]), torch.tensor([max_len]))
    for piece in prefix:
        state.advance(torch.tensor([PIECES.index(piece)]))
    lprobs = (-torch.arange(1.0, len(PIECES) + 1))[None].log_softmax(-1)
    before = lprobs.clone()
    state.mask(lprobs, len(prefix))
    legal = {PIECES[i]: float(lprobs[0, i]) for i in range(len(PIECES)) if lprobs[0, i] > -math.inf}
    for piece, score in legal.items():
        if not (kw.get("any_word") and piece not in ("(S", ")S", "(NP", ")NP", "</s>")):
            assert score == float(before[0, PIECES.index(piece)])
    return legal


@pytest.mark.parametrize(("n_words", "prefix", "kw", "legal"), [
    (3, [], dict(max_len=5), {"(S", "(NP"}),  # the tightest bound: (S XX XX XX )S
    (3, [], dict(max_len=4), set()),  # too short for any tree
    (2, ["(S", "(NP"], dict(max_len=5), set()),  # out of room (a dead row): nothing fits
    (2, ["(S", "(NP"], dict(max_depth=2), {"XX"}),  # at max_depth: no opening; NP empty: no closing
    (2, ["(S", "(NP", "XX"], {}, {"(S", "(NP", "XX", ")NP"}),  # an inner bracket closes with words left
    (1, ["(S", "XX"], {}, {")S"}),  # the root closes once every word is placed
    (1, ["(S", "XX", ")S"], {}, {"</s>"}),
    (1, ["(S", "XX", "dog"], {}, {")S"}),  # a stray token leaves the root filled
    (2, ["(S", "(NP", "dog"], dict(max_depth=2), {"XX"}),  # ... and does not fill an empty bracket
    (1, ["(S", "XX", "XX"], {}, {")S"}),  # an XX past the last word places nothing
    (2, ["(S", "(NP", "XX", ")NP", "XX"], dict(max_depth=2), {")S"}),  # the root's label survives max_depth
    (70, ["(S"] + ["(NP"] * 63, dict(max_len=200), {"XX"}),  # max_depth defaults to 64
    (70, ["(S"] + ["(NP"] * 62, dict(max_len=200), {"XX", "(S", "(NP"}),
])
def test_legal_next_tokens(n_words: int, prefix: list[str], kw: dict, legal: set[str]) -> None:
    assert set(_legal(n_words, prefix, **kw)) == legal


def test_a_spelled_word_is_scored_by_its_own_probability_unless_any_word() -> None:
    own = _legal(1, ["(S"], word_ids=[[9]])
    assert set(own) == {"(S", "(NP", "dog"}
    lprobs = (-torch.arange(1.0, len(PIECES) + 1)).log_softmax(-1)
    assert own["dog"] == float(lprobs[9])
    anyw = _legal(1, ["(S"], word_ids=[[9]], any_word=True)
    # the words: <unk>, XX and dog (the specials and tree symbols are not)
    assert anyw["dog"] == pytest.approx(float(torch.logsumexp(lprobs[[1, 4, 9]], 0)), abs=1e-6)


def test_any_word_with_unnormalised_scores_keeps_the_word_score() -> None:
    # Scores that are not log-probabilities (the symbols' mass above 1): the word mass
    # 1 - exp(rest) is clamped at 0, so the word keeps its own score (no NaN).
    state = TreeGrammar(VOCAB, [1], word_ids=[[9]], any_word=True).start(torch.tensor([0]), torch.tensor([9]))
    state.advance(torch.tensor([PIECES.index("(S")]))
    lprobs = torch.zeros(1, len(PIECES))
    state.mask(lprobs, 1)
    assert float(lprobs[0, 9]) == 0.0


def test_the_state_lives_on_max_len_s_device() -> None:
    # "meta" stands for an accelerator. (Only start: the first mask or advance on "meta" imports
    # torch._dynamo, seconds.)
    con = TreeGrammar(VOCAB, [2, 1], word_ids=[[9, 4], [9]], any_word=True)
    state = con.start(torch.tensor([0, 1]), torch.tensor([10, 10], device="meta"))
    devices = {name: v.device.type for name, v in vars(state).items() if isinstance(v, torch.Tensor)}
    assert len(devices) == 13 and set(devices.values()) == {"meta"}, devices


def test_the_state_ignores_the_default_device() -> None:
    con = TreeGrammar(VOCAB, [2], any_word=True)
    sent, max_len = torch.tensor([0]), torch.tensor([8])
    tokens = [torch.tensor([PIECES.index(p)]) for p in ["(S", "(NP", "XX", ")NP", "XX"]]
    lprobs = torch.zeros(1, len(PIECES))

    def run() -> torch.Tensor:
        state, seen = con.start(sent, max_len), []
        for t, tok in enumerate(tokens):
            scores = lprobs.clone()
            state.mask(scores, t)
            seen.append(scores)
            state.advance(tok)
        scores = lprobs.clone()
        state.mask(scores, len(tokens))
        return torch.cat([*seen, scores])

    ref = run()
    with torch.device("meta"):
        out = run()
    assert out.device.type == "cpu" and torch.equal(out, ref)
