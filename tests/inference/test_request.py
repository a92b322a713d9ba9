"""A translation request and its encoding (aiayn.inference.request): validation when it is made,
the one length rule, terminology as pieces checked against the length bound, and batching by
padded source tokens. A scripted tokenizer makes every id known."""

from __future__ import annotations

import logging

import pytest

from aiayn.config import DecodeConfig
from aiayn.errors import ConfigError, ConstraintError, DataError
from aiayn.inference.request import (
    EncodedSentence,
    SourceLimits,
    SourceTooLong,
    TranslationRequest,
    batches,
    check_source_length,
    encode_request,
)
from aiayn.inference.terms import SentenceConstraints
from aiayn.vocab import EOS_ID, UNK_ID

WORDS = {"a": 10, "red": 11, "dog": 12, "ball": 13, "Hund": 20, "roten": 21, "Ball": 22, "der": 23}


class Words:
    """Each word is one id (unknown words UNK); sources end with EOS."""

    def encode_src_batch(self, texts: list[str], num_threads: int = 1) -> list[list[int]]:
        return [[WORDS.get(w, UNK_ID) for w in t.split()] + [EOS_ID] for t in texts]

    def encode_tgt(self, text: str) -> list[int]:
        return [WORDS.get(w, UNK_ID) for w in text.split()]


NO_LIMITS = SourceLimits(None, None)


def test_a_request_checks_its_per_text_lists_and_normalizes_constraints() -> None:
    with pytest.raises(ConfigError, match=r"^prefixes: 1 given for 2 texts$"):
        TranslationRequest(["a", "b"], prefixes=["x"])
    with pytest.raises(ConfigError, match=r"^sources: 3 given for 2 texts$"):
        TranslationRequest(["a", "b"], sources=[[1], [2], [3]])
    with pytest.raises(ConfigError, match=r"^constraints: lexical constraints cannot be combined with another "
                                          r"constraint$"):
        TranslationRequest(["a"], constraints=[["Hund"]], grammar=lambda batch: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(DataError, match=r"constraints: 1 entries for 2 texts"):
        TranslationRequest(["a", "b"], constraints=[["Hund"]])
    request = TranslationRequest(["a", "b"], constraints=[["Hund"], {"exclude": ["der"]}])
    assert request.sentence_constraints(0) == SentenceConstraints(("Hund",), ())
    assert request.sentence_constraints(1) == SentenceConstraints((), ("der",))
    assert TranslationRequest(["a"]).sentence_constraints(0) == SentenceConstraints()


def test_the_length_rule_cuts_with_a_warning_or_refuses(caplog) -> None:
    ids = [1, 2, 3, 4, 5, EOS_ID]
    cut = TranslationRequest(["x"], first_number=7)
    assert check_source_length(ids, 0, None, cut) == ids
    assert check_source_length(ids, 0, 6, cut) == ids
    assert check_source_length(ids, 0, 6, TranslationRequest(["x"], truncate=False)) == ids  # exactly the limit
    with caplog.at_level(logging.WARNING):
        assert check_source_length(ids, 2, 4, cut) == [1, 2, 3, EOS_ID]
    assert caplog.messages == ["sentence 9: 6 source tokens, truncated to the model's 4 positions"]
    with pytest.raises(SourceTooLong) as refused:
        check_source_length(ids, 2, 5, TranslationRequest(["x"], truncate=False))
    assert (refused.value.index, refused.value.length, refused.value.limit) == (2, 6, 5)
    assert str(refused.value) == "texts[2]: 6 source tokens (with EOS); the model has 5 positions"


def test_encoding_skips_empty_texts_and_takes_given_sources() -> None:
    tok = Words()
    request = TranslationRequest(["a red dog", "  ", "dog"], prefixes=[None, "x", "der Hund"])
    got = encode_request(request, tok, tok, NO_LIMITS)
    assert [(s.index, s.source, s.prefix) for s in got] == [(0, [10, 11, 12, EOS_ID], []),
                                                           (2, [12, EOS_ID], [23, 20])]
    given = TranslationRequest(["a red dog", "", "dog"], sources=[[99, EOS_ID], [], [98, EOS_ID]])
    assert [s.source for s in encode_request(given, tok, tok, NO_LIMITS)] == [[99, EOS_ID], [98, EOS_ID]]


def test_phrases_become_pieces_and_what_cannot_be_met_is_refused_or_dropped(caplog) -> None:
    tok = Words()
    cfg = DecodeConfig(max_len_a=0.0, max_len_b=4)
    strict = TranslationRequest(["a dog"], cfg, constraints=[{"include": ["roten Ball"], "exclude": ["der"]}])
    [sentence] = encode_request(strict, tok, tok, NO_LIMITS)
    assert (sentence.include, sentence.exclude, sentence.constrained) == ([[21, 22]], [[23]], True)
    for phrase, reason in [("Katze", "the target vocabulary cannot spell it"),
                           ("der Hund", "contains the excluded phrase 'der'"),
                           ("Hund der", "contains the excluded phrase 'der'")]:
        bad = TranslationRequest(["a dog"], cfg, constraints=[{"include": [phrase], "exclude": ["der"]}])
        with pytest.raises(ConstraintError, match=reason):
            encode_request(bad, tok, tok, NO_LIMITS)
    # The bound (0 x |x| + 4, less a 2-piece prefix) leaves 2 pieces: 3 are refused, or dropped.
    long = dict(prefixes=["der Hund"], constraints=[["roten Ball Hund"]])
    with pytest.raises(ConstraintError, match=r"^texts\[0\]: the constraints need 3 target pieces; .* leaves 2$"):
        encode_request(TranslationRequest(["a dog"], cfg, **long), tok, tok, NO_LIMITS)
    with caplog.at_level(logging.WARNING):
        [kept] = encode_request(TranslationRequest(["a dog"], cfg, best_effort=True, first_number=5, **long),
                                tok, tok, NO_LIMITS)
    assert kept.include == [] and not kept.constrained
    assert caplog.messages == ["sentence 5: the constraints need 3 target pieces; the length bound (max_len_a x "
                               "source length + max_len_b, less any prefix) leaves 2; translated without them"]
    # Exactly the room the bound leaves is enough; a prefix longer than the bound leaves none,
    # which excluded phrases do not need.
    exact = encode_request(TranslationRequest(["a dog"], cfg, prefixes=["der Hund"], constraints=[["roten Ball"]]),
                           tok, tok, NO_LIMITS)
    assert exact[0].include == [[21, 22]]
    short = DecodeConfig(max_len_a=0.0, max_len_b=1)
    [excluding] = encode_request(TranslationRequest(["a dog"], short, prefixes=["der Hund"],
                                                    constraints=[{"exclude": ["Ball"]}]), tok, tok, NO_LIMITS)
    assert (excluding.include, excluding.exclude) == ([], [[22]])
    # The model's decoder steps bound the output too (one step stays for EOS).
    fits = TranslationRequest(["a dog"], cfg, constraints=[["roten Ball"]])
    with pytest.raises(ConstraintError, match="leaves 1$"):
        encode_request(fits, tok, tok, SourceLimits(None, 2))


def test_a_phrase_dropped_with_best_effort_is_named_in_one_warning(caplog) -> None:
    """The warning names the sentence's line and the phrase, quoted and cut to 60 characters."""
    tok = Words()
    sixty, longer = "x" * 60, "y" * 61
    for phrase, quoted in [("Katze", "'Katze'"), (sixty, repr(sixty)), (longer, repr("y" * 60 + "..."))]:
        caplog.clear()
        request = TranslationRequest(["a dog"], best_effort=True, first_number=3, constraints=[[phrase]])
        with caplog.at_level(logging.WARNING):
            [sentence] = encode_request(request, tok, tok, NO_LIMITS)
        assert sentence.include == []
        assert caplog.messages == [f"sentence 3: constraint {quoted}: the target vocabulary cannot spell it (an "
                                   f"unknown piece); translated without it"]


def test_batches_hold_longest_first_within_the_padded_budget_costliest_first() -> None:
    sentences = [EncodedSentence(i, [1] * n) for i, n in enumerate([3, 7, 2, 7, 5, 20])]
    got = [[s.index for s in batch] for batch in batches(sentences, 15)]
    # 20 alone (over the budget); 7 + 7 = 14; then 5, 3, 2 padded to 5: 15. Estimated steps:
    # 3 x (5 + 7) = 36, 2 x (7 + 7) = 28, 1 x (20 + 7) = 27, in that order.
    assert got == [[4, 0, 2], [1, 3], [5]]
    # equal estimates keep the longest-first order: 2 x (1 + 7) = 1 x (9 + 7); one step more
    # for the two short ones puts them first: 2 x (1 + 7) > 1 x (8 + 7)
    for longest, expected in [(9, [[1], [0, 2]]), (8, [[0, 2], [1]])]:
        pair = [EncodedSentence(0, [1]), EncodedSentence(1, [1] * longest), EncodedSentence(2, [1])]
        assert [[s.index for s in batch] for batch in batches(pair, longest)] == expected
    assert batches([], 10) == []
