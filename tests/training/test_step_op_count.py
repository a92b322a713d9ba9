"""The operators one training step dispatches, counted and pinned, so that per-step launch
overhead cannot grow back unnoticed: on a GPU each dispatched operator is at least one
kernel launch or a host-side cost between them, and torch's profiler counts the same
dispatches on a CPU. The model is Transformer base's shape (6 + 6 layers, 8 heads,
post-norm, dropout 0.1, tied embeddings) at a small width.

When a change lowers the count, lower ``PINNED_OPS`` with it; a change that raises it must
say why (the test names the operators that grew most)."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from aiayn.config import Config, DataConfig, TrainConfig, model_preset
from aiayn.data.batching import collate
from aiayn.model import build_model
from aiayn.training.loss import CPU_CHUNK_ROWS, chunk_rows_for_memory, loss_chunk_rows
from aiayn.training.trainer import Trainer

# aten operators of one fp32 step on a CPU (nested calls included), torch 2.13.
PINNED_OPS = 10255
VOCAB = 64


def _step_ops(batch_rows: int = 16) -> collections.Counter:
    model = dataclasses.replace(model_preset("base", src_vocab_size=VOCAB, tgt_vocab_size=VOCAB),
                                d_model=64, d_ff=128, max_positions=64)
    train = TrainConfig(max_tokens=256, lr_schedule="constant", lr=1e-3, warmup_steps=0, log_every=0,
                        valid_every=0, save_every=0, max_steps=10, progress_bar=False)
    cfg = Config(model=model, data=DataConfig(), train=train)
    cfg.validate()
    torch.manual_seed(0)
    trainer = Trainer(cfg, build_model(cfg.model))
    rng = np.random.default_rng(0)
    batch = collate([(i, rng.integers(4, VOCAB, size=9), rng.integers(4, VOCAB, size=8))
                     for i in range(batch_rows)])
    trainer.train_step([batch])  # the optimizer's state is created on the first step
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.train_step([batch])
    return collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))


def test_a_training_step_dispatches_no_more_operators_than_pinned(one_thread):
    ops = _step_ops()
    total = sum(ops.values())
    assert total > PINNED_OPS // 2, f"the profiler saw only {total} operators"
    assert total <= PINNED_OPS, (f"one training step dispatches {total} aten operators, {total - PINNED_OPS} more "
                                 f"than pinned; most frequent: {ops.most_common(12)}")


def test_the_loss_chunk_is_sized_per_device(monkeypatch):
    cpu = torch.device("cpu")
    assert loss_chunk_rows(cpu, 32000, torch.float32) == CPU_CHUNK_ROWS == 1024
    # A GPU: a quarter of the free memory, at most 2 GiB, in multiples of 1,024 rows.
    gib = 1 << 30
    assert chunk_rows_for_memory(60 * gib, 32000, torch.bfloat16) == 5 * 1024  # 2 GiB / (32000 x 12 B) = 5,592
    assert chunk_rows_for_memory(4 * gib, 32000, torch.bfloat16) == 2 * 1024  # a quarter: 1 GiB
    assert chunk_rows_for_memory(8 * gib, 32000, torch.float32) == 4 * 1024  # 2 x 4 B + 8 B a column
    assert chunk_rows_for_memory(gib, 32000, torch.bfloat16) == CPU_CHUNK_ROWS  # never below the CPU's
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (6 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 3 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: gib)
    # 6 GiB free + 2 GiB cached but unused: a quarter is 2 GiB.
    assert loss_chunk_rows(torch.device("cuda", 0), 32000, torch.bfloat16) == 5 * 1024
