"""Running a recipe script end to end, as a user does, from the offline data mirror."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The offline data mirror (real corpora): $AIAYN_DATA_MIRROR alone, which .ci/run sets. Unset, a
# path that exists nowhere and names the variable, so the tests that need data skip saying so.
MIRROR = Path(os.environ.get("AIAYN_DATA_MIRROR") or "/AIAYN_DATA_MIRROR-is-not-set")


@pytest.fixture
def run_recipe(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_recipe(script, data, *overrides)``: ``scripts/SCRIPT`` with its data from the
    mirror's ``DATA`` folder (skipped without it), prepared data in ``tmp_path/data-bin``, the
    run in ``tmp_path/run``, the compile cache in ``tmp_path/cache``, the last 3 checkpoints
    averaged; asserts it succeeded."""

    def run(script: str, data: str, *overrides: str) -> subprocess.CompletedProcess[str]:
        if not (MIRROR / data).is_dir():
            pytest.skip(f"no {data} at {MIRROR} (set AIAYN_DATA_MIRROR)")
        env = {**os.environ, "DATA_DIR": str(MIRROR), "PREPARED": str(tmp_path / "data-bin"),
               "RUN": str(tmp_path / "run"), "AVERAGE": "3", "AIAYN": str(Path(sys.executable).with_name("aiayn")),
               "AIAYN_CACHE_DIR": str(tmp_path / "cache")}
        proc = subprocess.run(["bash", str(ROOT / "scripts" / script), *overrides],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    return run


def recording_aiayn(folder: Path, script: str = "") -> dict[str, str]:
    """The environment of a recipe script whose `aiayn` only records its calls (with its
    thread setting, on 4 threads), one line each in ``folder/calls.txt``, then runs the bash
    ``script`` (its arguments in "$@")."""
    fake = folder / "aiayn"
    fake.write_text('#!/usr/bin/env bash\necho "threads=${AIAYN_NUM_THREADS:-} $*" >> "$CALLS"\n' + script)
    fake.chmod(0o755)
    return {"AIAYN": str(fake), "CALLS": str(folder / "calls.txt"), "AIAYN_NUM_THREADS": "4"}


def recorded_calls(folder: Path, command: str) -> list[str]:
    """The recorded calls of ``aiayn COMMAND`` (not the overrides' --print-config check)."""
    lines = (folder / "calls.txt").read_text().splitlines()
    return [line for line in lines if line.split(" ")[1] == command and "--print-config" not in line]


# The quality guard of `--dtype auto`: each precision auto can choose on a CPU (bf16 with bf16
# units, int8 with VNNI or AMX; aiayn.runtime.auto_inference_dtype) translates a trained
# model's test set within this many BLEU of fp32.
AUTO_CPU_PRECISIONS = ("bf16", "int8")
DTYPE_GUARD_BLEU = 0.3


@pytest.fixture
def dtype_guard() -> Callable[..., dict[str, float]]:
    """``dtype_guard(checkpoints, source_file, reference_file, ensemble=False)``: sacreBLEU of
    the checkpoints' translations of the source file (the checkpoint's decode options) in fp32
    and in each of ``AUTO_CPU_PRECISIONS``; asserts each within ``DTYPE_GUARD_BLEU`` of fp32 and
    returns the scores by precision. Every precision runs on any CPU (emulated or on an exact
    fallback where the units are missing), so the guard holds for every CPU kind's choice."""

    def guard(checkpoints: list[Path], source_file: Path, reference_file: Path, ensemble: bool = False,
              tolerance: float = DTYPE_GUARD_BLEU) -> dict[str, float]:
        from aiayn.evaluation.bleu import corpus_bleu, read_lines
        from aiayn.inference.translator import Translator

        sources, references = read_lines(source_file), read_lines(reference_file)
        scores = {}
        for dtype in ("fp32", *AUTO_CPU_PRECISIONS):
            translator = Translator.from_checkpoint(checkpoints, device="cpu", dtype=dtype, ensemble=ensemble)
            scores[dtype] = corpus_bleu(translator.translate(sources), references)
        far = {d: s for d, s in scores.items() if abs(s - scores["fp32"]) > tolerance}
        assert not far, f"--dtype auto's precisions more than {tolerance} BLEU from fp32: {scores}"
        return scores

    return guard
