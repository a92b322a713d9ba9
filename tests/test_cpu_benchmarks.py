"""The CPU benchmarks' shared choices (benchmarks/workloads.py, imported as a module): which
precision rows a CPU kind skips, and that every CPU benchmark offers ``--emulated``."""

from __future__ import annotations

import argparse
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
