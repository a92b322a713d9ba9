"""`aiayn tune-decoding`: every cell scores as `aiayn evaluate` does with that beam and
length penalty, the translator is loaded once, greedy search runs once, the best is marked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from aiayn.cli.main import main
from aiayn.errors import ConfigError
from aiayn.inference.translator import Translator
from aiayn.recipes.tune_decoding import searches, tune_decoding

BEAMS = ["1", "2", "4"]
LENPENS = ["0.0", "1.0"]
FIXED = ["--max-len-b", "20"]  # long enough for the beams to disagree


@pytest.fixture
def dev(tmp_path: Path, english: list[str]) -> tuple[Path, Path]:
    src, ref = tmp_path / "dev.en", tmp_path / "dev.de"
    src.write_text("\n".join(english) + "\n", encoding="utf-8")
    ref.write_text("\n".join(f"ein mann {s.split()[-1]} im park" for s in english) + "\n", encoding="utf-8")
    return src, ref


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main([*args, "--threads", "1"])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def _tune(capsys: pytest.CaptureFixture[str], checkpoint: Path, src: Path, ref: Path, *extra: str) -> dict[str, Any]:
    code, out, err = _run(capsys, "tune-decoding", "--checkpoint", str(checkpoint), "--input", str(src),
                          "--ref", str(ref), "--beams", *BEAMS, "--lenpens", *LENPENS, *FIXED, "-q", "--json",
                          *extra)
    assert code == 0, err
    return json.loads(out)


def test_every_cell_scores_as_evaluate(capsys, tiny_checkpoint: Path, dev: tuple[Path, Path]) -> None:
    src, ref = dev
    grid = _tune(capsys, tiny_checkpoint, src, ref, "--width", "4")
    assert [(c["beam"], c["lenpen"]) for c in grid["cells"]] == [(b, lp) for b in (1, 2, 4) for lp in (0.0, 1.0)]
    assert grid["n_sentences"] == len(src.read_text().splitlines()) and grid["lenpen_style"] == "gnmt"
    assert grid["fixed"] == {"max_len_b": 20}
    for cell in grid["cells"]:
        code, out, err = _run(capsys, "evaluate", "--checkpoint", str(tiny_checkpoint), "--input", str(src),
                              "--ref", str(ref), "--beam", str(cell["beam"]), "--lenpen", str(cell["lenpen"]),
                              *FIXED, "-q", "--json", "--width", "4")
        assert code == 0, err
        scores = json.loads(out)
        assert (cell["bleu"], cell["chrf"]) == (scores["bleu"], scores["chrf"]), cell
        assert grid["bleu_signature"] == scores["bleu_signature"]
        assert grid["chrf_signature"] == scores["chrf_signature"]


def test_the_best_cell_is_marked(capsys, tiny_checkpoint: Path, dev: tuple[Path, Path], tmp_path: Path) -> None:
    """References = what beam 2 translates: its cells score 100, the first of them is best."""
    src, _ = dev
    translator = Translator.from_checkpoint(tiny_checkpoint)
    ref = tmp_path / "beam2.de"
    outputs = translator.translate(src.read_text().splitlines(), beam=2, lenpen=0.0, max_len_b=20)
    assert outputs != translator.translate(src.read_text().splitlines(), beam=4, max_len_b=20)
    ref.write_text("\n".join(outputs) + "\n", encoding="utf-8")
    grid = _tune(capsys, tiny_checkpoint, src, ref)
    assert grid["best"] == {**grid["cells"][2], "best": True} and grid["best"]["beam"] == 2
    assert grid["best"]["lenpen"] == 0.0 and grid["best"]["bleu"] == 100.0
    assert [c["best"] for c in grid["cells"]] == [False, False, True, False, False, False]
    code, out, _ = _run(capsys, "tune-decoding", "--checkpoint", str(tiny_checkpoint), "--input", str(src),
                        "--ref", str(ref), "--beams", *BEAMS, "--lenpens", *LENPENS, *FIXED, "-q")
    lines = out.splitlines()
    assert code == 0 and lines[0] == f"{src}: {len(outputs)} sentences, 6 settings (gnmt length penalty)"
    assert lines[2].split() == ["beam", "\\", "lenpen", "0", "1"]
    row = lines[4].split()
    assert row[:3] == ["2", "*100.0", f"({grid['best']['chrf']:.1f})"] and row[3] == "100.0"
    assert sum(line.count("*") for line in lines[3:6]) == 1
    assert lines[6] == f"best: --beam 2 --lenpen 0: BLEU 100.0, chrF2 {grid['best']['chrf']:.1f}"


def test_one_translator_one_search_per_cell_greedy_once(tiny_checkpoint: Path, english: list[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    translator = Translator.from_checkpoint(tiny_checkpoint)
    calls: list[tuple[int, float]] = []
    real = Translator.translate_detailed

    def counting(self: Translator, texts: Any, nbest: int = 1, **kw: Any) -> Any:
        calls.append((kw["beam"], kw["lenpen"]))
        return real(self, texts, nbest=nbest, **kw)

    monkeypatch.setattr(Translator, "translate_detailed", counting)
    done: list[int] = []
    refs = [s.upper() for s in english]
    grid = tune_decoding(translator, english, refs, [1, 2, 2], [0.0, 0.6, 1.0], progress=done.append, max_len_b=20)
    assert calls == [(1, 0.0), (2, 0.0), (2, 0.6), (2, 1.0)] and searches([1, 2, 2], [0.0, 0.6, 1.0]) == 4
    assert sum(done) == 4 * len(english)
    assert [(c.beam, c.lenpen) for c in grid.cells] == [(b, lp) for b in (1, 2) for lp in (0.0, 0.6, 1.0)]
    greedy = [c for c in grid.cells if c.beam == 1]
    assert all(c.hypotheses == greedy[0].hypotheses for c in greedy) and greedy[1].seconds == 0.0
    # The beam-1 output really does not depend on the penalty.
    assert translator.translate(english, beam=1, lenpen=1.0, max_len_b=20) == greedy[0].hypotheses


def test_bad_settings_are_refused_before_translating(tiny_checkpoint: Path, english: list[str]) -> None:
    translator = Translator.from_checkpoint(tiny_checkpoint)
    with pytest.raises(ConfigError, match=r"^decode\.sampling: "):
        tune_decoding(translator, english, english, [2], [0.6], sampling=True)
    with pytest.raises(ConfigError, match=r"^decode\.max_len_a / max_len_b / min_len: must not be negative"):
        tune_decoding(translator, english, english, [2], [0.6], max_len_a=-1.0)


@pytest.mark.parametrize("args, message", [
    (["--beams", "0"], "--beams: must be at least 1, got 0"),
    (["--lenpens", "nan"], "--lenpens: must be a finite number, got nan"),
    (["--dataset", "multi30k", "--split", "test_2016_flickr"], "--split test_2016_flickr: a test split; "),
    (["--dataset", "multi30k", "--ref", "x"], "--dataset brings its own references; drop --ref"),
    ([], "give either --dataset (with --split) or --input with --ref"),
    (["--input", "x"], "--input needs at least one --ref FILE"),
])
def test_bad_flags_are_one_line(capsys, tiny_checkpoint: Path, args: list[str], message: str) -> None:
    code, out, err = _run(capsys, "tune-decoding", "--checkpoint", str(tiny_checkpoint), *args)
    assert code == 2 and out == ""
    assert err.startswith(f"aiayn tune-decoding: error: {message}") and err.count("\n") == 1, err


def test_a_test_split_when_asked(capsys, tiny_checkpoint: Path, mirror: Path) -> None:
    """--allow-test gets past the guard (to the data: a split the mirror lacks is an error)."""
    code, _, err = _run(capsys, "tune-decoding", "--checkpoint", str(tiny_checkpoint), "--dataset", "multi30k",
                        "--split", "test_2016_nope", "--allow-test", "--data-dir", str(mirror))
    assert code == 2 and "test split" not in err and "test_2016_nope" in err
