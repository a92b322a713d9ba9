"""The operators one training step dispatches, counted and pinned, so that per-step launch
overhead cannot grow back unnoticed: on a GPU each dispatched operator is at least one
kernel launch or a host-side cost between them, and torch's profiler counts the same
dispatches on a CPU. The model is Transformer base's shape (6 + 6 layers, 8 heads,
post-norm, dropout 0.1, tied embeddings) at a small width.

When a change lowers the count, lower ``PINNED_OPS`` with it; a change that raises it must
say why (the test names the operators that grew most).

Under bf16 autocast the step is pinned twice: as autocast runs it (every linear casts its
weight and bias, and backward casts their gradients back, one tensor at a time), and with the
weights cast once per layer and forward pass (``aiayn.training.weight_cast``, what a CUDA
device gets), which must dispatch fewer."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from aiayn.config import Config, DataConfig, TrainConfig, model_preset
from aiayn.data.batching import collate
from aiayn.model import build_model
from aiayn.training.trainer import Trainer
from aiayn.training.weight_cast import cast_weights_once

# aten operators of one step on a CPU (nested calls included), torch 2.13: fp32; bf16 autocast;
# bf16 autocast with the weights cast once.
PINNED_OPS = 10247
PINNED_BF16_OPS = 14241
PINNED_CAST_ONCE_OPS = 13611
VOCAB = 64


def _step_ops(batch_rows: int = 16, dtype: str = "fp32", cast_once: bool = False) -> collections.Counter:
    model = dataclasses.replace(model_preset("base", src_vocab_size=VOCAB, tgt_vocab_size=VOCAB),
                                d_model=64, d_ff=128, max_positions=64)
    train = TrainConfig(max_tokens=256, lr_schedule="constant", lr=1e-3, warmup_steps=0, log_every=0,
                        valid_every=0, save_every=0, max_steps=10, progress_bar=False, dtype=dtype)
    cfg = Config(model=model, data=DataConfig(), train=train)
    cfg.validate()
    torch.manual_seed(0)
    trainer = Trainer(cfg, build_model(cfg.model))
    if cast_once:
        cast_weights_once(trainer.model)
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



def _check_pin(ops: collections.Counter, pinned: int, what: str) -> int:
    total = sum(ops.values())
    assert total > pinned // 2, f"the profiler saw only {total} operators"
    assert total <= pinned, (f"one {what} training step dispatches {total} aten operators, {total - pinned} more "
                             f"than pinned; most frequent: {ops.most_common(12)}")
    return total


def test_weights_cast_once_dispatch_fewer_operators_than_autocast_alone(one_thread):
    per_use = _check_pin(_step_ops(dtype="bf16"), PINNED_BF16_OPS, "bf16 autocast")
    cast_once = _step_ops(dtype="bf16", cast_once=True)
    once = _check_pin(cast_once, PINNED_CAST_ONCE_OPS, "bf16 cast-once")
    assert once < per_use
    # The linears' weight and bias casts are gone: 96 linears x 2 tensors x (forward + backward).
    assert cast_once["aten::_foreach_copy_"] == 2 * 12
