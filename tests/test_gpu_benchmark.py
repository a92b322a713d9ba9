"""benchmarks/gpu.py runs end to end: ``--device cpu --quick`` (tiny sizes) writes the report
with every section, so that its first run on a GPU does not fail on a mistake of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The whole script at tiny sizes, its pytest and torchrun children included: about two minutes
# on a busy 2-core machine, which the module's first test waits for.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("transformers", reason="the 'bench' extra is not installed")
    out = tmp_path_factory.mktemp("gpu_bench") / "report.json"
    log = out.parent / "pytest_cuda.log"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--device", "cpu", "--quick",
                           "--json", str(out), "--tests-log", str(log)], cwd=out.parent, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "training" in proc.stdout and "decoding" in proc.stdout and f"written {out}" in proc.stdout
    report = json.loads(out.read_text())
    report["_tests_log"] = log.read_text()  # pytest's own output, kept beside the JSON
    return report


def test_every_section_is_reported(report: dict) -> None:
    assert set(report) >= {"machine", "quick", "dtype", "tests", "peak_tflops", "datasheet_tflops", "train",
                           "fastest_training", "decode", "ddp", "multi30k", "seconds", "section_seconds", "budget_s"}
    assert report["quick"] is True and report["dtype"] == "fp32" and report["machine"]["device"] == "cpu"
    assert report["multi30k"] is None  # only with --multi30k
    assert isinstance(report["peak_tflops"], float) and report["peak_tflops"] > 0
    assert report["datasheet_tflops"] is None  # a CPU has no datasheet entry
    assert report["budget_s"] == 480.0
    assert set(report["section_seconds"]) == {"tests", "peak_tflops", "train", "decode", "ddp"}


def test_the_cuda_tests_are_collected_and_skip_without_a_gpu(report: dict) -> None:
    tests = report["tests"]
    assert tests["skipped"] >= 10 and tests["passed"] == tests["failed"] == tests["errors"] == 0
    assert tests["skip_reasons"] == ["platform: no CUDA device"] and tests["exit_code"] == 0
    assert tests["timed_out"] is False and tests["failures"] == []
    assert tests["summary"] in report["_tests_log"] and "platform: no CUDA device" in report["_tests_log"]
    # Each test's outcome by name.
    outcomes = tests["outcomes"]
    assert len(outcomes) == tests["skipped"] and set(outcomes.values()) == {"skipped"}
    assert "tests/inference/test_cuda_graph_decoding.py::test_graph_decoding_translates_as_eager_decoding[bf16]" \
        in outcomes


def test_training_rows_measure_every_mode_and_the_peers(report: dict) -> None:
    rows = {(r["model"], r["system"]): r for r in report["train"]}
    systems = ("aiayn", "aiayn+compile", "aiayn+reduce-overhead", "nn.Transformer", "hf")
    assert set(rows) == {(m, s) for m in ("base", "big") for s in systems}
    for (_, system), row in rows.items():
        assert "skipped" not in row, row
        assert row["mode"] == {"aiayn+compile": "compile", "aiayn+reduce-overhead": "reduce-overhead"}.get(
            system, "eager")
        assert row["tokens_per_step"] == 8 * 8 and row["tokens_per_s"] > 0 and 0 < row["mfu"]
        assert row["mfu_datasheet"] is None  # no datasheet peak for a CPU
        assert row["flop_per_token"] > 0 and len(row["seconds"]) == 1
    assert rows[("big", "aiayn")]["flop_per_token"] > rows[("base", "aiayn")]["flop_per_token"]
    # The paper's recipe at the measured speed: 100k (base) / 300k (big) updates of 25k tokens.
    for model, updates in (("base", 100_000), ("big", 300_000)):
        row = rows[(model, "aiayn")]
        assert row["paper_recipe_hours"] == pytest.approx(updates * 25_000 / row["tokens_per_s"] / 3600)
        # The fastest of aiayn's modes, and the recipe's hours at its speed.
        fastest = report["fastest_training"][model]
        modes = [r for (m, s), r in rows.items() if m == model and s.startswith("aiayn")]
        best = max(modes, key=lambda r: r["tokens_per_s"])
        assert fastest == {"mode": best["mode"], "tokens_per_s": best["tokens_per_s"],
                           "paper_recipe_hours": best["paper_recipe_hours"]}


def test_decoding_rows_cover_every_batch_size(report: dict) -> None:
    rows = {(r["system"], r["sentences"]): r for r in report["decode"]}
    assert {s for s, _ in rows} == {"aiayn", "aiayn+cuda-graphs", "hf", "ctranslate2"}
    assert {n for _, n in rows} == {1, 4}
    for system in ("aiayn", "hf"):
        for n in (1, 4):
            row = rows[(system, n)]
            assert "skipped" not in row, row
            assert row["tokens"] == n * 4 and row["tokens_per_s"] > 0
    for n in (1, 4):  # the CUDA-graph step needs a GPU: skipped, saying so
        assert rows[("aiayn+cuda-graphs", n)]["skipped"] == "RuntimeError: CUDA graphs need a CUDA device, not cpu"


def test_ddp_runs_a_world_of_one_without_a_gpu(report: dict) -> None:
    ddp = report["ddp"]
    assert ddp["world_size"] == 1 and ddp["backend"] is None and ddp["tokens_per_step"] == 8 * 8
    single = next(r["tokens_per_s"] for r in report["train"] if r["model"] == "base" and r["system"] == "aiayn")
    assert ddp["single_device_tokens_per_s"] == single
    assert ddp["scaling"] == pytest.approx(ddp["tokens_per_s"] / single) == pytest.approx(ddp["efficiency"])


def _gpu_module():
    import gpu

    return gpu


@pytest.mark.parametrize(("name", "dtype", "tflops"), [
    ("NVIDIA H200", "bf16", 989.0),
    ("NVIDIA H200 NVL", "bf16", 835.0),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.0),
    ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA L4", "bf16", 121.0),
    ("Tesla V100-SXM2-16GB", "fp16", 125.0),
    ("Tesla V100-PCIE-32GB", "fp16", 112.0),
    ("Tesla T4", "fp16", 65.0),
    ("Tesla T4", "bf16", None),  # the table gives a T4's fp16 peak only
    ("Some Future GPU", "bf16", None),
    (None, "fp32", None),
])
def test_the_datasheet_peak_of_each_gpu(name, dtype, tflops) -> None:
    assert _gpu_module().datasheet_tflops(name, dtype) == tflops


def test_compiled_modes_past_the_budget_are_skipped_with_the_reason() -> None:
    import dataclasses

    import torch

    gpu = _gpu_module()
    sizes = dataclasses.replace(gpu.QUICK, models={"base": gpu.TINY})
    budget = gpu.Budget(0.0)
    rows = gpu.training(sizes, torch.device("cpu"), "fp32", None, None, budget)
    skipped = {r["system"]: r.get("skipped") for r in rows}
    assert skipped.pop("aiayn+compile") == skipped.pop("aiayn+reduce-overhead") == "time budget: 0 s left of 0 s"
    assert all(v is None for k, v in skipped.items() if k != "hf")  # eager rows always run


def test_mfu_counts_the_flops_of_transformer_base() -> None:
    from aiayn.config import model_preset

    gpu = _gpu_module()
    base = model_preset("base", src_vocab_size=32000, tgt_vocab_size=32000)
    # 3 x (6 x 6.36M + 6 x 8.52M + 32.8M) per target token at 32 tokens a side: cpu_train.py's 366e6.
    assert gpu.train_flop_per_token(base, 32) == pytest.approx(366e6, rel=2e-3)
