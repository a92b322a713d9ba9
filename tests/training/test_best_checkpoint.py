"""The best checkpoint lives outside the periodic series: ``aiayn average --last N`` and
``keep_last`` count periodic checkpoints only, and pruning never deletes the best."""

import pytest
import torch

from aiayn.checkpoint.average import last_checkpoints
from aiayn.checkpoint.directory import is_checkpoint_dir, resolve_checkpoint
from aiayn.cli.main import main
from aiayn.data.batching import BatchIterator
from aiayn.model import build_model
from aiayn.training.trainer import Trainer

# Periodic saves every 3 steps (and the final one), validation every 4: the best (step 8)
# is not a periodic save.
SCRIPTED_LOSS = {4: 3.0, 8: 1.0, 12: 2.0, 16: 2.5, 20: 2.2}


def _run(run_dir, make_cfg, make_task, losses, **train):
    cfg = make_cfg(save_every=3, valid_every=4, keep_last=5, max_steps=20, keep_best=True, **train)
    task = make_task(n=24)
    torch.manual_seed(0)
    trainer = Trainer(cfg, build_model(cfg.model), run_dir,
                      train_batches=BatchIterator(task, cfg.train.max_tokens, seed=1),
                      valid_batches=[BatchIterator(task, 64, shuffle=False).make_batch([0, 1])])
    kept_best = []

    def scripted_validate():
        # Whenever validation runs, the best so far is still on disk.
        best = trainer.checkpoints.best()
        kept_best.append(best is None or is_checkpoint_dir(best))
        return {"valid_loss": losses[trainer.state.step]}

    trainer.validate = scripted_validate
    trainer.train()
    assert all(kept_best)
    return trainer


def test_last_n_counts_periodic_checkpoints_only(tmp_path, make_cfg, make_task, capsys):
    run = tmp_path / "run"
    trainer = _run(run, make_cfg, make_task, SCRIPTED_LOSS)
    ckpts = run / "checkpoints"
    periodic = [ckpts / f"step_{s:06d}" for s in (9, 12, 15, 18, 20)]
    assert trainer.checkpoints.best() == ckpts / "best_step_000008"
    assert trainer.checkpoints.last() == ckpts / "step_000020"
    assert sorted(p.name for p in ckpts.iterdir()) == \
        ["best", "best_step_000008", "last"] + [p.name for p in periodic]
    assert last_checkpoints(run, 5) == periodic
    with pytest.raises(SystemExit) as exc:
        main(["average", str(run), "--last", "5", "--out", str(tmp_path / "avg")])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert [line.strip() for line in out.splitlines()[1:]] == [str(p) for p in periodic]
    # The best checkpoint is a complete training checkpoint: `best` resolves and resumes.
    assert resolve_checkpoint(ckpts / "best") == ckpts / "best_step_000008"
    fresh = Trainer(trainer.cfg, build_model(trainer.cfg.model), None,
                    train_batches=BatchIterator(make_task(n=24), trainer.cfg.train.max_tokens, seed=1))
    fresh.load(ckpts / "best")
    assert fresh.state.step == 8 and fresh.state.best["step"] == 8


def test_best_only_copy_goes_once_a_periodic_checkpoint_is_best(tmp_path, make_cfg, make_task):
    run = tmp_path / "run"
    losses = {4: 3.0, 8: 1.0, 12: 0.5, 16: 2.5, 20: 2.2}  # the best moves from 8 to 12 (periodic)
    trainer = _run(run, make_cfg, make_task, losses)
    ckpts = run / "checkpoints"
    assert trainer.checkpoints.best() == ckpts / "step_000012"
    assert not any(p.name.startswith("best_step_") for p in ckpts.iterdir())
    assert last_checkpoints(run, 5) == [ckpts / f"step_{s:06d}" for s in (9, 12, 15, 18, 20)]


def test_end_of_data_after_a_best_only_save_writes_the_periodic_one(tmp_path, make_cfg, make_task):
    """Stopped by max_epochs right after a best-only save: the final checkpoint is still
    periodic (so `--last` sees the end of training) and takes over the `best` pointer."""
    cfg = make_cfg(save_every=0, valid_every=1, keep_last=5, max_steps=0, max_epochs=1, keep_best=True)
    task = make_task(n=24)
    torch.manual_seed(0)
    batches = BatchIterator(task, cfg.train.max_tokens, seed=1)
    n = len(batches)
    trainer = Trainer(cfg, build_model(cfg.model), tmp_path, train_batches=batches,
                      valid_batches=[BatchIterator(task, 64, shuffle=False).make_batch([0, 1])])
    trainer.validate = lambda: {"valid_loss": 10.0 - trainer.state.step}  # always a new best
    trainer.train()
    ckpts = tmp_path / "checkpoints"
    assert trainer.checkpoints.last() == trainer.checkpoints.best() == ckpts / f"step_{n:06d}"
    best_only = sorted(p.name for p in ckpts.iterdir() if p.name.startswith("best_step_"))
    assert best_only == []  # each was superseded by the next best, the last by step_n
