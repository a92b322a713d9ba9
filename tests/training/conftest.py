"""Tiny models and an in-memory 'reverse' task for the training tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aiayn.config import Config, DataConfig, ModelConfig, TrainConfig

EOS = 3


class ReverseTask:
    """src = random tokens + EOS, tgt = the same tokens reversed (the batcher's SizedPairs)."""

    def __init__(self, n: int = 64, vocab: int = 16, min_len: int = 2, max_len: int = 6,
                 seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.pairs = []
        for _ in range(n):
            toks = rng.integers(4, vocab, size=int(rng.integers(min_len, max_len + 1)))
            self.pairs.append((np.append(toks, EOS).astype(np.int64), toks[::-1].astype(np.int64)))
        self.src_sizes = np.array([len(s) for s, _ in self.pairs])
        self.tgt_sizes = np.array([len(t) for _, t in self.pairs])

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.pairs[i]


def tiny_cfg(vocab: int = 16, **train: object) -> Config:
    model = ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=32, n_heads=2,
                        d_ff=64, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0,
                        max_positions=64)
    t = dict(max_tokens=64, lr_schedule="constant", lr=3e-3, warmup_steps=0, log_every=0,
             valid_every=0, save_every=0, max_steps=10, label_smoothing=0.1, progress_bar=False)
    t.update(train)
    cfg = Config(model=model, data=DataConfig(), train=TrainConfig(**t))
    cfg.validate()
    return cfg


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run fastest on one thread, and far faster than two threads on a busy
    shared machine (intra-op threads spin-wait for each other)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def make_cfg():
    """``make_cfg(**train_fields) -> Config`` of a tiny model (fixtures: importable helpers
    do not work under --import-mode=importlib)."""
    return tiny_cfg


@pytest.fixture
def make_task():
    """``make_task(n=64, ...) -> ReverseTask``."""
    return ReverseTask
