"""`aiayn model-info`: parameter count and breakdown of a preset (plus overrides), or, with
``--table3``, of every row of the paper's Table 3 next to the paper's figure."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from typing import Any

from aiayn.config import Config, ModelConfig, apply_overrides, model_preset
from aiayn.errors import ConfigError

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


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model-info", help="parameter count of a model configuration")
    p.add_argument("--preset", default="base", help="base | big | tiny (default: base)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help=f"shared vocabulary size (sets src and tgt; --table3: default {TABLE3_VOCAB:,})")
    p.add_argument("--table3", action="store_true",
                   help="every row of the paper's Table 3 with its count and the paper's figure")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("overrides", nargs="*", metavar="model.KEY=VALUE",
                   help="config overrides, e.g. model.n_heads=16")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.table3:
        if args.overrides:
            raise ConfigError("--table3 takes no model.* overrides (only --vocab-size)")
        rows = table3(args.vocab_size or TABLE3_VOCAB)
        print(json.dumps(rows, indent=2) if args.json else "\n".join(format_table3(rows)))
        return 0
    overrides = list(args.overrides)
    for item in overrides:
        if not item.startswith("model."):
            raise ConfigError(f"override {item!r}: model-info only takes model.* overrides")
    if args.vocab_size is not None:
        overrides = [f"model.src_vocab_size={args.vocab_size}",
                     f"model.tgt_vocab_size={args.vocab_size}", *overrides]
    cfg = apply_overrides(Config(model=model_preset(args.preset)), overrides).model
    counts = _counts(cfg)
    if args.json:
        print(json.dumps({**counts, "preset": args.preset, "model": vars(cfg)}, indent=2))
    else:
        print(f"preset {args.preset}: {counts['parameters']:,} parameters")
        for part in ("embeddings", "encoder", "decoder"):
            print(f"  {part:<10} {counts[part]:>14,}")
    return 0


def _counts(cfg: ModelConfig) -> dict[str, int]:
    import torch

    from aiayn.model import build_model, count_parameters

    with torch.device("meta"):  # count without allocating (big has ~200M parameters)
        return count_parameters(build_model(cfg))


# ------------------------------------------------------------------------ Table 3


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
        params = _counts(cfg)["parameters"]
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


def format_table3(rows: list[dict[str, Any]]) -> list[str]:
    """One line per row, between a header and a summary of which vocabularies fit."""
    vocab = rows[0]["vocab_size"]
    lines = [f"Table 3 parameter counts: shared {vocab:,}-piece vocabulary, one matrix for both "
             "embeddings and the pre-softmax projection; count built from the config",
             f"{'row':<5}{'N':>3}{'d_model':>8}{'d_ff':>6}{'h':>4}{'d_k':>5}{'d_v':>5}{'P_drop':>7}"
             f"{'eps_ls':>7}  {'positions':<11}{'parameters':>13}{'M':>7}{'paper':>6}  status"]
    for r in rows:
        lines.append(f"{r['row']:<5}{r['N']:>3}{r['d_model']:>8}{r['d_ff']:>6}{r['h']:>4}{r['d_k']:>5}"
                     f"{r['d_v']:>5}{r['P_drop']:>7g}{r['eps_ls']:>7g}  {r['positions']:<11}"
                     f"{r['parameters']:>13,}{r['parameters'] / 1e6:>7.1f}"
                     f"{'-' if r['paper_m'] is None else r['paper_m']:>6}  {_status(r)}")
    return lines + _summary(rows)


def _status(r: dict[str, Any]) -> str:
    if r["paper_m"] is None:
        return r["note"]
    lo, hi = r["vocab_range"]
    verdict = "match" if r["matches"] else "DIFFERS"
    return f"{verdict} (V {lo:,}..{hi:,} gives {r['paper_m']}M)"


def _summary(rows: list[dict[str, Any]]) -> list[str]:
    ranges = [(r["row"], r["vocab_range"]) for r in rows if r["vocab_range"] is not None]
    lo, hi = max(v[0] for _, v in ranges), min(v[1] for _, v in ranges)
    if lo <= hi:
        return [f"every printed figure matches for a shared vocabulary of {lo:,}..{hi:,}"]
    fits = [(n, v) for n, v in ranges if v[0] <= rows[0]["vocab_size"] <= v[1]]
    odd = "; ".join(f"{n} needs {v[0]:,}..{v[1]:,}" for n, v in ranges if (n, v) not in fits)
    if not fits:
        return [f"no one vocabulary matches every printed figure: {odd}"]
    lo, hi = max(v[0] for _, v in fits), min(v[1] for _, v in fits)
    return [f"no one vocabulary matches every printed figure: {', '.join(n for n, _ in fits)} "
            f"match for {lo:,}..{hi:,}; {odd}"]
