"""`aiayn export hf|ctranslate2`: move a checkpoint to Hugging Face MarianMT or CTranslate2."""

from __future__ import annotations

import argparse

QUANTIZATION_CHOICES = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                        "bfloat16", "float32")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="export a checkpoint to Hugging Face MarianMT or CTranslate2",
        description="Export a checkpoint for deployment elsewhere (needs the 'interop' extra: "
                    "pip install 'aiayn[interop]'). See docs/deploying.md.")
    formats = p.add_subparsers(dest="format", metavar="FORMAT")
    formats.required = True

    hf = formats.add_parser(
        "hf", help="a directory MarianMTModel / MarianTokenizer.from_pretrained load",
        description="Write config.json, model.safetensors, generation_config.json and the Marian "
                    "tokenizer files (vocab.json, source.spm, target.spm). Models with the paper's "
                    "interleaved sinusoids are exported exactly by permuting the model dimension.")
    hf.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint or run directory")
    hf.add_argument("out_dir", metavar="OUT_DIR", help="output directory")
    hf.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    hf.set_defaults(func=run)

    ct = formats.add_parser(
        "ctranslate2", help="a CTranslate2 model directory (via the HF export)",
        description="Export through the Hugging Face Marian format and CTranslate2's converter. "
                    "The output holds model.bin, the vocabulary, and source.spm / target.spm.")
    ct.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint or run directory")
    ct.add_argument("out_dir", metavar="OUT_DIR", help="output directory")
    ct.add_argument("--quantization", choices=QUANTIZATION_CHOICES, default=None,
                    help="weight type of the converted model (default: float32)")
    ct.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    ct.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from aiayn import fileio

    with fileio.output_lock(args.out_dir):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.format == "hf":
        from aiayn.interop.hf_export import export_hf

        out = export_hf(args.checkpoint, args.out_dir, force=args.force)
        print(f"exported {args.checkpoint} -> {out} (Hugging Face MarianMT)")
        print(f"  load with: MarianMTModel.from_pretrained({str(out)!r}), "
              f"MarianTokenizer.from_pretrained({str(out)!r})")
    else:
        from aiayn.interop.ctranslate2 import export_ctranslate2

        out = export_ctranslate2(args.checkpoint, args.out_dir, quantization=args.quantization,
                                 force=args.force)
        print(f"exported {args.checkpoint} -> {out} (CTranslate2, {args.quantization or 'float32'})")
        print(f"  load with: ctranslate2.Translator({str(out)!r}); tokenize with {out}/source.spm")
    return 0
