"""Shared fixtures: tiny seeded configurations and the offline data mirror."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from aiayn.config import Config, DataConfig, ModelConfig, TrainConfig, model_preset

REPO = Path(__file__).resolve().parents[1]
# ../shared/data beside the checkout: real corpora, used as an offline download mirror.
MIRROR = REPO.parent / "shared" / "data"

# Two cores on CI: keep torch from oversubscribing when pytest runs alongside builds.
torch.set_num_threads(int(os.environ.get("AIAYN_TEST_THREADS", "2")))


@pytest.fixture
def tiny_config() -> ModelConfig:
    return model_preset("tiny")


@pytest.fixture
def mirror() -> Path:
    if not (MIRROR / "multi30k").is_dir():
        pytest.skip(f"data mirror not found at {MIRROR}")
    return MIRROR


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Deterministic weights in every test unless it seeds on its own.
    torch.manual_seed(0)


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


@pytest.fixture
def one_thread():
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
