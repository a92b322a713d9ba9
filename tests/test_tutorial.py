"""docs/tutorial.md runs as written: its ```bash blocks, then its ```python block (and after
it the API's docstring examples), each in a fresh directory on a small corpus (400 pairs of
Multi30k from the data mirror, else a synthetic task), with the changes of ``quick`` that
make training take seconds."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import aiayn
from aiayn.config import load_config, save_config
from aiayn.data.synthetic import generate

REPO = Path(__file__).resolve().parents[1]
TUTORIAL = REPO / "docs" / "tutorial.md"
# The offline data mirror (real corpora): $AIAYN_DATA_MIRROR alone, which .ci/run sets. Unset, a
# path that exists nowhere and names the variable, so the tests that need data skip saying so.
MIRROR = Path(os.environ.get("AIAYN_DATA_MIRROR") or "/AIAYN_DATA_MIRROR-is-not-set")
PAIRS, HELD_OUT = 400, 40
CONFIG = "configs/multi30k_en_de.yaml"
# The tutorial's configuration, small and short: 30 steps, a checkpoint every 5 (so that
# `average --last 5` has its 5), outputs of at most source length + 20.
TINY = ["model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "train.max_time_minutes=0", "train.max_steps=30", "train.save_every=5",
        "train.valid_every=15", "train.log_every=10", "train.warmup_steps=10", "train.max_tokens=1024",
        "train.dtype=fp32", "train.device=cpu", "decode.max_len_b=20"]
# The API's docstring examples, in the order they build on each other; they use the
# tutorial's files, so they run after it.
EXAMPLES = [aiayn.prepare, aiayn.train, aiayn.average, aiayn.Translator.from_checkpoint,
            aiayn.Translator.translate, aiayn.load_checkpoint, aiayn]


def quick(tmp: Path) -> dict[str, str]:
    """Text of the tutorial -> what the test runs instead. Each must be in the tutorial, so
    that a change there fails here rather than silently testing something else."""
    config = tmp / "quick.yaml"
    save_config(load_config(REPO / CONFIG, TINY), config)
    return {"HELD_OUT=1000": f"HELD_OUT={HELD_OUT}", CONFIG: str(config)}


def blocks(lang: str, replace: dict[str, str]) -> list[str]:
    text = TUTORIAL.read_text(encoding="utf-8")
    for old, new in replace.items():
        assert old in text, f"docs/tutorial.md no longer has {old!r}: update quick() in {__file__}"
        text = text.replace(old, new)
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def examples(replace: dict[str, str]) -> str:
    """The ```python example of each of EXAMPLES' docstrings, as one script."""
    code = ["import aiayn", "from aiayn import Translator, load_checkpoint"]
    for obj in EXAMPLES:
        found = re.findall(r"^ *```python\n(.*?)^ *```$", inspect.getdoc(obj) or "", flags=re.MULTILINE | re.DOTALL)
        assert len(found) == 1, f"{obj}: expected one ```python example"
        code.append(textwrap.dedent(found[0]))
    script = "\n".join(code)
    for old, new in replace.items():
        script = script.replace(old, new)
    return script


def write_corpus(where: Path) -> None:
    """mine.en / mine.de, line-aligned, as the tutorial starts from."""
    if (MIRROR / "multi30k").is_dir():
        import gzip

        for lang in ("en", "de"):
            with gzip.open(MIRROR / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(PAIRS)]
            (where / f"mine.{lang}").write_text("".join(lines), encoding="utf-8")
    else:
        pairs = generate("reverse", PAIRS, seed=1, min_len=3, max_len=10, vocab=20)
        (where / "mine.en").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (where / "mine.de").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """A process as the reader runs it: the venv's `aiayn` first on PATH, in ``cwd``."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "AIAYN_NUM_THREADS": os.environ.get("AIAYN_TEST_THREADS", "2")}
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{args[0]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run(["bash", "-c", f"set -euo pipefail\n{script}"], cwd)


def test_every_code_block_is_run_and_every_config_exists() -> None:
    text = TUTORIAL.read_text(encoding="utf-8")
    assert set(re.findall(r"^```(\w*)$", text, flags=re.MULTILINE)) == {"bash", "python", ""}
    assert len(blocks("bash", {})) == 7 and len(blocks("python", {})) == 1
    for config in set(re.findall(r"configs/\w+\.yaml", text)):
        assert (REPO / config).is_file(), config


def test_the_decode_options_it_states_are_the_configs() -> None:
    """The tutorial says which beam and length penalty `translate` uses; they come from the
    config, so a change of the recipe's decode section must show here."""
    stated = re.search(r"beam (\d+) and length penalty ([\d.]+), from the\s+configuration's `decode` section",
                       TUTORIAL.read_text(encoding="utf-8"))
    assert stated, "docs/tutorial.md no longer states the beam and length penalty: update this test"
    decode = load_config(REPO / CONFIG).decode
    assert (int(stated[1]), float(stated[2])) == (decode.beam, decode.lenpen)


@pytest.mark.slow  # trains, averages and translates: half a minute on 2 cores
@pytest.mark.timeout(300)
def test_the_commands(tmp_path: Path) -> None:
    write_corpus(tmp_path)
    proc = bash("\n".join(blocks("bash", quick(tmp_path))), tmp_path)
    assert f"{PAIRS - 2 * HELD_OUT} corpus/train.en" in proc.stdout
    assert "prepared files en-de -> data-bin/mine" in proc.stdout
    assert "averaged 5 checkpoints -> " in proc.stdout
    assert "done (max_steps): step 30" in proc.stderr
    hyps = (tmp_path / "runs/mine/test.hyp.de").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == HELD_OUT
    # The ensemble of the two seeds translated every line too, not as either model alone.
    ensemble = (tmp_path / "runs/mine/test.ens.hyp.de").read_text(encoding="utf-8").splitlines()
    assert len(ensemble) == HELD_OUT and ensemble != hyps
    assert re.search(r"^BLEU = \d+\.\d ", proc.stdout, flags=re.MULTILINE)


def test_the_python_api(tmp_path: Path) -> None:
    write_corpus(tmp_path)
    replace = quick(tmp_path)
    bash(blocks("bash", replace)[0], tmp_path)  # step 1: the held-out split
    (tmp_path / "tutorial.py").write_text(blocks("python", replace)[0], encoding="utf-8")
    proc = run([sys.executable, "tutorial.py"], tmp_path)
    assert "stopped (max_steps) at step 30\n" in proc.stdout
    assert re.search(r"^BLEU \d+\.\d  chrF2 \d+\.\d  nrefs:1\|", proc.stdout, flags=re.MULTILINE)
    assert (tmp_path / "runs/mine/averaged/model.safetensors").is_file()
    (tmp_path / "examples.py").write_text(examples(replace), encoding="utf-8")
    run([sys.executable, "examples.py"], tmp_path)
