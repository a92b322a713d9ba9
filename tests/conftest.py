"""Shared fixtures: tiny seeded configurations and the offline data mirror."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from aiayn.config import ModelConfig, model_preset

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
