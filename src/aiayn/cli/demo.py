"""`aiayn demo`: train, translate and show attention on a built-in task in a few minutes."""

from __future__ import annotations

import argparse

from aiayn.cli import options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train a small Transformer on a built-in task, translate, show attention",
                       description="Trains a small Transformer on the built-in 'reverse' task (no data, no "
                                   "network), translates held-out sequences with beam search, reports "
                                   "exact-match accuracy and writes an attention heatmap PNG. With "
                                   "--dataset multi30k, the same flow on real data, scored with sacreBLEU.")
    p.add_argument("--out", default="runs/demo", help="run directory (default: runs/demo)")
    p.add_argument("--task", default="reverse", choices=["copy", "reverse", "sort", "toy"],
                   help="built-in synthetic task (default: reverse)")
    p.add_argument("--dataset", default=None, help="'multi30k' to run on real data")
    p.add_argument("--data-dir", default=None,
                   help="mirror folder holding the corpus (else $AIAYN_DATA_MIRROR, else download)")
    options.add_threads(p)
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from aiayn import fileio
    from aiayn.recipes.demo import run_demo

    with fileio.output_lock(args.out, flag="--out "):
        run_demo(args.out, dataset=args.dataset, data_dir=args.data_dir, task=args.task,
                 overrides=args.overrides, echo=print, threads=args.threads)
    return 0
