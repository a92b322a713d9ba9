"""The Multi30k recipe end to end, reduced to fit `make test-slow` (at most ~10 minutes on
the project's 2-core CPU): prepare from the offline mirror, train the recipe's model for a
fixed number of updates, average the last checkpoints, translate test_2016_flickr with beam
4 and score it with sacreBLEU, all through `scripts/multi30k.sh`, the documented command.

The floor comes from measured runs of this configuration (docs/benchmarks.md, "Multi30k end
to end"): after 450 updates BLEU 9.1, after 750 updates 18.8; at 700 updates with the last
3 checkpoints averaged a healthy pipeline scores well above 10. A regression in any stage
(tokenizer, batching, model, loss, optimizer, averaging, search, detokenization, scoring)
drops it below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIRROR = Path(os.environ.get("AIAYN_DATA_MIRROR", ROOT.parent / "shared" / "data"))
BLEU_FLOOR = 10.0


@pytest.mark.slow
def test_multi30k_reduced_run_reaches_the_bleu_floor(tmp_path: Path) -> None:
    if not (MIRROR / "multi30k").is_dir():
        pytest.skip(f"no Multi30k mirror at {MIRROR} (set AIAYN_DATA_MIRROR)")
    aiayn = Path(sys.executable).with_name("aiayn")
    env = {**os.environ, "DATA_DIR": str(MIRROR), "PREPARED": str(tmp_path / "data-bin"),
           "RUN": str(tmp_path / "run"), "AVERAGE": "3", "AIAYN": str(aiayn)}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "multi30k.sh"), "train.max_time_minutes=0", "train.max_steps=700",
         "train.save_every=100", "train.keep_last=3", "train.valid_every=350"],
        cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    score = json.loads((tmp_path / "run" / "test.score.json").read_text())
    hyps = (tmp_path / "run" / "test.hyp.de").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 1000  # one line per test sentence, none lost
    assert score["bleu"] >= BLEU_FLOOR, score
