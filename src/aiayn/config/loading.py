"""Experiment files: YAML in and out, model presets and ``section.field=value`` overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from aiayn.config.coercion import from_dict, short_repr, to_dict
from aiayn.config.sections import MODEL_PRESETS, Config
from aiayn.errors import ConfigError


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply ``section.field=value`` strings; values are parsed as YAML scalars."""
    data = to_dict(cfg)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected section.field=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if len(parts) != 2 or parts[0] not in data:
            raise ConfigError(
                f"override {item!r}: expected one of {', '.join(data)} followed by .field"
            )
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: cannot parse value: {exc}") from None
        data[parts[0]][parts[1]] = value
    return config_from_dict(data)


def config_from_dict(data: dict[str, Any], where: str = "") -> Config:
    """A validated :class:`Config` from a mapping; a ``model.preset`` key selects a preset."""
    data = dict(data or {})
    model = dict(data.get("model") or {})
    preset = model.pop("preset", None)
    if preset is not None:
        if preset not in MODEL_PRESETS:
            raise ConfigError(f"{where}model.preset: unknown preset {short_repr(preset)}; "
                              f"choose from {sorted(MODEL_PRESETS)}")
        model = {**MODEL_PRESETS[preset], **model}
    data["model"] = model
    try:
        cfg = from_dict(Config, data)
        cfg.validate()
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load a YAML experiment file, then apply dotted overrides."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc})") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with model/data/train/decode sections")
    cfg = config_from_dict(data or {}, where=f"{path}: ")
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    return cfg


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(dump_config(cfg), encoding="utf-8")


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None)
