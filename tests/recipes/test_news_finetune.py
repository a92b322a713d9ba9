"""scripts/news_finetune.sh: a Multi30k model fine-tuned on news text with an extended
vocabulary, beside the base, a news+Multi30k mix and a model trained from scratch.

The fast tests pin what the script decides (refusals, the data split, which command each arm
runs) through an `aiayn` that records its calls; the slow one rehearses it end to end on a
tiny model and a cut-down mirror. That a kept piece's rows are copied bitwise and a new one's
are the mean is pinned in tests/checkpoint/test_vocab_init.py, not repeated here.
"""

from __future__ import annotations

import gzip
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sacrebleu.metrics import BLEU

from .conftest import MIRROR, ROOT

SCRIPT = ROOT / "scripts" / "news_finetune.sh"
AIAYN = str(Path(sys.executable).with_name("aiayn"))


def _write_gz(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def _script(env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *overrides], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True)


def test_the_config_has_the_multi30k_model_and_decoding() -> None:
    """train.init_from loads the base strictly: the model section must be the recipe's."""
    tune = yaml.safe_load((ROOT / "configs" / "news_finetune_en_de.yaml").read_text())
    base = yaml.safe_load((ROOT / "configs" / "multi30k_en_de.yaml").read_text())
    assert tune["model"] == base["model"] and tune["decode"] == base["decode"]
    assert tune["train"]["lr"] < base["train"]["lr"] and tune["train"]["warmup_steps"] < base["train"]["warmup_steps"]


# --- the script's decisions, seen through an `aiayn` that records its calls -------------------

FAKE_AIAYN = r"""#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$1" in
    evaluate) echo '{"bleu": 12.5}' ;;
    train)
        for a in "$@"; do case "$a" in --print-config) exit 0 ;; esac; done
        run=$(printf '%s\n' "$@" | sed -n '/^--run-dir$/{n;p}')
        mkdir -p "$run"
        case "$*" in *train.init_from=*)
            echo 'INFO aiayn.recipes.train: init_vocab extend: joint vocabulary 20 -> 23 pieces, 20 kept,' \
                '3 new (mean embedding)' > "$run/train.log" ;;
        esac ;;
esac
"""


@pytest.fixture
def world(tmp_path: Path) -> dict[str, str]:
    """A base run (RUN/averaged), its prepared test set, a mirror of 10 news pairs per set and
    6 Multi30k training pairs, and the recording `aiayn`."""
    for year in (2012, 2013):
        for lang in ("en", "de"):
            _write_gz(tmp_path / "mirror" / "wmt-news" / f"newstest{year}.{lang}.gz",
                      [f"{year} {lang} {i}" for i in range(1, 11)])
    for lang in ("en", "de"):
        _write_gz(tmp_path / "mirror" / "multi30k" / f"train.{lang}.gz", [f"m30k {lang} {i}" for i in range(1, 7)])
    (tmp_path / "run" / "averaged" / "tokenizer").mkdir(parents=True)
    (tmp_path / "run" / "averaged" / "model.safetensors").write_bytes(b"")
    (tmp_path / "prep").mkdir()
    for name in ("test.src.txt", "test.tgt.txt"):
        (tmp_path / "prep" / name).write_text("a\n")
    fake = tmp_path / "aiayn"
    fake.write_text(FAKE_AIAYN)
    fake.chmod(0o755)
    return {"AIAYN": str(fake), "CALLS": str(tmp_path / "calls.txt"), "RUN": str(tmp_path / "run"),
            "PREPARED": str(tmp_path / "prep"), "DATA_DIR": str(tmp_path / "mirror"), "OUT": str(tmp_path / "out"),
            "EXTEND": "3", "STEPS": "20", "SCRATCH_STEPS": "30", "HELDOUT": "4", "MIX": "2", "AVERAGE": "3"}


@pytest.mark.parametrize(("name", "value", "line"), [
    ("STEPS", "0", "STEPS=0: give a whole number, 1 or more"),
    ("SCRATCH_STEPS", "ten", "SCRATCH_STEPS=ten: give a whole number, 1 or more"),
    ("HELDOUT", "0", "HELDOUT=0: give a whole number, 1 or more"),
    ("EXTEND", "-5", "EXTEND=-5: give a whole number, the pieces to add to the base tokenizer"),
    ("MIX", "1.5", "MIX=1.5: give a whole number, the Multi30k training pairs of the mixed arm"),
    ("HELDOUT", "10", "HELDOUT=10: newstest2012 has no pairs left to train on"),
])
def test_bad_settings_are_one_line_and_exit_2(world: dict[str, str], tmp_path: Path, name: str, value: str,
                                                line: str) -> None:
    proc = _script({**world, name: value})
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"news_finetune.sh: {line}"]
    assert not (tmp_path / "out").exists() and not (tmp_path / "calls.txt").exists()


def test_a_run_without_a_checkpoint_is_refused(world: dict[str, str], tmp_path: Path) -> None:
    proc = _script({**world, "RUN": str(tmp_path / "prep")})
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"news_finetune.sh: RUN={tmp_path / 'prep'} has no averaged checkpoint (member1/averaged or averaged): "
        "run scripts/multi30k.sh first, or give BASE"]
    assert not (tmp_path / "out").exists()


def test_a_missing_mirror_is_refused(world: dict[str, str], tmp_path: Path) -> None:
    proc = _script({**world, "DATA_DIR": "", "AIAYN_DATA_MIRROR": ""})
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [
        "news_finetune.sh: no data mirror: set DATA_DIR or AIAYN_DATA_MIRROR (a folder with wmt-news/ and multi30k/)"])
    (tmp_path / "mirror" / "wmt-news" / "newstest2013.de.gz").unlink()
    proc = _script(world)
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [
        f"news_finetune.sh: no {tmp_path / 'mirror' / 'wmt-news' / 'newstest2013.de.gz'}"])


def test_the_arms_run_their_commands_on_their_data(world: dict[str, str], tmp_path: Path) -> None:
    proc = _script(world, "train.seed=7")
    assert proc.returncode == 0, proc.stderr
    out, base, news = tmp_path / "out", tmp_path / "run" / "averaged", tmp_path / "mirror" / "wmt-news"
    text = {p.name: p.read_text().splitlines() for p in (out / "text").iterdir()}
    assert text["news.train.en"] == [f"2012 en {i}" for i in range(1, 7)]   # 10 pairs less HELDOUT=4
    assert text["news.valid.de"] == [f"2012 de {i}" for i in range(7, 11)]  # the last 4: validation
    assert text["mixed.train.de"] == [*text["news.train.de"], "m30k de 1", "m30k de 2"]  # MIX=2
    calls = [shlex.split(line) for line in (tmp_path / "calls.txt").read_text().splitlines()]
    trains = {c[c.index("--run-dir") + 1]: c for c in calls if c[0] == "train" and "--print-config" not in c}
    assert sorted(trains) == [str(out / arm) for arm in ("finetune", "mixed", "scratch")]
    common = ["train.max_time_minutes=0", "train.save_every=2", "train.valid_every=2", "train.keep_last=3"]
    assert trains[str(out / "finetune")] == [
        "train", "--config", "configs/news_finetune_en_de.yaml", "--run-dir", str(out / "finetune"),
        "train.max_steps=20", *common, f"data.prepared_dir={out / 'data-bin' / 'news'}",
        f"train.init_from={base}", "train.init_vocab=extend", "train.seed=7"]
    assert f"data.prepared_dir={out / 'data-bin' / 'mixed'}" in trains[str(out / "mixed")]
    assert f"train.init_from={base}" in trains[str(out / "mixed")]
    assert trains[str(out / "scratch")] == [
        "train", "--config", "configs/multi30k_en_de.yaml", "--run-dir", str(out / "scratch"),
        "train.max_steps=30", "train.max_time_minutes=0", "train.save_every=3", "train.valid_every=3",
        "train.keep_last=3", f"data.prepared_dir={out / 'data-bin' / 'news'}", "train.seed=7"]
    prepares = [c for c in calls if c[0] == "prepare"]
    assert [c[c.index("--tokenizer-dir") + 1:] for c in prepares] == [
        [str(base / "tokenizer"), "--extend-vocab", "3", "--out", str(out / "data-bin" / "news")],
        [str(out / "data-bin" / "news"), "--out", str(out / "data-bin" / "mixed")]]  # finetune's vocabulary
    scored = [(c[c.index("--checkpoint") + 1], Path(c[c.index("--input") + 1]).name)
              for c in calls if c[0] == "evaluate"]
    assert scored == [(str(base), "newstest2013.en.gz"), (str(base), "test.src.txt"),
                      (str(out / "finetune" / "averaged"), "newstest2013.en.gz"),
                      (str(out / "finetune" / "averaged"), "test.src.txt"),
                      (str(out / "mixed" / "averaged"), "newstest2013.en.gz"),
                      (str(out / "mixed" / "averaged"), "test.src.txt"),
                      (str(out / "scratch" / "averaged"), "newstest2013.en.gz")]
    assert all(c[c.index("--ref") + 1] == str(news / "newstest2013.de.gz") for c in calls
               if c[0] == "evaluate" and c[c.index("--input") + 1].endswith("newstest2013.en.gz"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["bleu"] == {"newstest2013": dict.fromkeys(("base", "finetune", "mixed", "scratch"), 12.5),
                               "test2016": dict.fromkeys(("base", "finetune", "mixed"), 12.5)}
    assert summary["init_vocab"]["mixed"] == {"mode": "extend",
                                              "joint": {"old": 20, "new": 23, "kept": 20, "added": 3}}


def test_member1_of_an_ensemble_run_is_the_base(world: dict[str, str], tmp_path: Path) -> None:
    member = tmp_path / "run" / "member1" / "averaged"
    (member / "tokenizer").mkdir(parents=True)
    (member / "model.safetensors").write_bytes(b"")
    assert _script(world).returncode == 0
    calls = (tmp_path / "calls.txt").read_text()
    assert f"train.init_from={member} " in calls and f"train.init_from={tmp_path / 'run' / 'averaged'} " not in calls


# --- end to end: a tiny model on a cut-down mirror --------------------------------------------

TINY = ["model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "train.device=cpu", "train.dtype=fp32", "train.progress_bar=false",
        "train.max_tokens=512", "train.warmup_steps=1"]


ONE_THREAD = {"AIAYN_NUM_THREADS": "1"}  # the commands run one after another


def _aiayn(*args: str) -> None:
    proc = subprocess.run([AIAYN, *args], cwd=ROOT, env={**os.environ, **ONE_THREAD}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _head(src: Path, dst: Path, n: int) -> None:
    with gzip.open(src, "rt", encoding="utf-8") as f:
        _write_gz(dst, [line.rstrip("\n") for _, line in zip(range(n), f)])


def _pieces(tokenizer_dir: Path) -> list[str]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_dir / "spm.model"))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about a CPU-minute (25 commands, mostly their start-up); far longer beside other work
def test_rehearsal_end_to_end(tmp_path: Path) -> None:
    """A tiny Multi30k model (6 updates on 400 pairs), then every arm of the script on a mirror
    cut to 120 newstest2012 and 20 newstest2013 pairs; then a re-run after the mixed arm lost
    its scores: the other arms are skipped, the mixed training resumes, the counts stay."""
    if not (MIRROR / "wmt-news").is_dir() or not (MIRROR / "multi30k").is_dir():
        pytest.skip(f"no wmt-news and multi30k at {MIRROR} (set AIAYN_DATA_MIRROR)")
    mirror, prep, run, out = tmp_path / "mirror", tmp_path / "prep", tmp_path / "run", tmp_path / "out"
    for lang in ("en", "de"):
        _head(MIRROR / "wmt-news" / f"newstest2012.{lang}.gz", mirror / "wmt-news" / f"newstest2012.{lang}.gz", 120)
        _head(MIRROR / "wmt-news" / f"newstest2013.{lang}.gz", mirror / "wmt-news" / f"newstest2013.{lang}.gz", 20)
        _head(MIRROR / "multi30k" / f"train.{lang}.gz", mirror / "multi30k" / f"train.{lang}.gz", 400)
        for split in ("val", "test_2016_flickr"):
            _head(MIRROR / "multi30k" / f"{split}.{lang}.gz", tmp_path / "m30k" / f"{split}.{lang}.gz", 20)
    m30k = tmp_path / "m30k"
    _aiayn("prepare", "--quiet", "--vocab-size", "300", "--out", str(prep),
           "--train-src", str(mirror / "multi30k" / "train.en.gz"),
           "--train-tgt", str(mirror / "multi30k" / "train.de.gz"),
           "--valid-src", str(m30k / "val.en.gz"), "--valid-tgt", str(m30k / "val.de.gz"),
           "--test-src", str(m30k / "test_2016_flickr.en.gz"), "--test-tgt", str(m30k / "test_2016_flickr.de.gz"))
    _aiayn("train", "--config", "configs/multi30k_en_de.yaml", "--run-dir", str(run), f"data.prepared_dir={prep}",
           *TINY, "train.max_steps=6", "train.max_time_minutes=0", "train.save_every=3", "train.valid_every=6")
    _aiayn("average", str(run), "--last", "2", "--out", str(run / "averaged"))

    env = {**ONE_THREAD, "AIAYN": AIAYN, "RUN": str(run), "PREPARED": str(prep), "DATA_DIR": str(mirror),
           "OUT": str(out), "EXTEND": "40", "STEPS": "4", "SCRATCH_STEPS": "4", "HELDOUT": "20", "MIX": "50",
           "AVERAGE": "2"}
    proc = _script(env, *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["bleu"]["newstest2013"]) == {"base", "finetune", "mixed", "scratch"}
    assert set(summary["bleu"]["test2016"]) == {"base", "finetune", "mixed"}
    # Each score is sacreBLEU's (13a, as `aiayn evaluate` prints it: one decimal) of the arm's
    # hypotheses against that test set's references, recomputed here from the files.
    references = {"newstest2013": gzip.decompress((mirror / "wmt-news" / "newstest2013.de.gz").read_bytes())
                  .decode("utf-8").splitlines(),
                  "test2016": (prep / "test.tgt.txt").read_text(encoding="utf-8").splitlines()}
    for name, arms in summary["bleu"].items():
        for arm, score in arms.items():
            hyps = (out / arm / f"{name}.hyp.de").read_text(encoding="utf-8").splitlines()
            assert len(hyps) == len(references[name]) == 20
            assert score == round(BLEU().corpus_score(hyps, [references[name]]).score, 1), (arm, name)

    # The fine-tuned vocabulary: the base's pieces at their ids, the added ones after them.
    added = json.loads((out / "data-bin" / "news" / "summary.json").read_text())["extended_vocab"]["joint"]["added"]
    assert 0 < added <= 40
    base_pieces = _pieces(run / "averaged" / "tokenizer")
    tuned_pieces = _pieces(out / "finetune" / "averaged" / "tokenizer")
    assert len(base_pieces) == 300 and tuned_pieces[:300] == base_pieces and len(tuned_pieces) == 300 + added
    for arm in ("mixed", "scratch"):  # one vocabulary for the three trained arms
        assert _pieces(out / arm / "averaged" / "tokenizer") == tuned_pieces
    counts = {"mode": "extend", "joint": {"old": 300, "new": 300 + added, "kept": 300, "added": added}}
    assert summary["init_vocab"] == {"finetune": counts, "mixed": counts}
    assert "scratch" not in summary["init_vocab"]

    # A re-run: finished arms skipped; the mixed arm, its scores and average gone, resumes.
    hyps = {arm: (out / arm / "newstest2013.hyp.de").stat().st_mtime_ns for arm in ("base", "finetune", "scratch")}
    for name in ("newstest2013.score.json", "test2016.score.json"):
        (out / "mixed" / name).unlink()
    (out / "mixed" / "averaged" / "model.safetensors").unlink()
    proc = _script(env, *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for arm in ("base", "finetune", "scratch"):
        assert f"== {arm}: scored already ({out / arm}), skipped" in proc.stdout
        assert (out / arm / "newstest2013.hyp.de").stat().st_mtime_ns == hyps[arm]
    assert "resuming from" in proc.stderr
    assert json.loads((out / "summary.json").read_text())["init_vocab"] == {"finetune": counts, "mixed": counts}
