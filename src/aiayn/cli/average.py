"""`aiayn average`: average the parameters of the last N checkpoints (paper section 6.1)."""

from __future__ import annotations

import argparse
from pathlib import Path

from aiayn import fileio
from aiayn.errors import CheckpointError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "average", help="average checkpoints into one (last 5 for base, last 20 for big)",
        description="Average the parameters of checkpoints into a new, normal checkpoint. "
                    "Give a run directory with --last N, or checkpoint directories.")
    p.add_argument("inputs", nargs="+", metavar="PATH",
                   help="a run directory (with --last), or checkpoint directories")
    p.add_argument("--last", type=int, default=None, metavar="N",
                   help="average the newest N periodic checkpoints (step_*) of the run directory; "
                        "a checkpoint saved only as the best (best_step_*) is not counted")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output checkpoint directory (new or empty; never one that holds an input)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with fileio.output_lock(args.out, flag="--out "):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from aiayn.checkpoint.average import average_checkpoints, last_checkpoints

    if args.last is not None:
        if len(args.inputs) != 1:
            raise CheckpointError("--last N takes exactly one run directory")
        paths: list[str | Path] = list(last_checkpoints(args.inputs[0], args.last))
    else:
        if len(args.inputs) < 2:
            raise CheckpointError(f"{args.inputs[0]}: give --last N with a run directory, or two "
                                  "or more checkpoint directories")
        paths = list(args.inputs)
    fileio.check_not_inside(args.out, [args.inputs[0], *paths] if args.last is not None else paths)
    fileio.check_empty_dir(args.out, args.force)
    out = average_checkpoints(paths, args.out)
    print(f"averaged {len(paths)} checkpoints -> {out}")
    for p in paths:
        print(f"  {p}")
    return 0
