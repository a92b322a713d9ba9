"""Weights cast once per layer and forward pass (aiayn.training.weight_cast) give autocast's
results bit for bit, touch neither the parameters nor their names, and fall back to plain
``nn.Linear`` wherever a layer is not entered under autocast. CPU bf16 autocast stands in for
a GPU's here: the casts and matmuls are the same operators."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from aiayn.config import Config, DataConfig, TrainConfig, model_preset
from aiayn.data.batching import collate
from aiayn.model import build_model
from aiayn.training.trainer import Trainer
from aiayn.training.weight_cast import CastOnceLinear, cast_once_pays, cast_weights_once

VOCAB = 48


def _trainer(dtype: str = "bf16", cast_once: bool = False, update_freq: int = 1) -> Trainer:
    model = dataclasses.replace(model_preset("base", src_vocab_size=VOCAB, tgt_vocab_size=VOCAB),
                                d_model=32, d_ff=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2,
                                max_positions=32)
    train = TrainConfig(max_tokens=256, lr_schedule="constant", lr=1e-3, warmup_steps=0, log_every=0,
                        valid_every=0, save_every=0, max_steps=10, progress_bar=False, dtype=dtype,
                        update_freq=update_freq)
    cfg = Config(model=model, data=DataConfig(), train=train)
    cfg.validate()
    torch.manual_seed(0)
    trainer = Trainer(cfg, build_model(cfg.model))
    if cast_once:
        assert cast_weights_once(trainer.model) == 2 * 6 + 2 * 10  # linears of 2 encoder, 2 decoder layers
    return trainer


def _batches(n: int = 2, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [collate([(i, rng.integers(4, VOCAB, size=int(rng.integers(3, 9))),
                      rng.integers(4, VOCAB, size=int(rng.integers(2, 8)))) for i in range(6)])
            for _ in range(n)]


@pytest.mark.parametrize("update_freq", [1, 2])
def test_cast_once_trains_bit_for_bit_as_autocast(update_freq):
    runs = []
    for cast_once in (False, True):
        trainer = _trainer(cast_once=cast_once, update_freq=update_freq)
        results = [trainer.train_step(group) for group in (_batches(update_freq, 0), _batches(update_freq, 1))]
        runs.append((trainer, results))
    (base, base_results), (once, once_results) = runs
    for a, b in zip(base_results, once_results):
        assert (a.loss_sum, a.nll_sum, a.grad_norm) == (b.loss_sum, b.nll_sum, b.grad_norm)
    for (name, p), q in zip(base.model.named_parameters(), once.model.parameters()):
        assert torch.equal(p, q), name
    # The tied embedding / output projection, used twice, trained as under autocast alone.
    assert once.model.output_weight is once.model.tgt_embed.weight


def test_gradients_reach_the_float32_master_weights_as_autocast_gives_them():
    grads = []
    for cast_once in (False, True):
        trainer = _trainer(cast_once=cast_once)
        trainer.model.train()
        torch.manual_seed(5)
        loss, _ = trainer._loss(trainer.forward_model, _batches(1)[0])
        loss.backward()
        grads.append({n: p.grad for n, p in trainer.model.named_parameters()})
    for name, g in grads[0].items():
        assert grads[1][name].dtype == torch.float32
        assert torch.equal(g, grads[1][name]), name


def test_parameters_and_their_names_stay_the_models():
    trainer = _trainer()
    before = dict(trainer.model.named_parameters())
    keys = list(trainer.model.state_dict())
    cast_weights_once(trainer.model)
    assert dict(trainer.model.named_parameters()) == before
    assert list(trainer.model.state_dict()) == keys
    assert isinstance(trainer.model.encoder_layers[0].ffn.w_1, CastOnceLinear)
    assert cast_weights_once(trainer.model) == 0  # applied already


@pytest.fixture
def linear_paths(monkeypatch) -> list[str]:
    """Which path each CastOnceLinear call took, in order: "cast" (its layer's cast copies)
    or "plain" (nn.Linear). The two give the same numbers, so only this tells them apart."""
    seen: list[str] = []
    forward = CastOnceLinear.forward

    def recorded(self, x):
        seen.append("plain" if self._weight_cast.current is None else "cast")
        return forward(self, x)

    monkeypatch.setattr(CastOnceLinear, "forward", recorded)
    return seen


def test_cast_copies_serve_the_linears_of_a_layer_entered_under_autocast(linear_paths):
    trainer = _trainer(cast_once=True)
    trainer.train_step(_batches(1))
    assert linear_paths and set(linear_paths) == {"cast"}


def test_outside_autocast_or_an_entered_layer_a_linear_is_plain(linear_paths):
    fp32 = [_trainer("fp32", cast_once=flag) for flag in (False, True)]
    results = []
    for trainer in fp32:
        torch.manual_seed(1)
        results.append(trainer.train_step(_batches(1)))
    assert results[0].loss_sum == results[1].loss_sum
    assert linear_paths and set(linear_paths) == {"plain"}  # no autocast: no cast copies
    plain, once = fp32[0].model, fp32[1].model
    lin = once.decoder_layers[0].ffn.w_1
    x = torch.randn(3, 32)
    linear_paths.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(lin(x), nn.functional.linear(x, lin.weight, lin.bias))
    assert linear_paths == ["plain"]  # called outside its layer
    # Incremental decoding calls the layers' step(), never entering them: plain linears,
    # and the logits of the same model without cast_weights_once, bit for bit.
    for model in (plain, once):
        model.eval()
    src = _batches(1)[0].src
    logits, steps = [], []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for model in (plain, once):
            linear_paths.clear()
            memory, mask = model.encode(src)
            encoded = list(linear_paths)
            linear_paths.clear()
            cache = model.init_cache(memory, mask, 4)
            logits.append(model.decode_step(torch.full((src.size(0),), 1), cache)[0])
            steps.append(list(linear_paths))
    assert torch.equal(logits[0], logits[1])
    assert steps[0] == [] and steps[1] and set(steps[1]) == {"plain"}
    # The encoder's layers are entered: their cast copies (the record tells the paths apart).
    assert encoded and set(encoded) == {"cast"}


def test_only_an_eager_cuda_autocast_forward_casts_once():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert cast_once_pays(cuda, torch.bfloat16, compiled=False)
    assert cast_once_pays(cuda, torch.float16, compiled=False)
    assert not cast_once_pays(cuda, None, compiled=False)
    assert not cast_once_pays(cuda, torch.bfloat16, compiled=True)
    assert not cast_once_pays(cpu, torch.bfloat16, compiled=False)
