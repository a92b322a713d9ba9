"""`aiayn evaluate --checkpoint`: translate (a file or a known test set), then score."""

from __future__ import annotations

import json
from pathlib import Path

from aiayn.cli.main import main


def _aiayn(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_checkpoint_on_a_file_equals_scoring_its_output(tiny_checkpoint: Path, tmp_path: Path, english,
                                                        capsys) -> None:
    src, ref, hyp = tmp_path / "src.en", tmp_path / "ref.de", tmp_path / "hyp.de"
    src.write_text("\n".join(english) + "\n", encoding="utf-8")
    ref.write_text("\n".join(s.replace("a ", "ein ") for s in english) + "\n", encoding="utf-8")
    code, out, err = _aiayn(["evaluate", "--checkpoint", str(tiny_checkpoint), "--input", str(src), "--ref",
                             str(ref), "--output", str(hyp), "--json", "--width", "4", "--beam", "2", "--quiet"],
                            capsys)
    assert code == 0, err
    via_checkpoint = json.loads(out)
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == len(english)
    code, out, err = _aiayn(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--json", "--width", "4"], capsys)
    via_file = json.loads(out)
    assert via_checkpoint["bleu"] == via_file["bleu"] and via_checkpoint["chrf"] == via_file["chrf"]
    short = tmp_path / "short.de"
    short.write_text("one line\n", encoding="utf-8")
    code, out, err = _aiayn(["evaluate", "--checkpoint", str(tiny_checkpoint), "--input", str(src), "--ref",
                             str(short)], capsys)
    assert code == 2 and "line counts must match" in err


def test_checkpoint_on_multi30k(tiny_checkpoint: Path, mirror: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AIAYN_OFFLINE", "1")
    hyp = tmp_path / "hyp.de"
    code, out, err = _aiayn(["evaluate", "--checkpoint", str(tiny_checkpoint), "--dataset", "multi30k",
                             "--split", "test_2016_flickr", "--src", "en", "--tgt", "de", "--data-dir",
                             str(mirror), "--beam", "1", "--max-len-a", "0", "--max-len-b", "2", "--output",
                             str(hyp), "--json", "--quiet", "--tokenized-bleu"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["n_sentences"] == 1000
    assert {"bleu", "chrf", "signature", "tokenized_bleu"} <= set(data)
    assert "test_2016_flickr" in data["source"]
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 1000
