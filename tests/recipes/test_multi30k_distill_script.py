"""scripts/multi30k_distill.sh: its settings, what it needs of the teacher run, and the
commands it runs, seen through an `aiayn` that records its calls (translating a line into
"hyp " + the line, scoring 12.5 BLEU); the whole script runs for real in the slow test beside
this file."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

SOURCES = ["A dog runs.", "Two men sit.", "A girl sings."]
TARGETS = ["Ein Hund rennt.", "Zwei Männer sitzen.", "Ein Mädchen singt."]
FAKE_AIAYN = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
command=$1
while [ $# -gt 0 ]; do
    case "$1" in --input) input=$2 ;; --output) output=$2 ;; esac
    shift
done
case "$command" in
    translate) mkdir -p "$(dirname "$output")"  # the student's run directory, as `aiayn train` makes it
               gzip -cdf "$input" | sed 's/^/hyp /' > "$output" ;;
    evaluate) printf '{\n "bleu": 12.5\n}\n' ;;
esac
"""


def _teacher(tmp_path: Path, members: int = 2) -> dict[str, str]:
    """What scripts/multi30k.sh leaves (empty checkpoints), a mirror with the training
    text, and the recording `aiayn`."""
    prepared, run, mirror = tmp_path / "data-bin", tmp_path / "run", tmp_path / "mirror" / "multi30k"
    prepared.mkdir()
    (prepared / "summary.json").write_text("{}")
    (prepared / "test.src.txt").write_text("A cat.\nA bird.\n")
    for member in ([run] if members == 1 else [run / f"member{k}" for k in range(1, members + 1)]):
        (member / "averaged").mkdir(parents=True)
    (run / "test.score.json").write_text('{\n "bleu": 20.25,\n "chrf": 40.0\n}\n')
    mirror.mkdir(parents=True)
    for lang, lines in (("en", SOURCES), ("de", TARGETS)):
        (mirror / f"train.{lang}.gz").write_bytes(gzip.compress("".join(f"{x}\n" for x in lines).encode()))
    fake = tmp_path / "aiayn"
    fake.write_text(FAKE_AIAYN)
    fake.chmod(0o755)
    return {"AIAYN": str(fake), "CALLS": str(tmp_path / "calls.txt"), "DATA_DIR": str(mirror.parent),
            "PREPARED": str(prepared), "RUN": str(run), "MEMBERS": str(members)}


def _script(tmp_path: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items()
            if k not in ("CONFIG", "SRC", "TGT", "SEED", "MIX", "STUDENT", "AVERAGE", "MEMBERS", "DATA_DIR")}
    full.update({"AIAYN_CACHE_DIR": str(tmp_path / "cache"), **env})
    return subprocess.run(["bash", str(ROOT / "scripts" / "multi30k_distill.sh"), *overrides],
                          cwd=ROOT, env=full, capture_output=True, text=True)


def _calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls.txt"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize(("name", "value", "message"), [
    ("MEMBERS", "0", "MEMBERS=0: give a whole number of models, 1 or more"),
    ("SEED", "-3", "SEED=-3: give a whole number, the student's seed"),
    ("MIX", "yes", "MIX=yes: give 0 (distilled pairs only) or 1 (original and distilled pairs)"),
    ("AVERAGE", "0", "AVERAGE=0: give a whole number of checkpoints, 1 or more"),
    ("CONFIG", "configs/nope.yaml", "no config configs/nope.yaml"),
])
def test_bad_settings_stop_with_one_line(tmp_path: Path, name: str, value: str, message: str) -> None:
    proc = _script(tmp_path, **{**_teacher(tmp_path), name: value})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"multi30k_distill.sh: {message}"]
    assert _calls(tmp_path) == []


@pytest.mark.parametrize(("missing", "message"), [
    ("data-bin/summary.json", "{t}/data-bin: not a prepared directory; run scripts/multi30k.sh first (same PREPARED)"),
    ("run/member2/averaged", "no {t}/run/member2/averaged: run scripts/multi30k.sh to its end first "
                             "(same RUN and MEMBERS)"),
    ("run/test.score.json", "no {t}/run/test.score.json with a BLEU: run scripts/multi30k.sh to its end first "
                            "(same RUN)"),
    ("mirror/multi30k/train.en.gz", "no multi30k/train.en.gz in the mirror {t}/mirror or the download cache "
                                    "{t}/cache: set DATA_DIR"),
])
def test_an_unfinished_teacher_run_stops_with_one_line(tmp_path: Path, missing: str, message: str) -> None:
    env = _teacher(tmp_path)
    path = tmp_path / missing
    path.rmdir() if path.is_dir() else path.unlink()
    proc = _script(tmp_path, **env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["multi30k_distill.sh: " + message.format(t=tmp_path)]
    assert _calls(tmp_path) == [] and not (tmp_path / "run" / "distill").exists()


def test_a_score_file_without_a_bleu_stops_with_one_line(tmp_path: Path) -> None:
    env = _teacher(tmp_path)
    (tmp_path / "run" / "test.score.json").write_text('{\n "chrf": 40.0\n}\n')
    proc = _script(tmp_path, **env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"multi30k_distill.sh: no {tmp_path}/run/test.score.json with a BLEU: run scripts/multi30k.sh to its end "
        "first (same RUN)"]
    assert _calls(tmp_path) == []


def test_the_training_text_may_come_from_the_download_cache(tmp_path: Path) -> None:
    env = _teacher(tmp_path)
    (tmp_path / "mirror").rename(tmp_path / "cache")
    proc = _script(tmp_path, **{**env, "DATA_DIR": "", "AIAYN_DATA_MIRROR": ""})
    assert proc.returncode == 0, proc.stderr
    assert f"--input {tmp_path}/cache/multi30k/train.en.gz " in _calls(tmp_path)[1]


def test_the_ensemble_teaches_one_student_timed_against_it(tmp_path: Path) -> None:
    proc = _script(tmp_path, "train.max_steps=9", **_teacher(tmp_path), STUDENT="model.d_model=128 model.d_ff=512")
    assert proc.returncode == 0, proc.stderr
    t, config = tmp_path, "configs/multi30k_en_de.yaml"
    teachers = f"{t}/run/member1/averaged {t}/run/member2/averaged --ensemble"
    student = f"train --config {config} --run-dir {t}/run/student data.prepared_dir={t}/data-bin.distill " \
              "train.max_steps=9 model.d_model=128 model.d_ff=512"
    assert _calls(tmp_path) == [
        f"{student} --print-config",
        f"translate --checkpoint {teachers} --input {t}/mirror/multi30k/train.en.gz "
        f"--output {t}/run/distill/train.hyp.de --resume",
        f"prepare --config {config} --data-dir {t}/mirror --tokenizer-dir {t}/data-bin "
        f"--train-src {t}/mirror/multi30k/train.en.gz --train-tgt {t}/run/distill/train.hyp.de "
        f"--out {t}/data-bin.distill",
        student,
        f"average {t}/run/student --last 5 --out {t}/run/student/averaged --force",
        f"translate --checkpoint {teachers} --input {t}/data-bin/test.src.txt "
        f"--output {t}/run/distill/test.ensemble.hyp.de",
        f"translate --checkpoint {t}/run/student/averaged --input {t}/data-bin/test.src.txt "
        f"--output {t}/run/student/test.hyp.de",
        f"evaluate --hyp {t}/run/student/test.hyp.de --ref {t}/data-bin/test.tgt.txt",
        f"evaluate --hyp {t}/run/student/test.hyp.de --ref {t}/data-bin/test.tgt.txt --json",
    ]
    report = json.loads((t / "run" / "distill.json").read_text())
    assert report.keys() == {"bleu_student", "bleu_ensemble", "decode_s_student", "decode_s_ensemble",
                             "speedup", "members", "mix"}
    assert (report["bleu_student"], report["bleu_ensemble"], report["members"], report["mix"]) == (12.5, 20.25, 2, 0)
    assert report["decode_s_student"] > 0 and report["decode_s_ensemble"] > 0
    assert report["speedup"] == pytest.approx(report["decode_s_ensemble"] / report["decode_s_student"], abs=1e-3)
    assert (t / "run" / "student" / "test.score.json").read_text() == '{\n "bleu": 12.5\n}\n'


def test_a_complete_translation_of_the_training_text_is_kept(tmp_path: Path) -> None:
    env = _teacher(tmp_path)
    hyp = tmp_path / "run" / "distill" / "train.hyp.de"
    hyp.parent.mkdir()
    hyp.write_text("kept 1\nkept 2\nkept 3\n")
    proc = _script(tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    assert "the training sources are translated already" in proc.stdout
    assert not [c for c in _calls(tmp_path) if c.startswith("translate") and "train.en.gz" in c]
    assert hyp.read_text() == "kept 1\nkept 2\nkept 3\n"


def test_a_short_translation_of_the_training_text_is_done_again(tmp_path: Path) -> None:
    env = _teacher(tmp_path)
    hyp = tmp_path / "run" / "distill" / "train.hyp.de"
    hyp.parent.mkdir()
    hyp.write_text("kept 1\n")  # not one line per source: not from this corpus
    proc = _script(tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    assert hyp.read_text().splitlines() == [f"hyp {x}" for x in SOURCES]


def test_mix_pairs_each_source_with_its_original_and_its_distilled_target(tmp_path: Path) -> None:
    proc = _script(tmp_path, **_teacher(tmp_path), MIX="1")
    assert proc.returncode == 0, proc.stderr
    work = tmp_path / "run" / "distill"
    assert (work / "train.mix.en").read_text().splitlines() == SOURCES + SOURCES
    assert (work / "train.mix.de").read_text().splitlines() == TARGETS + [f"hyp {x}" for x in SOURCES]
    prepare = [c for c in _calls(tmp_path) if c.startswith("prepare")]
    assert prepare == [f"prepare --config configs/multi30k_en_de.yaml --data-dir {tmp_path}/mirror "
                       f"--tokenizer-dir {tmp_path}/data-bin --train-src {work}/train.mix.en "
                       f"--train-tgt {work}/train.mix.de --out {tmp_path}/data-bin.distill-mix"]
    assert (tmp_path / "run" / "student-mix" / "test.hyp.de").is_file()
    assert json.loads((tmp_path / "run" / "distill-mix.json").read_text())["mix"] == 1
    assert not (tmp_path / "run" / "distill.json").exists()


def test_one_member_teaches_alone(tmp_path: Path) -> None:
    proc = _script(tmp_path, **_teacher(tmp_path, members=1), SEED="7")
    assert proc.returncode == 0, proc.stderr
    calls = _calls(tmp_path)
    assert calls[1].startswith(f"translate --checkpoint {tmp_path}/run/averaged --input ")
    assert calls[3].endswith("train.seed=7") and "--ensemble" not in " ".join(calls)
    assert json.loads((tmp_path / "run" / "distill.json").read_text())["members"] == 1


def test_a_bad_student_override_stops_before_any_translating(tmp_path: Path) -> None:
    env = {**_teacher(tmp_path), "AIAYN": str(Path(sys.executable).with_name("aiayn"))}
    proc = _script(tmp_path, STUDENT="model.d_modl=128", **env)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "model.d_modl" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "distill").exists() and not (tmp_path / "run" / "student").exists()
