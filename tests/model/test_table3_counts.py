"""The paper's Table 3 (aiayn.model.parameter_count, `aiayn model-info --table3`): every
row, its built parameter count next to the paper's "params x10^6", one output line per row."""

from __future__ import annotations

import json

import pytest

from aiayn.cli.main import main
from aiayn.model.parameter_count import TABLE3, TABLE3_VOCAB, table3

ROWS = ["base", "A1", "A2", "A3", "A4", "B1", "B2", "C1", "C2", "C3", "C4", "C5", "C6", "C7",
        "D1", "D2", "D3", "D4", "E", "big"]
# The paper's figures (Table 3, "params x10^6"); None where it leaves the cell blank.
PAPER = {"base": 65, "B1": 58, "B2": 60, "C1": 36, "C2": 50, "C3": 80, "C4": 28, "C5": 168,
         "C6": 53, "C7": 90, "big": 213}


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    return {r["row"]: r for r in table3(TABLE3_VOCAB)}


def test_the_rows_are_the_papers(rows: dict[str, dict]) -> None:
    assert [r.name for r in TABLE3] == ROWS
    assert {n: r["paper_m"] for n, r in rows.items() if r["paper_m"] is not None} == PAPER
    shape = {n: (r["N"], r["d_model"], r["d_ff"], r["h"], r["d_k"], r["d_v"]) for n, r in rows.items()}
    assert shape["base"] == (6, 512, 2048, 8, 64, 64)
    assert [shape[f"A{i}"][3:] for i in range(1, 5)] == [(1, 512, 512), (4, 128, 128), (16, 32, 32), (32, 16, 16)]
    assert shape["B1"][4:] == (16, 64) and shape["B2"][4:] == (32, 64)  # d_k shrinks, d_v stays 64
    assert [shape[f"C{i}"] for i in (1, 2, 3)] == [(n, 512, 2048, 8, 64, 64) for n in (2, 4, 8)]
    assert shape["C4"] == (6, 256, 2048, 8, 32, 32) and shape["C5"] == (6, 1024, 2048, 8, 128, 128)
    assert shape["C6"][2] == 1024 and shape["C7"][2] == 4096
    assert [(rows[f"D{i}"]["P_drop"], rows[f"D{i}"]["eps_ls"]) for i in range(1, 5)] == [
        (0.0, 0.1), (0.2, 0.1), (0.1, 0.0), (0.1, 0.2)]
    assert rows["E"]["positions"] == "learned"
    assert shape["big"] == (6, 1024, 4096, 16, 64, 64) and rows["big"]["P_drop"] == 0.3


@pytest.mark.parametrize("name", [n for n in PAPER if n != "big"])
def test_every_base_family_figure_rounds_to_the_papers(rows: dict[str, dict], name: str) -> None:
    assert round(rows[name]["parameters"] / 1e6) == PAPER[name]
    assert rows[name]["matches"] is True


def test_row_b_adds_up_only_with_d_v_64(rows: dict[str, dict]) -> None:
    assert (rows["B1"]["parameters"], rows["B2"]["parameters"]) == (58_038_784, 60_402_688)
    # Had d_v shrunk with d_k, the counts would be 51M and 56M, not the paper's 58M and 60M.
    assert rows["base"]["parameters"] - rows["B1"]["parameters"] == 18 * 2 * (512 * 384 + 384)


def test_blank_rows_say_why(rows: dict[str, dict]) -> None:
    base = rows["base"]["parameters"]
    for name in ("A1", "A2", "A3", "A4", "D1", "D2", "D3", "D4"):
        assert rows[name]["parameters"] == base and rows[name]["matches"] is None
        assert rows[name]["note"].startswith("paper blank")
    assert rows["E"]["parameters"] == base + 2 * 1024 * 512  # two learned position tables


def test_big_contradicts_base_at_any_one_vocabulary(rows: dict[str, dict]) -> None:
    """213M needs V in 35,296..36,272 (at 37,000: 214.2M), where base is 62-63M, not 65M."""
    assert rows["big"]["matches"] is False and rows["big"]["parameters"] == 218_341_376
    lo, hi = rows["big"]["vocab_range"]
    assert (lo, hi) == (35_296, 36_272)
    others = [rows[n]["vocab_range"] for n in PAPER if n != "big"]
    assert (max(r[0] for r in others), min(r[1] for r in others)) == (40_932, 41_160)
    at_36k = {r["row"]: r for r in table3(36_000)}
    assert at_36k["big"]["matches"] is True and at_36k["base"]["matches"] is False


def test_vocab_ranges_are_exact(rows: dict[str, dict]) -> None:
    """The count is rest + V * d_model: the range's ends round to the figure, one beyond does not."""
    for name in PAPER:
        r = rows[name]
        rest = r["parameters"] - TABLE3_VOCAB * r["d_model"]
        lo, hi = r["vocab_range"]
        assert round((rest + lo * r["d_model"]) / 1e6) == round((rest + hi * r["d_model"]) / 1e6) == PAPER[name]
        assert round((rest + (lo - 1) * r["d_model"]) / 1e6) != PAPER[name]
        assert round((rest + (hi + 1) * r["d_model"]) / 1e6) != PAPER[name]


def _cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(["model-info", *args])
    out = capsys.readouterr()
    return int(exit_.value.code or 0), out.out, out.err


def test_cli_prints_one_line_per_row(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _cli(capsys, "--table3")
    assert code == 0
    lines = out.splitlines()
    by_row = [line for line in lines if line.split() and line.split()[0] in ROWS]
    assert [line.split()[0] for line in by_row] == ROWS
    assert len(lines) == len(ROWS) + 3  # two header lines, one summary
    status = {line.split()[0]: line for line in by_row}
    assert "65,130,496" in status["base"] and "match" in status["base"]
    assert " 58  match" in status["B1"] and " 60  match" in status["B2"]
    assert "DIFFERS" in status["big"] and "213" in status["big"]
    assert all("paper blank" in status[n] for n in ("A1", "D3", "E"))
    assert "big needs 35,296..36,272" in lines[-1]


def test_cli_json_and_vocabulary(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _cli(capsys, "--table3", "--json", "--vocab-size", "37000")
    assert code == 0
    rows = json.loads(out)
    assert [r["row"] for r in rows] == ROWS
    assert rows[0]["parameters"] == 63_082_496 and rows[0]["matches"] is False  # the paper's "about 37,000"


def test_cli_table3_refuses_overrides(capsys: pytest.CaptureFixture) -> None:
    code, _, err = _cli(capsys, "--table3", "model.n_heads=16")
    assert code == 2 and "--table3 takes no model.* overrides" in err
