"""The translator and CLI tests run on one torch thread; their checkpoints (``tiny_checkpoint``,
``second_checkpoint``) and ``run_cli`` come from tests/conftest.py."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models gain nothing from a second thread, and on a shared 2-core machine the
    threads' hand-offs cost more than the arithmetic; restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
