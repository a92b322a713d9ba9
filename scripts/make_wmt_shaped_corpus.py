#!/usr/bin/env python
"""A WMT-shaped synthetic parallel corpus, streamed to disk: for measuring the data path at scale.

Each side has its own vocabulary of ``--vocab`` made-up words drawn with Zipfian frequencies
(exponent ``--zipf``); source lengths follow a log-normal close to WMT14's (median about 22
words, a long tail, 1 to 250 words); each target length is the source length times a
log-normal ratio around 1. The output depends only on the arguments (``--seed``), and the
corpus is written chunk by chunk, never held in memory::

    python scripts/make_wmt_shaped_corpus.py --pairs 1000000 --out /tmp/wmt1m
    # -> /tmp/wmt1m/train.src, train.tgt (N pairs), valid.src, valid.tgt (--valid pairs)
"""

from __future__ import annotations

import argparse
import string
import sys
from pathlib import Path

import numpy as np

CHUNK = 20_000
LETTERS = np.array(list(string.ascii_lowercase))


def vocabulary(rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` distinct made-up words, 2 to 12 letters (shorter words are the frequent ones)."""
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        rank = len(words)
        n = int(min(12, 2 + rng.poisson(1 + 4 * rank / size)))
        word = "".join(rng.choice(LETTERS, n))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return np.array(words, dtype=object)


def zipf_cdf(size: int, exponent: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, size + 1, dtype=np.float64) ** exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def lengths(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    src = np.clip(np.round(rng.lognormal(np.log(22.0), 0.6, n)), 1, 250).astype(np.int64)
    ratio = rng.lognormal(0.0, 0.15, n)
    tgt = np.clip(np.round(src * ratio), 1, 250).astype(np.int64)
    return src, tgt


def write_pairs(path_src: Path, path_tgt: Path, n: int, rng: np.random.Generator,
                vocabs: tuple[np.ndarray, np.ndarray], cdf: np.ndarray, progress: bool) -> None:
    with open(path_src, "w", encoding="utf-8") as fs, open(path_tgt, "w", encoding="utf-8") as ft:
        done = 0
        while done < n:
            m = min(CHUNK, n - done)
            lens = lengths(rng, m)
            for f, vocab, side_lens in ((fs, vocabs[0], lens[0]), (ft, vocabs[1], lens[1])):
                ids = np.searchsorted(cdf, rng.random(int(side_lens.sum())))
                words = vocab[ids]
                ends = np.cumsum(side_lens)
                starts = ends - side_lens
                f.write("".join(" ".join(words[a:b]) + "\n" for a, b in zip(starts.tolist(), ends.tolist())))
            done += m
            if progress:
                print(f"\r{path_src.name}: {done:,}/{n:,} pairs", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, required=True, help="training pairs")
    p.add_argument("--valid", type=int, default=3000, help="validation pairs (default 3000)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--vocab", type=int, default=50_000, help="words per side (default 50000)")
    p.add_argument("--zipf", type=float, default=1.05, help="Zipf exponent (default 1.05)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    vocabs = (vocabulary(rng, args.vocab), vocabulary(rng, args.vocab))
    cdf = zipf_cdf(args.vocab, args.zipf)
    write_pairs(args.out / "train.src", args.out / "train.tgt", args.pairs, rng, vocabs, cdf, not args.quiet)
    write_pairs(args.out / "valid.src", args.out / "valid.tgt", args.valid, rng, vocabs, cdf, not args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
