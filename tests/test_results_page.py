"""docs/results.md agrees with the benchmark JSON files it quotes, and the README with it.

A table of docs/results.md that comes from a benchmark follows a line
``Source: benchmarks/results/NAME.json``. Every number in such a table must equal the JSON
value for its row and column, rounded as displayed (a cell "1,829.1" is the JSON value
formatted with one decimal); a number the JSON cannot account for fails the test too. Ratios
("x CTranslate2 int8") are computed from the JSON values of the same file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS_PAGE = REPO / "docs" / "results.md"
RESULTS_DIR = REPO / "benchmarks" / "results"
MAX_LINES = 405  # a section per CPU kind and task, the recipe's variants, parsing's levers, AVX2's speed

SOURCE_RE = re.compile(r"^Source: `?benchmarks/results/([\w.-]+\.json)`?", re.M)
NUMBER_RE = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?!\.?\d)")

Row = tuple[str, ...]
Expected = dict[Row, dict[str, float]]

SYSTEM_NAMES = {"aiayn": "aiayn", "nn.Transformer": "torch.nn.Transformer", "hf": "HF transformers",
                "ctranslate2": "CTranslate2"}


def system_name(system: str) -> str:
    return SYSTEM_NAMES.get(system, system)


def dtype_name(dtype: str) -> str:
    return dtype.replace("+", " + ")


def rows_by_key(rows: list[dict]) -> dict[tuple[str, str], dict]:
    return {(r["system"], r["dtype"]): r for r in rows if not r.get("skipped")}


def train_expected(data: dict) -> Expected:
    """Ratios against torch.nn.Transformer in each precision it ran in (bf16 is skipped where
    the CPU emulates it)."""
    rows = rows_by_key(data["rows"])
    nn = {d: r["tokens_per_s"] for (s, d), r in rows.items() if s == "nn.Transformer"}
    return {(system_name(s), dtype_name(d)): {
        "tok/s": r["tokens_per_s"],
        **{f"x torch.nn.Transformer {p}": r["tokens_per_s"] / v for p, v in nn.items()},
        "peak RSS MB": r["peak_rss_mb"],
        "first step s": r["first_call_s"],
    } for (s, d), r in rows.items()}


def decode_expected(data: dict) -> Expected:
    rows = rows_by_key(data["rows"])
    ct2_int8 = rows[("ctranslate2", "int8")]["tokens_per_s"]
    out: Expected = {}
    for (s, d), r in rows.items():
        cells = {"tok/s": r["tokens_per_s"], "x CTranslate2 int8": r["tokens_per_s"] / ct2_int8,
                 "peak RSS MB": r["peak_rss_mb"]}
        if r.get("first_call_s") is not None:
            cells["first call s"] = r["first_call_s"]
        if r.get("second_run_first_call_s") is not None:
            cells["second run's first call s"] = r["second_run_first_call_s"]
        out[(system_name(s), dtype_name(d))] = cells
    return out


def latency_expected(data: dict) -> Expected:
    rows = rows_by_key(data["rows"])
    ct2_int8 = rows[("ctranslate2", "int8")]["p50_ms"]
    out: Expected = {}
    for (s, d), r in rows.items():
        cells = {"p50 ms": r["p50_ms"], "p99 ms": r["p99_ms"], "mean ms": r["mean_ms"],
                 "p50 / CTranslate2 int8": r["p50_ms"] / ct2_int8}
        cells.update({f"batch {n} tok/s": v for n, v in r["batch_tokens_per_s"].items()})
        out[(system_name(s), dtype_name(d))] = cells
    return out


def gpu_expected(data: dict) -> Expected:
    """benchmarks/gpu.py: training rows keyed (model, system), decoding rows (sentences, system)."""
    out: Expected = {}
    train = [r for r in data["train"] if not r.get("skipped")]
    for r in train:
        nn = next(x["tokens_per_s"] for x in train if x["model"] == r["model"] and x["system"] == "nn.Transformer")
        out[(r["model"], system_name(r["system"]))] = {
            "tok/s": r["tokens_per_s"], "MFU %": 100 * r["mfu"], "peak GB": r["peak_memory_gb"],
            "x torch.nn.Transformer": r["tokens_per_s"] / nn, "paper recipe h": r["paper_recipe_hours"]}
    decode = [r for r in data["decode"] if not r.get("skipped")]
    for r in decode:
        hf = next(x["tokens_per_s"] for x in decode if x["sentences"] == r["sentences"] and x["system"] == "hf")
        out[(f"{r['sentences']:,}", system_name(r["system"]))] = {
            "tok/s": r["tokens_per_s"], "peak GB": r["peak_memory_gb"], "x HF transformers": r["tokens_per_s"] / hf}
    return out


def end_to_end_expected(data: dict) -> Expected:
    rows = [r for r in data["rows"] if not r.get("skipped")]
    ct2_int8 = {r["lines"]: r["median_s"] for r in rows if r["system"] == "ctranslate2" and r["variant"] == "int8"}
    out: Expected = {}
    for r in rows:
        cells = {"s": r["median_s"], "lines/s": r["lines_per_s"],
                 "CTranslate2 int8 s / s": ct2_int8[r["lines"]] / r["median_s"]}
        if r.get("median_first_output_s") is not None:
            cells["first line s"] = r["median_first_output_s"]
        out[(f"{r['lines']:,}", system_name(r["system"]), r["variant"])] = cells
    return out


def parsing_expected(data: dict) -> Expected:
    out: Expected = {}
    for r in data["rows"]:
        cells = {}
        for split in ("valid", "test"):
            s = r[split]
            cells.update({f"{split} F1": s["f1"], f"{split} P": s["precision"], f"{split} R": s["recall"]})
            if "seconds" in s:
                cells[f"{split} s"] = s["seconds"]
                cells[f"{split} repaired"] = s["repaired"]
        out[(r["system"],)] = cells
    return out


def serve_stress_expected(data: dict) -> Expected:
    out: Expected = {}
    for c in data["clients"]:
        out[(str(c["clients"]),)] = {
            "clients": c["clients"], "requests": c["requests"], "failures": c["failures"],
            "503 + Retry-After": c["codes"].get("503 + Retry-After", 0), "req/s": c["throughput_rps"],
            "p50 ms": c["p50_ms"], "p99 ms": c["p99_ms"], "server RSS MB": c["rss_mb"]}
    slow = data["slow"]
    for key, label in (("alone", "alone"), ("with_slow_clients", f"beside {slow['slow_clients']:,} slow clients")):
        s = slow[key]
        out[(label,)] = {"requests": s["requests"], "failures": s["failures"], "req/s": s["throughput_rps"],
                         "p50 ms": s["p50_ms"], "p99 ms": s["p99_ms"]}
    return out


# JSON file -> (number of leading key columns, expected values)
SPECS: dict[str, tuple[int, Callable[..., Expected]]] = {
    "train.json": (2, train_expected),
    "decode.json": (2, decode_expected),
    "latency.json": (2, latency_expected),
    "end_to_end.json": (3, end_to_end_expected),
    "end_to_end_avx2.json": (3, end_to_end_expected),
    "train_avx2.json": (2, train_expected),
    "decode_avx2.json": (2, decode_expected),
    "gpu.json": (2, gpu_expected),
    "parsing.json": (1, parsing_expected),
    "serve_stress.json": (1, serve_stress_expected),
}


def plain(cell: str) -> str:
    return cell.replace("**", "").replace("`", "").strip()


def split_row(line: str) -> list[str]:
    return [plain(c) for c in line.strip().strip("|").split("|")]


def tables(lines: list[str]) -> list[list[list[str]]]:
    """The markdown tables among lines: each a list of rows (header first, separator dropped)."""
    found, current = [], []
    for line in lines + [""]:
        if line.lstrip().startswith("|"):
            if not re.fullmatch(r"\|?[\s:|-]+\|?", line.strip()):
                current.append(split_row(line))
        elif current:
            found.append(current)
            current = []
    return found


def sourced_sections(text: str) -> list[tuple[str, list[str]]]:
    """(JSON name, the lines after its Source line up to the next heading or Source line)."""
    lines = text.splitlines()
    out: list[tuple[str, list[str]]] = []
    for i, line in enumerate(lines):
        m = SOURCE_RE.match(line)
        if not m:
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("#") and not SOURCE_RE.match(lines[end]):
            end += 1
        out.append((m.group(1), lines[i + 1:end]))
    return out


def displayed(value: float, shown: str) -> str:
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return f"{value:.{decimals}f}"


def numbers(text: str) -> list[str]:
    return [m.group(0).replace(",", "") for m in NUMBER_RE.finditer(text)]


def page() -> str:
    return RESULTS_PAGE.read_text(encoding="utf-8")


def test_results_page_is_short() -> None:
    n = len(page().splitlines())
    assert n <= MAX_LINES, f"docs/results.md has {n} lines (at most {MAX_LINES})"


def test_every_results_json_is_quoted_and_known() -> None:
    quoted = {name for name, _ in sourced_sections(page())}
    on_disk = {p.name for p in RESULTS_DIR.glob("*.json")}
    assert quoted == on_disk, f"quoted but missing: {quoted - on_disk}; on disk but not quoted: {on_disk - quoted}"
    assert on_disk <= set(SPECS), f"no check for {on_disk - set(SPECS)}"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_tables_agree_with_their_json(name: str) -> None:
    sections = [lines for source, lines in sourced_sections(page()) if source == name]
    assert sections, f"docs/results.md quotes no table from benchmarks/results/{name}"
    n_keys, expected_of = SPECS[name]
    expected = expected_of(json.loads((RESULTS_DIR / name).read_text(encoding="utf-8")))
    checked = 0
    for lines in sections:
        found = tables(lines)
        assert found, f"no table after 'Source: benchmarks/results/{name}'"
        for table in found:
            header, body = table[0], table[1:]
            for row in body:
                key = tuple(row[:n_keys])
                assert key in expected, f"{name}: row {key} is not in the JSON (rows: {sorted(expected)})"
                for column, cell in zip(header[n_keys:], row[n_keys:]):
                    shown = numbers(cell)
                    if not shown:
                        continue
                    assert column in expected[key], f"{name}: no JSON value for {key} / {column!r}"
                    assert len(shown) == 1, f"{name}: {key} / {column!r} holds several numbers: {cell!r}"
                    want = displayed(expected[key][column], shown[0])
                    assert shown[0] == want, f"{name}: {key} / {column!r} shows {cell!r}, the JSON gives {want}"
                    checked += 1
    assert checked, f"no figure of {name} was checked"


def test_matmul_ceilings_agree_with_their_json() -> None:
    for name, lines in sourced_sections(page()):
        data = json.loads((RESULTS_DIR / name).read_text(encoding="utf-8"))
        for m in re.finditer(r"(bf16|fp32|int8) ([\d,]+) G(?:FL)?OP/s", "\n".join(lines)):
            want = data["matmul_gflops"][m.group(1)]
            assert m.group(2).replace(",", "") == f"{want:.0f}", f"{name}: {m.group(0)} against {want:.1f}"


def readme_results_table() -> list[list[str]]:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#") and "results" in line.lower():
            rest = lines[i + 1:]
            end = next((j for j, text in enumerate(rest) if text.startswith("#")), len(rest))
            found = tables(rest[:end])
            if found:
                return found[0]
    pytest.fail("README.md has no results table (a markdown table under a heading containing 'Results')")


def test_readme_results_table_figures_are_on_the_results_page() -> None:
    on_page = set(numbers(page()))
    for row in readme_results_table()[1:]:
        for cell in row:
            text = re.sub(r"\]\([^)]*\)", "]", cell)  # link targets are not figures
            for number in numbers(text):
                assert number in on_page, f"README results table: {number} ({cell!r}) is not in docs/results.md"
