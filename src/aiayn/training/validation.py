"""Validation during training: loss, NLL and perplexity, plus BLEU from an injected scorer.

BLEU needs decoding (aiayn.inference) and scoring (aiayn.evaluation), which training does not
import: whoever builds the run (aiayn.recipes.train) passes a ``(model) -> float | None``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from aiayn.training.metrics import perplexity
from aiayn.training.state import TrainerState

if TYPE_CHECKING:
    from aiayn.model import Transformer

# (model) -> validation BLEU, or None when it cannot be computed this time.
BleuFn = Callable[["Transformer"], "float | None"]
# (model, batch) -> (summed smoothed loss, summed NLL) of the batch.
LossFn = Callable[[nn.Module, Any], tuple[Tensor, Tensor]]

# Metrics where higher is better; the others (losses, perplexity) improve downwards.
HIGHER_IS_BETTER = frozenset({"valid_bleu"})


class Validator:
    """``validator(model)`` -> ``valid_loss``, ``valid_nll``, ``valid_ppl`` (per target
    token) and ``valid_bleu`` when ``bleu`` gives one; ``{}`` without validation batches.

    Runs under a forked RNG so that validating does not change the random stream training
    continues with (exact resume), and leaves the model in training mode.
    """

    def __init__(self, batches: list[Any] | None, loss_fn: LossFn, device: torch.device,
                 bleu: BleuFn | None = None) -> None:
        self.batches = batches
        self.loss_fn = loss_fn
        self.device = device
        self.bleu = bleu

    @torch.no_grad()
    def __call__(self, model: Transformer) -> dict[str, float]:
        if not self.batches:
            return {}
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            model.eval()
            result = self._losses(model, self.batches)
            if self.bleu is not None:
                bleu = self.bleu(model)
                if bleu is not None:
                    result["valid_bleu"] = bleu
            model.train()
        return result

    def _losses(self, model: nn.Module, batches: list[Any]) -> dict[str, float]:
        loss_sum = nll_sum = 0.0
        tokens = 0
        for batch in batches:
            batch = batch.to(self.device)
            loss, nll = self.loss_fn(model, batch)
            loss_sum += float(loss)
            nll_sum += float(nll)
            tokens += int(batch.n_tgt_tokens)
        result = {"valid_loss": loss_sum / max(tokens, 1), "valid_nll": nll_sum / max(tokens, 1)}
        result["valid_ppl"] = perplexity(result["valid_nll"])
        return result


def is_better(metric: str, metrics: dict[str, float], best: dict[str, Any] | None) -> bool:
    """Whether ``metrics`` improve on ``best`` (``{"value": ...}``, None: nothing yet) in ``metric``."""
    if metric not in metrics:
        return False
    if best is None:
        return True
    value, best_value = metrics[metric], best["value"]
    return value > best_value if metric in HIGHER_IS_BETTER else value < best_value


def record_validation(state: TrainerState, metric: str, metrics: dict[str, float], step: int) -> bool:
    """Note the validation of ``step`` in ``state`` (``last_valid``; ``best`` if ``metrics``
    improve on it in ``metric``, else one more of ``validations_since_best``); whether they
    did. A validation without ``metric`` (BLEU that could not be computed) counts for neither."""
    state.last_valid = {"step": step, **metrics}
    better = is_better(metric, metrics, state.best)
    if better:
        state.best = {"metric": metric, "value": metrics[metric], "step": step}
        state.validations_since_best = 0
    elif metric in metrics:
        state.validations_since_best += 1
    return better
