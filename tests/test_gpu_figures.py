"""Every GPU figure the docs quote comes from benchmarks/results/gpu.json.

The results page's GPU tables are checked cell by cell by test_results_page.py. Here: the
figures in its prose ("One GPU" and the summary row that links to it) and in docs/gpu.md,
found as a number (or a range ``a-b``) followed by its unit: tok/s, TFLOP/s, %, x, h, GB,
and test counts. Each must equal, rounded as displayed, a value of that kind in the JSON:
tokens/s of a row, the measured or datasheet peak, MFU (either), a ratio of two rows of
the same model (training) or batch (decoding), the DDP scaling, a recipe's hours, a
memory figure, a test count.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GPU_JSON = REPO / "benchmarks" / "results" / "gpu.json"

NUMBER = r"\d[\d,]*(?:\.\d+)?"
FIGURE_RE = re.compile(rf"(?<![\w.])({NUMBER})(?:-({NUMBER}))?\**\s*(target tok/s|tok/s|TFLOP/s|%|x|h|GB|passed|"
                       r"failed|skipped|tests)(?![\w/])")
TORCH_RE = re.compile(r"torch (\d+\.\d+\.\d+[^\s,)]*)")


def gpu_text() -> str:
    """The results page's GPU prose (its "One GPU" section without the tables, and every other
    line that names a GPU) and docs/gpu.md."""
    page = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    section = page.split("\n## One GPU", 1)[1].split("\n## ", 1)[0]
    prose = [line for line in section.splitlines() if not line.lstrip().startswith("|")]
    elsewhere = [line for line in page.replace(section, "").splitlines() if "GPU" in line]
    return "\n".join(prose + elsewhere + [(REPO / "docs" / "gpu.md").read_text(encoding="utf-8")])


def _numbers(value: object) -> list[float]:
    return [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def allowed(report: dict) -> dict[str, list[float]]:
    """Per unit, the values the JSON can account for."""
    train = [r for r in report.get("train") or [] if not r.get("skipped")]
    decode = [r for r in report.get("decode") or [] if not r.get("skipped")]
    ddp = report.get("ddp") or {}
    tests = report.get("tests") or {}
    tok = [r["tokens_per_s"] for r in train + decode] + _numbers(ddp.get("tokens_per_s"))
    tok += [f["tokens_per_s"] for f in (report.get("fastest_training") or {}).values()]
    ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a in train for b in train if a["model"] == b["model"]]
    ratios += [a["tokens_per_s"] / b["tokens_per_s"] for a in decode for b in decode
               if a["sentences"] == b["sentences"]]
    counts = [tests.get(k) for k in ("passed", "failed", "skipped", "errors")]
    return {
        "tok/s": tok,
        "TFLOP/s": _numbers(report.get("peak_tflops")) + _numbers(report.get("datasheet_tflops")),
        "%": [100 * v for r in train for k in ("mfu", "mfu_datasheet") for v in _numbers(r.get(k))]
        + [100 * v for v in _numbers(ddp.get("efficiency"))],
        "x": ratios + _numbers(ddp.get("scaling")),
        "h": [v for r in train for v in _numbers(r.get("paper_recipe_hours"))],
        "GB": [v for r in train + decode for v in _numbers(r.get("peak_memory_gb"))]
        + _numbers(report["machine"].get("memory_gb")),
        "tests": [float(c) for c in counts if isinstance(c, int)] + ([float(sum(c for c in counts if c))]
                                                                     if tests else []),
    }


UNITS = {"target tok/s": "tok/s", "passed": "tests", "failed": "tests", "skipped": "tests"}


def shown_as(value: float, shown: str) -> bool:
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return f"{value:.{decimals}f}" == shown


def figures(text: str) -> list[tuple[str, str, str]]:
    """(number as shown without commas, unit, the text around it) for every figure in ``text``."""
    out = []
    for m in FIGURE_RE.finditer(text):
        unit = UNITS.get(m[3], m[3])
        context = text[max(0, m.start() - 40):m.end() + 10].replace("\n", " ")
        out += [(n.replace(",", ""), unit, context) for n in (m[1], m[2]) if n]
    return out


def test_every_gpu_figure_on_the_pages_is_in_the_recorded_run() -> None:
    report = json.loads(GPU_JSON.read_text())
    values = allowed(report)
    found = figures(gpu_text())
    # The figures the pages quote now: they are found, so the check is not vacuous.
    assert {("743", "TFLOP/s"), ("271099", "tok/s"), ("46.0", "%"), ("1.43", "x")} <= {(n, u) for n, u, _ in found}
    missing = [f"{n} {u} in {context!r}" for n, u, context in found
               if not any(shown_as(v, n) for v in values[u])]
    assert not missing, "figures not in benchmarks/results/gpu.json:\n" + "\n".join(missing)
    for version in TORCH_RE.findall(gpu_text()):
        assert version == report["machine"]["torch"]


@pytest.mark.parametrize(("text", "ok"), [
    ("aiayn ran at 1.43x torch.nn.Transformer", True),
    ("decoding at 1.33-1.51x HF", True),
    ("decoding at 1.33-1.45x HF", False),  # one end of a range that is not in the file
    ("`pytest -m cuda` there: 18 passed", False),  # that run: 26
    ("Measured bf16 matmul: 743 TFLOP/s", True),
    ("Measured bf16 matmul: 781 TFLOP/s", False),  # an earlier run's
    ("**271,099 target tok/s**, 46.0% MFU", True),
    ("46.1% MFU", False),
    ("a 768-pair x 32-token batch, 2 GiB, 120 s", True),  # no measured figure here
])
def test_the_check_finds_what_is_not_in_the_file(text: str, ok: bool) -> None:
    values = allowed(json.loads(GPU_JSON.read_text()))
    assert all(any(shown_as(v, n) for v in values[u]) for n, u, _ in figures(text)) is ok
