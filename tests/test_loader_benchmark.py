"""benchmarks/loader.py runs end to end in ``--quick`` mode with every loader option: on a
machine without CUDA it reports pinning and the copy to the GPU as unavailable and times the
rest; with CUDA it times them, so that its first run on a GPU does not fail on a mistake of
its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def test_quick_run_with_pinning_copy_and_prefetch(tmp_path: Path) -> None:
    out = tmp_path / "loader.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "loader.py"), "--quick", "--device", "cuda",
                           "--pin", "--prefetch", "2", "--workdir", str(tmp_path / "work"), "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["quick"] is True and report["train_start"] is None and report["prefetch"] == 2
    rows = report["loader"]
    assert list(rows)[0] == "gather + collate"
    for row in rows.values():
        assert row["batches_per_s"] > 0 and row["tgt_tokens_per_s"] > 0
    if torch.cuda.is_available():
        assert report["pin"] is True and report["unavailable"] == []
        assert list(rows)[1:] == ["gather + collate + pin + non-blocking copy to cuda",
                                  "gather + collate + pin + non-blocking copy to cuda + prefetch 2"]
    else:
        assert report["pin"] is False and report["device"] == "cpu"
        assert [note.split(":")[0] for note in report["unavailable"]] == ["--device cuda", "--pin"]
        assert "(--pin: unavailable without CUDA" in proc.stdout
        assert list(rows)[1:] == ["gather + collate + prefetch 2"]
