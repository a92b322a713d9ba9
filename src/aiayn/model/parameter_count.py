"""Parameter counts: of a built model, of a configuration without building its weights, and
of every row of the paper's Table 3 next to the paper's "params x10^6" (:func:`table3`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from aiayn.config import ModelConfig, model_preset
from aiayn.model.builder import build_model


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Unique parameters (a shared matrix counts once), total and by part."""
    seen: set[int] = set()
    parts = {"embeddings": 0, "encoder": 0, "decoder": 0}
    for name, p in model.named_parameters():  # named_parameters already skips duplicates
        if id(p) in seen:
            continue
        seen.add(id(p))
        if name.startswith(("encoder_layers", "encoder_norm")):
            parts["encoder"] += p.numel()
        elif name.startswith(("decoder_layers", "decoder_norm")):
            parts["decoder"] += p.numel()
        else:
            parts["embeddings"] += p.numel()
    return {"parameters": sum(parts.values()), **parts}


def count_config_parameters(cfg: ModelConfig) -> dict[str, int]:
    """:func:`count_parameters` of the model ``cfg`` builds, built on the meta device: no
    memory is allocated for the weights (big has about 200M parameters)."""
    with torch.device("meta"):
        return count_parameters(build_model(cfg))


# The one shared vocabulary at which every Table 3 figure of the base family (base, B, C)
# rounds to the paper's: any V in 40,932..41,160 does (`aiayn model-info --table3` prints each
# row's own range). The paper's "about 37,000" gives base 63.1M, not 65M; see docs/architecture.md.
TABLE3_VOCAB = 41_000


@dataclass(frozen=True)
class Table3Row:
    """One row of Table 3: ModelConfig changes from ``base``, eps_ls (a training setting,
    no parameters), the paper's "params x10^6" (None where the paper leaves it blank)."""

    name: str
    model: dict[str, Any] = field(default_factory=dict)
    label_smoothing: float = 0.1
    paper_m: int | None = None
    note: str = ""


_SAME_AS_BASE = "paper blank: h*d_k = h*d_v = d_model, same count as base"
_NO_PARAMS = "paper blank: no parameters change"
TABLE3: tuple[Table3Row, ...] = (
    Table3Row("base", {}, paper_m=65),
    Table3Row("A1", {"n_heads": 1, "d_k": 512, "d_v": 512}, note=_SAME_AS_BASE),
    Table3Row("A2", {"n_heads": 4, "d_k": 128, "d_v": 128}, note=_SAME_AS_BASE),
    Table3Row("A3", {"n_heads": 16, "d_k": 32, "d_v": 32}, note=_SAME_AS_BASE),
    Table3Row("A4", {"n_heads": 32, "d_k": 16, "d_v": 16}, note=_SAME_AS_BASE),
    Table3Row("B1", {"d_k": 16, "d_v": 64}, paper_m=58),
    Table3Row("B2", {"d_k": 32, "d_v": 64}, paper_m=60),
    Table3Row("C1", {"n_encoder_layers": 2, "n_decoder_layers": 2}, paper_m=36),
    Table3Row("C2", {"n_encoder_layers": 4, "n_decoder_layers": 4}, paper_m=50),
    Table3Row("C3", {"n_encoder_layers": 8, "n_decoder_layers": 8}, paper_m=80),
    Table3Row("C4", {"d_model": 256, "d_k": 32, "d_v": 32}, paper_m=28),
    Table3Row("C5", {"d_model": 1024, "d_k": 128, "d_v": 128}, paper_m=168),
    Table3Row("C6", {"d_ff": 1024}, paper_m=53),
    Table3Row("C7", {"d_ff": 4096}, paper_m=90),
    Table3Row("D1", {"dropout": 0.0}, note=_NO_PARAMS),
    Table3Row("D2", {"dropout": 0.2}, note=_NO_PARAMS),
    Table3Row("D3", {}, label_smoothing=0.0, note=_NO_PARAMS),
    Table3Row("D4", {}, label_smoothing=0.2, note=_NO_PARAMS),
    Table3Row("E", {"positions": "learned"},
              note="paper blank: learned positions (instead of sinusoids) add 2 x max_positions x d_model"),
    Table3Row("big", {"d_model": 1024, "d_ff": 4096, "n_heads": 16, "dropout": 0.3}, paper_m=213),
)


def table3_config(row: Table3Row, vocab_size: int) -> ModelConfig:
    """The row's model in the paper's setup: one shared vocabulary, one matrix for both
    embeddings and the pre-softmax projection (section 3.4), no output bias."""
    return model_preset("base", src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, **row.model)


def table3(vocab_size: int) -> list[dict[str, Any]]:
    """Each row's configuration, built parameter count and the paper's figure.

    With one shared vocabulary the count is ``rest + V * d_model``, so each figure the
    paper prints holds for a range of V: ``vocab_range``, the V whose count rounds to it."""
    out = []
    for row in TABLE3:
        cfg = table3_config(row, vocab_size)
        params = count_config_parameters(cfg)["parameters"]
        entry: dict[str, Any] = {
            "row": row.name, "N": cfg.n_encoder_layers, "d_model": cfg.d_model, "d_ff": cfg.d_ff,
            "h": cfg.n_heads, "d_k": cfg.key_dim, "d_v": cfg.value_dim, "P_drop": cfg.dropout,
            "eps_ls": row.label_smoothing, "positions": cfg.positions, "vocab_size": vocab_size,
            "parameters": params, "paper_m": row.paper_m, "note": row.note,
            "matches": None, "vocab_range": None,
        }
        if row.paper_m is not None:
            entry["matches"] = round(params / 1e6) == row.paper_m
            entry["vocab_range"] = _vocab_range(params - vocab_size * cfg.d_model, cfg.d_model, row.paper_m)
        out.append(entry)
    return out


def _vocab_range(rest: int, d_model: int, paper_m: int) -> list[int]:
    """[lo, hi]: the shared vocabularies V with round((rest + V d_model) / 1e6) == paper_m."""
    lo = math.ceil(((paper_m - 0.5) * 1e6 - rest) / d_model)
    hi = math.ceil(((paper_m + 0.5) * 1e6 - rest) / d_model) - 1
    return [lo, hi]
