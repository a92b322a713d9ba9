"""`aiayn parse`: constituency trees from a parsing checkpoint, scored with EVALB when gold
trees are given (paper, section 6.2)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from aiayn.cli import options
from aiayn.errors import AiaynError, DataError

EPILOG = """\
examples
  aiayn parse --checkpoint runs/ptb_parsing/averaged --prepared data-bin/ptb_parsing --split test
  aiayn parse --checkpoint runs/ptb_parsing/averaged --input words.txt --output trees.txt
  aiayn parse --checkpoint runs/ptb_parsing/averaged --input words.txt --gold gold.txt --json
  echo "Ms. Haag plays Elianti ." | aiayn parse --checkpoint runs/ptb_parsing/averaged

Input: one sentence per line (a file, or stdin when neither --input nor --prepared is
given, or --input -), words separated by spaces (Penn Treebank tokenization; brackets
become -LRB- / -RRB-). Output: one tree per line, POS tags written as XX (the model
predicts structure only); an empty input line gives an empty output line. A line longer
than the model can read or write a tree for is refused, naming the line. By default the
search only produces well-formed trees over exactly the input words; with --no-constraint
malformed predictions are repaired into such a tree, and the summary says how many were.
Scores are EVALB's with COLLINS.prm (labeled bracket F1, precision, recall, exact match;
punctuation found with the gold POS tags).
--json prints {"f1", "precision", "recall", "exact_match", "sentences", "repaired", ...}.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "parse", help="parse sentences into constituency trees (and score them with EVALB)",
        description="Parse with a checkpoint trained on linearized trees (configs/ptb_parsing.yaml): "
                    "a split of a prepared directory (scored against its gold trees), or an --input "
                    "file (scored when --gold is given).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_checkpoint(p)
    p.add_argument("--prepared", metavar="DIR", help="directory written by `aiayn prepare --task parsing`")
    p.add_argument("--split", default="test", choices=("test", "valid", "train"),
                   help="with --prepared: the split to parse and score (default test)")
    p.add_argument("--input", metavar="FILE", help="sentences to parse, one per line; - for stdin (the default "
                                                   "without --prepared)")
    p.add_argument("--gold", metavar="FILE", help="with --input: gold trees to score against")
    p.add_argument("--output", "-o", metavar="FILE", help="write the predicted trees here")
    p.add_argument("--json", action="store_true", help="print the scores as JSON")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--no-constraint", dest="constrained", action="store_false",
                   help="decode freely and repair malformed outputs (the paper's setting); by default the "
                        "search only produces well-formed trees over exactly the input words")
    g = options.add_decode_flags(
        p, ("beam", "lenpen", "max_len_a", "max_len_b", "batch_tokens"),
        title="decoding (default: the paper's parsing settings, beam 21, alpha 0.3, max length = input + 300)",
        notes={"beam": "default 21", "lenpen": "default 0.3", "max_len_a": "default 1", "max_len_b": "default 300",
               "batch_tokens": "default: the checkpoint's"})
    options.add_device_flags(g)
    p.set_defaults(func=run, exit_at_once=True)  # main: no interpreter teardown after the outputs are closed


def _check_args(args: argparse.Namespace) -> None:
    from aiayn import fileio

    if args.prepared and args.input:
        raise AiaynError("give either --prepared DIR (with --split) or --input FILE, not both")
    if not args.prepared and not args.input:
        args.input = "-"
    if args.gold and not args.input:
        raise AiaynError("--gold goes with --input; a --prepared split brings its own gold trees")
    if args.output:
        inputs = [args.input, args.gold, args.prepared, *args.checkpoint]
        fileio.check_output_file(args.output, inputs, "--output")


def _read_input(args: argparse.Namespace) -> tuple[list[str], list[Any] | None]:
    """The --input sentences and, with --gold, their gold trees."""
    from aiayn import fileio
    from aiayn.inference.parser import read_gold

    if args.input == "-":
        sentences = [fileio.decode_line(raw, "<stdin>", n) or ""
                     for n, raw in enumerate(fileio.iter_raw_lines(sys.stdin.buffer, "<stdin>"), 1)]
    else:
        sentences = [line or "" for line in fileio.read_text_lines(Path(args.input), "error", strip="eol")]
    gold = None
    if args.gold:
        gold = read_gold(args.gold)
        if len(gold) != len(sentences):
            raise AiaynError(f"{args.gold} has {len(gold)} trees but {args.input} has {len(sentences)} lines")
    return sentences, gold


def run(args: argparse.Namespace) -> int:
    from aiayn import fileio

    if not args.output:
        return _run(args)
    with fileio.output_lock(args.output, flag="--output "):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from aiayn.inference.parser import Parser, parse_prepared_split, score_parses

    _check_args(args)
    decode = options.decode_overrides(args)
    sentences, gold = _read_input(args) if args.input else ([], None)
    # Parser takes the device by name.
    device = options.device(args)
    dtype = options.dtype(args, device)
    parser = Parser.from_checkpoint(args.checkpoint, device=str(device), dtype=dtype.dtype, ensemble=args.ensemble)
    settings = parser.decode_settings(**decode)  # a bad option fails before any decoding
    problem = parser.length_problem([s.split() for s in sentences], settings)
    if problem is not None:
        raise DataError(f"{'<stdin>' if args.input == '-' else args.input}:{problem[0] + 1}: {problem[1]}")
    total = len(sentences) if args.input else None
    options.say_dtype(dtype, args.quiet)
    scores: dict[str, Any] | None = None
    with tqdm(total=total, unit="sent", file=sys.stderr, disable=args.quiet, desc="parse") as bar:
        if args.prepared:
            scores, results = parse_prepared_split(parser, args.prepared, args.split, progress=bar.update,
                                                   constrained=args.constrained, **decode)
            what = f"{args.prepared} {args.split}"
        else:
            results = parser.parse(sentences, progress=bar.update, constrained=args.constrained, **decode)
            what = args.input
            if gold is not None:
                scores = score_parses(gold, results)
    return _report(args, what, results, scores)


def _report(args: argparse.Namespace, what: str, results: list[Any], scores: dict[str, Any] | None) -> int:
    from aiayn import fileio
    from aiayn.data.trees import tree_to_string

    if args.output:  # written whole or not at all
        fileio.write_atomic(args.output, "".join((tree_to_string(r.tree) if r.tree else "") + "\n" for r in results),
                            durable=False)
    repaired = sum(r.repaired for r in results)
    if scores is None:
        if args.json:
            print(json.dumps({"source": what, "parsed": len(results), "repaired": repaired}))
        elif not args.output:  # nothing was scored or written: the trees are the output
            for r in results:
                print(tree_to_string(r.tree) if r.tree else "")
        else:
            print(f"{what}: {len(results)} sentences parsed, {repaired} repaired -> {args.output}")
        return 0
    scores["source"] = what
    if args.json:
        print(json.dumps(scores, indent=1))
        return 0
    print(f"{what}: {scores['sentences']} sentences ({scores['skipped']} skipped by EVALB), "
          f"{repaired} of {len(results)} predictions repaired")
    print(f"F1 = {scores['f1']:.2f}  (P {scores['precision']:.2f}, R {scores['recall']:.2f}; "
          f"{scores['matched']} matched of {scores['gold_brackets']} gold / {scores['test_brackets']} "
          f"predicted brackets)")
    print(f"exact match = {scores['exact_match']:.2f}")
    return 0
