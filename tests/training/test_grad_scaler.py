"""The fp16 branch of the update (a gradient scaler) on a CPU: ``torch.amp.GradScaler("cpu")``
runs the same unscale / skip / back-off logic as CUDA's, so the branch is tested everywhere.
Injected inf gradients stand for an fp16 overflow."""

import dataclasses

import pytest
import torch

from aiayn.data.batching import BatchIterator, collate
from aiayn.model import build_model
from aiayn.training import amp
from aiayn.training.trainer import Trainer

CPU = torch.device("cpu")
INIT_SCALE = 2.0**10


def _scaler() -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=3)


def _trainer(cfg, run_dir=None, task=None, seed=0):
    torch.manual_seed(seed)
    batches = BatchIterator(task, cfg.train.max_tokens, seed=cfg.train.seed) if task else None
    return Trainer(cfg, build_model(cfg.model), run_dir, train_batches=batches, scaler=_scaler())


def _overflow_once(param: torch.nn.Parameter) -> None:
    """The next backward writes inf into ``param``'s gradient (the loss stays finite)."""
    handle = None

    def hook(grad):
        handle.remove()
        return torch.full_like(grad, float("inf"))

    handle = param.register_hook(hook)


def test_an_overflow_skips_the_update_and_halves_the_scale():
    p = torch.nn.Parameter(torch.ones(2))
    scaler = _scaler()
    opt = torch.optim.SGD([p], lr=1.0)
    scaler.scale(torch.ones(()))  # as a backward of a scaled loss: the scale comes to life
    p.grad = torch.full((2,), float("inf"))
    out = amp.apply_update(opt, scaler, [p], clip_norm=1.0, loss_ok=True, device=CPU)
    assert out.overflow and not out.updated and not out.nonfinite
    assert out.scale_before == INIT_SCALE and scaler.get_scale() == INIT_SCALE / 2
    assert torch.equal(p.detach(), torch.ones(2))
    p.grad = torch.full((2,), INIT_SCALE / 2)  # scaled gradient of 1 at the new scale
    out = amp.apply_update(opt, scaler, [p], clip_norm=0.0, loss_ok=True, device=CPU)
    assert out.updated and not out.overflow and out.grad_norm == pytest.approx(2**0.5)
    assert torch.equal(p.detach(), torch.zeros(2))


def test_the_trainer_skips_an_overflowed_step(make_cfg, make_task):
    task = make_task(n=8)
    batch = collate([(i, *task[i]) for i in range(8)])
    tr = _trainer(make_cfg())
    assert tr.scaler.is_enabled() and tr.train_step([batch]).updated
    before = [p.detach().clone() for p in tr.params]
    _overflow_once(tr.params[0])
    res = tr.train_step([batch])
    assert not res.updated and not res.nonfinite
    assert tr.state.step == 1 and tr.state.nonfinite.fp16_overflows == 1 and tr.state.nonfinite.total == 0
    assert tr.scaler.get_scale() == INIT_SCALE / 2
    for a, p in zip(before, tr.params):
        assert torch.equal(a, p)
    assert not any(s for s in tr.optimizer.state.values() if s.get("step", 0) > 1)  # Adam did not step
    assert tr.train_step([batch]).updated and tr.state.step == 2


def test_scaled_training_resumes_bit_exactly_with_its_scale(make_cfg, make_task, tmp_path):
    base = make_cfg(max_steps=8, log_every=0)
    cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, dropout=0.1))
    task = make_task(n=40)
    full = _trainer(cfg, tmp_path / "full", task)
    full.train()
    half_cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=4))
    half = _trainer(half_cfg, tmp_path / "half", task)
    half.train()
    grown = half.scaler.get_scale()
    assert grown > INIT_SCALE  # growth_interval 3: the scale grew once in 4 steps
    resumed = _trainer(cfg, tmp_path / "half", task, seed=123)
    resumed.load(tmp_path / "half")
    assert resumed.scaler.get_scale() == grown and resumed.state.step == 4
    resumed.train()
    assert resumed.scaler.get_scale() == full.scaler.get_scale()
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)
