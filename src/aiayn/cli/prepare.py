"""`aiayn prepare`: tokenizer + binarized splits + summary.json from a corpus, files or a task.

Examples::

    aiayn prepare --dataset multi30k --src en --tgt de --vocab-size 8000 \\
        --out data-bin/multi30k.en-de      # the mirror --data-dir / $AIAYN_DATA_MIRROR, else download
    aiayn prepare --train-src train.en --train-tgt train.de --valid-src dev.en \\
        --valid-tgt dev.de --out data-bin/mine
    aiayn prepare --synthetic reverse --out data-bin/reverse
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from aiayn.config import DataConfig, load_config
from aiayn.errors import DataError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare", help="train the tokenizer and binarize a corpus",
        description="Train SentencePiece and binarize train/valid/test into OUT, writing OUT/summary.json.")
    p.add_argument("--out", required=True, help="output directory (the prepared data)")
    p.add_argument("--force", action="store_true",
                   help="replace a non-empty --out (a directory prepare wrote is rebuilt without it)")
    p.add_argument("--config", help="YAML experiment file; its data section gives the defaults")
    p.add_argument("--task", choices=("translation", "parsing"), default="translation",
                   help="translation (default), or constituency parsing of the Penn Treebank")
    src = p.add_argument_group("sources")
    src.add_argument("--dataset", help="known corpus: multi30k | wmt14_en_de | wmt14_en_fr")
    src.add_argument("--src", dest="src_lang", help="source language (default en)")
    src.add_argument("--tgt", dest="tgt_lang", help="target language (default de)")
    src.add_argument("--data-dir", help="mirror folder holding the corpus files (else $AIAYN_DATA_MIRROR, "
                                        "else download)")
    src.add_argument("--download-dir", help="where downloads and extracted archives are kept")
    src.add_argument("--valid-split", help="dataset split for validation (multi30k: val)")
    src.add_argument("--test-split", help="dataset split for test (multi30k: test_2016_flickr)")
    for role in ("train", "valid", "test"):
        src.add_argument(f"--{role}-src", help=f"{role} source file (plain or .gz)")
        src.add_argument(f"--{role}-tgt", help=f"{role} target file, line-aligned with --{role}-src")
        src.add_argument(f"--{role}-tsv", help=f"{role} pairs as one source<TAB>target file")
    src.add_argument("--synthetic", choices=("copy", "reverse", "sort", "toy"), help="a synthetic task")
    src.add_argument("--synthetic-train-size", type=int)
    src.add_argument("--synthetic-valid-size", type=int)
    src.add_argument("--ptb-dir", help="--task parsing: folder of Penn Treebank .mrg files "
                                       "(default: ptb-sample/ in the data mirror)")
    tok = p.add_argument_group("tokenizer")
    tok.add_argument("--vocab-size", type=int, help="SentencePiece vocabulary size (default 8000)")
    tok.add_argument("--separate-vocab", action="store_true",
                     help="separate source and target models instead of one joint vocabulary")
    tok.add_argument("--tgt-vocab-size", type=int, help="target vocabulary size (with --separate-vocab)")
    tok.add_argument("--spm-model-type", choices=("bpe", "unigram", "word"))
    tok.add_argument("--tgt-spm-model-type", choices=("bpe", "unigram", "word"))
    tok.add_argument("--character-coverage", type=float)
    tok.add_argument("--spm-input-sentence-size", type=int,
                     help="sentences sampled for SentencePiece training (0 = all)")
    tok.add_argument("--seed", type=int)
    tok.add_argument("--tokenizer-dir", help="use this tokenizer (e.g. a checkpoint directory's spm*.model) "
                                             "instead of training one: for fine-tuning with train.init_from")
    tok.add_argument("--extend-vocab", type=int, metavar="N",
                     help="with --tokenizer-dir: add N pieces learned on the training text to that tokenizer, "
                          "every old id kept (fine-tune with train.init_vocab: extend)")
    tok.add_argument("--shortlist-k", type=int, metavar="K",
                     help="build a vocabulary shortlist: K target pieces per source piece (decode with --shortlist)")
    tok.add_argument("--shortlist-frequent", type=int, metavar="N",
                     help="the N most frequent target pieces join every shortlist (default 100)")
    flt = p.add_argument_group("filters (training data only)")
    flt.add_argument("--max-len", type=int, help="drop training pairs with a side over this many pieces")
    flt.add_argument("--max-len-ratio", type=float, help="drop training pairs whose length ratio exceeds this")
    flt.add_argument("--on-invalid-utf8", choices=("error", "replace", "skip"),
                     help="invalid UTF-8: stop (default), replace characters, or skip the pair")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="processes encoding the training pairs (default 1; the output is the same for any N)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


_FIELDS = ("dataset", "src_lang", "tgt_lang", "data_dir", "download_dir", "valid_split", "test_split",
           "train_src", "train_tgt", "train_tsv", "valid_src", "valid_tgt", "valid_tsv",
           "test_src", "test_tgt", "test_tsv", "synthetic", "synthetic_train_size",
           "synthetic_valid_size", "vocab_size", "tgt_vocab_size", "spm_model_type",
           "tgt_spm_model_type", "character_coverage", "spm_input_sentence_size", "seed",
           "tokenizer_dir", "extend_vocab", "shortlist_k", "shortlist_frequent", "max_len", "max_len_ratio",
           "on_invalid_utf8")


def config_from_args(args: argparse.Namespace) -> DataConfig:
    base = load_config(args.config).data if args.config else DataConfig()
    changes: dict[str, Any] = {f: getattr(args, f) for f in _FIELDS if getattr(args, f) is not None}
    if args.separate_vocab:
        changes["joint_vocab"] = False
    cfg = dataclasses.replace(base, **changes)
    cfg.validate()
    return cfg


def run(args: argparse.Namespace) -> int:
    from aiayn import fileio

    with fileio.output_lock(args.out, flag="--out "):
        out = Path(args.out)
        # What a killed run left besides atomic_dir's own temporaries: the parsing text.
        fileio.remove_stale_temporaries(out.with_name(out.name + "-text"))
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.task == "parsing":
        return _run_parsing(args)
    from aiayn.data.prepare import prepare_data

    cfg = config_from_args(args)
    summary = prepare_data(cfg, args.out, progress=not args.quiet, force=args.force, workers=args.workers)
    if args.json:
        print(json.dumps(summary, indent=2, ensure_ascii=False))
    else:
        print_summary(summary, Path(args.out))
    return 0


def print_summary(summary: dict[str, Any], out: Path) -> None:
    src = summary.get("source", {})
    what = src.get("dataset") or (f"synthetic:{src['synthetic']}" if src.get("synthetic") else "files")
    print(f"prepared {what} {src.get('src_lang')}-{src.get('tgt_lang')} -> {out}")
    for role, s in summary["splits"].items():
        dropped = s.get("dropped") or {}
        why = ", ".join(f"{k} {v:,}" for k, v in dropped.items()) if dropped else "none"
        print(f"  {role:<5} {s.get('name', ''):<18} pairs {s.get('pairs', 0):>9,}   dropped {why:<24} "
              f"tokens src {s.get('src_tokens', 0):>11,} tgt {s.get('tgt_tokens', 0):>11,}")
    if summary.get("joint_vocab", True):
        print(f"  vocabulary {summary.get('vocab_size', 0):,} (joint)")
    else:
        print(f"  vocabulary source {summary.get('src_vocab_size', 0):,}, "
              f"target {summary.get('tgt_vocab_size', 0):,}")
    extended = summary.get("extended_vocab") or {}
    for side in ("joint", "source", "target"):
        if side in extended:
            r = extended[side]
            print(f"  {side} vocabulary extended: {r['old']:,} -> {r['new']:,} pieces ({r['added']:,} added)")
    reused = [k for k, v in summary.get("reused", {}).items() if v]
    if reused:
        print(f"  reused unchanged: {', '.join(reused)}")
    times = summary.get("time_s", {})
    print(f"  time {times.get('total', 0):.1f} s; summary in {out / 'summary.json'}")


def _run_parsing(args: argparse.Namespace) -> int:
    from aiayn.data.datasets import default_mirror
    from aiayn.data.treebank import prepare_parsing_data

    mirror = Path(args.data_dir) if args.data_dir else default_mirror()
    if args.ptb_dir:
        ptb = Path(args.ptb_dir)
    elif mirror is not None:
        ptb = mirror / "ptb-sample"
    else:
        raise DataError("--task parsing needs --ptb-dir (or --data-dir or $AIAYN_DATA_MIRROR holding ptb-sample/)")
    summary = prepare_parsing_data(ptb, args.out, config_from_args(args), progress=not args.quiet,
                                   force=args.force)
    if args.json:
        print(json.dumps(summary, indent=2, ensure_ascii=False))
    else:
        print_summary(summary, Path(args.out))
    return 0
