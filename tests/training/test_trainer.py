import dataclasses
import json

import pytest
import torch

from aiayn.checkpoint.directory import resolve_checkpoint, save_checkpoint, verify_checkpoint
from aiayn.data.batching import BatchIterator, collate
from aiayn.errors import AiaynError
from aiayn.model import build_model
from aiayn.training.stopping import TrainingError
from aiayn.training.trainer import Trainer


def _batch(task, indices):
    return collate([(i, *task[i]) for i in indices])


def _trainer(cfg, run_dir=None, task=None, seed=0, **kw):
    torch.manual_seed(seed)
    model = build_model(cfg.model)
    batches = BatchIterator(task, cfg.train.max_tokens, seed=cfg.train.seed) if task else None
    return Trainer(cfg, model, run_dir, train_batches=batches, **kw)


def test_overfits_a_small_batch(make_cfg, make_task):
    cfg = make_cfg(label_smoothing=0.0, lr=3e-3)
    task = make_task(n=8)
    batch = _batch(task, range(8))
    tr = _trainer(cfg)
    first = tr.train_step([batch])
    for _ in range(150):
        last = tr.train_step([batch])
    assert first.loss_sum / first.n_tokens > 2.0
    assert last.loss_sum / last.n_tokens < 0.05
    assert tr.state.step == 151


def test_accumulation_equals_one_large_batch(make_cfg, make_task):
    task = make_task(n=12)
    small = [_batch(task, range(0, 5)), _batch(task, range(5, 12))]
    large = _batch(task, range(12))
    grads = []
    for cfg, group in ((make_cfg(update_freq=2), small), (make_cfg(), [large])):
        tr = _trainer(cfg)
        captured = []
        tr.optimizer.step = lambda captured=captured, tr=tr: captured.append(
            [p.grad.clone() for p in tr.params])
        res = tr.train_step(group)
        assert res.n_tokens == large.n_tgt_tokens
        grads.append(captured[0])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_bf16_autocast_trains_on_cpu(make_cfg, make_task):
    cfg = make_cfg(dtype="bf16", label_smoothing=0.0)
    task = make_task(n=8)
    batch = _batch(task, range(8))
    tr = _trainer(cfg)
    losses = [tr.train_step([batch]) for _ in range(40)]
    assert all(r.updated for r in losses)
    assert tr.model.src_embed.weight.dtype == torch.float32  # master weights stay fp32
    assert losses[-1].loss_sum / losses[-1].n_tokens < 0.6 * losses[0].loss_sum / losses[0].n_tokens


def test_fp16_needs_cuda(make_cfg):
    with pytest.raises(AiaynError, match="fp16 needs a CUDA"):
        _trainer(make_cfg(dtype="fp16"))


def _poison(tr, from_call):
    """Make the model's outputs NaN from the `from_call`-th forward on."""
    real = tr.forward_model
    calls = {"n": 0}

    def forward(src, tgt_in, **kwargs):
        calls["n"] += 1
        out = real(src, tgt_in, **kwargs)
        return out * float("nan") if calls["n"] >= from_call else out

    tr.forward_model = forward


def test_nonfinite_loss_is_skipped(make_cfg, make_task):
    task = make_task(n=8)
    batch = _batch(task, range(8))
    tr = _trainer(make_cfg())
    tr.train_step([batch])
    before = [p.detach().clone() for p in tr.params]
    _poison(tr, from_call=1)
    res = tr.train_step([batch])
    assert res.nonfinite and not res.updated
    assert tr.state.step == 1 and tr.state.nonfinite.total == 1 and tr.state.nonfinite.consecutive == 1
    for a, p in zip(before, tr.params):
        assert torch.equal(a, p)
    tr.forward_model = tr.model
    assert tr.train_step([batch]).updated and tr.state.nonfinite.consecutive == 0


def test_divergence_stops_with_last_checkpoint_intact(make_cfg, make_task, tmp_path):
    cfg = make_cfg(save_every=2, max_nonfinite=3, max_steps=50)
    tr = _trainer(cfg, tmp_path, make_task(n=64))
    _poison(tr, from_call=4)  # steps 1-3 fine (checkpoint at 2), then NaN forever
    with pytest.raises(TrainingError, match="non-finite for 3 consecutive"):
        tr.train()
    last = resolve_checkpoint(tmp_path)
    assert last.name == "step_000002"
    verify_checkpoint(last)
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["stop_reason"] == "diverged" and summary["step"] == 3


def test_in_process_resume_is_exact(make_cfg, make_task, tmp_path):
    base = make_cfg(max_steps=8, log_every=2)
    cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, dropout=0.1))
    task = make_task(n=40)
    full = _trainer(cfg, tmp_path / "full", task)
    full.train()
    half_cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=4))
    _trainer(half_cfg, tmp_path / "half", task).train()
    resumed = _trainer(cfg, tmp_path / "half", task, seed=123)
    resumed.load(tmp_path / "half")
    assert resumed.state.step == 4
    resumed.train()
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)
    lines = [json.loads(x) for x in (tmp_path / "half" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["split"] == "train"] == [2, 4, 6, 8]
    assert set(lines[0]) >= {"step", "epoch", "loss", "nll", "ppl", "lr", "grad_norm",
                             "tokens_per_s", "elapsed"}


def test_stops_after_max_epochs(make_cfg, make_task, tmp_path):
    cfg = make_cfg(max_epochs=2, max_steps=0)
    task = make_task(n=40)
    tr = _trainer(cfg, tmp_path, task)
    summary = tr.train()
    assert summary["stop_reason"] == "max_epochs"
    assert tr.state.step == 2 * len(tr.train_batches) and tr.train_batches.epoch == 3
    assert resolve_checkpoint(tmp_path).name == f"step_{tr.state.step:06d}"


def test_stops_at_wall_time(make_cfg, make_task, tmp_path):
    tr = _trainer(make_cfg(max_time_minutes=1e-6, max_steps=100), tmp_path, make_task(n=40))
    summary = tr.train()
    assert summary["stop_reason"] == "max_time" and tr.state.step == 1
    assert resolve_checkpoint(tmp_path).name == "step_000001"


def test_wall_time_budget_is_not_overshot(make_cfg, make_task, tmp_path, monkeypatch):
    """max_time is a budget, not a trigger: the run stops before an update that would end
    past it. A fake clock makes every update take exactly 0.2 s: budget 0.9 s -> 4 updates,
    ending at 0.8 s (a fifth would end at 1.0 s), however fast or loaded the machine is."""
    import types

    from aiayn.training import trainer as trainer_module

    clock = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    tr = _trainer(make_cfg(max_time_minutes=0.9 / 60, max_steps=100), tmp_path, make_task(n=40))
    real_step, ends = tr.train_step, []

    def slow_step(group):
        clock.now += 0.2
        out = real_step(group)
        ends.append(tr.elapsed())
        return out

    tr.train_step = slow_step
    summary = tr.train()
    assert summary["stop_reason"] == "max_time"
    assert tr.state.step == 4 and ends == pytest.approx([0.2, 0.4, 0.6, 0.8])


@pytest.mark.parametrize("shape", ["cosine", "linear"])
def test_decay_over_a_time_budget_follows_the_clock(make_cfg, make_task, tmp_path, monkeypatch, shape):
    """lr_schedule cosine/linear with max_steps 0 decays over max_time_minutes: with a fake
    clock of 0.1 s an update and a 1 s budget, update k (after 0.1 (k-1) s) gets the rate at
    that share of the budget; 9 updates fit (a tenth would end at the budget), and the last
    checkpoint records the rate at 0.9 of it, near the bottom."""
    import math
    import types

    from aiayn.training import trainer as trainer_module

    clock = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    cfg = make_cfg(max_time_minutes=1.0 / 60, max_steps=0, lr_schedule=shape, lr=1e-3, min_lr=1e-5,
                   warmup_steps=0, valid_every=0)
    tr = _trainer(cfg, tmp_path, make_task(n=40))
    real_step, lrs = tr.train_step, []

    def timed_step(group):
        out = real_step(group)  # the rate is read at the update's start
        clock.now += 0.1
        lrs.append(out.lr)
        return out

    tr.train_step = timed_step
    assert tr.train()["stop_reason"] == "max_time"

    def rate(share):
        return 1e-5 + (1e-3 - 1e-5) * (0.5 * (1 + math.cos(math.pi * share)) if shape == "cosine" else 1 - share)

    assert lrs == pytest.approx([rate(0.1 * k) for k in range(9)], rel=1e-9)
    state = json.loads((resolve_checkpoint(tmp_path) / "state.json").read_text())
    assert state["scheduler"]["lr"] == pytest.approx(rate(0.9), rel=1e-9)


def test_a_rate_decaying_by_time_follows_the_ranks_mean_clock(make_cfg, make_task, monkeypatch):
    """Under torchrun every rank applies the update itself, so the rate of a schedule that
    decays by time must not come from each rank's own clock. A fake peer 30 s ahead of this
    rank (its clock reads 10 s): the rate is the one at the mean, 25 s of a 60 s budget."""
    import types

    from aiayn.training import trainer as trainer_module
    from aiayn.training.distributed import DistInfo

    cfg = make_cfg(max_time_minutes=1.0, max_steps=0, lr_schedule="cosine", lr=1e-3, warmup_steps=0)
    task = make_task(n=8)
    tr = _trainer(cfg)
    tr.dist = DistInfo(rank=0, world_size=2)  # no process group: the peer is simulated below
    clock = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    tr._t0 = clock.now - 10.0

    def two_ranks(values, info, device):  # the sum with a peer whose clock is 30 s ahead
        peer = list(values)
        if len(values) > 2:  # the reduction after the backward pass ends with the clock
            peer[-1] += 30.0
        return [a + b for a, b in zip(values, peer)]

    monkeypatch.setattr(trainer_module, "all_reduce_sum", two_ranks)
    out = tr.train_step([_batch(task, range(8))])
    assert out.lr == tr.schedule(1, 25.0)
    assert tr.schedule(1, 25.0) < tr.schedule(1, 10.0)  # the two clocks give different rates


def test_sigterm_stops_cleanly_with_a_checkpoint(make_cfg, make_task, tmp_path):
    import os
    import signal

    tr = _trainer(make_cfg(max_steps=100), tmp_path, make_task(n=40))
    real = tr.forward_model
    calls = {"n": 0}

    def forward(src, tgt_in, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # as a cluster scheduler does
        return real(src, tgt_in, **kwargs)

    tr.forward_model = forward
    before = signal.getsignal(signal.SIGTERM)
    summary = tr.train()
    assert summary["stop_reason"] == "signal" and tr.state.step == 3
    assert resolve_checkpoint(tmp_path).name == "step_000003"
    assert signal.getsignal(signal.SIGTERM) is before  # handler restored


def test_optimizer_options(make_cfg):
    from aiayn.training.optim import build_optimizer

    cfg = make_cfg()
    model = build_model(cfg.model)
    opt = build_optimizer(model, cfg.train)
    assert type(opt) is torch.optim.Adam
    group = opt.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0
    # The tied embedding/projection matrix is one parameter, updated once.
    assert sum(p is model.src_embed.weight for p in group["params"]) == 1
    cfg2 = make_cfg(optimizer="adamw", weight_decay=0.01, optimizer_impl="fused")
    opt2 = build_optimizer(model, cfg2.train)
    assert type(opt2) is torch.optim.AdamW and opt2.param_groups[0]["weight_decay"] == 0.01


@pytest.mark.slow
def test_torch_compile_trains_and_saves_plain_names(make_cfg, make_task, tmp_path):
    from safetensors import safe_open

    cfg = make_cfg(compile=True)
    task = make_task(n=8)
    tr = _trainer(cfg)
    batch = _batch(task, range(8))
    losses = [tr.train_step([batch]).loss_sum for _ in range(3)]
    assert losses[-1] < losses[0]
    save_checkpoint(tmp_path / "c", tr.forward_model, cfg)
    with safe_open(str(tmp_path / "c" / "model.safetensors"), "pt") as f:
        assert not [k for k in f.keys() if "_orig_mod" in k]


@pytest.mark.parametrize("impl", ["fused", "foreach"])
def test_validation_after_updates_sees_the_updated_weights(make_cfg, make_task, impl):
    """Regression: the inference-time fused QKV / transposed output weights were cached on
    the weights' version counters, which torch's fused Adam does not bump, so every
    validation after the first used stale copies (valid loss and valid BLEU wrong)."""
    import copy

    cfg = make_cfg(optimizer_impl=impl, lr=3e-3)
    task = make_task(n=8)
    batch = _batch(task, range(8))
    tr = _trainer(cfg, valid_batches=[batch])
    tr.validate()  # builds the inference-time copies
    for _ in range(3):
        tr.train_step([batch])
    seen = tr.validate()["valid_loss"]
    fresh = _trainer(cfg, valid_batches=[batch])
    fresh.model.load_state_dict(copy.deepcopy(tr.model.state_dict()))
    assert seen == pytest.approx(fresh.validate()["valid_loss"], rel=1e-6)
