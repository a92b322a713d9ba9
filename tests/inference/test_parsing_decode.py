"""Parsing as decoding (aiayn.inference.parser, `aiayn parse`): every prediction becomes a
valid tree over the input words, repairs are counted, and gold linearizations score 100 F1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aiayn.cli.main import main
from aiayn.config import Config, DecodeConfig, load_config, model_preset
from aiayn.data.trees import is_well_formed, linearize, parse_tree, tree_to_string
from aiayn.evaluation.evalb import OK, score_sentence
from aiayn.inference.parser import (
    PARSING_DECODE,
    Parser,
    ParseResult,
    parse_prepared_split,
    ptb_escape,
    score_parses,
    to_tree,
)

from .conftest import GOLD

REPO = Path(__file__).resolve().parents[2]


class FakeTranslator:
    """Returns scripted target texts: the search replaced by known outputs."""

    config = None  # no checkpoint config: a placeholder (XX) target

    def __init__(self, outputs: dict[str, str]) -> None:
        self.outputs = outputs
        self.seen: list[str] = []
        self.settings: dict = {}

    def decode_config(self, **overrides: object) -> DecodeConfig:
        return DecodeConfig(**{k: v for k, v in overrides.items() if v is not None})

    def run(self, request) -> list:
        from aiayn.inference.results import Hypothesis, TranslationResult

        cfg = request.decode
        self.seen = list(request.texts)
        self.settings = {"beam": cfg.beam, "lenpen": cfg.lenpen, "max_len_a": cfg.max_len_a, "max_len_b": cfg.max_len_b}
        return [TranslationResult(t, [Hypothesis(self.outputs.get(t, ""), [], 0.0, [], [])]) for t in request.texts]


def _assert_valid(result: ParseResult) -> None:
    assert result.tree is not None
    assert result.tree.leaves() == result.words
    # One tree that prints and reads back unchanged.
    assert tree_to_string(parse_tree(tree_to_string(result.tree))) == tree_to_string(result.tree)


def test_recipe_config_has_the_papers_parsing_settings() -> None:
    cfg = load_config(REPO / "configs" / "ptb_parsing.yaml")
    assert (cfg.decode.beam, cfg.decode.lenpen, cfg.decode.max_len_a, cfg.decode.max_len_b) == (21, 0.3, 1.0, 300)
    assert not cfg.data.joint_vocab and cfg.model.share_embeddings != "all"
    assert PARSING_DECODE == {"beam": 21, "lenpen": 0.3, "max_len_a": 1.0, "max_len_b": 300}


def test_random_model_gives_a_valid_tree_for_every_sentence(parsing_checkpoint: Path, gold_trees: list) -> None:
    parser = Parser.from_checkpoint(parsing_checkpoint)
    assert parser.decode_settings() == PARSING_DECODE
    sentences = [" ".join(t.leaves()) for t in gold_trees] + ["unseen words here ( too )", ""]
    done: list[int] = []
    # Beam 21 and alpha 0.3 as the paper; a short length limit keeps a random model quick.
    results = parser.parse(sentences, progress=done.append, max_len_b=40, constrained=False)
    assert sum(done) == len(sentences) and len(results) == len(sentences)
    for r in results[:-1]:
        _assert_valid(r)
    assert results[-2].words == ["unseen", "words", "here", "-LRB-", "too", "-RRB-"]
    assert results[-1].tree is None and results[-1].words == []
    # Random weights emit brackets at random: most outputs need repair, and it is counted.
    scores = score_parses(gold_trees, results[:len(gold_trees)])
    assert scores["repaired"] == sum(r.repaired for r in results[:len(gold_trees)]) > 0
    assert scores["parsed"] == len(gold_trees)
    assert scores == _corpus_scores(gold_trees, results[:len(gold_trees)])
    # Repaired random outputs match none of the 28 gold brackets: F1 is exactly 0 (EVALB's nan).
    assert (scores["matched"], scores["gold_brackets"], scores["f1"]) == (0, 28, 0.0)


def _corpus_scores(gold_trees: list, results: list[ParseResult]) -> dict:
    """score_parses' figures rebuilt from the sentences' own EVALB counts (score_sentence,
    checked against EVALB's output in tests/evaluation/test_evalb_reference.py): summed
    brackets, then precision, recall and F1 from the sums (0.0 where EVALB prints nan)."""
    per = [score_sentence(g, r.tree) for g, r in zip(gold_trees, results)]
    assert all(s.status == OK for s in per)
    matched, gold, test = (sum(getattr(s, k) for s in per) for k in ("matched", "gold_brackets", "test_brackets"))
    p, r = (100.0 * matched / test if test else 0.0), (100.0 * matched / gold if gold else 0.0)
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0,
            "exact_match": 100.0 * sum(s.exact for s in per) / len(per), "sentences": len(per), "skipped": 0,
            "matched": matched, "gold_brackets": gold, "test_brackets": test, "parsed": len(results),
            "repaired": sum(r.repaired for r in results)}


@pytest.fixture(scope="module")
def words_checkpoint(tmp_path_factory: pytest.TempPathFactory, gold_trees: list) -> Path:
    """Random weights, a target that spells its words (data.parsing_target: words)."""
    from aiayn.checkpoint.directory import save_checkpoint
    from aiayn.config import DataConfig
    from aiayn.model import build_model
    from aiayn.text.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("parsing-words")
    spell = {"The", "the", "a", ".", "cat"}
    words = [" ".join(t.leaves()) for t in gold_trees] * 20
    symbols = [" ".join(linearize(t, spell=spell)) for t in gold_trees] * 20
    tok = train_tokenizer(words, symbols, root / "spm", vocab_size=60, joint=False, model_type="bpe",
                          tgt_model_type="word", num_threads=1)
    cfg = Config(model=model_preset("tiny", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                                    share_embeddings="decoder", max_positions=128),
                 data=DataConfig(parsing_target="words"), decode=DecodeConfig(batch_tokens=64))
    torch.manual_seed(0)
    return save_checkpoint(root / "ckpt", build_model(cfg.model).eval(), cfg, tokenizer=tok, state={"step": 1})


@pytest.mark.parametrize("beam", [1, 5])
def test_a_words_target_parses_with_each_word_in_place(words_checkpoint: Path, gold_trees: list, beam: int) -> None:
    parser = Parser.from_checkpoint(words_checkpoint)
    assert parser.target == "words"
    sentences = [t.leaves() for t in gold_trees] + [["the", "dog", "of", "Ms.", "cat"]]
    tok = parser.translator.tokenizer
    xx = tok.tgt_pieces(range(tok.tgt_vocab_size)).index("\u2581XX")
    # Spelled words by their own id, the others (unseen or rare in training) as XX.
    assert [tok.tgt_pieces([i])[0] for i in parser._word_ids(sentences[-1], xx)] == \
        ["\u2581the", "\u2581XX", "\u2581XX", "\u2581XX", "\u2581cat"]
    results = parser.parse(sentences, beam=beam, max_len_b=40)
    for r, words in zip(results, sentences):
        assert not r.repaired and r.tree is not None and r.tree.leaves() == words
        assert is_well_formed(r.tokens, len(words))  # words read back as placeholders
    # Unconstrained, the same model's free output is read the same way (and repaired).
    free = parser.parse(sentences, beam=beam, max_len_b=40, constrained=False)
    assert all(r.tree is not None and r.tree.leaves() == w for r, w in zip(free, sentences))


def test_gold_linearizations_score_100(gold_trees: list) -> None:
    results = [to_tree(linearize(t), t.leaves()) for t in gold_trees]
    assert not any(r.repaired for r in results)
    scores = score_parses(gold_trees, results)
    assert scores["f1"] == scores["exact_match"] == 100.0
    assert scores["repaired"] == 0 and scores["sentences"] == len(gold_trees)


def test_parse_path_with_scripted_outputs(gold_trees: list, tmp_path: Path) -> None:
    outputs = {" ".join(t.leaves()): " ".join(linearize(t)) for t in gold_trees}
    fake = FakeTranslator(outputs)
    (tmp_path / "valid.gold.txt").write_text("".join(g + "\n" for g in GOLD), encoding="utf-8")
    scores, results = parse_prepared_split(Parser(fake), tmp_path, "valid",  # type: ignore[arg-type]
                                           constrained=False)
    assert scores["f1"] == 100.0 and scores["repaired"] == 0 and scores["split"] == "valid"
    assert fake.settings == PARSING_DECODE  # the paper's settings reach the search

    # Malformed outputs: unbalanced, too few/many placeholders, stray closers, <unk>.
    bad = {fake.seen[0]: "(S (NP XX XX )VP XX XX XX XX", fake.seen[1]: ")S XX ⁇ (NP XX )NP",
           fake.seen[2]: "", fake.seen[3]: "(NP XX XX XX XX XX XX XX XX XX )NP )NP )NP"}
    results = Parser(FakeTranslator(bad)).parse(fake.seen[:4], beam=2, constrained=False)  # type: ignore[arg-type]
    assert [r.repaired for r in results] == [True, True, True, True]
    for r in results:
        _assert_valid(r)
    scores = score_parses(gold_trees[:4], results)
    assert scores["repaired"] == 4
    assert scores == _corpus_scores(gold_trees[:4], results)
    # Two right, two repaired: partly right, with figures the sentences' counts give.
    mixed = {**bad, fake.seen[0]: outputs[fake.seen[0]], fake.seen[2]: outputs[fake.seen[2]]}
    results = Parser(FakeTranslator(mixed)).parse(fake.seen[:4], beam=2, constrained=False)  # type: ignore[arg-type]
    scores = score_parses(gold_trees[:4], results)
    assert scores == _corpus_scores(gold_trees[:4], results)
    # 12 of the 20 gold brackets found, 13 proposed: F1 = 2 x 12 / (20 + 13).
    assert (scores["matched"], scores["gold_brackets"], scores["test_brackets"]) == (12, 20, 13)
    assert scores["f1"] == pytest.approx(100 * 24 / 33) and scores["exact_match"] == 50.0


def test_ptb_escape() -> None:
    assert [ptb_escape(w) for w in ["(", ")", "{", "}", "a(b)", "word"]] == \
        ["-LRB-", "-RRB-", "-LCB-", "-RCB-", "a-LRB-b-RRB-", "word"]


def test_parse_cli(parsing_checkpoint: Path, gold_trees: list, tmp_path: Path, capsys) -> None:
    words = tmp_path / "words.txt"
    words.write_text("".join(" ".join(t.leaves()) + "\n" for t in gold_trees[:3]) + "\n", encoding="utf-8")
    out = tmp_path / "trees.txt"
    with pytest.raises(SystemExit) as exc:
        main(["parse", "--checkpoint", str(parsing_checkpoint), "--input", str(words), "--output", str(out),
              "--beam", "3", "--max-len-b", "20", "--quiet"])
    assert exc.value.code == 0
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 5 and lines[3] == "" and lines[4] == ""  # empty input line -> empty line
    for line, tree in zip(lines[:3], gold_trees):
        assert parse_tree(line).leaves() == tree.leaves()

    gold = tmp_path / "gold.txt"
    gold.write_text("".join(g + "\n" for g in GOLD[:3]), encoding="utf-8")
    words.write_text("".join(" ".join(t.leaves()) + "\n" for t in gold_trees[:3]), encoding="utf-8")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["parse", "--checkpoint", str(parsing_checkpoint), "--input", str(words), "--gold", str(gold),
              "--beam", "2", "--max-len-b", "20", "--json", "--quiet"])
    assert exc.value.code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["parsed"] == 3 and report["repaired"] == 0  # constrained: nothing to repair
    parser = Parser.from_checkpoint(parsing_checkpoint)
    again = score_parses(gold_trees[:3], parser.parse([" ".join(t.leaves()) for t in gold_trees[:3]], beam=2,
                                                      max_len_b=20))
    assert {k: report[k] for k in again} == again  # the CLI reports the scorer's figures

    with pytest.raises(SystemExit) as exc:
        main(["parse", "--checkpoint", str(parsing_checkpoint), "--input", str(words), "--prepared", str(tmp_path)])
    assert exc.value.code == 2
    assert "either --prepared" in capsys.readouterr().err


def _parse_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["parse", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_parse_reads_stdin_and_escapes_brackets(parsing_checkpoint: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import io
    import sys

    stdin = io.TextIOWrapper(io.BytesIO(b"a ( b )\n\nMs. Haag plays\n"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    code, out, err = _parse_cli(["--checkpoint", str(parsing_checkpoint), "--beam", "2", "--quiet"], capsys)
    assert code == 0, err
    lines = out.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    assert parse_tree(lines[0]).leaves() == ["a", "-LRB-", "b", "-RRB-"]
    assert parse_tree(lines[2]).leaves() == ["Ms.", "Haag", "plays"]


@pytest.mark.parametrize(("line", "flags", "message"), [
    (" ".join(["word"] * 200), [], "200 words make"),  # the fixture's model has 128 positions
    ("a a a", ["--max-len-a", "1", "--max-len-b", "0"], "3 words need a tree of at least 5 tokens"),
])
def test_a_sentence_the_model_cannot_parse_is_one_clear_line(parsing_checkpoint: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str], line: str,
                                                             flags: list[str], message: str) -> None:
    words = tmp_path / "words.txt"
    words.write_text("Ms. Haag plays\n" + line + "\n", encoding="utf-8")
    out = tmp_path / "trees.txt"
    code, _, err = _parse_cli(["--checkpoint", str(parsing_checkpoint), "--input", str(words), "--output", str(out),
                               "--beam", "2", "--quiet", *flags], capsys)
    assert code == 2 and f"{words}:2: " in err and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_parse_never_writes_over_its_input(parsing_checkpoint: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    words = tmp_path / "words.txt"
    words.write_text("Ms. Haag plays\n", encoding="utf-8")
    code, _, err = _parse_cli(["--checkpoint", str(parsing_checkpoint), "--input", str(words), "--output",
                               str(words), "--quiet"], capsys)
    assert code == 2 and "is also an input" in err
    assert words.read_text(encoding="utf-8") == "Ms. Haag plays\n"
