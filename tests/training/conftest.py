"""Tiny models and an in-memory 'reverse' task for the training tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

EOS = 3


def reverse_pairs(n: int = 64, vocab: int = 16, min_len: int = 2, max_len: int = 6,
                  seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """src = random tokens + EOS, tgt = the same tokens reversed."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        toks = rng.integers(4, vocab, size=int(rng.integers(min_len, max_len + 1)))
        pairs.append((np.append(toks, EOS).astype(np.int64), toks[::-1].astype(np.int64)))
    return pairs


@pytest.fixture
def make_task(listed_pairs):
    """``make_task(n=64, vocab=16, min_len=2, max_len=6, seed=0)``: the reverse task as the
    batcher's SizedPairs (a ListedPairs)."""

    def make(n: int = 64, vocab: int = 16, min_len: int = 2, max_len: int = 6, seed: int = 0):
        return listed_pairs(reverse_pairs(n, vocab, min_len, max_len, seed))

    return make


@pytest.fixture(autouse=True)
def _tiny_models_on_one_thread(one_thread):
    yield


@pytest.fixture
def deterministic():
    """CUDA kernels with a fixed reduction order (index_add_, embedding backward), and the
    attention as plain matmuls and softmax (the fused attention kernels' backward passes
    accumulate in no fixed order): runs repeat bit for bit. An operation without a
    deterministic kernel raises (warn_only=False) instead of warning and running the
    nondeterministic one, so that a bit-exact comparison never passes or fails by chance."""
    before = torch.are_deterministic_algorithms_enabled()
    before_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=False)
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        math_attention = sdpa_kernel(SDPBackend.MATH)
    except ImportError:  # torch < 2.3
        math_attention = torch.backends.cuda.sdp_kernel(enable_flash=False, enable_mem_efficient=False)
    try:
        with math_attention:
            yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=before_warn_only)
