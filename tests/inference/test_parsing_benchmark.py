"""benchmarks/parsing.py, the parsing table of docs/results.md, on a tiny random model: the
baselines, the model's rows, and with --ensemble each member alone beside the ensemble."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import parsing  # benchmarks/parsing.py

from .conftest import GOLD


def _table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> dict:
    (tmp_path / "valid.gold.txt").write_text("".join(g + "\n" for g in GOLD), encoding="utf-8")
    out = tmp_path / "parsing.json"
    monkeypatch.setattr(sys, "argv", ["parsing.py", "--prepared", str(tmp_path), "--splits", "valid",
                                      "--threads", "1", "--json", str(out), *args])
    parsing.main()
    return json.loads(out.read_text())


def test_the_model_rows_follow_the_baselines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              parsing_checkpoint: Path) -> None:
    rows = _table(tmp_path, monkeypatch, "--checkpoint", str(parsing_checkpoint))["rows"]
    assert [r["system"] for r in rows] == [*parsing.BASELINES, "model, beam 1, free", "model, beam 1, constrained",
                                           "model, beam 21, free", "model, beam 21, constrained"]
    for row in rows[3:]:
        assert row["valid"]["sentences"] == len(GOLD) and row["valid"]["seconds"] > 0
    assert [r["valid"]["repaired"] for r in rows[3:] if r["system"].endswith("constrained")] == [0, 0]


def test_an_ensemble_of_one_model_twice_parses_as_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             parsing_checkpoint: Path) -> None:
    """The mean of two equal distributions is that distribution: the ensemble's trees are the
    member's, so their scores are equal in every field but the time."""
    ck = str(parsing_checkpoint)
    table = _table(tmp_path, monkeypatch, "--checkpoint", ck, ck, "--ensemble")
    rows = {r["system"]: r["valid"] for r in table["rows"]}
    assert list(rows)[3:] == ["ensemble, beam 1, free", "ensemble, beam 1, constrained", "ensemble, beam 21, free",
                              "ensemble, beam 21, constrained", "member 1 alone, beam 21, constrained",
                              "member 2 alone, beam 21, constrained"]
    untimed = [{k: v for k, v in rows[name].items() if k != "seconds"}
               for name in ("ensemble, beam 21, constrained", "member 1 alone, beam 21, constrained",
                            "member 2 alone, beam 21, constrained")]
    assert untimed[0] == untimed[1] == untimed[2]
