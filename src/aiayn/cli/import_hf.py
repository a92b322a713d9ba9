"""`aiayn import hf`: convert a local Hugging Face MarianMT directory into a checkpoint."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import", help="convert a Hugging Face MarianMT directory into an aiayn checkpoint",
        description="Import a model from another toolkit (needs the 'interop' extra: "
                    "pip install 'aiayn[interop]'). Nothing is downloaded.")
    formats = p.add_subparsers(dest="format", metavar="FORMAT")
    formats.required = True
    hf = formats.add_parser(
        "hf", help="a local MarianMT directory (e.g. an OPUS-MT model on disk)",
        description="Convert a local MarianMT directory (config.json, weights, vocab.json, "
                    "source.spm, target.spm) into a checkpoint that translate, serve and "
                    "train --init-from use.")
    hf.add_argument("hf_dir", metavar="HF_DIR", help="local MarianMT directory")
    hf.add_argument("out", metavar="OUT_CHECKPOINT", help="checkpoint directory to write")
    hf.add_argument("--force", action="store_true", help="replace OUT_CHECKPOINT if it exists")
    hf.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from aiayn import fileio
    from aiayn.interop.hf_import import import_hf

    with fileio.output_lock(args.out):
        out = import_hf(args.hf_dir, args.out, force=args.force)
        print(f"imported {args.hf_dir} -> {out}")
    return 0
