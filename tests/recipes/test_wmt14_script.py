"""scripts/wmt14.sh: its settings, and the commands it runs, seen through an `aiayn`, a
`torchrun` and an `nvidia-smi` that only record their calls (the GPU branch cannot run
here); the whole script runs on a WMT-shaped corpus in the slow test beside this file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

CALLS = "calls.txt"


def _fakes(tmp_path: Path, gpus: int | None) -> dict[str, str]:
    """`aiayn` and `torchrun` that record their calls; `nvidia-smi -L` listing ``gpus`` GPUs
    (None: no nvidia-smi at all)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("aiayn", "torchrun"):
        fake = bin_dir / name
        fake.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >> "$CALLS"\n')
        fake.chmod(0o755)
    if gpus is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/usr/bin/env bash\n" + "".join(
            f'echo "GPU {k}: NVIDIA H100 80GB HBM3 (UUID: GPU-{k})"\n' for k in range(gpus)))
        smi.chmod(0o755)
    prepared, run = tmp_path / "data-bin", tmp_path / "run"
    prepared.mkdir()
    (prepared / "test.src.txt").write_text("a\nb\n")
    run.mkdir()  # what the real `aiayn train` makes, for the score's files
    path = f"{bin_dir}:/usr/bin:/bin"
    return {"AIAYN": str(bin_dir / "aiayn"), "TORCHRUN": str(bin_dir / "torchrun"), "PYTHON": sys.executable,
            "CALLS": str(tmp_path / CALLS), "PATH": path, "PREPARED": str(prepared), "RUN": str(run)}


def _script(tmp_path: Path, *overrides: str, gpus: int | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("GPUS", "DATA_DIR", "MODEL", "PAIR", "CONFIG")}
    full.update({"DATA_DIR": "/mirror", **_fakes(tmp_path, gpus), **env})
    return subprocess.run(["bash", str(ROOT / "scripts" / "wmt14.sh"), *overrides],
                          cwd=ROOT, env=full, capture_output=True, text=True)


def _calls(tmp_path: Path) -> list[str]:
    return (tmp_path / CALLS).read_text().splitlines()


@pytest.mark.parametrize(("name", "value", "message"), [
    ("MODEL", "huge", "MODEL=huge: choose base or big"),
    ("PAIR", "de-en", "PAIR=de-en: choose en-de or en-fr"),
    ("AVERAGE", "0", "AVERAGE=0: give a whole number of checkpoints, 1 or more"),
    ("MAX_STEPS", "1e5", "MAX_STEPS=1e5: give a whole number of updates, 1 or more"),
    ("GPUS", "two", "GPUS=two: give a whole number of GPUs, 0 for the CPU"),
])
def test_bad_settings_stop_with_one_line(tmp_path: Path, name: str, value: str, message: str) -> None:
    proc = _script(tmp_path, **{name: value})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"wmt14.sh: {message}"]
    assert not (tmp_path / CALLS).exists()


def test_en_fr_has_only_the_big_model(tmp_path: Path) -> None:
    proc = _script(tmp_path, PAIR="en-fr")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("wmt14.sh: no config configs/wmt14_en_fr_base.yaml (the paper trained only "
                                   "the big model on EN-FR: MODEL=big)")


@pytest.mark.parametrize(("gpus", "freq"), [(8, 8 // 8), (4, 8 // 4), (1, 8)])
def test_gpus_train_under_torchrun_with_the_papers_tokens_per_update(tmp_path: Path, gpus: int, freq: int) -> None:
    proc = _script(tmp_path, "train.seed=2", gpus=gpus, MAX_STEPS="300", CONFIG_OVERRIDES="train.save_every=50")
    assert proc.returncode == 0, proc.stderr
    run, prep, cfg = tmp_path / "run", tmp_path / "data-bin", "configs/wmt14_en_de_base.yaml"
    hyp = f"{run}/newstest2014.hyp.de"
    assert _calls(tmp_path) == [
        f"aiayn prepare --config {cfg} --data-dir /mirror --out {prep}",
        f"torchrun --standalone --nproc-per-node {gpus} -m aiayn train --config {cfg} --run-dir {run} "
        f"data.prepared_dir={prep} train.device=cuda train.update_freq={freq} train.max_steps=300 "
        "train.save_every=50 train.seed=2",
        f"aiayn average {run} --last 5 --out {run}/averaged --force",
        f"aiayn translate --checkpoint {run}/averaged --input {prep}/test.src.txt --output {hyp} --device cuda --quiet",
        f"aiayn evaluate --hyp {hyp} --ref {prep}/test.tgt.txt --tokenized-bleu --tgt de",
        f"aiayn evaluate --hyp {hyp} --ref {prep}/test.tgt.txt --tokenized-bleu --tgt de --json"]
    assert "warning" not in proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("== time: download ")
    assert (run / "time.txt").read_text().startswith("== time: download ")


def test_a_gpu_count_that_does_not_divide_8_is_warned_about(tmp_path: Path) -> None:
    proc = _script(tmp_path, gpus=3)
    assert proc.returncode == 0, proc.stderr
    assert "--nproc-per-node 3" in _calls(tmp_path)[1] and "train.update_freq=3" in _calls(tmp_path)[1]
    assert "wmt14.sh: warning: 3 GPUs x update_freq 3 = 9 batches per update" in proc.stderr


@pytest.mark.parametrize("gpus", [None, 0])
def test_without_gpus_it_trains_on_the_cpu_and_says_so(tmp_path: Path, gpus: int | None) -> None:
    proc = _script(tmp_path, gpus=gpus)
    assert proc.returncode == 0, proc.stderr
    assert _calls(tmp_path)[1] == (f"aiayn train --config configs/wmt14_en_de_base.yaml --run-dir {tmp_path}/run "
                                   f"data.prepared_dir={tmp_path}/data-bin train.device=cpu train.update_freq=8")
    assert "--device cpu" in _calls(tmp_path)[3]
    assert "wmt14.sh: warning: no GPU found: training on the CPU" in proc.stderr


@pytest.mark.parametrize(("env", "config", "average", "tgt"), [
    ({"MODEL": "big"}, "configs/wmt14_en_de_big.yaml", 20, "de"),
    ({"MODEL": "big", "PAIR": "en-fr"}, "configs/wmt14_en_fr_big.yaml", 20, "fr"),
    ({"MODEL": "big", "AVERAGE": "3"}, "configs/wmt14_en_de_big.yaml", 3, "de"),
])
def test_model_and_pair_pick_the_config_and_the_papers_averaging(
        tmp_path: Path, env: dict[str, str], config: str, average: int, tgt: str) -> None:
    proc = _script(tmp_path, gpus=8, **env)
    assert proc.returncode == 0, proc.stderr
    calls = _calls(tmp_path)
    assert calls[0].startswith(f"aiayn prepare --config {config} ")
    assert calls[2] == f"aiayn average {tmp_path}/run --last {average} --out {tmp_path}/run/averaged --force"
    assert calls[-1].endswith(f"--tokenized-bleu --tgt {tgt} --json")


def test_the_download_is_stated_before_it_starts(tmp_path: Path) -> None:
    # No mirror: the sizes come first; here the archives are already in the cache (no curl
    # call), and `aiayn prepare` is pointed at it.
    cache = tmp_path / "cache"
    for name in ("wmt14/training-parallel-europarl-v7.tgz", "wmt14/training-parallel-commoncrawl.tgz",
                 "wmt14/training-parallel-nc-v9.tgz", "wmt19/dev.tgz", "wmt14/test-full.tgz"):
        (cache / name).parent.mkdir(parents=True, exist_ok=True)
        (cache / name).write_bytes(b"")
    proc = _script(tmp_path, gpus=1, DATA_DIR="", AIAYN_DATA_MIRROR="", AIAYN_CACHE_DIR=str(cache))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "== wmt14_en_de: 5 archives, 1.70 GB + 1 of unpublished size"
    assert lines[1] == "   wmt14/training-parallel-europarl-v7.tgz  0.66 GB"
    assert lines[6].startswith(f"== download into {cache}: 1.70 GB, then extracted text and prepared data")
    assert _calls(tmp_path)[0] == (f"aiayn prepare --config configs/wmt14_en_de_base.yaml --download-dir {cache} "
                                   f"--out {tmp_path}/data-bin")
