"""Training with batches prepared ahead by a thread (``data.prefetch_batches``): the same
updates as without it, and a run stopped and resumed with it ends where an uninterrupted run
without it does, bit for bit (the CPU counterpart of the CUDA test in test_cuda_prefetch.py)."""

import dataclasses
import json
import threading

import torch

from aiayn.checkpoint.directory import resolve_checkpoint
from aiayn.checkpoint.layout import STATE_FILE
from aiayn.data.batching import BatchIterator
from aiayn.model import build_model
from aiayn.training.trainer import Trainer


def _prefetching(cfg, batches):
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, prefetch_batches=batches))


def _trainer(cfg, run_dir, task, seed=0):
    torch.manual_seed(seed)
    batches = BatchIterator(task, cfg.train.max_tokens, seed=cfg.train.seed)
    return Trainer(cfg, build_model(cfg.model), run_dir, train_batches=batches)


def _no_prefetch_thread():
    return not any(t.name == "aiayn-prefetch" and t.is_alive() for t in threading.enumerate())


def test_the_config_sets_the_iterators_prefetching(make_cfg, make_task):
    task = make_task(n=16)
    assert _trainer(make_cfg(), None, task).train_batches.transfer.prefetch == 0  # CPU default
    trainer = _trainer(_prefetching(make_cfg(), 3), None, task)
    assert trainer.train_batches.transfer.prefetch == 3 and not trainer.transfer.pin_memory


def test_resume_with_prefetching_is_exact(make_cfg, make_task, tmp_path):
    base = make_cfg(max_steps=8, update_freq=2)
    cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, dropout=0.1))
    task = make_task(n=40)  # 3 updates an epoch: the run crosses epochs
    full = _trainer(cfg, tmp_path / "full", task)
    full.train()
    half_cfg = _prefetching(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=4)), 4)
    half = _trainer(half_cfg, tmp_path / "half", task)
    half.train()
    assert _no_prefetch_thread()
    plain_half = _trainer(dataclasses.replace(half_cfg, data=cfg.data), tmp_path / "plain_half", task)
    plain_half.train()
    state = json.loads((resolve_checkpoint(tmp_path / "half") / STATE_FILE).read_text())
    # The position saved is the batches trained on, not those the thread had made ahead.
    assert state["data"] == plain_half.train_batches.state_dict()
    resumed = _trainer(_prefetching(cfg, 2), tmp_path / "half", task, seed=123)
    resumed.load(tmp_path / "half")
    resumed.train()
    assert resumed.state.step == full.state.step == 8
    assert resumed.train_batches.state_dict() == full.train_batches.state_dict()
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)
    assert _no_prefetch_thread()


def test_each_batch_is_copied_as_the_transfer_says(make_cfg, make_task, monkeypatch):
    from aiayn.data.prefetch import HostTransfer
    from aiayn.training import trainer as trainer_module

    trainer = _trainer(make_cfg(), None, make_task(n=16))
    assert not trainer.transfer.non_blocking  # a CPU: plain copies (no-ops)
    copies = []
    on_device = trainer_module._on_device

    def spy(batch, device, non_blocking=False):
        copies.append((torch.device(device), non_blocking))
        return on_device(batch, device, non_blocking)

    monkeypatch.setattr(trainer_module, "_on_device", spy)
    # What host_transfer chooses for CUDA, pointed at the CPU (no GPU needed to route it).
    trainer.transfer = HostTransfer(torch.device("cpu"), pin_memory=False, non_blocking=True, prefetch=0)
    trainer.train_step(trainer.groups.next())
    assert copies == [(torch.device("cpu"), True)]


def test_the_loop_says_how_batches_are_prepared(make_cfg, make_task, caplog):
    trainer = _trainer(_prefetching(make_cfg(max_steps=1), 2), None, make_task(n=16))
    with caplog.at_level("INFO", logger="aiayn.training.trainer"):
        trainer.train()
    assert "batches: in host memory, 2 prepared ahead by a thread (data.prefetch_batches)" in caplog.text
