"""The CPU benchmarks' shared choices (benchmarks/workloads.py, imported as a module): which
precision rows a CPU kind skips, that every CPU benchmark offers ``--emulated``, and the short
pass `make bench` runs (the latency benchmark's rows, batches and tables; options that exist)."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def workloads():
    import workloads

    return workloads


@pytest.mark.parametrize("native, dtype, include, skipped", [
    (False, "bf16", False, True), (False, "bf16+compile", False, True), (False, "bfloat16", False, True),
    (False, "bf16", True, False),  # --emulated: measured all the same
    (True, "bf16", False, False), (True, "bf16+compile", False, False),
    (False, "fp32", False, False), (False, "int8", False, False), (False, "int8+compile", False, False),
    (False, "float32", False, False),
])
def test_emulated_precisions_are_skipped_with_one_reason(monkeypatch: pytest.MonkeyPatch, workloads, native: bool,
                                                        dtype: str, include: bool, skipped: bool):
    from aiayn.runtime import precision

    monkeypatch.setattr(precision, "native_bf16", lambda device: native)
    reason = workloads.emulated(dtype, include)
    if skipped:
        assert reason == "bf16 is emulated on this CPU (no AVX-512 BF16 or AMX); --emulated measures it"
    else:
        assert reason is None


@pytest.mark.parametrize("script", ["cpu_train", "cpu_decode", "cpu_latency"])
def test_every_cpu_benchmark_skips_emulated_rows_unless_asked(monkeypatch: pytest.MonkeyPatch, workloads,
                                                              script: str):
    """`make bench` runs these three: each parses --emulated and asks workloads.emulated per row."""
    source = (BENCHMARKS / f"{script}.py").read_text()
    assert "W.emulated(dtype, args.emulated)" in source
    ap = argparse.ArgumentParser()
    workloads.add_common_args(ap, "x.json")
    assert ap.parse_args(["--emulated"]).emulated is True
    assert ap.parse_args([]).emulated is False


@pytest.fixture
def cpu_latency():
    import cpu_latency

    return cpu_latency


@pytest.mark.parametrize("flags, fbgemm, aiayn_dtype", [
    ({"avx2"}, True, "int8"), ({"avx2"}, False, "fp32"), ({"avx2", "avx512_vnni"}, True, "int8"),
    ({"avx2", "avx512_bf16"}, True, "bf16")])
def test_the_short_latency_pass_runs_the_precision_auto_picks_against_ctranslate2_int8(
        monkeypatch: pytest.MonkeyPatch, cpu_latency, flags: set[str], fbgemm: bool, aiayn_dtype: str):
    from aiayn.runtime import cpu

    monkeypatch.delenv("AIAYN_DTYPE", raising=False)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(cpu, "onednn_int8", lambda: True)
    monkeypatch.setattr(cpu, "fbgemm_int8", lambda: fbgemm)
    assert cpu_latency.selected_rows({"aiayn", "ctranslate2"}, auto_only=True) == [
        ("aiayn", aiayn_dtype), ("ctranslate2", "int8")]
    assert cpu_latency.selected_rows({"ctranslate2"}, auto_only=True) == [("ctranslate2", "int8")]
    every = cpu_latency.selected_rows({"aiayn", "ctranslate2"}, auto_only=False)
    assert every == cpu_latency.SYSTEMS and len(every) == 8


def test_latency_batches_parse_with_the_latency_pass_always_in(cpu_latency):
    assert cpu_latency.parse_batches("64") == (1, 64)
    assert cpu_latency.parse_batches("256,8, 64,8") == (1, 8, 64, 256)
    for bad, says in [("eight", "comma-separated batch sizes"), ("0,8", "1 or more")]:
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            cpu_latency.parse_batches(bad)


def test_latency_tables_show_the_batches_measured(cpu_latency, capsys: pytest.CaptureFixture[str]):
    row = {"p50_ms": 10.0, "p99_ms": 30.0, "mean_ms": 12.0, "warmup_s": 1.5, "latency_sentences": 100}
    rows = [{"system": "aiayn", "dtype": "fp32", **row, "batch_tokens_per_s": {"1": 50.0, "64": 400.0}},
            {"system": "ctranslate2", "dtype": "int8", **row, "p50_ms": 20.0,
             "batch_tokens_per_s": {"1": 40.0, "64": 300.0}}]
    cpu_latency.print_tables(rows)
    assert capsys.readouterr().out.splitlines() == [
        "",
        "single-sentence latency, beam 4, 100 Multi30k-length sentences, 2 threads",
        "system        dtype            p50 ms   p99 ms  mean ms  p50 x ct2 int8",
        "aiayn         fp32               10.0     30.0     12.0            0.50",
        "ctranslate2   int8               20.0     30.0     12.0            1.00",
        "warm-up on 10 single sentences, compiling included: aiayn fp32 1.5 s, ctranslate2 int8 1.5 s",
        "",
        "generated tokens/s against batch size (sentences per call), beam 4",
        "system        dtype                 1       64",
        "aiayn         fp32               50.0    400.0",
        "ctranslate2   int8               40.0    300.0"]


def test_make_bench_passes_options_the_benchmarks_have(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]):
    """Each option of `make bench`'s commands is one its script offers (its --help)."""
    makefile = (BENCHMARKS.parent / "Makefile").read_text()
    recipe = makefile[makefile.index("\nbench:"):].split("\n\n")[0]
    commands = re.findall(r"benchmarks/(cpu_\w+)\.py([^\n]*)", recipe)
    assert [name for name, _ in commands] == ["cpu_train", "cpu_decode", "cpu_latency"]
    for name, options in commands:
        monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
        with pytest.raises(SystemExit) as done:
            importlib.import_module(name).main()
        assert done.value.code == 0
        shown = capsys.readouterr().out
        for option in re.findall(r"--[\w-]+", options):
            assert re.search(rf"{option}\b", shown), (name, option)
