"""`aiayn train`: train a model from a config file; resumes automatically.

    aiayn train --config configs/tiny_synthetic.yaml [--run-dir DIR] [key=value ...]
    aiayn train --resume RUN_DIR [key=value ...]          # e.g. train.max_steps=200000
    torchrun --nproc_per_node 8 -m aiayn train --config FILE --run-dir DIR
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from aiayn.cli import options
from aiayn.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a model (the paper's recipe by default); resumes automatically",
        description="Train from a YAML config. If the run directory already holds a "
                    "checkpoint, training continues from it exactly where it stopped.")
    p.add_argument("--config", metavar="FILE", help="experiment YAML (configs/*.yaml)")
    p.add_argument("--run-dir", metavar="DIR",
                   help="where checkpoints, metrics.jsonl and logs go (default: runs/<config name>)")
    p.add_argument("--resume", metavar="PATH",
                   help="continue from this run directory or checkpoint (its config is used "
                        "when --config is not given)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"),
                   help="mixed precision: bf16 autocast (CPU/CUDA), fp16 + grad scaler (CUDA)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), help="train.device")
    p.add_argument("--init-from", metavar="CHECKPOINT",
                   help="train.init_from: start from these weights (e.g. an `aiayn import hf` checkpoint)")
    options.add_threads(p)
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved configuration and exit")
    p.add_argument("overrides", nargs="*", metavar="section.key=value",
                   help="config overrides, e.g. train.max_steps=1000 train.save_every=100")
    p.set_defaults(func=run)


def _run_dir_of(resume: Path) -> Path:
    """The run directory a --resume path belongs to."""
    from aiayn.checkpoint.layout import CHECKPOINTS_DIR, MODEL_FILE

    if resume.is_file():  # a last/best pointer
        resume = resume.parent
    if (resume / MODEL_FILE).is_file():  # a checkpoint directory
        resume = resume.parent
    if resume.name == CHECKPOINTS_DIR:
        resume = resume.parent
    return resume


def run(args: argparse.Namespace) -> int:
    from aiayn.checkpoint.directory import resolve_checkpoint
    from aiayn.checkpoint.layout import CONFIG_FILE
    from aiayn.config import apply_overrides, dump_config, load_config

    overrides = list(args.overrides)
    if args.dtype:
        overrides.append(f"train.dtype={args.dtype}")
    if args.device:
        overrides.append(f"train.device={args.device}")
    if args.init_from:
        overrides.append(f"train.init_from={args.init_from}")
    run_dir = Path(args.run_dir) if args.run_dir else None
    if args.config:
        cfg = load_config(args.config, overrides)
    else:
        source = args.resume or (str(run_dir) if run_dir else None)
        if source is None:
            raise ConfigError("give --config FILE (or --resume RUN_DIR to continue a run)")
        ckpt = resolve_checkpoint(source)
        cfg = apply_overrides(load_config(ckpt / CONFIG_FILE), overrides)
    if run_dir is None:
        if args.resume:
            run_dir = _run_dir_of(Path(args.resume))
        else:
            from aiayn.recipes.train import default_run_dir

            run_dir = default_run_dir(args.config)
    if args.print_config:
        print(f"# resolved configuration (run directory: {run_dir})")
        print(dump_config(cfg), end="")
        return 0

    from aiayn.recipes.train import run_training

    summary = run_training(cfg, run_dir, resume=args.resume, threads=args.threads)
    if int(os.environ.get("RANK", "0")) == 0:
        best = summary.get("best") or {}
        line = (f"done ({summary['stop_reason']}): step {summary['step']}, "
                f"checkpoint {summary['last_checkpoint']}")
        if best:
            line += f"; best {best.get('metric')} {best.get('value'):.4f} at step {best.get('step')}"
        print(line, file=sys.stderr)
    return 0
