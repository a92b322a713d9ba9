"""`aiayn evaluate`: sacreBLEU BLEU and chrF of a hypothesis file, or of a checkpoint's
translation of a known test set (e.g. Multi30k test_2016_flickr) or of a source file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from aiayn import fileio
from aiayn.cli import options
from aiayn.errors import AiaynError

EPILOG = """\
examples
  aiayn evaluate --hyp hyp.de --ref ref.de
  aiayn evaluate --hyp hyp.de --ref ref1.de --ref ref2.de --tokenized-bleu --tgt de
  aiayn evaluate --checkpoint runs/base --dataset multi30k --split test_2016_flickr --src en --tgt de
  aiayn evaluate --checkpoint runs/base --input test.en --ref test.de --output hyp.de

The BLEU and chrF figures are sacreBLEU's (detokenized, cased, 13a), identical to
`sacrebleu REF -i HYP -m bleu chrf` on the same files, printed with their signatures.
--tokenized-bleu adds the paper's figure, computed as tensor2tensor's get_ende_bleu.sh
does: Moses tokenizer for the target language (sacremoses, XML escaping on), compound
splitting a-b -> a ##AT##-##AT## b for German, then multi-bleu.perl's corpus BLEU (cased,
no smoothing; multi-bleu.perl prints it with --width 2). It needs the target language
(--tgt, or the checkpoint's) and is NOT comparable to sacreBLEU (typically 0.6-0.8 higher).
--json prints {"bleu", "chrf", "signature" (BLEU's), "bleu_signature", "chrf_signature", ...}.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate", help="BLEU/chrF with sacreBLEU (of a file, or of a checkpoint on a test set)",
        description="Score translations with sacreBLEU: --hyp FILE --ref FILE..., or translate with "
                    "--checkpoint first (a known --dataset split, or an --input file with --ref).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hyp", help="hypothesis file (one translation per line)")
    p.add_argument("--ref", action="append", default=[], metavar="FILE",
                   help="reference file; repeat for several references")
    options.add_checkpoint(p, required=False, purpose="translate with this checkpoint")
    p.add_argument("--dataset", help="known dataset to take source and references from (e.g. multi30k)")
    p.add_argument("--split", help="dataset split (default: the dataset's test split)")
    p.add_argument("--input", help="with --checkpoint: source file to translate (references from --ref)")
    p.add_argument("--src", help="source language (default: the checkpoint's data.src_lang)")
    p.add_argument("--tgt", help="target language (default: the checkpoint's data.tgt_lang); "
                   "--tokenized-bleu tokenizes for it and splits compounds for 'de'")
    p.add_argument("--data-dir", help="mirror folder with the dataset files (or $AIAYN_DATA_MIRROR)")
    p.add_argument("--output", help="with --checkpoint: also write the translations here")
    p.add_argument("--tokenized-bleu", action="store_true",
                   help="also print the paper's tokenized BLEU (get_ende_bleu.sh: Moses tokenizer, "
                   "compound splitting for de, multi-bleu.perl; NOT comparable to sacreBLEU)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--width", type=int, default=1, help="decimals of the printed scores (default 1, as sacrebleu)")
    options.add_on_invalid_utf8(p)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    options.add_decode_flags(p)
    options.add_device_flags(p)
    p.set_defaults(func=run, exit_at_once=True)  # main: no interpreter teardown after the outputs are closed


def _check_args(args: argparse.Namespace) -> None:
    if args.hyp and args.checkpoint:
        raise AiaynError("give either --hyp (score a file) or --checkpoint (translate, then score), not both")
    if not args.hyp and not args.checkpoint:
        raise AiaynError("nothing to score: give --hyp FILE --ref FILE, or --checkpoint with --dataset or --input")
    if args.hyp and not args.ref:
        raise AiaynError("--hyp needs at least one --ref FILE")
    if args.hyp and args.ensemble:
        raise AiaynError("--ensemble decodes with several --checkpoint models; --hyp scores a file as it is")
    if args.checkpoint:
        if bool(args.dataset) == bool(args.input):
            raise AiaynError("with --checkpoint give either --dataset (with --split) or --input with --ref")
        if args.input and not args.ref:
            raise AiaynError("--input needs at least one --ref FILE")
        if args.dataset and args.ref:
            raise AiaynError("--dataset brings its own references; drop --ref")
    if args.hyp and args.tokenized_bleu and not args.tgt:
        raise AiaynError("--tokenized-bleu needs --tgt LANG (the Moses tokenizer's rules, and compound "
                         "splitting for 'de', depend on the target language)")
    if args.width < 0:
        raise AiaynError("--width: must not be negative")
    if args.output:  # checked before the translation, so a bad path costs nothing
        fileio.check_output_file(args.output, [args.input, args.hyp, *(args.ref or []), *(args.checkpoint or [])],
                                 "--output")


def _dataset_text(args: argparse.Namespace, src: str, tgt: str) -> tuple[list[str], list[str], str]:
    from aiayn.data import datasets
    from aiayn.data.corpus import iter_lines

    info = datasets.get_dataset(args.dataset)
    split = args.split or info.default_test
    sources: list[str] = []
    refs: list[str] = []
    for src_path, tgt_path, _tag in datasets.split_files(args.dataset, split, src, tgt, mirror=args.data_dir,
                                                         progress=not args.quiet):
        s = [x if x is not None else "" for x in iter_lines(src_path, args.on_invalid_utf8)]
        r = [x if x is not None else "" for x in iter_lines(tgt_path, args.on_invalid_utf8)]
        if len(s) != len(r):
            raise AiaynError(f"{src_path} has {len(s)} lines but {tgt_path} has {len(r)}")
        sources += s
        refs += r
    return sources, refs, f"{args.dataset} {split} {src}-{tgt}"


def sources_and_references(args: argparse.Namespace, translator: Any) -> tuple[list[str], list[list[str]], str, str]:
    """What a checkpoint is scored on: the sources, the reference streams, what they are (for
    the output) and the target language; a known ``--dataset`` split, or ``--input`` with its
    ``--ref`` files (line counts checked). Also used by `aiayn tune-decoding`."""
    from aiayn.cli.translate import read_file_lines
    from aiayn.evaluation.bleu import read_lines

    data_cfg = translator.config.data
    src, tgt = args.src or data_cfg.src_lang, args.tgt or data_cfg.tgt_lang
    if args.dataset:
        sources, refs, what = _dataset_text(args, src, tgt)
        return sources, [refs], what, tgt
    sources = read_file_lines(Path(args.input), args.on_invalid_utf8)
    streams = [read_lines(r, args.on_invalid_utf8) for r in args.ref]
    for path, stream in zip(args.ref, streams):
        if len(stream) != len(sources):
            raise AiaynError(f"{path} has {len(stream)} lines but {args.input} has {len(sources)}; "
                             "the line counts must match")
    return sources, streams, args.input, tgt


def _translate(args: argparse.Namespace) -> tuple[list[str], list[list[str]], str, str | None]:
    from tqdm import tqdm

    from aiayn.inference.translator import Translator

    device = options.device(args)
    dtype = options.dtype(args, device)
    translator = Translator.from_checkpoint(args.checkpoint, device=device, dtype=dtype,
                                            ensemble=args.ensemble)
    sources, streams, what, tgt = sources_and_references(args, translator)
    overrides = options.decode_overrides(args)
    options.say_dtype(dtype, args.quiet)
    with tqdm(total=len(sources), unit="sent", file=sys.stderr, disable=args.quiet, desc="translate") as bar:
        results = translator.translate_detailed(sources, nbest=1, progress=bar.update, **overrides)
    hyps = [r.hypotheses[0].text.replace("\n", " ") if r.hypotheses else "" for r in results]
    if args.output:
        fileio.write_atomic(args.output, "".join(h + "\n" for h in hyps), durable=False)
    return hyps, streams, what, tgt


def run(args: argparse.Namespace) -> int:
    if not args.output:
        return _run(args)
    with fileio.output_lock(args.output, flag="--output "):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from aiayn.evaluation.bleu import corpus_scores, read_lines

    _check_args(args)
    if args.hyp:
        hyps = read_lines(args.hyp, args.on_invalid_utf8)
        streams = [read_lines(r, args.on_invalid_utf8) for r in args.ref]
        for path, stream in zip(args.ref, streams):
            if len(stream) != len(hyps):
                raise AiaynError(f"{path} has {len(stream)} lines but {args.hyp} has {len(hyps)}; "
                                 "the line counts must match (nothing is truncated)")
        what, tgt = args.hyp, args.tgt
    else:
        hyps, streams, what, tgt = _translate(args)
    if not hyps:
        raise AiaynError(f"{what}: no lines to score (the file is empty)")
    scores = corpus_scores(hyps, streams, tokenized=args.tokenized_bleu, tgt_lang=tgt)
    w = args.width
    if args.json:
        # Rounded the way sacrebleu prints (--width decimals), so the numbers are identical.
        out: dict[str, Any] = {k: (float(f"{v:.{w}f}") if k in ("bleu", "chrf", "tokenized_bleu") else v)
                               for k, v in scores.items()}
        out["source"] = what
        print(json.dumps(out, indent=1, ensure_ascii=False))
        return 0
    print(f"{what}: {scores['n_sentences']} sentences")
    print(f"BLEU = {scores['bleu']:.{w}f} {scores['bleu_verbose']}")
    print(f"  sacreBLEU signature: {scores['bleu_signature']}")
    print(f"chrF2 = {scores['chrf']:.{w}f}")
    print(f"  sacreBLEU signature: {scores['chrf_signature']}")
    if args.tokenized_bleu:
        print(f"tokenized BLEU = {scores['tokenized_bleu']:.{w}f}  [{scores['tokenized_bleu_note']}]")
        print(f"  signature: {scores['tokenized_bleu_signature']}")
    return 0
