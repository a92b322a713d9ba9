"""torchrun: 2 gloo processes on CPU against one process with update_freq=2.

Under torchrun, rank r takes batches r, r+2, r+4, ... of the same epoch order that one
process walks through in order, so with update_freq=2 the single process sees exactly
the batches the two ranks see together at each step. The loss of an update is divided by
its total token count in both cases (the DDP average is multiplied back by the world
size), so the updates are the same: in practice bit-identical on CPU; asserted to 1e-6.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aiayn.config import DataConfig
from aiayn.data.batching import BatchIterator
from aiayn.data.prepare import ensure_prepared, load_split

TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"

CONFIG = """\
model: {{d_model: 32, n_heads: 2, d_ff: 64, n_encoder_layers: 1, n_decoder_layers: 1,
        dropout: {dropout}, max_positions: 64, src_vocab_size: 16, tgt_vocab_size: 16}}
data: {{prepared_dir: "{prepared}"}}
train: {{max_tokens: {max_tokens}, max_steps: {steps}, lr_schedule: noam, warmup_steps: 4,
        lr_scale: 0.3, save_every: 0, log_every: 1, valid_every: 0, seed: 3, device: cpu,
        progress_bar: false}}
"""


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, int]:
    cfg = DataConfig(synthetic="reverse", synthetic_train_size=200, synthetic_valid_size=10,
                     synthetic_min_len=2, synthetic_max_len=6, synthetic_vocab=10,
                     spm_model_type="word")
    path = ensure_prepared(cfg, tmp_path_factory.mktemp("ddp") / "prepared")
    # An even batch count: then sharding needs no split and both setups share batches.
    train = load_split(path, "train")
    max_tokens = next(m for m in range(64, 200, 8) if len(BatchIterator(train, m)) % 2 == 0)
    return path, max_tokens


def _config(tmp: Path, prepared: tuple[Path, int], steps: int, dropout: float = 0.0) -> Path:
    path = tmp / f"cfg_{steps}_{dropout}.yaml"
    path.write_text(CONFIG.format(prepared=prepared[0], max_tokens=prepared[1], steps=steps,
                                  dropout=dropout))
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "AIAYN_NUM_THREADS": "1"}


def _torchrun(args: list[str]) -> None:
    cmd = [TORCHRUN, "--standalone", "--nproc_per_node", "2", "-m", "aiayn", "train", *args]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _single(args: list[str]) -> None:
    cmd = [sys.executable, "-m", "aiayn", "train", *args]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    last = (run / "checkpoints" / "last").read_text().strip()
    return load_file(str(run / "checkpoints" / last / "model.safetensors"))


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_two_gloo_processes_match_update_freq_2(tmp_path, prepared):
    cfg = _config(tmp_path, prepared, steps=5)
    _torchrun(["--config", str(cfg), "--run-dir", str(tmp_path / "two")])
    _single(["--config", str(cfg), "--run-dir", str(tmp_path / "one"), "train.update_freq=2"])
    assert _max_diff(_weights(tmp_path / "two"), _weights(tmp_path / "one")) <= 1e-6
    # Only rank 0 writes: one metrics line per step, one checkpoint.
    lines = (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 5


@pytest.mark.slow
def test_torchrun_resume_is_exact(tmp_path, prepared):
    # With dropout, so that the per-rank RNG states in the checkpoint matter.
    full, half = _config(tmp_path, prepared, 6, 0.1), _config(tmp_path, prepared, 3, 0.1)
    _torchrun(["--config", str(full), "--run-dir", str(tmp_path / "full")])
    _torchrun(["--config", str(half), "--run-dir", str(tmp_path / "half")])
    _torchrun(["--config", str(half), "--resume", str(tmp_path / "half"), "train.max_steps=6"])
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "half")
    assert all(torch.equal(a[k], b[k]) for k in a)
