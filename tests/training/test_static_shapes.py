"""Static batch shapes for ``train.compile_mode: reduce-overhead`` (aiayn.training.static_shapes):
padding to a bucket is masked (the loss and gradients of the padded batch are the unpadded
ones), a batch's shape depends on its length buckets only, the batcher keeps the padded size
within max_tokens, and the config says what the mode needs. The CUDA graphs themselves:
test_cuda_static_shapes.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aiayn.config import apply_overrides
from aiayn.config.sections import Config
from aiayn.data.batching import BatchIterator, collate
from aiayn.errors import ConfigError
from aiayn.model import build_model
from aiayn.training.static_shapes import BucketedPairs, StaticShapes
from aiayn.training.trainer import Trainer
from aiayn.vocab import PAD_ID


def _pairs(n: int, seed: int = 0, longest: int = 30):
    rng = np.random.default_rng(seed)
    return [(np.append(rng.integers(4, 16, size=int(rng.integers(1, longest))), 3),
             rng.integers(4, 16, size=int(rng.integers(1, longest)))) for _ in range(n)]


def _loss_and_grads(trainer, batch):
    trainer.model.zero_grad(set_to_none=True)
    loss, nll = trainer._loss(trainer.model, batch)
    loss.backward()
    return loss.detach(), nll, {n: p.grad.clone() for n, p in trainer.model.named_parameters()}


def test_a_padded_batch_has_the_loss_and_gradients_of_the_unpadded_one(make_cfg):
    torch.manual_seed(0)
    trainer = Trainer(make_cfg(max_tokens=256), build_model(make_cfg().model))
    trainer.model.train()  # dropout 0: the same computation, more of it
    batch = collate([(i, s, t) for i, (s, t) in enumerate(_pairs(5))])
    padded = StaticShapes(length_multiple=16, max_tokens=256).pad(batch)
    assert padded.src.size(1) % 16 == 0 and padded.tgt_in.size(1) % 16 == 0
    assert padded.size == 256 // max(padded.src.size(1), padded.tgt_in.size(1)) > batch.size
    assert (padded.n_src_tokens, padded.n_tgt_tokens) == (batch.n_src_tokens, batch.n_tgt_tokens)
    assert bool((padded.tgt_out[batch.size:] == PAD_ID).all())
    loss, nll, grads = _loss_and_grads(trainer, batch)
    loss_p, nll_p, grads_p = _loss_and_grads(trainer, padded)
    # Equal but for the order of float32 additions over the longer rows and columns.
    torch.testing.assert_close(loss_p, loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(nll_p, nll, rtol=1e-6, atol=0)
    for name, g in grads.items():
        # Relative to the largest entry: w_k's bias has a gradient of rounding noise alone.
        assert (grads_p[name] - g).abs().max() <= 1e-5 * max(g.abs().max().item(), 1.0), name


def test_a_batch_of_a_bucket_is_left_as_it_is():
    shapes = StaticShapes(length_multiple=8, max_tokens=64)
    batch = shapes.pad(collate([(i, np.array([5] * 7 + [3]), np.array([6] * 7)) for i in range(8)]))
    assert shapes.pad(batch) is batch


def test_the_shapes_of_an_epoch_are_bounded_by_the_buckets(listed_pairs):
    max_tokens, multiple = 512, 16
    shapes = StaticShapes(length_multiple=multiple, max_tokens=max_tokens)
    pairs = listed_pairs(_pairs(600, seed=1, longest=60))
    batches = BatchIterator(BucketedPairs(pairs, shapes), max_tokens, seed=3)
    by_bucket: dict[tuple[int, int], set[tuple[int, int, int]]] = {}
    unpadded = set()
    n_batches = 0
    for batch in batches:
        n_batches += 1
        unpadded.add((batch.size, batch.src.size(1), batch.tgt_in.size(1)))
        padded = shapes.pad(batch)
        rows, s, t = padded.size, padded.src.size(1), padded.tgt_in.size(1)
        assert rows * max(s, t) <= max_tokens  # the budget holds for the padded batch
        by_bucket.setdefault((s, t), set()).add((rows, s, t))
    assert n_batches == len(batches)
    assert all(len(v) == 1 for v in by_bucket.values())  # a shape per pair of length buckets
    buckets = -(-61 // multiple)  # sources and targets of up to 61 tokens with EOS / BOS
    assert len(by_bucket) <= buckets * buckets < len(unpadded)


def test_bucketed_sizes_round_up_what_the_tensors_hold(listed_pairs):
    shapes = StaticShapes(length_multiple=8, max_tokens=64)
    pairs = listed_pairs([(np.array([5, 3]), np.array([6] * 7)), (np.array([5] * 8 + [3]), np.array([6]))])
    bucketed = BucketedPairs(pairs, shapes)
    assert bucketed.src_sizes.tolist() == [8, 16]  # sources count their EOS
    assert bucketed.tgt_sizes.tolist() == [7, 7]  # targets gain BOS / EOS in the tensors: 8
    assert len(bucketed) == 2 and bucketed[1] is pairs[1]
    assert getattr(bucketed, "epoch_sizes", None) is None  # as the dataset: none

    class Sampled(type(pairs)):  # lengths that change by epoch, as subword sampling's
        def epoch_sizes(self, epoch):
            return self.src_sizes + epoch, self.tgt_sizes

    sampled = BucketedPairs(Sampled(pairs.pairs), shapes)
    src, tgt = sampled.epoch_sizes(7)
    assert src.tolist() == [16, 16] and tgt.tolist() == [7, 7]


def test_the_trainer_pads_each_batch_under_reduce_overhead(make_cfg):
    batch = collate([(i, s, t) for i, (s, t) in enumerate(_pairs(4, seed=2))])
    results = []
    for overrides in ({}, {"compile": True, "compile_mode": "reduce-overhead", "length_multiple": 8}):
        torch.manual_seed(0)
        cfg = make_cfg(max_tokens=256, **overrides)
        trainer = Trainer(cfg, build_model(cfg.model))
        trainer.forward_model = trainer.model  # the eager forward: what the capture replays
        torch.manual_seed(1)
        results.append(trainer.train_step([batch]))
    eager, static = results
    assert static.n_padded > eager.n_padded
    assert (static.n_tokens, static.n_sentences) == (eager.n_tokens, eager.n_sentences)
    assert static.loss_sum == pytest.approx(eager.loss_sum, rel=1e-6)


@pytest.mark.parametrize(("overrides", "message"), [
    (["train.compile_mode=max-autotune"],
     r"train\.compile_mode: 'max-autotune' is not one of default, reduce-overhead"),
    (["train.compile_mode=reduce-overhead"], r"train\.compile_mode: reduce-overhead applies to a compiled forward, "
                                             r"but train\.compile is false"),
    (["train.compile=true", "train.compile_mode=reduce-overhead", "train.max_tokens_mode=real"],
     r"train\.compile_mode: reduce-overhead .* needs train\.max_tokens_mode padded, got real"),
    (["train.length_multiple=0"], r"train\.length_multiple: must be in 1\.\.train\.max_tokens \(4096\), got 0"),
])
def test_the_config_says_what_reduce_overhead_needs(overrides, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(Config(), overrides)


def test_reduce_overhead_with_compile_is_a_valid_config():
    cfg = apply_overrides(Config(), ["train.compile=true", "train.compile_mode=reduce-overhead"])
    assert (cfg.train.compile_mode, cfg.train.length_multiple) == ("reduce-overhead", 16)
