"""Config: presets, YAML round trip, overrides, and one test per validation error."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.config import (
    Config,
    DecodeConfig,
    DecodeOption,
    apply_overrides,
    config_from_dict,
    decode_options,
    dump_config,
    load_config,
    model_preset,
    save_config,
    to_dict,
)
from aiayn.errors import ConfigError


def test_presets_match_paper_table() -> None:
    base, big = model_preset("base"), model_preset("big")
    assert (base.n_encoder_layers, base.d_model, base.d_ff, base.n_heads, base.head_dim, base.dropout) == (
        6, 512, 2048, 8, 64, 0.1)
    assert (big.n_encoder_layers, big.d_model, big.d_ff, big.n_heads, big.head_dim, big.dropout) == (
        6, 1024, 4096, 16, 64, 0.3)
    assert base.norm == "post" and base.positions == "sinusoidal" and base.share_embeddings == "all"
    assert base.sinusoid_layout == "interleaved"


def test_paper_defaults_in_train_and_decode() -> None:
    cfg = Config()
    assert cfg.train.adam_betas == (0.9, 0.98) and cfg.train.adam_eps == 1e-9
    assert cfg.train.warmup_steps == 4000 and cfg.train.label_smoothing == 0.1
    assert (cfg.decode.beam, cfg.decode.lenpen, cfg.decode.max_len_a, cfg.decode.max_len_b) == (4, 0.6, 1.0, 50)


def test_watching_defaults_and_round_trip(tmp_path: Path) -> None:
    """metrics.jsonl only, no early stopping; a list of loggers survives config.yaml."""
    train = Config().train
    assert (train.loggers, train.patience, train.tensorboard) == (("jsonl",), 0, False)
    assert (train.wandb_project, train.wandb_run_name) == ("aiayn", None)
    cfg = apply_overrides(Config(), ["train.loggers=[jsonl, tensorboard, wandb]", "train.patience=5",
                                     "train.wandb_run_name=base-1"])
    save_config(cfg, tmp_path / "c.yaml")
    again = load_config(tmp_path / "c.yaml")
    assert again.train.loggers == ("jsonl", "tensorboard", "wandb") and again.train.patience == 5
    assert again.train.wandb_run_name == "base-1"


def test_yaml_round_trip(tmp_path: Path) -> None:
    cfg = apply_overrides(Config(), ["model.n_heads=16", "model.d_head=32", "train.adam_betas=[0.9, 0.997]",
                                     "data.dataset=multi30k", "model.positions=learned"])
    path = tmp_path / "c.yaml"
    save_config(cfg, path)
    again = load_config(path)
    assert again == cfg
    assert dump_config(again) == dump_config(cfg)
    assert again.train.adam_betas == (0.9, 0.997)


def test_preset_key_in_yaml(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  preset: big\n  dropout: 0.1\n")
    cfg = load_config(path, ["model.n_encoder_layers=4"])
    assert cfg.model.d_model == 1024 and cfg.model.dropout == 0.1 and cfg.model.n_encoder_layers == 4


def test_overrides_typed() -> None:
    cfg = apply_overrides(Config(), ["train.max_steps=10", "train.lr=1e-3", "model.output_bias=true",
                                     "model.d_head=null"])
    assert cfg.train.max_steps == 10 and cfg.train.lr == pytest.approx(1e-3)
    assert cfg.model.output_bias is True and cfg.model.d_head is None


@pytest.mark.parametrize("override, field", [
    ("model.n_heads=7", "model.n_heads"),            # d_model not divisible by heads
    ("model.dropout=-0.1", "model.dropout"),          # negative dropout
    ("model.attention_dropout=1.0", "model.attention_dropout"),
    ("model.activation=tanh", "model.activation"),
    ("model.positions=rotary", "model.positions"),
    ("model.sinusoid_layout=shuffled", "model.sinusoid_layout"),
    ("model.norm=sandwich", "model.norm"),
    ("model.share_embeddings=some", "model.share_embeddings"),
    ("model.d_model=0", "model.d_model"),
    ("model.n_decoder_layers=0", "model.n_decoder_layers"),
    ("model.d_head=-2", "model.d_head"),
    ("model.pad_id=40000", "model.pad_id"),
    ("model.tgt_vocab_size=100", "model.share_embeddings"),   # 'all' needs one vocabulary
    ("model.d_model=abc", "model.d_model"),           # wrong type
    ("model.n_head=8", "model.n_head"),               # unknown key
    ("train.dtype=fp8", "train.dtype"),
    ("train.label_smoothing=1.5", "train.label_smoothing"),
    ("train.max_tokens=0", "train.max_tokens"),
    ("train.adam_betas=[0.9]", "train.adam_betas"),
    ("train.lr_schedule=polynomial", "train.lr_schedule"),
    ("train.loggers=[jsonl, mlflow]", "train.loggers"),
    ("train.loggers=wandb", "train.loggers"),           # a list, not a name
    ("train.patience=-1", "train.patience"),
    ("train.wandb_project=''", "train.wandb_project"),
    ("decode.beam=0", "decode.beam"),
    ("decode.nbest=5", "decode.nbest"),
    ("decode.lenpen_style=marian", "decode.lenpen_style"),
    ("data.on_invalid_utf8=ignore", "data.on_invalid_utf8"),
    ("data.vocab_size=2", "data.vocab_size"),
    ("data.subword_alpha_src=1.5", "data.subword_alpha_src"),
    ("data.parsing_subtrees=-1", "data.parsing_subtrees"),
    ("data.parsing_substitutions=-1", "data.parsing_substitutions"),
    ("data.parsing_substitution_rate=0", "data.parsing_substitution_rate"),
    ("data.subword_alpha_tgt=-0.1", "data.subword_alpha_tgt"),
    ("data.subword_nbest=1", "data.subword_nbest"),
    ("data.subword_nbest=513", "data.subword_nbest"),
])
def test_validation_errors_name_the_field(override: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        apply_overrides(Config(), [override])


def test_unknown_key_suggests(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  n_head: 8\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: model\.n_head: unknown field \(did you mean 'n_heads'\?\)"):
        load_config(path)


def test_unknown_section_and_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("modle:\n  d_model: 8\n")
    with pytest.raises(ConfigError, match="modle: unknown field"):
        load_config(path)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    path.write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="section.field=value"):
        apply_overrides(Config(), ["train.max_steps"])


def test_explicit_head_dim_allows_any_heads() -> None:
    cfg = apply_overrides(Config(), ["model.n_heads=7", "model.d_head=32"])
    assert cfg.model.head_dim == 32


def test_every_decode_field_declares_its_option() -> None:
    """DecodeConfig is the one declaration of the decoding options: each field says how the
    command lines and the HTTP API show it."""
    names = [f.name for f, _ in decode_options()]
    assert names == list(Config().decode.__dataclass_fields__)
    for f, opt in decode_options():
        assert isinstance(opt, DecodeOption) and opt.help, f.name
        if opt.http is not None and opt.http.ge is not None and opt.http.le is not None:
            assert opt.http.ge <= getattr(DecodeConfig(), f.name) <= opt.http.le, f.name
    positions = [opt.http.position for _, opt in decode_options() if opt.http is not None]
    assert len(set(positions)) == len(positions)
    # Only nbest is a per-call argument (translate_detailed(nbest=...)), not an override.
    assert [f.name for f, opt in decode_options() if opt.argument] == ["nbest"]


def test_decode_with_overrides() -> None:
    base = DecodeConfig(beam=5, lenpen=1.0)
    cfg = base.with_overrides(beam=2, lenpen=None, nbest=2)
    assert (cfg.beam, cfg.lenpen, cfg.nbest) == (2, 1.0, 2)  # None keeps the value
    assert (base.beam, base.nbest) == (5, 1)  # a copy
    assert base.with_overrides() == base and base.with_overrides() is not base
    with pytest.raises(ConfigError, match=r"^decode\.beem: unknown decoding option; choose from .*beam"):
        base.with_overrides(beem=3)
    with pytest.raises(ConfigError, match=r"decode\.nbest: must be between 1 and beam=2"):
        base.with_overrides(beam=2, nbest=3)
    with pytest.raises(ConfigError, match=r"decode\.lenpen_style: 'x' is not one of gnmt, fairseq"):
        base.with_overrides(lenpen_style="x")


@pytest.mark.parametrize("section, field, value", [
    ("decode", "lenpen", float("nan")), ("decode", "max_len_a", float("inf")),
    ("train", "lr", float("nan")), ("model", "dropout", float("-inf")),
])
def test_non_finite_numbers_are_refused(section: str, field: str, value: float) -> None:
    """Regression: `--lenpen nan` was accepted and decoded silently."""
    cfg = Config()
    setattr(getattr(cfg, section), field, value)
    with pytest.raises(ConfigError, match=rf"^{section}\.{field}: must be a finite number"):
        cfg.validate()
    with pytest.raises(ConfigError, match=rf"^{section}\.{field}: must be a finite number"):
        apply_overrides(Config(), [f"{section}.{field}=.nan"] if value != value else [f"{section}.{field}={value}"])


def test_subword_sampling_fields() -> None:
    """Off by default; on as soon as either side's alpha is above 0; a YAML round trip keeps it."""
    assert not Config().data.subword_sampling and Config().data.subword_nbest == 64
    cfg = apply_overrides(Config(), ["data.subword_alpha_tgt=0.1", "data.subword_nbest=8"])
    assert cfg.data.subword_sampling and (cfg.data.subword_alpha_src, cfg.data.subword_alpha_tgt) == (0.0, 0.1)
    assert config_from_dict(to_dict(cfg)) == cfg


REPO = Path(__file__).resolve().parents[1]


def test_multi30k_de_en_is_en_de_reversed() -> None:
    """configs/multi30k_de_en.yaml: German -> English, otherwise exactly the en-de recipe."""
    de_en = load_config(REPO / "configs" / "multi30k_de_en.yaml")
    en_de = load_config(REPO / "configs" / "multi30k_en_de.yaml")
    assert (de_en.data.dataset, de_en.data.src_lang, de_en.data.tgt_lang) == ("multi30k", "de", "en")
    en_de.data.src_lang, en_de.data.tgt_lang = "de", "en"
    assert de_en == en_de


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_shipped_configs_load_and_keep_their_header_short(name: str) -> None:
    """Each shipped config loads; its header says what it is and how to run it in at most 10
    lines (reasons and figures live in docs/results.md), and no path in it points outside the
    repository: the data come from $AIAYN_DATA_MIRROR or a download."""
    path = REPO / "configs" / name
    load_config(path)
    text = path.read_text(encoding="utf-8")
    header = text[:text.index("\n\n")].splitlines()
    assert all(line.startswith("#") for line in header) and len(header) <= 10
    assert "../" not in text and load_config(path).data.data_dir is None


def test_the_output_bound_is_one_rule():
    """a * |x| + b, truncated: what the search forces EOS after and what the exports copy."""
    import torch

    from aiayn.inference.search import max_output_lengths

    cfg = DecodeConfig(max_len_a=1.3, max_len_b=7)
    assert [cfg.max_output_len(n) for n in (0, 1, 9, 10)] == [7, 8, 18, 20]
    assert DecodeConfig().max_output_len(12) == 62  # the paper's 1 * |x| + 50
    lengths = torch.tensor([0, 1, 9, 10])
    assert max_output_lengths(lengths, cfg, None).tolist() == [7, 8, 18, 20]
    assert max_output_lengths(lengths, cfg, 15).tolist() == [7, 8, 14, 14]  # one position stays for EOS
