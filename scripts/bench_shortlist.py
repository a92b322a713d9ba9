"""Vocabulary shortlist benchmark: decoding time and BLEU with and without ``--shortlist``.

    aiayn prepare --config configs/multi30k_en_de.yaml --tokenizer-dir data-bin/multi30k.en-de \
        --shortlist-k 50 --out data-bin/multi30k.en-de.shortlist
    python scripts/bench_shortlist.py --checkpoint runs/multi30k.en-de/member1/averaged \
        --shortlist-from data-bin/multi30k.en-de.shortlist \
        --input data-bin/multi30k.en-de/test.src.txt --ref data-bin/multi30k.en-de/test.tgt.txt

Translates ``--input`` with one checkpoint (beam 4, the checkpoint's decode options, eager)
in each ``--dtype``, without and with the shortlist, ``--runs`` times each in turn, and
prints one JSON object: per dtype the median seconds of both, their ratio, sacreBLEU BLEU of
both and the mean number of target pieces a list holds (one list per SENTENCES_PER_LIST
sentences). ``--shortlist-from``: a prepared directory (or checkpoint) whose tokenizer has
the shortlist, for a checkpoint trained without one; its SentencePiece model must be the
checkpoint's. The target: at beam 4
the shortlist >= 1.3x faster with BLEU within 0.1 of the full vocabulary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from aiayn.data.prepare import load_tokenizer
from aiayn.evaluation.bleu import corpus_bleu
from aiayn.inference.step_vocabulary import SENTENCES_PER_LIST
from aiayn.inference.translator import Translator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--shortlist-from", type=Path, help="a prepared directory or checkpoint holding the shortlist")
    ap.add_argument("--input", type=Path, required=True)
    ap.add_argument("--ref", type=Path, required=True)
    ap.add_argument("--dtype", default="int8,bf16", help="comma-separated: fp32, bf16, int8")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--batch-tokens", type=int, default=0,
                    help="padded source tokens per batch (0: the decode section's)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--limit", type=int, default=0, help="first N sentences only (0: all)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    src = args.input.read_text(encoding="utf-8").splitlines()
    ref = args.ref.read_text(encoding="utf-8").splitlines()
    if args.limit:
        src, ref = src[:args.limit], ref[:args.limit]
    overrides = {"beam": args.beam, **({"batch_tokens": args.batch_tokens} if args.batch_tokens else {})}
    report: dict[str, object] = {"sentences": len(src), "beam": args.beam, "threads": torch.get_num_threads(),
                                 "torch": torch.__version__}
    for dtype in args.dtype.split(","):
        tr = Translator.from_checkpoint(args.checkpoint, dtype=dtype, compile=False)
        if args.shortlist_from is not None:
            source = args.shortlist_from / "tokenizer" if (args.shortlist_from / "tokenizer").is_dir() \
                else args.shortlist_from
            donor = load_tokenizer(source)
            if donor.tgt_vocab_size != tr.tokenizer.tgt_vocab_size or donor.shortlist is None:
                sys.exit(f"bench_shortlist.py: {source}: no shortlist for this checkpoint's vocabulary")
            tr.tokenizer.shortlist = donor.shortlist
        shortlist = tr.tokenizer.shortlist
        tr.translate(src[:16], **overrides)  # warm-up
        tr.translate(src[:16], shortlist=True, **overrides)
        seconds: dict[bool, list[float]] = {False: [], True: []}
        outputs: dict[bool, list[str]] = {}
        for _ in range(args.runs):
            for short in (False, True):
                start = time.perf_counter()
                outputs[short] = tr.translate(src, shortlist=short, **overrides)
                seconds[short].append(time.perf_counter() - start)
        full_s, short_s = statistics.median(seconds[False]), statistics.median(seconds[True])
        per = SENTENCES_PER_LIST  # (in input order; a batch groups sentences of like length)
        sizes = [len(shortlist.rows([i for text in src[k:k + per] for i in tr.tokenizer.encode_src(text)]))
                 for k in range(0, len(src), per)]
        report[dtype] = {
            "seconds_full": round(full_s, 2), "seconds_shortlist": round(short_s, 2),
            "speedup": round(full_s / max(short_s, 1e-9), 3),
            "bleu_full": round(corpus_bleu(outputs[False], [ref]), 2),
            "bleu_shortlist": round(corpus_bleu(outputs[True], [ref]), 2),
            "identical_lines": sum(a == b for a, b in zip(outputs[False], outputs[True])),
            "vocabulary": tr.tokenizer.tgt_vocab_size, "mean_pieces_per_list": round(statistics.mean(sizes)),
        }
        print(json.dumps({dtype: report[dtype]}), file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
