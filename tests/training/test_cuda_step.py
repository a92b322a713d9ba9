"""The GPU training-step options on a CUDA device: weights cast once per layer (applied by the
trainer under autocast; bit for bit autocast's results) and ``train.compile_mode:
reduce-overhead`` (CUDA graphs over bucketed static shapes; the losses of eager training).
Runs where a GPU is present (``pytest -m cuda``); skips elsewhere. The CPU counterparts are
test_weight_cast.py and test_static_shapes.py."""

import os

import numpy as np
import pytest
import torch

# Bit-exact comparisons need cuBLAS's deterministic workspace, set before cuBLAS starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

from aiayn.data.batching import collate  # noqa: E402
from aiayn.model import build_model  # noqa: E402
from aiayn.runtime.devices import cuda_native_bf16  # noqa: E402
from aiayn.training import trainer as trainer_module  # noqa: E402
from aiayn.training.trainer import Trainer  # noqa: E402
from aiayn.training.weight_cast import CastOnceLinear  # noqa: E402

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="platform: no CUDA device")]

CUDA = "cuda:0"


def _batches(n: int, seed: int = 0, vocab: int = 16):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        rows = int(rng.integers(2, 7))
        out.append(collate([(i, np.append(rng.integers(4, vocab, size=int(rng.integers(2, 12))), 3),
                             rng.integers(4, vocab, size=int(rng.integers(2, 12)))) for i in range(rows)]))
    return out


def _trainer(cfg):
    torch.manual_seed(0)
    return Trainer(cfg, build_model(cfg.model), device=CUDA)


def test_cast_once_is_applied_under_autocast_and_trains_as_autocast(make_cfg, deterministic, monkeypatch):
    dtype = "bf16" if cuda_native_bf16() else "fp16"
    cfg = make_cfg(dtype=dtype, max_tokens=256)
    once = _trainer(cfg)
    assert isinstance(once.model.decoder_layers[0].ffn.w_1, CastOnceLinear)
    monkeypatch.setattr(trainer_module, "cast_once_pays", lambda *a, **k: False)
    per_use = _trainer(cfg)
    assert type(per_use.model.decoder_layers[0].ffn.w_1) is torch.nn.Linear
    for batch in _batches(4):
        a, b = per_use.train_step([batch]), once.train_step([batch])
        assert (a.loss_sum, a.grad_norm) == (b.loss_sum, b.grad_norm)
    for (name, p), q in zip(per_use.model.named_parameters(), once.model.parameters()):
        assert torch.equal(p, q), name


def test_reduce_overhead_trains_as_eager(make_cfg, monkeypatch):
    """CUDA graphs are captured (a reason inductor would skip them raises instead of running
    the kernels one by one) and the losses are eager training's."""
    import torch._dynamo
    import torch._inductor.config
    from torch._dynamo.utils import counters

    monkeypatch.setattr(torch._inductor.config.triton, "cudagraph_or_error", True)
    captures = []
    capture_begin = torch.cuda.CUDAGraph.capture_begin

    def counted(self, *args, **kwargs):
        captures.append(self)
        return capture_begin(self, *args, **kwargs)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", counted)
    torch._dynamo.reset()
    counters.clear()
    eager = _trainer(make_cfg(max_tokens=256))
    graphed = _trainer(make_cfg(max_tokens=256, compile=True, compile_mode="reduce-overhead", length_multiple=8))
    assert graphed.static_shapes is not None
    batches = _batches(3, seed=1)
    for step, batch in enumerate(batches * 2):  # each shape again: replayed graphs
        a, b = eager.train_step([batch]), graphed.train_step([batch])
        assert b.n_tokens == a.n_tokens and b.n_sentences == a.n_sentences
        # float32 either way; the compiled kernels add in another order.
        assert b.loss_sum == pytest.approx(a.loss_sum, rel=1e-5 if step == 0 else 1e-3), step
    assert captures, "no CUDA graph was captured"
    assert counters["inductor"]["cudagraph_skips"] == 0
