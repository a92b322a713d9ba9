"""`aiayn tune-decoding`: BLEU and chrF of a checkpoint on a development set for a grid of
beam sizes and length penalties, the best one marked (aiayn.recipes.tune_decoding)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from aiayn.cli import options
from aiayn.config import DecodeConfig, check_decode_bounds
from aiayn.errors import AiaynError, ConfigError

log = logging.getLogger(__name__)

# Every other decoding option is one value for the whole grid. Not offered: nbest (one
# translation is scored) and the sampling options (nothing to search).
FIXED = ("lenpen_style", "max_len_a", "max_len_b", "min_len", "no_repeat_ngram_size", "batch_tokens")
DEFAULT_BEAMS = (1, 4, 8)
DEFAULT_LENPENS = (0.0, 0.6, 1.0)

EPILOG = """\
examples
  aiayn tune-decoding --checkpoint runs/base --dataset multi30k --split val
  aiayn tune-decoding --checkpoint runs/base --input dev.en --ref dev.de --beams 4 8 --lenpens 0.6 1.0 1.4

Each cell is a full search with that beam and length penalty, scored exactly as
`aiayn evaluate --beam B --lenpen A` scores it (sacreBLEU BLEU and chrF, the same signatures);
the best cell (highest BLEU, then chrF) is marked with *. The checkpoint is loaded once;
greedy search (beam 1) runs once for every penalty, which does not change its output.
Tune on a development split: a --dataset split named test is refused unless --allow-test.
--json prints {"cells": [{"beam", "lenpen", "bleu", "chrf", "seconds", "best"}, ...], "best", ...}.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune-decoding", help="BLEU/chrF on a dev set for a grid of beam sizes and length penalties",
        description="Translate a development set with every beam size and length penalty of a grid "
                    "and score each with sacreBLEU: a known --dataset split, or an --input file with --ref.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_checkpoint(p, purpose="the model to tune")
    p.add_argument("--dataset", help="known dataset to take sources and references from (e.g. multi30k)")
    p.add_argument("--split", help="dataset split (default: the dataset's validation split)")
    p.add_argument("--input", help="source file to translate (references from --ref)")
    p.add_argument("--ref", action="append", default=[], metavar="FILE",
                   help="reference file for --input; repeat for several references")
    p.add_argument("--src", help="source language (default: the checkpoint's data.src_lang)")
    p.add_argument("--tgt", help="target language (default: the checkpoint's data.tgt_lang)")
    p.add_argument("--data-dir", help="mirror folder with the dataset files (or $AIAYN_DATA_MIRROR)")
    p.add_argument("--beams", type=int, nargs="+", default=list(DEFAULT_BEAMS), metavar="K",
                   help="beam sizes to try (default: 1 4 8)")
    p.add_argument("--lenpens", type=float, nargs="+", default=list(DEFAULT_LENPENS), metavar="ALPHA",
                   help="length penalties to try (default: 0.0 0.6 1.0)")
    p.add_argument("--allow-test", action="store_true",
                   help="allow a --dataset split whose name says test (its score is then no longer a test score)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--width", type=int, default=1, help="decimals of the printed scores (default 1, as sacrebleu)")
    options.add_on_invalid_utf8(p)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    options.add_decode_flags(p, FIXED, title="the other decoding options, one value for every cell "
                                             "(default: the checkpoint's decode section)")
    options.add_device_flags(p)
    p.set_defaults(func=run)


def _check_args(args: argparse.Namespace) -> None:
    for flag, name, values in (("--beams", "beam", args.beams), ("--lenpens", "lenpen", args.lenpens)):
        for value in values:
            try:
                check_decode_bounds({name: value})
                DecodeConfig().with_overrides(**{name: value})
            except ConfigError as exc:
                raise ConfigError(str(exc).replace(f"decode.{name}", flag, 1)) from None
    if bool(args.dataset) == bool(args.input):
        raise AiaynError("give either --dataset (with --split) or --input with --ref")
    if args.input and not args.ref:
        raise AiaynError("--input needs at least one --ref FILE")
    if args.dataset and args.ref:
        raise AiaynError("--dataset brings its own references; drop --ref")
    if args.width < 0:
        raise AiaynError("--width: must not be negative")


def _check_split(args: argparse.Namespace) -> None:
    """Choose on a development set: a test split is refused (or, for a file, warned about)."""
    if args.dataset:
        from aiayn.data import datasets

        args.split = args.split or datasets.get_dataset(args.dataset).default_valid
        if "test" in args.split.lower() and not args.allow_test:
            raise AiaynError(f"--split {args.split}: a test split; choose decoding options on a development "
                             "split (e.g. val), then score the test split once with them (--allow-test: "
                             "tune on it anyway)")
    elif "test" in Path(args.input).name.lower():
        log.warning("%s looks like a test set: choose decoding options on a development set", args.input)


def _texts(args: argparse.Namespace, translator: Any) -> tuple[list[str], list[list[str]], str, str]:
    """Sources, reference streams, what they are (for the output) and the target language."""
    from aiayn.cli.evaluate import sources_and_references

    sources, streams, what, tgt = sources_and_references(args, translator)
    if not sources:
        raise AiaynError(f"{what}: no lines to translate (the file is empty)")
    return sources, streams, what, tgt


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from aiayn.inference.translator import Translator
    from aiayn.recipes.tune_decoding import searches, tune_decoding

    _check_args(args)
    _check_split(args)
    device = options.device(args)
    dtype = options.dtype(args, device)
    translator = Translator.from_checkpoint(args.checkpoint, device=device, dtype=dtype,
                                            ensemble=args.ensemble)
    sources, streams, what, tgt = _texts(args, translator)
    fixed = options.decode_overrides(args)
    options.say_dtype(dtype, args.quiet)
    with tqdm(total=len(sources) * searches(args.beams, args.lenpens), unit="sent", file=sys.stderr, disable=args.quiet,
              desc="tune") as bar:
        grid = tune_decoding(translator, sources, streams, args.beams, args.lenpens, tgt_lang=tgt,
                             progress=bar.update, **fixed)
    style = translator.decode_config(**fixed).lenpen_style
    if args.json:
        print(json.dumps(_json(grid, what, style, fixed, args.width), indent=1, ensure_ascii=False))
    else:
        print(_table(grid, what, style, args.width))
    return 0


def _json(grid: Any, what: str, style: str, fixed: dict[str, Any], width: int) -> dict[str, Any]:
    # Rounded as `aiayn evaluate --json --width W` rounds, so the two compare equal.
    def cell(c: Any) -> dict[str, Any]:
        return {"beam": c.beam, "lenpen": c.lenpen, "bleu": float(f"{c.bleu:.{width}f}"),
                "chrf": float(f"{c.chrf:.{width}f}"), "seconds": round(c.seconds, 3), "best": c is grid.best}

    return {"source": what, "n_sentences": grid.n_sentences, "lenpen_style": style, "fixed": fixed,
            "cells": [cell(c) for c in grid.cells], "best": cell(grid.best),
            "bleu_signature": grid.bleu_signature, "chrf_signature": grid.chrf_signature}


def _table(grid: Any, what: str, style: str, width: int) -> str:
    """BLEU (chrF) per cell, beams down, penalties across; * marks the best."""
    lenpens = list(dict.fromkeys(c.lenpen for c in grid.cells))
    beams = list(dict.fromkeys(c.beam for c in grid.cells))
    by_key = {(c.beam, c.lenpen): c for c in grid.cells}
    text = {key: f"{'*' if c is grid.best else ''}{c.bleu:.{width}f} ({c.chrf:.{width}f})"
            for key, c in by_key.items()}
    col = max(*(len(t) for t in text.values()), *(len(f"{lp:g}") for lp in lenpens)) + 2
    lines = [f"{what}: {grid.n_sentences} sentences, {len(grid.cells)} settings ({style} length penalty)",
             "BLEU (chrF2) per beam size and length penalty; * the best",
             "beam \\ lenpen".ljust(14) + "".join(f"{lp:g}".rjust(col) for lp in lenpens)]
    lines += [str(b).rjust(4).ljust(14) + "".join(text[(b, lp)].rjust(col) for lp in lenpens) for b in beams]
    best = grid.best
    lines += [f"best: --beam {best.beam} --lenpen {best.lenpen:g}: BLEU {best.bleu:.{width}f}, "
              f"chrF2 {best.chrf:.{width}f}",
              f"  sacreBLEU signatures: BLEU {grid.bleu_signature}; chrF2 {grid.chrf_signature}"]
    return "\n".join(lines)
