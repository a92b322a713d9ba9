"""sacreBLEU scoring: identical to the sacrebleu command line, its verbose line and
signature, reference and line-count errors, reading hypothesis files, the paper's tokenized
BLEU in the evaluate command (its pipeline: test_tokenized_bleu.py)."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

from aiayn.cli.main import main
from aiayn.errors import DataError
from aiayn.evaluation.bleu import (
    compound_split,
    corpus_bleu,
    corpus_scores,
    read_lines,
    tokenized_bleu,
    tokenized_bleu_name,
)

WORDS = ("Ein Mann fährt mit dem Fahrrad über die Haus-Tür , ein Hund läuft im Park . "
         "Zwei Frauen spielen Fußball auf der Straße ! „Hallo“ 3-4 10.000 Kinder").split()


def _corpus(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0 if i % 17 == 0 else 3, 14)))
            for i in range(n)]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    refs = _corpus(60, 1)
    rng = random.Random(2)
    hyps = [" ".join(w for w in r.split() if rng.random() > 0.3) for r in refs]
    hyps[3] = hyps[3] + "   "  # trailing whitespace, as real files have
    ref2 = _corpus(60, 3)
    out = {"hyp": tmp_path / "hyp.de", "ref": tmp_path / "ref.de", "ref2": tmp_path / "ref2.de"}
    out["hyp"].write_text("\n".join(hyps) + "\n", encoding="utf-8")
    out["ref"].write_text("\n".join(refs) + "\n", encoding="utf-8")
    out["ref2"].write_text("\n".join(ref2) + "\n", encoding="utf-8")
    return out


def _sacrebleu_cli(ref_files: list[Path], hyp: Path, width: int = 1) -> dict[str, float]:
    exe = shutil.which("sacrebleu", path=str(Path(sys.executable).parent)) or shutil.which("sacrebleu")
    cmd = [exe] if exe else [sys.executable, "-m", "sacrebleu"]
    proc = subprocess.run(cmd + [str(r) for r in ref_files] + ["-i", str(hyp), "-m", "bleu", "chrf",
                                                               "-w", str(width)],
                          capture_output=True, text=True, timeout=120, check=True)
    data = json.loads(proc.stdout)
    return {d["name"]: (d["score"], d["signature"]) for d in data}


def _aiayn(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("n_refs", [1, 2])
def test_evaluate_equals_sacrebleu_command_line(files, capsys, width: int, n_refs: int) -> None:
    refs = [files["ref"], files["ref2"]][:n_refs]
    expected = _sacrebleu_cli(refs, files["hyp"], width)
    argv = ["evaluate", "--hyp", str(files["hyp"]), "--json", "--width", str(width)]
    for r in refs:
        argv += ["--ref", str(r)]
    code, out, err = _aiayn(argv, capsys)
    assert code == 0, err
    got = json.loads(out)
    assert got["bleu"] == expected["BLEU"][0]
    assert got["chrf"] == expected["chrF2"][0]
    assert got["signature"] == got["bleu_signature"] == expected["BLEU"][1]
    assert got["chrf_signature"] == expected["chrF2"][1]
    # The human-readable form prints the same figures.
    code, out, _ = _aiayn([a for a in argv if a != "--json"], capsys)
    assert f"BLEU = {expected['BLEU'][0]:.{width}f}" in out
    assert f"chrF2 = {expected['chrF2'][0]:.{width}f}" in out
    assert expected["BLEU"][1] in out


def test_library_matches_sacrebleu_api(files) -> None:
    hyps, refs = read_lines(files["hyp"]), read_lines(files["ref"])
    scores = corpus_scores(hyps, refs)
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert corpus_bleu(hyps, refs) == pytest.approx(scores["bleu"])
    assert corpus_scores(hyps, [refs])["bleu"] == scores["bleu"]  # one stream given as a list of streams
    assert {"bleu", "chrf", "signature", "bleu_signature", "chrf_signature"} <= set(scores)
    assert corpus_scores(["a b c"], ["a b c"])["bleu"] == pytest.approx(0.0)  # shorter than 4-grams


@pytest.mark.parametrize(("hyps", "refs", "verbose"), [
    (["a"], ["a"], "100.0/0.0/0.0/0.0 (BP = 1.000 ratio = 1.000 hyp_len = 1 ref_len = 1)"),
    (["a b c d e f", "x"], ["a b c d e g h", "x"],
     "85.7/80.0/75.0/66.7 (BP = 0.867 ratio = 0.875 hyp_len = 7 ref_len = 8)"),
    ([""], [""], "0.0/0.0/0.0/0.0 (BP = 1.000 ratio = 0.000 hyp_len = 0 ref_len = 0)"),
])
def test_bleu_verbose(hyps: list[str], refs: list[str], verbose: str) -> None:
    scores = corpus_scores(hyps, refs)
    assert scores["bleu_verbose"] == verbose
    assert scores["n_sentences"] == len(hyps)


def test_target_language_picks_sacrebleus_tokenizer() -> None:
    assert "|tok:zh|" in corpus_scores(["你好世界"], ["你好世界"], tgt_lang="zh")["signature"]
    assert "|tok:13a|" in corpus_scores(["a b"], ["a b"], tgt_lang="de")["signature"]
    assert "|tok:13a|" in corpus_scores(["a b"], ["a b"])["signature"]


def test_line_count_mismatch_is_an_error(files, tmp_path: Path, capsys) -> None:
    hyps, refs = read_lines(files["hyp"]), read_lines(files["ref"])
    with pytest.raises(DataError, match="line counts must match"):
        corpus_scores(hyps[:-1], refs)
    with pytest.raises(DataError, match="reference set 2"):
        corpus_scores(hyps, [refs, refs[:-2]])
    short = tmp_path / "short.de"
    short.write_text("\n".join(hyps[:10]) + "\n", encoding="utf-8")
    code, out, err = _aiayn(["evaluate", "--hyp", str(short), "--ref", str(files["ref"])], capsys)
    assert code == 2 and out == ""
    assert "60 lines" in err and "10" in err and "Traceback" not in err


@pytest.mark.parametrize(("refs", "error", "message"), [
    ("a b", TypeError, "refs: expected a list of reference lines or a list of reference streams"),
    ([], DataError, "no references given"),
    (["a", "b"], DataError, "reference set 1 has 2 lines but there are 1 hypotheses; the line counts must match"),
])
def test_reference_errors(refs, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        corpus_scores(["a"], refs)


def test_reading_files(tmp_path: Path, capsys) -> None:
    path = tmp_path / "x.txt"
    # Only b"\n" ends a line: U+2028 and U+0085 inside a line do not split it.
    path.write_bytes(b"a b  \r\n\nc" + "\u2028d\x85e".encode() + b"\nlast")
    assert read_lines(path) == ["a b", "", "c\u2028d\x85e", "last"]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\nfine\nbro\xffken\n")
    with pytest.raises(DataError, match=r"bad.txt:3: invalid UTF-8"):
        read_lines(bad)
    assert read_lines(bad, "replace")[2] == "bro\ufffdken"
    code, _, err = _aiayn(["evaluate", "--hyp", str(bad), "--ref", str(bad)], capsys)
    assert code == 2 and "bad.txt:3" in err
    code, _, err = _aiayn(["evaluate", "--hyp", str(tmp_path / "missing"), "--ref", str(bad)], capsys)
    assert code == 2 and "not found" in err


def test_read_lines_keeps_leading_whitespace(tmp_path: Path) -> None:
    # As sacreBLEU's command line: only the trailing whitespace goes.
    path = tmp_path / "hyp.txt"
    path.write_text("  indented line \t\n\tx\n", encoding="utf-8")
    assert read_lines(path) == ["  indented line", "\tx"]


def test_compound_splitting_like_tensor2tensor() -> None:
    assert compound_split("Haus-Tür") == "Haus ##AT##-##AT## Tür"
    # perl's s{(\S)-(\S)}{...}g does not overlap: a-b-c keeps its second hyphen.
    assert compound_split("a-b-c") == "a ##AT##-##AT## b-c"
    assert compound_split("3-4 x - y -z") == "3 ##AT##-##AT## 4 x - y -z"


def test_tokenized_bleu_is_labelled(files, capsys) -> None:
    hyps, refs = read_lines(files["hyp"]), read_lines(files["ref"])
    score, signature = tokenized_bleu(hyps, refs, "de")
    assert "tok:moses-de+atat" in signature and "smooth:none" in signature
    assert "tok:moses-en|" in tokenized_bleu(hyps, refs, "en")[1]
    name = tokenized_bleu_name("de")
    assert name == ("tokenized BLEU (tensor2tensor get_ende_bleu.sh: Moses tokenizer de, compound splitting, "
                    "multi-bleu.perl)")
    argv = ["evaluate", "--hyp", str(files["hyp"]), "--ref", str(files["ref"]), "--tokenized-bleu", "--tgt", "de"]
    code, out, _ = _aiayn(argv + ["--width", "2"], capsys)
    assert code == 0
    assert f"tokenized BLEU = {score:.2f}  [{name}; NOT comparable to sacreBLEU]" in out
    assert f"  signature: {signature}" in out
    code, out, _ = _aiayn(argv + ["--json"], capsys)
    data = json.loads(out)
    assert data["tokenized_bleu"] == float(f"{score:.1f}")
    assert data["tokenized_bleu_signature"] == signature
    assert data["tokenized_bleu_name"] == name
    assert data["tokenized_bleu_note"] == f"{name}; NOT comparable to sacreBLEU"
    # Without the target language the tokenizer is unknown: an error, before any scoring.
    code, out, err = _aiayn(argv[:-2], capsys)
    assert code == 2 and out == "" and "--tokenized-bleu needs --tgt" in err and "Traceback" not in err


def test_argument_errors(files, capsys) -> None:
    for argv in (["evaluate"], ["evaluate", "--hyp", str(files["hyp"])],
                 ["evaluate", "--hyp", str(files["hyp"]), "--ref", str(files["ref"]), "--checkpoint", "x"],
                 ["evaluate", "--checkpoint", "x"]):
        code, _, err = _aiayn(argv, capsys)
        assert code == 2 and "error" in err and "Traceback" not in err
