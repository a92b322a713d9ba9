"""The ``deterministic`` fixture of the bit-exact CUDA tests: an operation without a
deterministic kernel is an error there, not a warning, and the setting is restored after."""

from __future__ import annotations

import torch


def test_nondeterministic_kernels_raise_inside_the_fixture(deterministic) -> None:
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()


def test_the_setting_is_restored_after_the_fixture() -> None:
    assert not torch.are_deterministic_algorithms_enabled()
