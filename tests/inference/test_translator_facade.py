"""The translator stays a thin facade over the decoding engine and the request."""

from __future__ import annotations

from pathlib import Path

TRANSLATOR = Path(__file__).resolve().parents[2] / "src" / "aiayn" / "inference" / "translator.py"


def test_the_translator_is_at_most_150_lines() -> None:
    assert len(TRANSLATOR.read_text(encoding="utf-8").splitlines()) <= 150
