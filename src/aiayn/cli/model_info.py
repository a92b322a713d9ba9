"""`aiayn model-info`: parameter count and breakdown of a preset (plus overrides), or, with
``--table3``, of every row of the paper's Table 3 next to the paper's figure (the counts:
:mod:`aiayn.model.parameter_count`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from aiayn.config import Config, apply_overrides, model_preset
from aiayn.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model-info", help="parameter count of a model configuration")
    p.add_argument("--preset", default="base", help="base | big | tiny (default: base)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="shared vocabulary size (sets src and tgt; --table3: by default the one at which "
                        "the base family's figures round to the paper's)")
    p.add_argument("--table3", action="store_true",
                   help="every row of the paper's Table 3 with its count and the paper's figure")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("overrides", nargs="*", metavar="model.KEY=VALUE",
                   help="config overrides, e.g. model.n_heads=16")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from aiayn.model.parameter_count import TABLE3_VOCAB, count_config_parameters, table3

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
    counts = count_config_parameters(cfg)
    if args.json:
        print(json.dumps({**counts, "preset": args.preset, "model": vars(cfg)}, indent=2))
    else:
        print(f"preset {args.preset}: {counts['parameters']:,} parameters")
        for part in ("embeddings", "encoder", "decoder"):
            print(f"  {part:<10} {counts[part]:>14,}")
    return 0


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
