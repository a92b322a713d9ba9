"""Inference-time copies of weights in a faster layout, rebuilt when the weights change.

Decoding runs the same few matmuls thousands of times; on a CPU some of them are faster
with the weights rearranged (W_Q, W_K, W_V side by side; the vocabulary projection
transposed). The copies are kept on the module, outside its state dict, and keyed on the
weights' version counters and storage, so ``load_state_dict``, ``.to()``, most optimizer
steps and in-place edits all lead to a rebuild on next use.

Not all: torch's *fused* Adam (``fused=True``, this project's default on the CPU too)
updates the weights without bumping their version counters, so a copy built during one
validation would be served, stale, at the next. Hence the key also holds a generation
number that a global optimizer hook advances after every ``step()`` of any torch optimizer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

T = TypeVar("T")
_generation = 0


def _after_optimizer_step(*_: object) -> None:
    global _generation
    _generation += 1


# Every optimizer step, whatever the optimizer and training loop, invalidates all copies.
register_optimizer_step_post_hook(_after_optimizer_step)


def derived(owner: nn.Module, name: str, sources: tuple[Tensor, ...], build: Callable[[], T]) -> T:
    """``build()``, cached on ``owner`` under ``name`` until any of ``sources`` changes."""
    key = (_generation, *((t._version, t.data_ptr(), t.dtype, t.device) for t in sources))
    cached = owner.__dict__.get(name)
    if cached is None or cached[0] != key:
        cached = (key, build())
        owner.__dict__[name] = cached  # not a parameter or buffer: never saved
    return cached[1]
