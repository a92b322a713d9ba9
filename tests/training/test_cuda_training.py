"""Training on a CUDA device: fp16 with the gradient scaler, bf16 autocast, the CUDA RNG in
checkpoints, torch.compile, and DDP over NCCL. Runs where a GPU is present (``pytest -m
cuda``); skips elsewhere. The CPU counterparts are test_trainer.py and test_grad_scaler.py."""

import dataclasses
import json
import os

import pytest
import torch

# Bit-exact comparisons need cuBLAS's deterministic workspace, set before cuBLAS starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

from aiayn.checkpoint.directory import resolve_checkpoint  # noqa: E402
from aiayn.checkpoint.layout import STATE_FILE  # noqa: E402
from aiayn.data.batching import BatchIterator, collate  # noqa: E402
from aiayn.model import build_model  # noqa: E402
from aiayn.runtime.devices import cuda_native_bf16  # noqa: E402
from aiayn.training.distributed import DistInfo  # noqa: E402
from aiayn.training.trainer import Trainer  # noqa: E402
from aiayn.training.weight_cast import CastOnceLinear  # noqa: E402

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="platform: no CUDA device")]

CUDA = "cuda:0"  # as aiayn.runtime.devices.resolve_device names it (DDP needs the index)


def _trainer(cfg, run_dir=None, task=None, seed=0, **kw):
    torch.manual_seed(seed)
    batches = BatchIterator(task, cfg.train.max_tokens, seed=cfg.train.seed) if task else None
    return Trainer(cfg, build_model(cfg.model), run_dir, train_batches=batches, device=CUDA, **kw)


def _batch(task, n=8):
    return collate([(i, *task[i]) for i in range(n)])


def _with_dropout(cfg):
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dropout=0.1))


def test_fp16_trains_with_a_scaler_and_skips_an_overflow(make_cfg, make_task):
    task = make_task(n=8)
    tr = _trainer(make_cfg(dtype="fp16", label_smoothing=0.0))
    assert tr.scaler.is_enabled() and tr.amp_dtype is torch.float16
    first = tr.train_step([_batch(task)])
    while not first.updated:  # the scale starts high (65,536) and halves until gradients fit
        assert tr.state.nonfinite.fp16_overflows < 8
        first = tr.train_step([_batch(task)])
    before = [p.detach().clone() for p in tr.params]
    scale = tr.scaler.get_scale()
    param = tr.params[0]
    handle = param.register_hook(lambda g: torch.full_like(g, float("inf")))
    res = tr.train_step([_batch(task)])
    handle.remove()
    assert not res.updated and not res.nonfinite and tr.state.nonfinite.fp16_overflows == 1
    assert tr.scaler.get_scale() == scale / 2
    for a, p in zip(before, tr.params):
        assert torch.equal(a, p)
    losses = [tr.train_step([_batch(task)]) for _ in range(40)]
    assert sum(r.updated for r in losses) >= 36 and not any(r.nonfinite for r in losses)
    assert tr.model.src_embed.weight.dtype == torch.float32  # master weights stay fp32
    assert losses[-1].loss_sum < 0.6 * first.loss_sum


def test_fp16_resume_restores_the_scale_bit_exactly(make_cfg, make_task, tmp_path, deterministic):
    cfg = _with_dropout(make_cfg(max_steps=8, dtype="fp16"))
    task = make_task(n=40)
    full = _trainer(cfg, tmp_path / "full", task)
    full.train()
    half_cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=4))
    half = _trainer(half_cfg, tmp_path / "half", task)
    half.train()
    state = json.loads((resolve_checkpoint(tmp_path / "half") / STATE_FILE).read_text())
    assert state["scaler"]["scale"] == half.scaler.get_scale() and "cuda" in state["rng"]
    resumed = _trainer(cfg, tmp_path / "half", task, seed=123)
    resumed.load(tmp_path / "half")
    assert resumed.scaler.get_scale() == half.scaler.get_scale() and resumed.state.step == 4
    resumed.train()
    assert resumed.scaler.get_scale() == full.scaler.get_scale()
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)


def test_bf16_autocast_trains(make_cfg, make_task):
    """The matmuls run in bf16 (autocast, weights cast once per layer), the first loss is
    float32 training's to bf16's rounding, and training goes on from there."""
    if not cuda_native_bf16():
        pytest.skip("platform: no bf16 on this GPU")
    task = make_task(n=8)
    fp32 = _trainer(make_cfg(dtype="fp32", label_smoothing=0.0))
    tr = _trainer(make_cfg(dtype="bf16", label_smoothing=0.0))
    assert not tr.scaler.is_enabled() and tr.amp_dtype is torch.bfloat16
    linear = tr.model.decoder_layers[0].ffn.w_1
    assert isinstance(linear, CastOnceLinear)  # eager CUDA autocast: the trainer casts weights once
    dtypes = []
    handle = linear.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    reference = fp32.train_step([_batch(task)])
    losses = [tr.train_step([_batch(task)]) for _ in range(40)]
    handle.remove()
    assert dtypes and set(dtypes) == {torch.bfloat16}
    assert losses[0].loss_sum == pytest.approx(reference.loss_sum, rel=2e-2)
    assert all(r.updated for r in losses)
    assert tr.model.src_embed.weight.dtype == torch.float32  # master weights stay fp32
    assert losses[-1].loss_sum < 0.6 * losses[0].loss_sum


def test_the_cuda_rng_is_saved_and_restored(make_cfg, make_task, tmp_path):
    tr = _trainer(_with_dropout(make_cfg()), tmp_path / "run", make_task(n=16))
    tr.train_step([_batch(make_task(n=16))])
    path = tr.save()
    expected = torch.rand(8, device=CUDA)  # what the run draws next on the GPU
    torch.rand(100, device=CUDA)  # the stream moves on
    tr.load(path)
    assert torch.equal(torch.rand(8, device=CUDA), expected)


def test_cuda_training_is_exactly_resumable_with_dropout(make_cfg, make_task, tmp_path, deterministic):
    cfg = _with_dropout(make_cfg(max_steps=6))
    task = make_task(n=40)
    full = _trainer(cfg, tmp_path / "full", task)
    full.train()
    half_cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=3))
    _trainer(half_cfg, tmp_path / "half", task).train()
    resumed = _trainer(cfg, tmp_path / "half", task, seed=99)
    resumed.load(tmp_path / "half")
    resumed.train()
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)


def test_cuda_gradients_match_the_cpus_to_float32_rounding(make_cfg, make_task):
    task = make_task(n=8)
    cfg = make_cfg()
    grads = []
    for device in ("cpu", CUDA):
        torch.manual_seed(0)
        tr = Trainer(cfg, build_model(cfg.model), device=device)
        captured = []
        tr.optimizer.step = lambda captured=captured, tr=tr: captured.append([p.grad.cpu() for p in tr.params])
        res = tr.train_step([_batch(task)])
        grads.append((res.loss_sum, captured[0]))
    (cpu_loss, cpu_grads), (gpu_loss, gpu_grads) = grads
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-5)
    for a, b in zip(cpu_grads, gpu_grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_torch_compile_trains_on_cuda(make_cfg, make_task, dtype, monkeypatch):
    """The forward is compiled and its graph runs (an error raises instead of falling back
    to eager), with eager training's losses to the kernels' rounding."""
    if dtype == "bf16" and not cuda_native_bf16():
        pytest.skip("platform: no bf16 on this GPU")
    import torch._dynamo
    from torch._dynamo.utils import counters

    monkeypatch.setattr(torch._dynamo.config, "suppress_errors", False)
    torch._dynamo.reset()
    counters.clear()
    task = make_task(n=8)
    eager = _trainer(make_cfg(dtype=dtype, label_smoothing=0.0))
    tr = _trainer(make_cfg(compile=True, dtype=dtype, label_smoothing=0.0))
    assert isinstance(tr.forward_model, torch._dynamo.eval_frame.OptimizedModule)
    steps = [(eager.train_step([_batch(task)]).loss_sum, tr.train_step([_batch(task)]).loss_sum) for _ in range(10)]
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo captured the forward, inductor compiled it
    rel = 1e-4 if dtype == "fp32" else 2e-2
    for step, (want, got) in enumerate(steps[:3]):  # before rounding differences compound
        assert got == pytest.approx(want, rel=rel), step
    assert steps[-1][1] < steps[0][1]


class _OneRankGroup(DistInfo):
    """A process group of one: the trainer takes the DDP path although nobody else joins."""

    @property
    def enabled(self) -> bool:
        return True


def test_ddp_over_nccl_with_one_process_equals_plain_training(make_cfg, make_task, tmp_path, deterministic):
    import torch.distributed as dist

    if not dist.is_nccl_available():
        pytest.skip("platform: this torch build has no NCCL")
    task = make_task(n=16)
    batches = [[_batch(task, 8)], [collate([(i, *task[i]) for i in range(8, 16)])]]
    cfg = make_cfg(update_freq=1)
    plain = _trainer(cfg)
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    try:
        ddp = _trainer(cfg, dist_info=_OneRankGroup())
        assert ddp.ddp is not None
        for group in batches:
            a, b = plain.train_step(group), ddp.train_step(group)
            assert a.n_tokens == b.n_tokens and b.loss_sum == pytest.approx(a.loss_sum, rel=1e-6)
    finally:
        dist.destroy_process_group()
    for p, q in zip(plain.params, ddp.params):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)
