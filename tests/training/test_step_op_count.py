"""The operators one training step dispatches, counted and pinned, so that per-step launch
overhead cannot grow back unnoticed: on a GPU each dispatched operator is at least one
kernel launch or a host-side cost between them, and torch's profiler counts the same
dispatches on a CPU. The model is Transformer base's shape (6 + 6 layers, 8 heads,
post-norm, dropout 0.1, tied embeddings) at a small width.

The count is exact: a change that lowers it lowers ``PINNED_OPS`` with it, and a change that
raises it must say why (the test names the most frequent operators).

Operators that a matrix product dispatches inside itself are not counted: they are the CPU
kernel's own business, not launches. On a CPU without bf16 units a bf16 ``aten::bmm`` runs
aten's reference loop (a ``select`` and an ``mm`` per matrix, tens of thousands per step),
while a GPU or a CPU with bf16 units runs one kernel; counting only what the step itself
dispatches makes the pin the same on every CPU kind.

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

# aten operators of one step (nested calls included, except inside a matrix product), torch
# 2.13, the same on AVX2, AVX-512 and AMX CPUs: fp32; bf16 autocast; bf16 autocast with the
# weights cast once.
PINNED_OPS = 9280
PINNED_BF16_OPS = 13058
PINNED_CAST_ONCE_OPS = 12428
VOCAB = 64
# Matrix products whose internals are a CPU kernel's implementation, not dispatches of the step.
MATRIX_PRODUCTS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})


def _inside_matrix_product(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in MATRIX_PRODUCTS:
            return True
        parent = parent.cpu_parent
    return False


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
    return collections.Counter(e.name for e in prof.events()
                               if e.name.startswith("aten::") and not _inside_matrix_product(e))


def _check_pin(ops: collections.Counter, pinned: int, what: str) -> int:
    total = sum(ops.values())
    assert total == pinned, (f"one {what} training step dispatches {total} aten operators against {pinned} "
                             f"pinned ({total - pinned:+d}); most frequent: {ops.most_common(12)}")
    return total


def test_a_training_step_dispatches_exactly_the_pinned_operators(one_thread):
    _check_pin(_step_ops(), PINNED_OPS, "fp32")


def test_operators_inside_a_matrix_product_are_not_counted():
    """The filter looks through every ancestor: an op two levels under ``aten::bmm`` is the
    kernel's, one beside it is the step's."""
    class Event:
        def __init__(self, name, parent=None):
            self.name, self.cpu_parent = name, parent
    bmm = Event("aten::bmm", Event("aten::matmul"))
    assert _inside_matrix_product(Event("aten::resolve_conj", Event("aten::select", bmm)))
    assert not _inside_matrix_product(Event("aten::select", Event("aten::matmul")))
    assert not _inside_matrix_product(bmm)


def test_weights_cast_once_dispatch_fewer_operators_than_autocast_alone(one_thread):
    per_use = _check_pin(_step_ops(dtype="bf16"), PINNED_BF16_OPS, "bf16 autocast")
    cast_once = _step_ops(dtype="bf16", cast_once=True)
    once = _check_pin(cast_once, PINNED_CAST_ONCE_OPS, "bf16 cast-once")
    assert once < per_use
    # The linears' weight and bias casts are gone: 96 linears x 2 tensors x (forward + backward).
    assert cast_once["aten::_foreach_copy_"] == 2 * 12
