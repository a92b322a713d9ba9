"""`aiayn train`: train a model from a config file; resumes automatically.

    aiayn train --config configs/tiny_synthetic.yaml [--run-dir DIR] [key=value ...]
    aiayn train --resume RUN_DIR [key=value ...]          # e.g. train.max_steps=200000
    torchrun --nproc_per_node 8 -m aiayn train --config FILE --run-dir DIR
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

from aiayn import fileio
from aiayn.cli import options
from aiayn.errors import ConfigError, EnvironmentFailure

log = logging.getLogger(__name__)


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


def _resume_hint(run_dir: Path) -> str:
    """What a stopped run keeps: its last complete checkpoint, which the same command resumes."""
    pointer = run_dir / "checkpoints" / "last"
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f"; the run keeps its last complete checkpoint ({name}): the same command resumes from it" if name else ""


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

    # What the run reads besides its own directory (which a resumed run reads and writes).
    fileio.check_not_input(run_dir, [cfg.data.prepared_dir, cfg.train.init_from], "--run-dir", directory=True)
    summary = _train(cfg, run_dir, args)
    if int(os.environ.get("RANK", "0")) == 0:
        best = summary.get("best") or {}
        line = (f"done ({summary['stop_reason']}): step {summary['step']}, "
                f"checkpoint {summary['last_checkpoint']}")
        if best:
            line += f"; best {best.get('metric')} {best.get('value'):.4f} at step {best.get('step')}"
        print(line, file=sys.stderr)
    return 0


def _train(cfg: Any, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The run, holding its directory; a full disk or read-only file system in one line."""
    from aiayn.checkpoint.manager import CheckpointManager
    from aiayn.recipes.train import run_training

    main_rank = int(os.environ.get("RANK", "0")) == 0
    with contextlib.ExitStack() as stack:
        if main_rank:  # the one process that writes the run directory holds it
            with contextlib.suppress(OSError):
                run_dir.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(fileio.output_lock(run_dir, flag="--run-dir "))
            CheckpointManager(run_dir).remove_half_deleted()
        try:
            summary = run_training(cfg, run_dir, resume=args.resume, threads=args.threads)
        except Exception as exc:
            failure = fileio.environment_failure(exc, getattr(exc, "filename", None) or run_dir,
                                                 "nothing complete was replaced")
            if failure is None:
                raise
            raise EnvironmentFailure(f"{failure}{_resume_hint(run_dir)}") from None
    return summary
