"""The Multi30k recipe end to end, reduced to fit `make test-slow` (~8 minutes on a 2-core
CPU with bf16 units, ~25 in fp32 on an AVX2-only one): prepare from the offline mirror, train the recipe's two models
side by side (seeds 1 and 2) for a fixed number of updates, average the last checkpoints of
each, translate test_2016_flickr with their ensemble (compiled steps, left in the compile
cache) and score it with sacreBLEU, all
through `scripts/multi30k.sh`, the documented command.

The floor sits just under the measured figures of this configuration (700 updates, the
last 3 checkpoints of each member averaged, the two-member ensemble): test BLEU 16.8 to 17.1
over the measured runs (docs/results.md, "Translation: Multi30k"). A regression in any
stage (tokenizer, batching, model, loss, optimizer, averaging, search, detokenization,
scoring) drops it below. The same ensemble then guards `--dtype auto`: every precision it
may choose on a CPU scores within 0.3 BLEU of fp32.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

BLEU_FLOOR = 15.0  # measured: 16.8 to 17.1


@pytest.mark.slow
@pytest.mark.timeout(3000)  # 450 s on 2 cores with bf16 units, 1,470 s in fp32 (AVX2); twice that if busy
def test_multi30k_reduced_run_reaches_the_bleu_floor(run_recipe, dtype_guard, tmp_path: Path) -> None:
    run_recipe("multi30k.sh", "multi30k", "train.max_time_minutes=0", "train.max_steps=700",
               "train.save_every=100", "train.keep_last=3", "train.valid_every=350")
    score = json.loads((tmp_path / "run" / "test.score.json").read_text())
    hyps = (tmp_path / "run" / "test.hyp.de").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 1000  # one line per test sentence, none lost
    for k in (1, 2):  # two members, each with its own seed
        config = yaml.safe_load((tmp_path / "run" / f"member{k}" / "config.yaml").read_text())
        assert config["train"]["seed"] == k and config["train"]["max_steps"] == 700
        assert (tmp_path / "run" / f"member{k}" / "averaged" / "model.safetensors").is_file()
    assert score["bleu"] >= BLEU_FLOOR, score  # translated with the compiled steps (COMPILE=on)
    # Each member's compiled step stays in the compile cache for later translations.
    assert len(list((tmp_path / "cache").rglob("aoti/*.pt2"))) == 2
    members = [tmp_path / "run" / f"member{k}" / "averaged" for k in (1, 2)]
    dtype_guard(members, tmp_path / "data-bin" / "test.src.txt", tmp_path / "data-bin" / "test.tgt.txt",
                ensemble=True)
