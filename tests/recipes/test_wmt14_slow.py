"""scripts/wmt14.sh end to end on a small WMT-shaped corpus laid out as the WMT14 mirror:
the same archives (.tgz), members and SGML test files that `aiayn prepare` reads for
wmt14_en_de, a few hundred sentence pairs each, and a tiny model.

The archives' checksums are the dataset table's, which synthetic archives cannot match: the
`aiayn` the script runs here is aiayn itself with those checksums replaced by the synthetic
archives' (everything else, extraction and SGML included, is the product's own path)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from .conftest import ROOT

pytestmark = pytest.mark.slow

# Word ranks drawn from a Zipf law; sentence lengths log-normal around WMT14's ~25 words.
VOCAB = 600


def _sentences(rng: np.random.Generator, n: int) -> list[list[int]]:
    lengths = np.clip(rng.lognormal(np.log(12), 0.5, n).astype(int), 2, 60)
    return [list(np.minimum(rng.zipf(1.3, size=k), VOCAB) - 1) for k in lengths]


def _pairs(rng: np.random.Generator, n: int) -> tuple[list[str], list[str]]:
    """English-like and German-like lines: the German word of rank r is a fixed other word,
    and neighbouring words swap places (some reordering to learn)."""
    mapping = np.random.default_rng(0).permutation(VOCAB)
    en, de = [], []
    for words in _sentences(rng, n):
        target = [int(mapping[w]) for w in words]
        for i in range(0, len(target) - 1, 2):
            target[i], target[i + 1] = target[i + 1], target[i]
        en.append(" ".join(f"w{w}" for w in words) + " .")
        de.append(" ".join(f"v{w}" for w in target) + " .")
    return en, de


def _sgm(lines: list[str], role: str, lang: str) -> str:
    head = (f'<{role}set setid="newstest2014" srclang="any" trglang="{lang}">\n'
            f'<doc sysid="{role}" docid="1" genre="news">\n')
    body = "".join(f'<seg id="{k}">{line}</seg>\n' for k, line in enumerate(lines, 1))
    return head + body + f"</doc>\n</{role}set>\n"


def _archive(path: Path, members: dict[str, str]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _mirror(root: Path) -> dict[str, str]:
    """The WMT14 EN-DE mirror layout under ``root``; file name -> sha256."""
    rng = np.random.default_rng(1)
    sums = {}
    train = {
        "wmt14/training-parallel-europarl-v7.tgz": "training/europarl-v7.de-en.{lang}",
        "wmt14/training-parallel-commoncrawl.tgz": "commoncrawl.de-en.{lang}",
        "wmt14/training-parallel-nc-v9.tgz": "training/news-commentary-v9.de-en.{lang}",
    }
    for name, member in train.items():
        en, de = _pairs(rng, 300)
        sums[name] = _archive(root / name, {member.format(lang="en"): "\n".join(en) + "\n",
                                            member.format(lang="de"): "\n".join(de) + "\n"})
    en, de = _pairs(rng, 40)
    sums["wmt19/dev.tgz"] = _archive(root / "wmt19/dev.tgz", {"dev/newstest2013.en": "\n".join(en) + "\n",
                                                              "dev/newstest2013.de": "\n".join(de) + "\n"})
    en, de = _pairs(rng, 60)
    sums["wmt14/test-full.tgz"] = _archive(root / "wmt14/test-full.tgz", {
        "test-full/newstest2014-deen-src.en.sgm": _sgm(en, "src", "en"),
        "test-full/newstest2014-deen-ref.de.sgm": _sgm(de, "ref", "de")})
    return sums


WRAPPER = """\
import dataclasses, json, os, sys
from aiayn.data import datasets as ds
sums = json.loads(open(os.environ["WMT14_TEST_SUMS"]).read())
by_name = {f.name: dataclasses.replace(f, sha256=sums[f.name], md5=None)
           for f in ds.WMT_FILES.values() if f.name in sums}
ds.WMT_FILES.update({k: by_name.get(f.name, f) for k, f in ds.WMT_FILES.items()})
for splits in ds._WMT_PARTS.values():
    for split, parts in splits.items():
        splits[split] = tuple(dataclasses.replace(p, file=by_name.get(p.file.name, p.file)) for p in parts)
from aiayn.cli.main import main
sys.exit(main())
"""

TINY = ("model.d_model=32 model.n_heads=2 model.d_ff=64 model.n_encoder_layers=1 model.n_decoder_layers=1 "
        "train.max_tokens=300 train.save_every=2 train.save_every_minutes=0 train.valid_every=0 "
        "train.log_every=4 train.dtype=fp32 train.progress_bar=false")


def test_the_whole_script_on_a_wmt_shaped_mirror(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    (tmp_path / "sums.json").write_text(json.dumps(_mirror(mirror)))
    aiayn = tmp_path / "aiayn"
    aiayn.write_text(f"#!{sys.executable}\n{WRAPPER}")
    aiayn.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("GPUS", "MODEL", "PAIR", "CONFIG", "AVERAGE")}
    env.update({"DATA_DIR": str(mirror), "AIAYN_CACHE_DIR": str(tmp_path / "cache"), "AIAYN_OFFLINE": "1",
                "WMT14_TEST_SUMS": str(tmp_path / "sums.json"), "AIAYN": str(aiayn), "PYTHON": sys.executable,
                "GPUS": "0", "PREPARED": str(tmp_path / "data-bin"), "RUN": str(tmp_path / "run"),
                "MAX_STEPS": "12", "CONFIG_OVERRIDES": TINY, "PREPARE_ARGS": "--vocab-size 300",
                "AIAYN_NUM_THREADS": os.environ.get("AIAYN_TEST_THREADS", "2")})
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "wmt14.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out, run, prepared = proc.stdout, tmp_path / "run", tmp_path / "data-bin"

    stages = [line for line in out.splitlines() if line.startswith("== ")]
    assert [s.split(" ")[1] for s in stages] == [
        "wmt14_en_de:", "archives", "prepare", "train", "average", "translate", "score", "time:"]
    # Prepared from the archives: 3 x 300 training pairs, newstest2013 and newstest2014 from SGML.
    summary = json.loads((prepared / "summary.json").read_text())
    assert len((prepared / "test.src.txt").read_text().splitlines()) == 60
    assert (prepared / "test.tgt.txt").read_text().splitlines()[0].startswith("v")
    assert summary["source"]["dataset"] == "wmt14_en_de"
    assert (summary["splits"]["train"]["pairs"], summary["splits"]["valid"]["pairs"]) == (900, 40)
    # Trained 12 updates on the CPU (with the warning), checkpoints every 2, the last 5 averaged.
    assert "wmt14.sh: warning: no GPU found: training on the CPU" in proc.stderr
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "train"]
    assert steps[-1] == 12
    averaged = run / "averaged"
    assert (averaged / "model.safetensors").is_file()
    assert json.loads((averaged / "state.json").read_text())["averaged_steps"] == [4, 6, 8, 10, 12]
    # Both BLEU figures printed, and the time of each stage.
    assert len((run / "newstest2014.hyp.de").read_text().splitlines()) == 60
    assert any(line.startswith("BLEU") for line in out.splitlines()), out
    assert "tokenized BLEU" in out
    score = json.loads((run / "newstest2014.score.json").read_text())
    assert {"bleu", "tokenized_bleu"} <= score.keys()
    assert stages[-1].startswith("== time: download ") and " prepare " in stages[-1] and " total " in stages[-1]
