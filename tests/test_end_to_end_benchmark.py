"""benchmarks/cpu_end_to_end.py runs end to end: ``--quick --serve --startup`` (a tiny random
model, two small line counts, one run) writes a report with every section; each timed
`aiayn translate` wrote one output line per input line; the run from the compiled step on disk
ran that step (``--compile on`` under --quick) and wrote the same bytes as the eager runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINES = (10, 40)  # the script's --quick line counts
# About 20 fresh processes (each imports torch) and one compiled-step build: over a minute on 2
# cores, so in the slow suite.
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    for module in ("ctranslate2", "transformers", "fastapi", "uvicorn", "httpx"):
        pytest.importorskip(module, reason="the 'bench', 'interop' and 'serve' extras are not all installed")
    out = tmp_path_factory.mktemp("end_to_end") / "report.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cpu_end_to_end.py"), "--quick", "--serve",
                           "--startup", "--threads", "1", "--json", str(out)],
                          cwd=out.parent, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"written {out}" in proc.stdout and "aiayn / CTranslate2 int8" in proc.stdout
    return json.loads(out.read_text())


def test_the_report_names_the_machine_and_its_settings(report: dict) -> None:
    assert set(report) == {"machine", "quick", "runs", "checkpoint", "input", "aiayn_command", "ctranslate2", "rows",
                           "ratios", "serve", "startup", "seconds"}
    machine = report["machine"]
    assert {"label", "cpu", "cores", "threads", "flags", "torch", "ctranslate2"} <= set(machine)
    assert machine["threads"] == 1 and isinstance(machine["flags"], list)
    assert all(f.startswith("amx") or f in ("avx512_bf16", "avx512_vnni", "avx_vnni") for f in machine["flags"])
    assert report["quick"] is True and report["runs"] == 1
    assert report["aiayn_command"] == "aiayn translate --checkpoint CK -i FILE -o OUT"
    ct2 = report["ctranslate2"]
    assert ct2["compute_types"] == ["default", "int8"] and ct2["intra_threads"] == 1
    assert ct2["decode"]["beam"] == 4 and ct2["differences"]


def test_every_line_count_has_every_run_and_complete_outputs(report: dict) -> None:
    rows = {(r["lines"], r["system"], r["variant"]): r for r in report["rows"]}
    variants = {("aiayn", "first run (empty compile cache)"), ("aiayn", "second run (the first run's compile cache)"),
                ("aiayn", "the model's compiled step on disk"), ("ctranslate2", "default"), ("ctranslate2", "int8")}
    assert set(rows) == {(n, *v) for n in LINES for v in variants}
    for (n, system, _), row in rows.items():
        assert row["output_lines"] == n, row
        assert len(row["seconds"]) == 1 and row["median_s"] == row["seconds"][0] > 0
        assert row["lines_per_s"] == pytest.approx(n / row["median_s"])
        assert len(row["output_sha256"]) == 64
        if system == "aiayn":
            assert row["dtype"] in ("int8", "bf16", "fp32")
            assert 0 < row["median_first_output_s"] <= row["median_last_output_s"] <= row["median_s"]
    assert rows[(10, "ctranslate2", "int8")]["compute_type"].startswith("int8")
    assert [r["lines"] for r in report["ratios"]] == list(LINES)
    for r in report["ratios"]:
        n = r["lines"]
        int8 = rows[(n, "ctranslate2", "int8")]["median_s"]
        for key, variant in (("first", "first run (empty compile cache)"),
                             ("second", "second run (the first run's compile cache)"),
                             ("built", "the model's compiled step on disk")):
            assert r[f"aiayn_{key}_over_ct2_int8"] == pytest.approx(rows[(n, "aiayn", variant)]["median_s"] / int8)


@pytest.mark.parametrize("n", LINES)
def test_the_compiled_step_ran_and_wrote_what_the_eager_step_wrote(report: dict, n: int) -> None:
    """Under auto the tiny model never compiles (the warm-up is never won back); the third run
    (--compile on, its package on disk) ran the compiled step. All three wrote the same bytes:
    the compiled step's outputs are the eager step's."""
    if not any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")):
        pytest.skip("no C++ compiler (g++, c++ or clang++) for inductor: the compiled step cannot be built")
    aiayn = {r["variant"]: r for r in report["rows"] if r["lines"] == n and r["system"] == "aiayn"}
    first, second = aiayn["first run (empty compile cache)"], aiayn["second run (the first run's compile cache)"]
    built = aiayn["the model's compiled step on disk"]
    assert (first["compile"], first["compiled"]) == (second["compile"], second["compiled"]) == ("auto", False)
    # int8 steps compile only with int8 dot products (VNNI, AMX): elsewhere --compile on keeps
    # the eager steps (aiayn.inference.engine.DecodingEngine.steps_compile_well).
    from aiayn.runtime import cpu
    from aiayn.runtime.precision import INT8_DOT_PRODUCTS

    compiles = built["dtype"] != "int8" or bool(cpu.cpu_flags() & INT8_DOT_PRODUCTS)
    assert (built["compile"], built["compiled"]) == ("on", compiles)
    # Quick mode's 10 and 40 lines are below auto's worker threshold; a compiled step never forks.
    assert first["workers"] == second["workers"] == built["workers"] == 1
    assert first["dtype"] == second["dtype"] == built["dtype"]
    assert first["output_sha256"] == second["output_sha256"] == built["output_sha256"]


def test_both_servers_answer_every_request(report: dict) -> None:
    servers = {s["server"]: s for s in report["serve"]}
    assert set(servers) == {"aiayn serve", "aiayn serve --ctranslate2 (int8)"}
    for s in servers.values():
        assert s["ready_s"] > 0 and s["sequential"]["p50_ms"] > 0
        assert s["load"]["failures"] == 0 and s["load"]["clients"] == 16 and s["load"]["throughput_rps"] > 0
    assert servers["aiayn serve"]["dtype"] is not None


def test_startup_is_broken_down_by_stage(report: dict) -> None:
    startup = report["startup"]
    assert list(startup["stages_s"]) == [
        "interpreter (python -c pass)", "import aiayn.cli + parse", "import torch", "import the inference modules",
        "checkpoint checksums", "checkpoint load (model, weights, tokenizer)", f"inference copy ({startup['dtype']})",
        "first decode", "second decode (same line)"]
    assert all(s >= 0 for s in startup["stages_s"].values()) and startup["command_s"] > 0
    assert startup["exit_s"] is not None
    assert "torch" in {m["module"] for m in startup["slowest_imports"]}
