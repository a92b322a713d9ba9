"""Tiny models and an in-memory 'reverse' task for the training tests."""

from __future__ import annotations

import numpy as np
import pytest

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


@pytest.fixture
def make_task():
    """``make_task(n=64, ...) -> ReverseTask``."""
    return ReverseTask


@pytest.fixture(autouse=True)
def _tiny_models_on_one_thread(one_thread):
    yield
