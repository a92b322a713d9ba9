"""The one place that maps a :class:`ModelConfig` to modules."""

from __future__ import annotations

from typing import TypedDict

from torch import nn

from aiayn.config import ModelConfig
from aiayn.model.embeddings import PositionalEncoding, TokenEmbedding
from aiayn.model.layers import DecoderLayer, EncoderLayer
from aiayn.model.transformer import Transformer


class _LayerArgs(TypedDict):
    """What EncoderLayer and DecoderLayer take, both built from the same config."""

    d_model: int
    n_heads: int
    d_k: int
    d_v: int
    d_ff: int
    dropout: float
    attention_dropout: float
    activation_dropout: float
    activation: str
    norm: str
    eps: float


def build_model(cfg: ModelConfig) -> Transformer:
    cfg.validate()
    d = cfg.d_model
    tgt_embed = TokenEmbedding(cfg.tgt_vocab_size, d, cfg.pad_id)
    src_embed = tgt_embed if cfg.share_embeddings == "all" else TokenEmbedding(
        cfg.src_vocab_size, d, cfg.pad_id)

    def positions() -> PositionalEncoding:
        return PositionalEncoding(d, cfg.max_positions, cfg.positions, cfg.sinusoid_layout,
                                  cfg.dropout)

    layer_args = _LayerArgs(
        d_model=d, n_heads=cfg.n_heads, d_k=cfg.key_dim, d_v=cfg.value_dim, d_ff=cfg.d_ff,
        dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
        activation_dropout=cfg.activation_dropout, activation=cfg.activation,
        norm=cfg.norm, eps=cfg.layer_norm_eps,
    )
    pre = cfg.norm == "pre"
    output_projection = None
    if cfg.share_embeddings == "none":
        output_projection = nn.Linear(d, cfg.tgt_vocab_size, bias=False)
        nn.init.normal_(output_projection.weight, mean=0.0, std=d**-0.5)
    return Transformer(
        src_embed=src_embed,
        tgt_embed=tgt_embed,
        src_positions=positions(),
        tgt_positions=positions(),
        encoder_layers=[EncoderLayer(**layer_args) for _ in range(cfg.n_encoder_layers)],
        decoder_layers=[DecoderLayer(**layer_args) for _ in range(cfg.n_decoder_layers)],
        encoder_norm=nn.LayerNorm(d, eps=cfg.layer_norm_eps) if pre else None,
        decoder_norm=nn.LayerNorm(d, eps=cfg.layer_norm_eps) if pre else None,
        output_projection=output_projection,
        output_bias=cfg.output_bias,
    )
