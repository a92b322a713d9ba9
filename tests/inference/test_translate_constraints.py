"""Terminology through the Python API and `aiayn translate`, on the tiny checkpoint (a real
SentencePiece model, random weights): the phrases appear in every output, excluded ones
never, and bad constraint files get one line naming file:line."""

from __future__ import annotations

import gzip
import json
import pickle
import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.tiny_world import WORDS, WORDS_DE

from aiayn.errors import ConstraintError, DataError
from aiayn.inference.terms import (
    MAX_PHRASE_CHARS,
    MAX_PHRASES,
    SentenceConstraints,
    TermDictionary,
    parse_constraints_line,
    read_constraints,
)
from aiayn.inference.translator import Translator


@pytest.fixture(scope="module")
def translator(tiny_checkpoint: Path) -> Translator:
    return Translator.from_checkpoint(tiny_checkpoint)


def _pieces_in(tokens: list[int], part: list[int]) -> bool:
    return any(tokens[k:k + len(part)] == part for k in range(len(tokens) - len(part) + 1))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(WORDS), min_size=2, max_size=8),
       include=st.lists(st.lists(st.sampled_from(WORDS_DE), min_size=1, max_size=2), min_size=1, max_size=2),
       exclude=st.sampled_from(WORDS_DE), beam=st.sampled_from([1, 3]), sampling=st.booleans())
def test_every_phrase_appears_and_no_excluded_one(translator: Translator, words, include, exclude, beam: int,
                                                  sampling: bool) -> None:
    phrases = [" ".join(p) for p in include]
    excluded = [exclude] if all(exclude not in p for p in include) else []
    result = translator.translate_detailed([" ".join(words)], constraints=[{"include": phrases, "exclude": excluded}],
                                           beam=beam, sampling=sampling, max_len_b=10)[0]
    tok = translator.tokenizer
    assert result.hypotheses
    for hyp in result.hypotheses:
        for phrase in phrases:
            assert _pieces_in(hyp.tokens, tok.encode_tgt(phrase))
            assert phrase in hyp.text
        for phrase in excluded:
            assert not _pieces_in(hyp.tokens, tok.encode_tgt(phrase))


def test_api_forms_and_unconstrained_texts(translator: Translator) -> None:
    texts = ["a man is riding a bike", "a dog on the street"]
    plain = translator.translate(texts)
    got = translator.translate(texts, constraints=[["fahrrad", "rot ball"], None])
    assert got[1] == plain[1]  # no constraint: unchanged
    assert "fahrrad" in got[0] and "rot ball" in got[0]
    same = translator.translate(texts, constraints=[SentenceConstraints(("fahrrad", "rot ball")), []])
    assert same == got


def test_a_constraint_that_cannot_fit_is_an_error_or_dropped(translator: Translator, caplog) -> None:
    long = " ".join(["fahrrad"] * 12)
    with pytest.raises(ConstraintError, match=r"texts\[0\]: the constraints need \d+ target pieces"):
        translator.translate(["a man"], constraints=[[long]], max_len_b=3)
    assert translator.translate(["a man"], constraints=[[long]], constraints_best_effort=True, max_len_b=3) \
        == translator.translate(["a man"], max_len_b=3)
    assert "translated without them" in caplog.text
    with pytest.raises(ConstraintError, match="contains the excluded phrase 'rot'"):
        translator.translate(["a man"], constraints=[{"include": ["rot ball"], "exclude": ["rot"]}])
    with pytest.raises(DataError, match=r"constraints: 1 entries for 2 texts"):
        translator.translate(["a", "b"], constraints=[["x"]])
    with pytest.raises(DataError, match=r"constraints\[0\]\[0\]: an empty phrase"):
        translator.translate(["a"], constraints=[["  "]])


@pytest.mark.parametrize("line,expected", [
    ("", SentenceConstraints()),
    ("null", SentenceConstraints()),
    ('["Hund", "roten  Ball", "Hund"]', SentenceConstraints(("Hund", "roten Ball"))),
    ('{"include": ["a"], "exclude": ["b", "c"]}', SentenceConstraints(("a",), ("b", "c"))),
    ('{"exclude": ["b"]}', SentenceConstraints((), ("b",))),
])
def test_constraints_lines(line: str, expected: SentenceConstraints) -> None:
    assert parse_constraints_line(line, "f:1") == expected


@pytest.mark.parametrize("line,message", [
    ("[Hund]", "f:3: not JSON"),
    ('"Hund"', "f:3: constraints: expected a list of phrases or an object"),
    ('[1]', r"f:3: constraints\[0\]: expected a string, got int"),
    ('{"include": ["a"], "excluded": []}', "f:3: constraints: unknown key 'excluded'"),
    ('{"include": "a"}', "f:3: constraints.include: expected a list of phrases"),
])
def test_bad_constraints_lines(line: str, message: str) -> None:
    with pytest.raises(DataError, match=message):
        parse_constraints_line(line, "f:3")


NOT_JSON = ("not JSON (Expecting value at column 1); write a list of phrases, e.g. [\"Hund\", \"roten Ball\"], "
            "or {\"include\": [...], \"exclude\": [...]}")


def test_read_constraints(tmp_path: Path) -> None:
    path = tmp_path / "cons.jsonl"
    path.write_text(' ["Hund", "roten  Ball"] \n\nnull\n{"include": ["a"], "exclude": ["b"]}\n', encoding="utf-8")
    expected = [SentenceConstraints(("Hund", "roten Ball")), SentenceConstraints(), SentenceConstraints(),
                SentenceConstraints(("a",), ("b",))]
    assert list(read_constraints(path)) == expected
    packed = tmp_path / "cons.jsonl.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert list(read_constraints(str(packed))) == expected


def test_read_constraints_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "cons.jsonl"
    path.write_bytes(b'["a"]\n\xff\n["b"]\n')
    with pytest.raises(DataError) as exc:
        list(read_constraints(path))
    assert str(exc.value) == f"{path}:2: invalid UTF-8 at byte 0 of the line (byte 6 of the file): invalid start byte"
    assert list(read_constraints(path, "skip")) == [SentenceConstraints(("a",)), SentenceConstraints(),
                                                    SentenceConstraints(("b",))]
    with pytest.raises(DataError) as exc:
        list(read_constraints(path, "replace"))
    assert str(exc.value) == f"{path}:2: {NOT_JSON}"
    path.write_text('["a"]\n\n[1]\n', encoding="utf-8")
    with pytest.raises(DataError) as exc:
        list(read_constraints(path))
    assert str(exc.value) == f"{path}:3: constraints[0]: expected a string, got int"


def test_term_dictionary(tmp_path: Path) -> None:
    path = tmp_path / "terms.tsv"
    path.write_text("# source\ttarget\nred ball\troten Ball\ndog\tHund\nball\tBall\n\n", encoding="utf-8")
    terms = TermDictionary.load(path)
    assert terms.constraints("A Dog chases the red  ball.") == SentenceConstraints(("Hund", "roten Ball"))
    assert terms.constraints("hotdogs and balls") == SentenceConstraints()
    for text, message in [("dog\n", "terms.tsv:1: expected 'source<TAB>target' .* got 1 field$"),
                          ("dog\tHund\tx\n", "terms.tsv:1: .* got 3 fields"),
                          ("dog\tHund\nDog\tKöter\n", "terms.tsv:2: 'Dog' is also given on line 1")]:
        path.write_text(text, encoding="utf-8")
        with pytest.raises(DataError, match=message):
            TermDictionary.load(path)



def _refusal(line: str) -> str:
    with pytest.raises(DataError) as caught:
        parse_constraints_line(line, "f:1")
    return str(caught.value)


def test_constraint_lines_are_bounded_exactly_at_the_limits() -> None:
    """As many phrases and characters as the limits allow are read; one more is refused, in
    one line naming the limit."""
    words = [f"w{i}" for i in range(MAX_PHRASES + 1)]
    assert len(parse_constraints_line(json.dumps(words[:-1]), "f:1").include) == MAX_PHRASES
    assert _refusal(json.dumps(words)) == (
        f"f:1: constraints: {MAX_PHRASES + 1} phrases; at most {MAX_PHRASES} per sentence")
    longest = "a" * MAX_PHRASE_CHARS
    assert parse_constraints_line(json.dumps({"exclude": [longest]}), "f:1").exclude == (longest,)
    assert _refusal(json.dumps({"exclude": ["b", longest + "a"]})) == (
        f"f:1: constraints.exclude[1]: a phrase of {MAX_PHRASE_CHARS + 1} characters; at most {MAX_PHRASE_CHARS}")


@pytest.mark.parametrize("code", [0xD800, 0xDBFF, 0xDC00, 0xDFFF])
def test_a_lone_surrogate_is_refused_and_its_neighbours_are_text(code: int) -> None:
    assert _refusal(json.dumps(["Hund", "rot" + chr(code)])) == (
        f"f:1: constraints[1]: a lone surrogate (U+{code:04X}), not text; write the character itself or its "
        "surrogate pair")
    for text in (chr(0xD7FF), chr(0xE000), "\U0001F415"):
        assert parse_constraints_line(json.dumps([text]), "f:1").include == (text,)


def test_json_too_deep_or_too_long_a_number_is_one_line() -> None:
    assert _refusal("[" * 100_000) == ('f:1: JSON nested too deeply; a constraint is a list of phrases or an object '
                                       '{"include": [...], "exclude": [...]}')
    assert _refusal("[" + "9" * 5000 + "]") == (f"f:1: a number of more than {sys.get_int_max_str_digits()} digits; "
                                                "a constraint holds phrases (JSON strings)")


def test_a_term_is_bounded_exactly_at_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "terms.tsv"
    longest = "a" * MAX_PHRASE_CHARS
    path.write_text(f"dog\t{longest}\n", encoding="utf-8")
    assert TermDictionary.load(path).constraints("a dog") == SentenceConstraints((longest,))
    path.write_text(f"dog\tHund\n{longest}b\tx\n", encoding="utf-8")
    with pytest.raises(DataError) as caught:
        TermDictionary.load(path)
    assert str(caught.value) == f"{path}:2: a term of {MAX_PHRASE_CHARS + 1} characters; at most {MAX_PHRASE_CHARS}"

# --------------------------------------------------------------------------- CLI


def test_cli_constraints_and_terms(tiny_checkpoint: Path, tmp_path: Path, run_cli) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a man is riding a bike\n\na dog on the street\n", encoding="utf-8")
    cons = tmp_path / "cons.jsonl"
    cons.write_text('["fahrrad"]\n\n{"include": ["hund"], "exclude": ["straße"]}\n', encoding="utf-8")
    terms = tmp_path / "terms.tsv"
    terms.write_text("street\tpark\n", encoding="utf-8")
    base = ["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(src), "-q", "--beam", "3"]
    code, out, err = run_cli(base + ["--constraints", str(cons), "--terms", str(terms)])
    assert code == 0, err
    lines = out.decode().split("\n")[:-1]
    assert len(lines) == 3 and lines[1] == ""
    assert "fahrrad" in lines[0]
    assert "hund" in lines[2] and "park" in lines[2] and "straße" not in lines[2]


def test_cli_bad_constraint_rows(tiny_checkpoint: Path, tmp_path: Path, run_cli, caplog) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a man\na dog\n", encoding="utf-8")
    base = ["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(src), "-q"]
    cases = [('["x"]\n[oops\n', "cons.jsonl:2: not JSON"),
             ('["x"]\n', "cons.jsonl: 1 lines, but .*in.txt has 2"),
             ('[]\n["' + " ".join(["fahrrad"] * 30) + '"]\n', r"in.txt:2: the constraints need \d+ target pieces")]
    for text, message in cases:
        cons = tmp_path / "cons.jsonl"
        cons.write_text(text, encoding="utf-8")
        code, out, err = run_cli(base + ["--constraints", str(cons)])
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert re.search(message, err), err
    code, out, err = run_cli(base + ["--constraints", str(cons), "--constraints-best-effort"])
    assert code == 0 and "sentence 2: the constraints need" in caplog.text and len(out.decode().split("\n")) == 3
    terms = tmp_path / "terms.tsv"
    terms.write_text("man\n", encoding="utf-8")
    code, out, err = run_cli(base + ["--terms", str(terms)])
    assert code == 2 and "terms.tsv:1: expected 'source<TAB>target'" in err


# --------------------------------------------------------------------------- terms: exact messages, merging,
# the term dictionary's matching and file format


def test_coerce_messages_name_where_and_what() -> None:
    cases = [(5, "constraints: expected a list of phrases or an object with 'include'/'exclude', got int"),
             ({"include": "Hund"}, "constraints.include: expected a list of phrases, got str"),
             ({"exclude": [1]}, "constraints.exclude[0]: expected a string, got int"),
             ({"include": ["a"], "exclude": ("b", " ")}, "constraints.exclude[1]: an empty phrase")]
    for value, message in cases:
        with pytest.raises(ValueError) as err:
            SentenceConstraints.coerce(value)
        assert str(err.value) == message
    with pytest.raises(ValueError) as err:
        SentenceConstraints.coerce(3.5, "texts[2]")
    assert str(err.value) == "texts[2]: expected a list of phrases or an object with 'include'/'exclude', got float"


def test_a_list_is_include_phrases_only_whatever_the_class_defaults() -> None:
    """coerce of a list gives no exclude phrase, also on a subclass whose exclude default is not empty."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Guarded(SentenceConstraints):
        exclude: tuple[str, ...] = ("never",)

    assert Guarded.coerce(["a", "b"]) == Guarded(("a", "b"), ())
    assert Guarded.coerce({"include": ["a"]}) == Guarded(("a",), ())


def test_a_line_that_is_not_json_says_what_to_write() -> None:
    with pytest.raises(DataError) as err:
        parse_constraints_line("[Hund]", "f:3")
    assert str(err.value) == ('f:3: not JSON (Expecting value at column 2); write a list of phrases, '
                              'e.g. ["Hund", "roten Ball"], or {"include": [...], "exclude": [...]}')


def test_merged_keeps_both_includes_and_both_excludes_each_once() -> None:
    one = SentenceConstraints(("a", "b"), ("x",))
    other = SentenceConstraints(("b", "c"), ("y", "x"))
    assert one.merged(other) == SentenceConstraints(("a", "b", "c"), ("x", "y"))
    assert SentenceConstraints().merged(SentenceConstraints((), ("z",))) == SentenceConstraints((), ("z",))


def test_term_dictionary_prefers_the_longer_term_at_the_same_place() -> None:
    for terms in ({"new": "neu", "new york": "New York"}, {"new york": "New York", "new": "neu"}):
        dictionary = TermDictionary(terms)
        assert dictionary.constraints("in New  York") == SentenceConstraints(("New York",))
        assert dictionary.constraints("a new car") == SentenceConstraints(("neu",))
        assert dictionary.constraints("new cars in new york") == SentenceConstraints(("neu", "New York"))


def test_an_empty_term_dictionary_finds_nothing_in_any_text() -> None:
    dictionary = TermDictionary({})
    for text in ("", " ", "a, b", "Hund"):
        assert dictionary.constraints(text) == SentenceConstraints()


def test_term_dictionary_file_format(tmp_path: Path) -> None:
    """Comment lines (also indented, also with a tab) and empty lines are skipped; each of the
    two fields must be non-empty; only the line ending is stripped before the fields are split."""
    path = tmp_path / "terms.tsv"
    path.write_text("# terms\n  # source\ttarget\n\ndog\tHund\r\n  red   ball \t roten Ball\n", encoding="utf-8")
    terms = TermDictionary.load(path)
    assert terms.terms == {"dog": "Hund", "red ball": "roten Ball"}
    assert terms.constraints("# source, the dog") == SentenceConstraints(("Hund",))
    expected = ":1: expected 'source<TAB>target' (two non-empty fields), got "
    for text, fields in [("\tHund\n", "2 fields"), ("dog\t \n", "2 fields"), ("dog\tHund\t\n", "3 fields")]:
        path.write_text(text, encoding="utf-8")
        with pytest.raises(DataError) as err:
            TermDictionary.load(path)
        assert str(err.value) == f"{path}{expected}{fields}"


def test_term_dictionary_invalid_utf8_as_asked(tmp_path: Path) -> None:
    path = tmp_path / "terms.tsv"
    path.write_bytes(b"dog\tHund\nca\xfft\tKatze\n")
    with pytest.raises(DataError, match="terms.tsv"):
        TermDictionary.load(path)
    assert TermDictionary.load(path, on_invalid_utf8="replace").terms == {"dog": "Hund", "ca\ufffdt": "Katze"}
    assert TermDictionary.load(path, on_invalid_utf8="skip").terms == {"dog": "Hund"}


def test_constraints_list_wants_one_entry_per_text() -> None:
    from aiayn.inference.terms import constraints_list

    assert constraints_list([None, ["a"]], 2) == [SentenceConstraints(), SentenceConstraints(("a",))]
    for values, n, message in [("ab", 2, "constraints: expected one entry per text, got str"),
                               (b"ab", 2, "constraints: expected one entry per text, got bytes"),
                               ((v for v in [None]), 1, "constraints: expected one entry per text, got generator"),
                               ([None], 2, "constraints: 1 entries for 2 texts; give one per text (None for none)"),
                               ([None, 5], 2, "constraints[1]: expected a list of phrases or an object with "
                                              "'include'/'exclude', got int")]:
        with pytest.raises(DataError) as err:
            constraints_list(values, n)
        assert str(err.value) == message


def test_a_constraint_error_crosses_a_process_boundary_whole():
    """A decoding worker's ConstraintError reaches the caller with its index, reason and
    message, so that a command line can re-word it as FILE:LINE."""
    error = pickle.loads(pickle.dumps(ConstraintError(4, "cannot be met")))
    assert (type(error), error.index, error.reason, str(error)) == (
        ConstraintError, 4, "cannot be met", "texts[4]: cannot be met")
