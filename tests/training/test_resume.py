"""Exact resume, tested the way it fails in practice: separate processes, SIGKILL.

A CPU fp32 run stopped at step N (or killed mid-epoch, or killed while writing a
checkpoint) and resumed must end with weights bit-identical to a run that never stopped.
"""

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file

from aiayn.config import DataConfig
from aiayn.data.prepare import ensure_prepared

TOTAL = 12  # steps of the reference run; each epoch has ~8 batches, so the runs cross epochs

CONFIG = """\
model: {{d_model: 32, n_heads: 2, d_ff: 64, n_encoder_layers: 1, n_decoder_layers: 1,
        dropout: 0.1, max_positions: 64, src_vocab_size: 16, tgt_vocab_size: 16}}
data: {{prepared_dir: "{prepared}"}}
train: {{max_tokens: 96, max_steps: {steps}, lr_schedule: noam, warmup_steps: 4, lr_scale: 0.3,
        save_every: 3, log_every: 1, valid_every: 4, keep_last: 10, seed: 3,
        progress_bar: false}}
"""

# Runs `aiayn` with a fault injected: SIGKILL right after update `step` (before any
# checkpoint of that step), or in the middle of writing the checkpoint of `save`.
DRIVER = textwrap.dedent("""
    import os, signal, sys
    from aiayn.checkpoint import directory as checkpoint_directory
    from aiayn.training import trainer
    mode, at = sys.argv[1], int(sys.argv[2])
    if mode == "step":
        real_step = trainer.Trainer.train_step
        def train_step(self, batches):
            out = real_step(self, batches)
            if self.state.step == at:
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        trainer.Trainer.train_step = train_step
    elif mode == "save":
        real_save = checkpoint_directory.save_optimizer
        def save_optimizer(optimizer, directory):
            # model.safetensors, config.yaml and state.json are already in the temp dir
            if directory.name.startswith(".tmp-step_%06d" % at):
                os.kill(os.getpid(), signal.SIGKILL)
            return real_save(optimizer, directory)
        checkpoint_directory.save_optimizer = save_optimizer
    from aiayn.cli.main import main
    main(sys.argv[3:])
""")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    cfg = DataConfig(synthetic="reverse", synthetic_train_size=100, synthetic_valid_size=10,
                     synthetic_min_len=2, synthetic_max_len=6, synthetic_vocab=10,
                     spm_model_type="word")
    return ensure_prepared(cfg, tmp_path_factory.mktemp("data") / "prepared")


def _env() -> dict[str, str]:
    return {**os.environ, "AIAYN_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def _config(tmp: Path, prepared: Path, steps: int) -> Path:
    path = tmp / f"cfg{steps}.yaml"
    path.write_text(CONFIG.format(prepared=prepared, steps=steps))
    return path


def _train(args: list[str], driver: Path | None = None, fault: tuple[str, int] | None = None,
           expect_kill: bool = False) -> subprocess.CompletedProcess:
    """`aiayn train ARGS` in a new process (optionally with a fault injected)."""
    if fault is None:
        cmd = [sys.executable, "-m", "aiayn", "train", *args]
    else:
        cmd = [sys.executable, str(driver), fault[0], str(fault[1]), "train", *args]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    if expect_kill:
        assert proc.returncode == -9, proc.stderr[-3000:]
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _train_here(args: list[str]) -> None:
    """`aiayn train ARGS` in this process (importing torch again per run costs seconds;
    the interrupted and resumed halves of every test still run in different processes)."""
    from aiayn.cli.main import main

    torch.set_num_threads(1)  # as the subprocesses (module fixtures run before _one_thread)
    # and their environment: the trainer applies $AIAYN_NUM_THREADS, which a caller's
    # shell may set to 2 (bit-identical resume needs the same thread count on both sides)
    with mock.patch.dict(os.environ, _env()), pytest.raises(SystemExit) as exc:
        main(["train", *args])
    assert exc.value.code == 0


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    last = (run / "checkpoints" / "last").read_text().strip()
    assert last == f"step_{TOTAL:06d}"
    return load_file(str(run / "checkpoints" / last / "model.safetensors"))


def _train_losses(run: Path) -> list[tuple[int, float]]:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in recs if r["split"] == "train"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, prepared) -> Path:
    tmp = tmp_path_factory.mktemp("ref")
    _train_here(["--config", str(_config(tmp, prepared, TOTAL)), "--run-dir", str(tmp / "run")])
    return tmp / "run"


def _assert_same_as_reference(run: Path, reference: Path) -> None:
    a, b = _final_weights(reference), _final_weights(run)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume"
    assert _train_losses(run) == _train_losses(reference)


def test_stop_at_n_and_resume_to_2n(tmp_path, prepared, reference):
    run = tmp_path / "run"
    _train_here(["--config", str(_config(tmp_path, prepared, TOTAL // 2)), "--run-dir", str(run)])
    assert (run / "checkpoints" / "last").read_text().strip() == f"step_{TOTAL // 2:06d}"
    _train(["--config", str(_config(tmp_path, prepared, TOTAL // 2)), "--resume", str(run),
            f"train.max_steps={TOTAL}"])
    _assert_same_as_reference(run, reference)
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["step"] == TOTAL and summary["stop_reason"] == "max_steps"


def test_sigkill_mid_epoch_then_automatic_resume(tmp_path, prepared, reference):
    run, cfg = tmp_path / "run", _config(tmp_path, prepared, TOTAL)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    # Killed after update 8, mid-epoch; the last checkpoint is step 6.
    _train(["--config", str(cfg), "--run-dir", str(run)], driver, ("step", 8), expect_kill=True)
    assert (run / "checkpoints" / "last").read_text().strip() == "step_000006"
    # Same command again: resumes automatically from step 6.
    _train_here(["--config", str(cfg), "--run-dir", str(run)])
    assert "resuming from" in (run / "train.log").read_text()
    _assert_same_as_reference(run, reference)


def test_sigkill_while_writing_a_checkpoint(tmp_path, prepared, reference):
    run, cfg = tmp_path / "run", _config(tmp_path, prepared, TOTAL)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    _train(["--config", str(cfg), "--run-dir", str(run)], driver, ("save", 6), expect_kill=True)
    ckpts = run / "checkpoints"
    # 3 (periodic), then 4 (a new best: saved outside the periodic series)
    assert (ckpts / "last").read_text().strip() == "best_step_000004"
    assert any(p.name.startswith(".tmp-step_000006") for p in ckpts.iterdir())  # the torn write
    assert not (ckpts / "step_000006").exists()
    _train_here(["--config", str(cfg), "--run-dir", str(run)])
    assert not any(p.name.startswith(".tmp") for p in ckpts.iterdir())
    _assert_same_as_reference(run, reference)


# ------------------------------------------------------------------ subword sampling

SAMPLING = ["data.subword_alpha_src=0.3", "data.subword_alpha_tgt=0.3"]


@pytest.fixture(scope="module")
def bpe_prepared(tmp_path_factory) -> Path:
    """Text with a BPE vocabulary (subword sampling needs one): 60 pairs of 1-3 words, ~9
    batches an epoch once sampling lengthens them, so step 6 is mid-epoch and 12 in epoch 2."""
    tmp = tmp_path_factory.mktemp("bpe")
    rng = random.Random(0)
    words = "a man woman dog cat rides walks on the street with red ball".split()
    src = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 3))) for _ in range(60)]
    files = {}
    for role, lines in (("train", src), ("valid", src[:8])):
        for side, text in (("src", lines), ("tgt", [" ".join(reversed(x.split())) for x in lines])):
            (tmp / f"{role}.{side}").write_text("\n".join(text) + "\n", encoding="utf-8")
            files[f"{role}_{side}"] = str(tmp / f"{role}.{side}")
    cfg = DataConfig(vocab_size=40, spm_model_type="bpe", **files)
    return ensure_prepared(cfg, tmp / "prepared")


def test_resume_mid_epoch_with_subword_sampling(tmp_path, bpe_prepared):
    """New segmentations every epoch, drawn per (seed, epoch, sentence): a run stopped
    mid-epoch and resumed in another process ends bit-identical to one that never stopped."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    _train_here(["--config", str(_config(tmp_path, bpe_prepared, TOTAL)), "--run-dir", str(ref), *SAMPLING])
    assert "subword sampling (alpha source 0.3, target 0.3)" in (ref / "train.log").read_text()
    half = _config(tmp_path, bpe_prepared, TOTAL // 2)
    _train_here(["--config", str(half), "--run-dir", str(run), *SAMPLING])
    state = json.loads((run / "checkpoints" / f"step_{TOTAL // 2:06d}" / "state.json").read_text())
    assert state["data"]["epoch"] == 1 and state["data"]["offset"] > 0  # mid-epoch
    _train(["--config", str(half), "--resume", str(run), f"train.max_steps={TOTAL}", *SAMPLING])
    assert json.loads((run / "checkpoints" / f"step_{TOTAL:06d}" / "state.json").read_text())["data"]["epoch"] == 2
    _assert_same_as_reference(run, ref)
