"""Terminology benchmark: coverage, BLEU and decoding time with and without constraints.

    python scripts/build_term_set.py --out runs/term_set
    python scripts/bench_constraints.py --checkpoint runs/multi30k/averaged --terms runs/term_set \
        --beam 4 --threads 4

Translates ``TERMS/test.en`` twice with the same checkpoint and options -- without
constraints, then with ``TERMS/constraints.jsonl`` -- and prints one JSON object: the share
of constraints that appear in the outputs (a phrase counts when it occurs verbatim in the
translation) for both runs, sacreBLEU BLEU against ``TERMS/test.de`` for both, their decoding
times and the ratio. The targets: coverage >= 99 %, BLEU with >= BLEU without, time ratio
<= 1.5 at beam 4.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from aiayn.evaluation.bleu import corpus_bleu
from aiayn.inference.terms import read_constraints
from aiayn.inference.translator import Translator


def coverage(outputs: list[str], constraints: list[list[str]]) -> float:
    total = sum(len(c) for c in constraints)
    met = sum(phrase in out for out, phrases in zip(outputs, constraints) for phrase in phrases)
    return met / max(total, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", nargs="+", required=True)
    ap.add_argument("--ensemble", action="store_true")
    ap.add_argument("--terms", type=Path, required=True, help="a directory written by build_term_set.py")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--limit", type=int, default=0, help="first N sentences only (0: all)")
    ap.add_argument("--best-effort", action="store_true", help="translate unplaceable constraints' lines without")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    src = (args.terms / "test.en").read_text(encoding="utf-8").splitlines()
    ref = (args.terms / "test.de").read_text(encoding="utf-8").splitlines()
    cons = [list(c.include) for c in read_constraints(args.terms / "constraints.jsonl")]
    if args.limit:
        src, ref, cons = src[:args.limit], ref[:args.limit], cons[:args.limit]
    tr = Translator.from_checkpoint(args.checkpoint, device=args.device, dtype=args.dtype, ensemble=args.ensemble)
    tr.translate(src[:8], beam=args.beam)  # warm-up
    start = time.perf_counter()
    plain = tr.translate(src, beam=args.beam)
    plain_s = time.perf_counter() - start
    start = time.perf_counter()
    constrained = tr.translate(src, beam=args.beam, constraints=cons, constraints_best_effort=args.best_effort)
    constrained_s = time.perf_counter() - start
    print(json.dumps({
        "sentences": len(src), "constraints": sum(len(c) for c in cons), "beam": args.beam,
        "lenpen": tr.decode_config().lenpen,
        "coverage_without": round(100 * coverage(plain, cons), 2),
        "coverage_with": round(100 * coverage(constrained, cons), 2),
        "bleu_without": round(corpus_bleu(plain, [ref]), 2), "bleu_with": round(corpus_bleu(constrained, [ref]), 2),
        "seconds_without": round(plain_s, 2), "seconds_with": round(constrained_s, 2),
        "time_ratio": round(constrained_s / max(plain_s, 1e-9), 3),
    }))


if __name__ == "__main__":
    main()
