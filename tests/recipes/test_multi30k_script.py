"""scripts/multi30k.sh refuses bad settings with one line and exit 2, before any training
starts, and runs its members as documented (seen through an `aiayn` that records its calls;
the end-to-end run itself is the slow test beside this file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import MIRROR, ROOT, recorded_calls, recording_aiayn


def _script(tmp_path: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "DATA_DIR": str(MIRROR), "PREPARED": str(tmp_path / "data-bin"),
                "RUN": str(tmp_path / "run"), "AIAYN": str(Path(sys.executable).with_name("aiayn")), **env}
    return subprocess.run(["bash", str(ROOT / "scripts" / "multi30k.sh"), *overrides],
                          cwd=ROOT, env=full_env, capture_output=True, text=True)


MEMBERS_LINE = "give a whole number of models, 1 or more"
SEED_LINE = "give a whole number, the first member's seed"


@pytest.mark.parametrize(("name", "value", "message"), [
    *(("MEMBERS", v, MEMBERS_LINE) for v in ("0", "two", "-1", "1.5")),
    *(("SEED", v, SEED_LINE) for v in ("x", "-3", "1.5")),
    *(("COMPILE", v, "give on, off or auto") for v in ("yes", "1")),
])
def test_members_and_seed_must_be_whole_numbers(tmp_path: Path, name: str, value: str, message: str) -> None:
    proc = _script(tmp_path, **{name: value})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"multi30k.sh: {name}={value}: {message}"]
    assert not (tmp_path / "data-bin").exists() and not (tmp_path / "run").exists()


def test_a_bad_override_stops_before_the_members_start(tmp_path: Path) -> None:
    if not (MIRROR / "multi30k").is_dir():
        pytest.skip(f"no multi30k at {MIRROR} (set AIAYN_DATA_MIRROR)")
    proc = _script(tmp_path, "train.max_stepz=3")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "train.max_stepz" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # no member was started


def test_members_train_side_by_side_with_their_seeds_and_translate_as_one(tmp_path: Path) -> None:
    proc = _script(tmp_path, "train.max_steps=9", SEED="3", **recording_aiayn(tmp_path))
    assert proc.returncode == 0, proc.stderr
    run, prep, config = tmp_path / "run", tmp_path / "data-bin", "configs/multi30k_en_de.yaml"
    assert sorted(recorded_calls(tmp_path, "train")) == [
        f"threads=2 train --config {config} --run-dir {run}/member{k} data.prepared_dir={prep} train.max_steps=9 "
        f"train.seed={k + 2}" for k in (1, 2)]
    assert recorded_calls(tmp_path, "average") == [
        f"threads=4 average {run}/member{k} --last 5 --out {run}/member{k}/averaged --force" for k in (1, 2)]
    assert recorded_calls(tmp_path, "translate") == [
        f"threads=4 translate --checkpoint {run}/member1/averaged {run}/member2/averaged --ensemble "
        f"--input {prep}/test.src.txt --output {run}/test.hyp.de --compile on"]


@pytest.mark.parametrize("seed", [None, "5"])
def test_one_member_is_the_single_model_recipe(tmp_path: Path, seed: str | None) -> None:
    env = {**recording_aiayn(tmp_path), "MEMBERS": "1", **({"SEED": seed} if seed else {})}
    (tmp_path / "run").mkdir()  # what the real `aiayn train` makes, for the score's file
    proc = _script(tmp_path, "train.max_steps=9", **env)
    assert proc.returncode == 0, proc.stderr
    run, prep = tmp_path / "run", tmp_path / "data-bin"
    assert recorded_calls(tmp_path, "train") == [
        f"threads=4 train --config configs/multi30k_en_de.yaml --run-dir {run} data.prepared_dir={prep} "
        f"train.max_steps=9" + (f" train.seed={seed}" if seed else "")]
    assert recorded_calls(tmp_path, "translate") == [
        f"threads=4 translate --checkpoint {run}/averaged --input {prep}/test.src.txt --output {run}/test.hyp.de "
        "--compile on"]


@pytest.mark.parametrize(("data_dir", "mirror", "expected"), [
    ("/data/a", "/data/b", "--data-dir /data/a "),  # DATA_DIR first
    ("", "/data/b", "--data-dir /data/b "),          # else $AIAYN_DATA_MIRROR
    ("", "", ""),                                     # else `aiayn prepare` downloads
])
def test_the_corpus_comes_from_data_dir_else_the_mirror_variable_else_a_download(
        tmp_path: Path, data_dir: str, mirror: str, expected: str) -> None:
    env = {**recording_aiayn(tmp_path), "MEMBERS": "1", "DATA_DIR": data_dir, "AIAYN_DATA_MIRROR": mirror}
    (tmp_path / "run").mkdir()
    proc = _script(tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    assert recorded_calls(tmp_path, "prepare") == [
        f"threads=4 prepare --config configs/multi30k_en_de.yaml {expected}--out {tmp_path / 'data-bin'}"]


def _choosing_aiayn(tmp_path: Path, *overrides: str) -> dict[str, str]:
    """The recording `aiayn`, whose `choose-recipe` prints ``overrides`` and writes its --json."""
    lines = "\\n".join(overrides)
    return recording_aiayn(tmp_path, (
        'if [ "$1" = choose-recipe ]; then\n'
        f'  printf "{lines}\\n"\n'
        '  while [ $# -gt 0 ]; do [ "$1" = --json ] && echo \'{"variant": {"name": "light"}}\' > "$2"; shift; done\n'
        'fi\n'))


def test_the_chosen_variant_comes_before_the_callers_overrides_and_is_kept(tmp_path: Path) -> None:
    env = _choosing_aiayn(tmp_path, "model.d_ff=512", "train.warmup_steps=200")
    proc = _script(tmp_path, "train.warmup_steps=300", **env)
    assert proc.returncode == 0, proc.stderr
    run, prep, config = tmp_path / "run", tmp_path / "data-bin", "configs/multi30k_en_de.yaml"
    [choose] = recorded_calls(tmp_path, "choose-recipe")
    assert choose.startswith(f"threads=2 choose-recipe --config {config} --variants configs/variants/multi30k.yaml "
                             f"data.prepared_dir={prep} train.warmup_steps=300 --json ")
    assert sorted(recorded_calls(tmp_path, "train")) == [
        f"threads=2 train --config {config} --run-dir {run}/member{k} data.prepared_dir={prep} model.d_ff=512 "
        f"train.warmup_steps=200 train.warmup_steps=300 train.seed={k}" for k in (1, 2)]
    assert (run / "recipe.json").read_text() == '{"variant": {"name": "light"}}\n'
    # Run again (a resumed run): the earlier choice is handed back, not measured anew.
    (tmp_path / "calls.txt").unlink()
    assert _script(tmp_path, **env).returncode == 0
    [again] = recorded_calls(tmp_path, "choose-recipe")
    assert f"--previous {run}/recipe.json " in again


def test_variants_none_trains_the_config_as_written(tmp_path: Path) -> None:
    env = {**_choosing_aiayn(tmp_path, "model.d_ff=512"), "VARIANTS": "none", "MEMBERS": "1"}
    (tmp_path / "run").mkdir()
    proc = _script(tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    assert recorded_calls(tmp_path, "choose-recipe") == []
    assert recorded_calls(tmp_path, "train") == [f"threads=4 train --config configs/multi30k_en_de.yaml --run-dir "
                                         f"{tmp_path / 'run'} data.prepared_dir={tmp_path / 'data-bin'}"]
    assert not (tmp_path / "run" / "recipe.json").exists()


def test_a_missing_variants_file_is_one_line(tmp_path: Path) -> None:
    proc = _script(tmp_path, VARIANTS="nope.yaml")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["multi30k.sh: VARIANTS=nope.yaml: no such file (or none)"]
