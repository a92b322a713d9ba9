"""Batches to a CUDA device: pinned host memory, non-blocking copies, the prefetching thread.
Runs where a GPU is present (``pytest -m cuda``); skips elsewhere. The CPU counterparts are
tests/data/test_prefetch.py and test_prefetch_training.py."""

import threading

import pytest
import torch

from aiayn.data.batching import BatchIterator
from aiayn.data.prefetch import CUDA_PREFETCH, host_transfer
from aiayn.model import build_model
from aiayn.training.trainer import Trainer

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="platform: no CUDA device")]

CUDA = "cuda:0"


def _fields(batch):
    return batch.src, batch.tgt_in, batch.tgt_out, batch.ids


def test_batches_are_pinned_copied_without_blocking_and_equal(make_task):
    task = make_task(n=64)
    transfer = host_transfer(CUDA)
    assert transfer.pin_memory and transfer.non_blocking and transfer.prefetch == CUDA_PREFETCH
    plain = list(BatchIterator(task, 64, seed=3))
    ahead = BatchIterator(task, 64, seed=3, transfer=transfer)
    moved = []
    for batch in ahead:
        assert all(t.is_pinned() for t in _fields(batch))
        moved.append(transfer.to_device(batch))
    torch.cuda.synchronize()
    assert len(moved) == len(plain)
    for on_gpu, on_cpu in zip(moved, plain):
        assert on_gpu.src.device == torch.device(CUDA)
        for a, b in zip(_fields(on_gpu), _fields(on_cpu)):
            assert torch.equal(a.cpu(), b)
    assert not any(t.name == "aiayn-prefetch" and t.is_alive() for t in threading.enumerate())


def test_the_trainer_pins_and_prefetches_on_cuda(make_cfg, make_task):
    task = make_task(n=40)
    cfg = make_cfg(max_steps=4)
    torch.manual_seed(0)
    trainer = Trainer(cfg, build_model(cfg.model), None, train_batches=BatchIterator(task, 64, seed=1), device=CUDA)
    assert trainer.transfer.non_blocking and trainer.train_batches.transfer.pin_memory
    assert trainer.train_batches.transfer.prefetch == CUDA_PREFETCH
    summary = trainer.train()
    assert summary["step"] == 4
    assert not any(t.name == "aiayn-prefetch" and t.is_alive() for t in threading.enumerate())
