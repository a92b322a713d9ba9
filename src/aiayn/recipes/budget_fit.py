"""Which variant of a time-budgeted recipe fits this machine: measured, then chosen.

A recipe trained for a fixed time (``train.max_time_minutes``) reaches its score only where the
machine makes enough updates in that time. Its variants file lists, from the heaviest, the
variants to run and the updates each needs::

    variants:
      - name: as written
        min_updates: 3000
        overrides: []
      - name: light
        min_updates: 0
        overrides: [model.d_ff=512, train.warmup_steps=200]

:func:`measure_update_rate` times a few training updates of the config as written, on the
recipe's own batches and threads; :func:`choose_variant` projects the updates over the budget
and takes the first variant whose ``min_updates`` that meets. A run bounded by
``train.max_steps`` gets the first variant: its length does not depend on the machine.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from aiayn.config import Config, apply_overrides
from aiayn.config.coercion import short_repr
from aiayn.errors import ConfigError

log = logging.getLogger(__name__)

PROBE_WARMUP = 2  # updates not timed: the allocator's and the kernels' first calls
PROBE_UPDATES = 8  # updates timed


@dataclass(frozen=True)
class RecipeVariant:
    """One variant: config overrides (``section.key=value``) and the projected updates per
    training process it needs to be the one chosen."""

    name: str
    min_updates: int
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class UpdateRate:
    """What the probe measured: updates per second and target tokens per update."""

    updates_per_s: float
    tokens_per_update: float


@dataclass(frozen=True)
class RecipeChoice:
    """The chosen variant, the measurement and the projection behind it, and why, in words."""

    variant: RecipeVariant
    reason: str
    budget_minutes: float
    rate: UpdateRate | None = None
    projected_updates: int | None = None
    machine: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["variant"]["overrides"] = list(self.variant.overrides)
        return out


def load_variants(path: str | Path) -> list[RecipeVariant]:
    """The variants of a YAML file; a malformed one is a :class:`ConfigError` naming the file
    and the entry. The last variant must accept any machine (``min_updates: 0``)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: variants file not found") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read the variants: {short_repr(str(exc))}") from None
    entries = data.get("variants") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: expected a mapping with a non-empty 'variants' list")
    variants = [_variant(entry, f"{path}: variants[{i}]") for i, entry in enumerate(entries)]
    if variants[-1].min_updates != 0:
        raise ConfigError(f"{path}: variants[{len(variants) - 1}].min_updates: the last variant must be 0 "
                          "(the one every machine can run)")
    return variants


def _variant(entry: Any, where: str) -> RecipeVariant:
    if not isinstance(entry, dict) or set(entry) != {"name", "min_updates", "overrides"}:
        raise ConfigError(f"{where}: expected exactly the keys name, min_updates, overrides")
    name, min_updates, overrides = entry["name"], entry["min_updates"], entry["overrides"]
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}.name: expected a non-empty string")
    if isinstance(min_updates, bool) or not isinstance(min_updates, int) or min_updates < 0:
        raise ConfigError(f"{where}.min_updates: expected a whole number >= 0, got {short_repr(min_updates)}")
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"{where}.overrides: expected a list of section.key=value strings")
    return RecipeVariant(name.strip(), min_updates, tuple(overrides))


def check_variants(cfg: Config, variants: list[RecipeVariant], where: str,
                   caller_overrides: Sequence[str] = ()) -> None:
    """Every variant's overrides applied to ``cfg``, then the caller's (which win, as in
    training), give a valid config (checked before any probe or training starts)."""
    for i, variant in enumerate(variants):
        try:
            apply_overrides(cfg, [*variant.overrides, *caller_overrides])
        except ConfigError as exc:
            raise ConfigError(f"{where}: variants[{i}] ({variant.name}): {exc}") from None


def choose_variant(variants: list[RecipeVariant], cfg: Config,
                   measure: Callable[[Config], UpdateRate], machine: str = "") -> RecipeChoice:
    """The first variant whose ``min_updates`` the config's projected updates meet; the
    first one, unmeasured, where ``train.max_steps`` bounds the run or no time budget is set."""
    train = cfg.train
    budget = float(train.max_time_minutes)
    if train.max_steps or budget <= 0:
        return RecipeChoice(variants[0], "train.max_steps bounds the run (not time): the recipe's first variant",
                            budget, machine=machine)
    rate = measure(cfg)
    projected = int(round(rate.updates_per_s * budget * 60, 6))  # not 1,999 for 2,000 in floats
    variant = next(v for v in variants if projected >= v.min_updates)
    needed = f"needs >= {variant.min_updates:,}" if variant.min_updates else "runs on any machine"
    heavier = [v for v in variants if v.min_updates > projected]
    short = f"; {heavier[-1].name} needs >= {heavier[-1].min_updates:,}" if heavier else ""
    reason = (f"{rate.updates_per_s:.3f} updates/s ({rate.tokens_per_update:,.0f} target tokens each) measured: "
              f"~{projected:,} updates in {budget:g} min; {variant.name} {needed}{short}")
    return RecipeChoice(variant, reason, budget, rate, projected, machine)


def previous_choice(path: str | Path, variants: list[RecipeVariant], cfg: Config) -> RecipeChoice:
    """The variant an earlier choice (the JSON of :meth:`RecipeChoice.to_dict`) named, chosen
    again without a measurement: a resumed run keeps the model it started with."""
    path = Path(path)
    try:
        name = json.loads(path.read_text(encoding="utf-8"))["variant"]["name"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a recipe choice ({short_repr(str(exc))})") from None
    variant = next((v for v in variants if v.name == name), None)
    if variant is None:
        raise ConfigError(f"{path}: variant {short_repr(name)} is not in the variants file "
                          f"({', '.join(v.name for v in variants)})")
    return RecipeChoice(variant, f"chosen before ({path}): kept, as the run continues",
                        float(cfg.train.max_time_minutes))


def measure_update_rate(cfg: Config, updates: int = PROBE_UPDATES, warmup: int = PROBE_WARMUP,
                        clock: Callable[[], float] = time.perf_counter) -> UpdateRate:
    """Updates per second of ``cfg`` trained as its run would be (its batches, model,
    precision and this process's threads), from ``updates`` timed updates after ``warmup``."""
    from aiayn.model import build_model
    from aiayn.recipes.train import build_data, match_vocab, seed_everything
    from aiayn.runtime.devices import resolve_device
    from aiayn.training.distributed import DistInfo
    from aiayn.training.trainer import Trainer

    if not cfg.data.prepared_dir:
        raise ConfigError("data.prepared_dir: the probe trains on prepared data (run `aiayn prepare` first)")
    seed_everything(cfg.train.seed)
    data = build_data(cfg, Path(cfg.data.prepared_dir), DistInfo())  # the run's own batches
    cfg = match_vocab(cfg, data.tokenizer)
    batches = iter(data.train)
    trainer = Trainer(cfg, build_model(cfg.model), device=resolve_device(cfg.train.device, field="train.device"))
    for _ in range(warmup):
        trainer.train_step([next(batches)])
    tokens = 0
    start = clock()
    for _ in range(updates):
        tokens += trainer.train_step([next(batches)]).n_tokens
    seconds = max(clock() - start, 1e-9)
    return UpdateRate(updates / seconds, tokens / updates)
