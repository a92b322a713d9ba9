"""d_k and d_v set on their own (Table 3 row (B)): config validation, the built shapes, and
checkpoints written before the fields existed (no d_k / d_v in config.yaml) loading unchanged."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
import yaml

from aiayn.checkpoint.directory import load_checkpoint, save_checkpoint
from aiayn.config import Config, ModelConfig, config_from_dict, model_preset, to_dict
from aiayn.errors import ConfigError
from aiayn.model import build_model


def test_defaults_follow_d_head_then_d_model_over_heads() -> None:
    base = ModelConfig()
    assert (base.d_k, base.d_v, base.key_dim, base.value_dim, base.head_dim) == (None, None, 64, 64, 64)
    shared = ModelConfig(d_head=32)
    assert (shared.key_dim, shared.value_dim) == (32, 32)
    row_b = ModelConfig(d_k=16, d_v=64)
    assert (row_b.key_dim, row_b.value_dim, row_b.head_dim) == (16, 64, 16)
    assert (ModelConfig(d_head=32, d_k=16).key_dim, ModelConfig(d_head=32, d_k=16).value_dim) == (16, 32)
    # Both given: d_model need not be a multiple of n_heads.
    ModelConfig(d_model=100, n_heads=3, d_k=20, d_v=30).validate()


@pytest.mark.parametrize("field, value", [("d_k", 0), ("d_v", -4), ("d_k", 16.0), ("d_v", True)])
def test_head_sizes_must_be_positive_integers(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"model.{field}: must be a positive integer"):
        ModelConfig(**{field: value}).validate()


@pytest.mark.parametrize("overrides", [{"d_k": "16"}, {"d_v": 2.5}])
def test_head_sizes_from_yaml_are_checked(overrides: dict) -> None:
    with pytest.raises(ConfigError, match="model.d_"):
        config_from_dict({"model": overrides})


def test_one_default_head_size_still_needs_divisible_d_model() -> None:
    with pytest.raises(ConfigError, match="model.n_heads: d_model=100 is not divisible by n_heads=3"):
        ModelConfig(d_model=100, n_heads=3, d_k=20).validate()


def test_projection_shapes_for_row_b() -> None:
    model = build_model(model_preset("tiny", d_k=4, d_v=16))  # tiny: d_model 64, 4 heads
    for attn in (model.encoder_layers[0].self_attn, model.decoder_layers[0].cross_attn):
        assert attn.w_q.weight.shape == attn.w_k.weight.shape == (16, 64)
        assert attn.w_v.weight.shape == (64, 64) and attn.w_o.weight.shape == (64, 64)
    model = build_model(model_preset("tiny", d_k=16, d_v=8))
    assert model.decoder_layers[1].self_attn.w_v.weight.shape == (32, 64)
    assert model.decoder_layers[1].self_attn.w_o.weight.shape == (64, 32)


def _old_config_dict() -> dict:
    data = to_dict(Config(model=model_preset("tiny")))
    del data["model"]["d_k"], data["model"]["d_v"]
    return data


def test_config_without_the_fields_builds_the_same_model() -> None:
    cfg = config_from_dict(_old_config_dict()).model
    assert (cfg.d_k, cfg.d_v) == (None, None)
    torch.manual_seed(0)
    old = build_model(cfg)
    torch.manual_seed(0)
    new = build_model(model_preset("tiny"))
    shapes = {k: tuple(v.shape) for k, v in old.state_dict().items()}
    assert shapes == {k: tuple(v.shape) for k, v in new.state_dict().items()}
    assert shapes["encoder_layers.0.self_attn.w_v.weight"] == (64, 64)
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values()))


def test_checkpoint_written_before_the_fields_loads_unchanged(tmp_path: Path) -> None:
    """A checkpoint whose config.yaml has no d_k / d_v lines (as every checkpoint written
    before they existed) loads with d_k = d_v = d_model / n_heads and computes the same."""
    torch.manual_seed(0)
    cfg = Config(model=model_preset("tiny"))
    model = build_model(cfg.model).eval()
    ckpt = save_checkpoint(tmp_path / "ckpt", model, cfg)
    config = ckpt / "config.yaml"
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    del data["model"]["d_k"], data["model"]["d_v"]
    old = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    assert "d_k" not in old and "d_head" in old
    config.write_text(old, encoding="utf-8")
    manifest = ckpt / "checksums.sha256"
    digest = hashlib.sha256(old.encode("utf-8")).hexdigest()
    manifest.write_text("".join(f"{digest}  config.yaml\n" if line.endswith("  config.yaml") else line + "\n"
                                for line in manifest.read_text(encoding="utf-8").splitlines()), encoding="utf-8")
    loaded = load_checkpoint(ckpt)
    assert (loaded.config.model.d_k, loaded.config.model.d_v) == (None, None)
    src, tgt = torch.randint(4, 60, (2, 7)), torch.randint(4, 60, (2, 5))
    with torch.no_grad():
        assert torch.equal(loaded.model.eval()(src, tgt), model(src, tgt))
