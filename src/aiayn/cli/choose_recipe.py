"""`aiayn choose-recipe`: the variant of a time-budgeted recipe this machine runs best,
from a few training updates timed here (aiayn.recipes.budget_fit)."""

from __future__ import annotations

import argparse
import json
import sys

from aiayn import fileio
from aiayn.cli import options

EPILOG = """\
examples
  aiayn choose-recipe --config configs/multi30k_en_de.yaml --variants configs/variants/multi30k.yaml \\
      --threads 1 data.prepared_dir=data-bin/multi30k.en-de
  aiayn choose-recipe ... --json runs/multi30k.en-de/recipe.json

Times a few training updates of the config as written (its batches, model and precision, on
--threads threads: give each training process's share), projects the updates over
train.max_time_minutes, and takes the first variant of the variants file whose min_updates that
meets. Prints the chosen variant's overrides on stdout, one per line, to pass to `aiayn train`
(before your own, which win); the choice and its reason on stderr. A run bounded by
train.max_steps gets the first variant without a measurement; --previous repeats an earlier
choice (a run that resumes keeps its model).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "choose-recipe", help="choose the variant of a time-budgeted recipe from this machine's training speed",
        description="Time a few training updates of a config and choose, from a variants file, the "
                    "variant that reaches the best score in the config's time budget on this machine.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE", required=True, help="experiment YAML (configs/*.yaml)")
    p.add_argument("--variants", metavar="FILE", required=True,
                   help="YAML list of variants: name, min_updates, overrides (configs/variants/multi30k.yaml)")
    p.add_argument("--json", metavar="FILE", help="also write the choice, its measurement and reason as JSON")
    p.add_argument("--previous", metavar="FILE",
                   help="a --json file of an earlier choice: its variant again, unmeasured (a resumed run)")
    options.add_threads(p)
    p.add_argument("overrides", nargs="*", metavar="section.key=value",
                   help="config overrides, as given to `aiayn train`")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from aiayn.config import load_config
    from aiayn.recipes.budget_fit import (
        check_variants,
        choose_variant,
        load_variants,
        measure_update_rate,
        previous_choice,
    )
    from aiayn.runtime.cpu import cpu_kind

    cfg = load_config(args.config, list(args.overrides))
    variants = load_variants(args.variants)
    check_variants(cfg, variants, args.variants, args.overrides)
    if args.json:
        fileio.check_not_input(args.json, [args.config, args.variants, cfg.data.prepared_dir], "--json")
    if args.previous:
        choice = previous_choice(args.previous, variants, cfg)
    else:
        choice = choose_variant(variants, cfg, measure_update_rate, machine=cpu_kind())
    machine = f"; {choice.machine}" if choice.machine else ""
    print(f"recipe: {choice.variant.name} ({choice.reason}{machine})", file=sys.stderr)
    for override in choice.variant.overrides:
        print(override)
    if args.json:
        fileio.write_atomic(args.json, json.dumps(choice.to_dict(), indent=1) + "\n")
    return 0
