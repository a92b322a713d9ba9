"""torchrun: 2 gloo processes on CPU against one process with update_freq=2.

Under torchrun, rank r takes batches r, r+2, r+4, ... of the same epoch order that one
process walks through in order, so with update_freq=2 the single process sees exactly
the batches the two ranks see together at each step. The loss of an update is divided by
its total token count in both cases (the DDP average is multiplied back by the world
size), so the updates are the same: in practice bit-identical on CPU; asserted to 1e-6.
"""

import json
import os
import shutil
import socket
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


# ------------------------------------------------------------------ two nodes on one host

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def _two_nodes(tmp: Path, args: list[str], run_id: str) -> list[subprocess.CompletedProcess[str]]:
    """``torchrun --nnodes 2`` twice, as on two hosts: one process per "node", a c10d
    rendezvous on localhost, each node in its own directory (nothing shared but the data)."""
    port = _free_port()
    procs = []
    for node in (0, 1):
        cwd = tmp / f"node{node}"
        cwd.mkdir(exist_ok=True)
        cmd = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", run_id,
               "-m", "aiayn", "train", *args]
        procs.append(subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def _losses(run: Path) -> list[float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines if json.loads(line)["split"] == "train"]


@pytest.mark.slow
def test_two_nodes_match_one_process_and_only_rank_0_writes(tmp_path, prepared):
    cfg = _config(tmp_path, prepared, steps=4)
    nodes = _two_nodes(tmp_path, ["--config", str(cfg), "--run-dir", "run"], "fit")
    assert [p.returncode for p in nodes] == [0, 0], nodes[0].stderr[-3000:] + nodes[1].stderr[-3000:]
    _single(["--config", str(cfg), "--run-dir", str(tmp_path / "one"), "train.update_freq=2"])
    # Rank 0 writes the run on its node; the other node writes nothing at all.
    written = [node for node in (0, 1) if (tmp_path / f"node{node}" / "run").exists()]
    assert len(written) == 1
    run = tmp_path / f"node{written[0]}" / "run"
    assert not any((tmp_path / f"node{1 - written[0]}").iterdir())
    assert _max_diff(_weights(run), _weights(tmp_path / "one")) <= 1e-6
    assert _losses(run) == pytest.approx(_losses(tmp_path / "one"), abs=1e-6)
    assert len(_losses(run)) == 4

    # One process resumes what two wrote: it continues, and says in one line what changed.
    alone = tmp_path / "alone"
    shutil.copytree(run, alone)
    proc = subprocess.run([sys.executable, "-m", "aiayn", "train", "--config", str(cfg), "--resume", str(alone),
                           "train.max_steps=6"], env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    assert len(notes) == 1, proc.stderr
    assert "written by 2 process(es), this run has 1" in notes[0]
    assert "each update sums 1 batch(es) of train.max_tokens instead of 2 (train.update_freq=2 keeps them)" in notes[0]
    steps = [json.loads(line)["step"] for line in (alone / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 7))

    # Two nodes resuming a run that only one node holds: every rank stops with the same line.
    nodes = _two_nodes(tmp_path, ["--config", str(cfg), "--resume", "run", "train.max_steps=6"], "resume")
    assert all(p.returncode != 0 for p in nodes)
    errors = [line for p in nodes for line in p.stderr.splitlines() if line.startswith("aiayn train: error:")]
    assert len(errors) == 2 and len(set(errors)) == 1, errors
    assert all("exitcode  : 2" in p.stderr for p in nodes)  # the user error's code, not a crash
