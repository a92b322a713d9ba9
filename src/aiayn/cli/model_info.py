"""`aiayn model-info`: parameter count and breakdown of a preset (plus overrides)."""

from __future__ import annotations

import argparse
import json

from aiayn.config import Config, apply_overrides, model_preset
from aiayn.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model-info", help="parameter count of a model configuration")
    p.add_argument("--preset", default="base", help="base | big | tiny (default: base)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="shared vocabulary size (sets src and tgt)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("overrides", nargs="*", metavar="model.KEY=VALUE",
                   help="config overrides, e.g. model.n_heads=16")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from aiayn.model import build_model, count_parameters

    overrides = list(args.overrides)
    for item in overrides:
        if not item.startswith("model."):
            raise ConfigError(f"override {item!r}: model-info only takes model.* overrides")
    if args.vocab_size is not None:
        overrides = [f"model.src_vocab_size={args.vocab_size}",
                     f"model.tgt_vocab_size={args.vocab_size}", *overrides]
    cfg = apply_overrides(Config(model=model_preset(args.preset)), overrides).model
    with torch.device("meta"):  # count without allocating (big has ~200M parameters)
        model = build_model(cfg)
    counts = count_parameters(model)
    if args.json:
        print(json.dumps({**counts, "preset": args.preset, "model": vars(cfg)}, indent=2))
    else:
        print(f"preset {args.preset}: {counts['parameters']:,} parameters")
        for part in ("embeddings", "encoder", "decoder"):
            print(f"  {part:<10} {counts[part]:>14,}")
    return 0
