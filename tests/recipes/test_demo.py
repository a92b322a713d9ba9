"""`aiayn demo`, the README's first command: the whole flow (synthetic data, training,
checkpoint, beam search on held-out sequences, the accuracy line, the heatmap PNG).

The default-suite test runs the same code with a short schedule and checks the flow and its
outputs, and that the accuracy line is the Python API's exact match on the same held-out
sequences (not that the accuracy is high); the slow test runs the demo as shipped and
asserts the demo's promise: >= 95% exact match on held-out sequences.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.checkpoint.directory import load_checkpoint, resolve_checkpoint
from aiayn.data.synthetic import generate
from aiayn.inference.translator import Translator
from aiayn.recipes.demo import _held_out, run_demo

LINE = re.compile(r"^exact-match accuracy: (\d+\.\d)%$")
PNG = b"\x89PNG\r\n\x1a\n"


def test_demo_flow_writes_checkpoint_heatmap_and_accuracy_line(tmp_path: Path) -> None:
    lines: list[str] = []
    # A constant rate on sequences of 3-4 symbols: 60 steps get some of them right (40%
    # measured), so that the accuracy checked below is not a trivial 0%.
    res = run_demo(tmp_path / "demo", n_held_out=20, n_examples=3, echo=lines.append,
                   overrides=["train.max_steps=60", "train.valid_every=20", "train.save_every=20",
                              "data.synthetic_train_size=2000", "train.progress_bar=false",
                              "train.lr_schedule=constant", "train.lr=0.003", "train.warmup_steps=0",
                              "data.synthetic_max_len=4"])
    out = "\n".join(lines).splitlines()
    # The demo scores the best validation checkpoint: recompute its figure with the Python
    # API on the same held-out sequences (none of them in the training data).
    assert res.checkpoint == resolve_checkpoint(tmp_path / "demo" / "checkpoints" / "best")
    cfg = load_checkpoint(res.checkpoint).config
    d = cfg.data
    pairs = _held_out(cfg, 20)
    train = set(generate(d.synthetic, d.synthetic_train_size, d.seed, d.synthetic_min_len, d.synthetic_max_len,
                         d.synthetic_vocab))
    assert len(pairs) == 20 and not train & set(pairs)
    hyps = Translator.from_checkpoint(res.checkpoint).translate([s for s, _ in pairs])
    correct = [h == t for h, (_, t) in zip(hyps, pairs)]
    assert res.metric_name == "exact_match"
    assert res.metric == 100.0 * sum(correct) / 20
    assert out[-1] == f"exact-match accuracy: {res.metric:.1f}%"
    assert LINE.match(out[-1])
    # The 3 examples: the first 3 held-out sequences, marked as the translations score.
    examples = [line.strip() for line in out if line.lstrip().startswith(("[ok ]", "[err]"))]
    assert examples == [f"[{'ok ' if ok else 'err'}] {s}  ->  {h}".strip()
                        for ok, (s, _), h in zip(correct, pairs, hyps)][:3]
    assert res.heatmap.read_bytes().startswith(PNG)
    assert f"attention heatmap of one example: {res.heatmap}" in out
    assert (res.checkpoint / "model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_as_shipped_reaches_95_percent(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "aiayn", "demo", "--out", str(tmp_path / "demo")],
                          capture_output=True, text=True, check=True)
    last = proc.stdout.strip().splitlines()[-1]
    match = LINE.match(last)
    assert match, last
    assert float(match.group(1)) >= 95.0
    assert (tmp_path / "demo" / "attention.png").read_bytes().startswith(PNG)

    # The trained model decoded in int8 (aiayn.inference.quantize) keeps its accuracy.
    from aiayn.inference.translator import Translator
    from aiayn.recipes.demo import _held_out, synthetic_config

    pairs = _held_out(synthetic_config(), 400)
    best = tmp_path / "demo" / "checkpoints" / "best"
    int8 = Translator.from_checkpoint(best, dtype="int8").translate([s for s, _ in pairs])
    fp32 = Translator.from_checkpoint(best).translate([s for s, _ in pairs])
    accuracy = 100.0 * sum(h == t for h, (_, t) in zip(int8, pairs)) / len(pairs)
    assert accuracy >= 95.0
    assert sum(a != b for a, b in zip(int8, fp32)) <= 8  # at most 2% of the outputs change
