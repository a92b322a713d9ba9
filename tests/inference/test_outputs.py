"""Outputs never destroy inputs and are never left half-written (translate, evaluate)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from aiayn.cli.main import main
from aiayn.inference.translator import Translator


def _run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.fixture
def source(tmp_path: Path, english: list[str]) -> Path:
    path = tmp_path / "src.en"
    path.write_text("\n".join(english[:6]) + "\n", encoding="utf-8")
    return path


def test_translate_output_equal_to_input_is_refused(tiny_checkpoint, source, capsys) -> None:
    """Regression: `translate -i f -o f` truncated f before translating."""
    before = source.read_bytes()
    for name in (str(source), str(source.parent / "." / source.name)):
        code, err = _run(["translate", "--checkpoint", str(tiny_checkpoint), "-i", str(source), "-o", name], capsys)
        assert code == 2 and "is also an input" in err and "Traceback" not in err
    assert source.read_bytes() == before


@pytest.mark.parametrize("target", ["dir", "/proc/aiayn-test-output", "missing/out.txt"])
def test_translate_unwritable_output_is_one_line(tiny_checkpoint, source, capsys, tmp_path, target) -> None:
    out = {"dir": str(tmp_path), "missing/out.txt": str(tmp_path / "missing" / "out.txt")}.get(target, target)
    code, err = _run(["translate", "--checkpoint", str(tiny_checkpoint), "-i", str(source), "-o", out], capsys)
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "--output" in err


def test_translate_interrupted_leaves_the_old_output(tiny_checkpoint, source, capsys, tmp_path, monkeypatch) -> None:
    """A run that dies mid-way leaves the output file as it was, and no temporary beside it."""
    out = tmp_path / "out.de"
    out.write_text("previous translation\n", encoding="utf-8")
    calls = []
    real = Translator.run

    def dying(self, request, *args, **kwargs):
        calls.append(len(request.texts))
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(self, request, *args, **kwargs)

    monkeypatch.setattr(Translator, "run", dying)
    monkeypatch.setattr(sys, "stdin", open(source, encoding="utf-8"))  # noqa: SIM115 - closed by pytest
    code, err = _run(["translate", "--checkpoint", str(tiny_checkpoint), "-o", str(out), "--buffer-size", "2"], capsys)
    assert code == 130 and "interrupted" in err
    assert calls == [2, 2]
    assert out.read_text(encoding="utf-8") == "previous translation\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.de", "src.en"])
    monkeypatch.undo()
    code, _ = _run(["translate", "--checkpoint", str(tiny_checkpoint), "-i", str(source), "-o", str(out)], capsys)
    assert code == 0 and len(out.read_text(encoding="utf-8").splitlines()) == 6


def test_evaluate_output_equal_to_a_reference_is_refused(tiny_checkpoint, source, capsys, tmp_path) -> None:
    """Regression: `evaluate --output REF` overwrote the reference with the hypotheses."""
    ref = tmp_path / "ref.de"
    ref.write_text("eins\nzwei\ndrei\nvier\nfünf\nsechs\n", encoding="utf-8")
    before = ref.read_bytes()
    code, err = _run(["evaluate", "--checkpoint", str(tiny_checkpoint), "--input", str(source), "--ref", str(ref),
                      "--output", str(ref)], capsys)
    assert code == 2 and "is also an input" in err and "Traceback" not in err
    assert ref.read_bytes() == before


def test_evaluate_unwritable_output_fails_before_translating(tiny_checkpoint, source, capsys, tmp_path,
                                                            monkeypatch) -> None:
    ref = tmp_path / "ref.de"
    ref.write_text("a\n" * 6, encoding="utf-8")
    monkeypatch.setattr(Translator, "translate_detailed", lambda *a, **k: pytest.fail("translated first"))
    code, err = _run(["evaluate", "--checkpoint", str(tiny_checkpoint), "--input", str(source), "--ref", str(ref),
                      "--output", "/proc/aiayn-test-output"], capsys)
    assert code == 2 and "--output /proc/aiayn-test-output: cannot write there" in err


def test_evaluate_empty_files_is_one_line(tiny_checkpoint, capsys, tmp_path) -> None:
    """Regression: an empty hypothesis/reference file ended in an IndexError traceback."""
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    for argv in (["--hyp", str(empty), "--ref", str(empty)],
                 ["--checkpoint", str(tiny_checkpoint), "--input", str(empty), "--ref", str(empty)]):
        code, err = _run(["evaluate", *argv], capsys)
        assert code == 2 and "no lines to score" in err and "Traceback" not in err
