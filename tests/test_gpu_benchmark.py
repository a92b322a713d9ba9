"""benchmarks/gpu.py runs end to end: ``--device cpu --quick`` (tiny sizes) writes the report
with every section, so that its first run on a GPU does not fail on a mistake of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("transformers", reason="the 'bench' extra is not installed")
    out = tmp_path_factory.mktemp("gpu_bench") / "report.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--device", "cpu", "--quick",
                           "--json", str(out)], cwd=out.parent, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "training" in proc.stdout and "decoding" in proc.stdout and f"written {out}" in proc.stdout
    return json.loads(out.read_text())


def test_every_section_is_reported(report: dict) -> None:
    assert set(report) >= {"machine", "quick", "dtype", "tests", "peak_tflops", "train", "decode", "multi30k",
                           "seconds", "section_seconds"}
    assert report["quick"] is True and report["dtype"] == "fp32" and report["machine"]["device"] == "cpu"
    assert report["multi30k"] is None  # only with --multi30k
    assert isinstance(report["peak_tflops"], float) and report["peak_tflops"] > 0
    assert set(report["section_seconds"]) == {"tests", "peak_tflops", "train", "decode"}


def test_the_cuda_tests_are_collected_and_skip_without_a_gpu(report: dict) -> None:
    tests = report["tests"]
    assert tests["skipped"] >= 10 and tests["passed"] == tests["failed"] == tests["errors"] == 0
    assert tests["skip_reasons"] == ["platform: no CUDA device"] and tests["exit_code"] == 0
    assert tests["timed_out"] is False and tests["failures"] == []


def test_training_rows_measure_aiayn_and_its_peers(report: dict) -> None:
    rows = {(r["model"], r["system"]): r for r in report["train"]}
    assert set(rows) == {(m, s) for m in ("base", "big") for s in ("aiayn", "nn.Transformer", "hf")}
    for row in rows.values():
        assert "skipped" not in row, row
        assert row["tokens_per_step"] == 8 * 8 and row["tokens_per_s"] > 0 and 0 < row["mfu"]
        assert row["flop_per_token"] > 0 and len(row["seconds"]) == 1
    assert rows[("big", "aiayn")]["flop_per_token"] > rows[("base", "aiayn")]["flop_per_token"]
    # The paper's recipe at the measured speed: 100k (base) / 300k (big) updates of 25k tokens.
    for model, updates in (("base", 100_000), ("big", 300_000)):
        row = rows[(model, "aiayn")]
        assert row["paper_recipe_hours"] == pytest.approx(updates * 25_000 / row["tokens_per_s"] / 3600)


def test_decoding_rows_cover_every_batch_size(report: dict) -> None:
    rows = {(r["system"], r["sentences"]): r for r in report["decode"]}
    assert {s for s, _ in rows} == {"aiayn", "hf", "ctranslate2"} and {n for _, n in rows} == {1, 4}
    for system in ("aiayn", "hf"):
        for n in (1, 4):
            row = rows[(system, n)]
            assert "skipped" not in row, row
            assert row["tokens"] == n * 4 and row["tokens_per_s"] > 0


def test_mfu_counts_the_flops_of_transformer_base() -> None:
    import importlib.util

    from aiayn.config import model_preset

    spec = importlib.util.spec_from_file_location("aiayn_bench_gpu", REPO / "benchmarks" / "gpu.py")
    assert spec and spec.loader
    gpu = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gpu  # dataclasses look their module up by name
    spec.loader.exec_module(gpu)
    base = model_preset("base", src_vocab_size=32000, tgt_vocab_size=32000)
    # 3 x (6 x 6.36M + 6 x 8.52M + 32.8M) per target token at 32 tokens a side: cpu_train.py's 366e6.
    assert gpu.train_flop_per_token(base, 32) == pytest.approx(366e6, rel=2e-3)
