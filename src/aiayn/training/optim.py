"""The optimizer of section 5.3: Adam(beta1 0.9, beta2 0.98, eps 1e-9); AdamW as an option.

``weight_decay`` with ``adam`` is torch's L2 penalty added to the gradient; with ``adamw``
it is decoupled (Loshchilov & Hutter). The learning rate is set by the trainer before each
update from :mod:`aiayn.training.schedule`, so the rate given here is only a placeholder.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from aiayn.config import TrainConfig

log = logging.getLogger(__name__)


def _implementation(impl: str, device: torch.device) -> dict[str, bool]:
    """Keyword arguments choosing torch's fused / foreach / for-loop Adam kernels."""
    if impl == "auto":
        # Fused kernels exist for CUDA and, since torch 2.4, CPU. The fused step updates each
        # parameter in one pass where foreach makes one pass per operation, so it is the
        # default everywhere.
        impl = "fused"
    if impl == "fused":
        return {"fused": True}
    if impl == "foreach":
        return {"foreach": True}
    return {"foreach": False}


def build_optimizer(model: nn.Module, train: TrainConfig,
                    device: torch.device | str = "cpu") -> torch.optim.Optimizer:
    """Adam or AdamW over the model's unique parameters (tied matrices appear once)."""
    device = torch.device(device)
    params = [p for p in model.parameters() if p.requires_grad]
    impl = getattr(train, "optimizer_impl", "auto")
    beta1, beta2 = train.adam_betas
    kwargs: dict[str, Any] = dict(lr=train.lr, betas=(beta1, beta2), eps=train.adam_eps,
                                  weight_decay=train.weight_decay, **_implementation(impl, device))
    cls = torch.optim.AdamW if train.optimizer == "adamw" else torch.optim.Adam
    try:
        return cls(params, **kwargs)
    except (RuntimeError, TypeError, ValueError) as exc:
        if not kwargs.get("fused"):
            raise
        # An older torch, or a device/dtype without a fused kernel: fall back quietly.
        log.info("fused %s unavailable here (%s); using foreach", cls.__name__, exc)
        kwargs.pop("fused")
        kwargs["foreach"] = True
        return cls(params, **kwargs)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
