"""The training data path at WMT scale: memory and time from a binarized split to the first batch.

A binarized split of N pairs with WMT14-like lengths (log-normal source lengths, median ~24
pieces; target/source ratio log-normal around 1.05) is written without a tokenizer (the ids
are a sparse file of zeros: batching reads only the lengths), then, in a fresh process each,
the training iterator is built as `aiayn train` builds it and its first batch made. Printed:
pairs, seconds and peak-RSS growth (MB) for loading the split, laying out the batches (the
boundaries), the first epoch's batch order, and the first batch; and the anonymous memory
kept at the end (peak RSS also counts pages of the memory-mapped split, which the kernel may
map generously and can drop at any time).

    python benchmarks/data_scale.py --pairs 4000000 36000000 [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def fake_split(directory: Path, pairs: int, seed: int = 1) -> Path:
    """A binarized split of ``pairs`` pairs with WMT-like lengths; its ids are all zero."""
    from aiayn.data.binarize import FORMAT_VERSION, META

    directory.mkdir(parents=True, exist_ok=True)
    if (directory / META).is_file():
        return directory
    rng = np.random.default_rng(seed)
    src = np.clip(np.round(rng.lognormal(np.log(24.0), 0.6, pairs)), 1, 255).astype(np.int64) + 1  # + EOS
    tgt = np.clip(np.round((src - 1) * rng.lognormal(np.log(1.05), 0.2, pairs)), 1, 256).astype(np.int64)
    for side, sizes in (("src", src), ("tgt", tgt)):
        offsets = np.zeros(pairs + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        np.save(directory / f"{side}.offsets.npy", offsets)
        ids = np.lib.format.open_memmap(directory / f"{side}.ids.npy", mode="w+", dtype=np.uint16,
                                        shape=(int(offsets[-1]),))
        del ids  # never written: a sparse file
    meta = {"format_version": FORMAT_VERSION, "key": "fake", "pairs": pairs, "dropped": {},
            "src_tokens": int(src.sum()), "tgt_tokens": int(tgt.sum()), "dtype": "uint16", "filters": None}
    (directory / META).write_text(json.dumps(meta), encoding="utf-8")
    return directory


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _anon_mb() -> float:
    """Anonymous memory now (Linux), without the memory-mapped files' pages; else 0."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024
    except (OSError, StopIteration):
        return 0.0


def measure_start(directory: str, max_tokens: int, mode: str) -> dict[str, float]:
    """Seconds and peak-RSS growth (MB) of each stage from the split to the first batch."""
    from aiayn.data.batching import BatchIterator
    from aiayn.data.binarize import TokenDataset

    out: dict[str, float] = {"rss_start_mb": _rss_mb(), "anon_start_mb": _anon_mb()}
    t = time.perf_counter()
    data = TokenDataset(directory)
    out.update(load_s=time.perf_counter() - t, load_mb=_rss_mb() - out["rss_start_mb"])
    t = time.perf_counter()
    it = BatchIterator(data, max_tokens, seed=1, shuffle=True, mode=mode)
    out.update(layout_s=time.perf_counter() - t, layout_mb=_rss_mb() - out["rss_start_mb"])
    t = time.perf_counter()
    n = len(it.epoch_batches(1))
    out.update(order_s=time.perf_counter() - t, order_mb=_rss_mb() - out["rss_start_mb"], batches=n)
    t = time.perf_counter()
    batch = next(iter(it))
    out.update(first_batch_s=time.perf_counter() - t, peak_mb=_rss_mb() - out["rss_start_mb"],
               anon_mb=_anon_mb() - out["anon_start_mb"],
               first_batch_sentences=batch.size, pairs=len(data))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, nargs="+", default=[1_000_000, 4_000_000])
    p.add_argument("--workdir", type=Path, help="keep the fake splits here (default: a temporary folder)")
    p.add_argument("--max-tokens", type=int, default=25_000)
    p.add_argument("--mode", choices=("padded", "real"), default="padded")
    p.add_argument("--measure", help=argparse.SUPPRESS)  # child process: one split
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(measure_start(args.measure, args.max_tokens, args.mode)))
        return 0
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, numpy {np.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.workdir or Path(tmp)
        for n in args.pairs:
            directory = fake_split(root / f"fake_{n}", n)
            res = subprocess.run([sys.executable, __file__, "--measure", str(directory), "--max-tokens",
                                  str(args.max_tokens), "--mode", args.mode],
                                 check=True, capture_output=True, text=True)
            r = json.loads(res.stdout.strip().splitlines()[-1])
            print(f"{n:>11,} pairs  load {r['load_s']:.2f} s {r['load_mb']:.0f} MB | layout {r['layout_s']:.2f} s "
                  f"{r['layout_mb']:.0f} MB | epoch order {r['order_s']:.2f} s {r['order_mb']:.0f} MB | "
                  f"first batch {r['first_batch_s']:.3f} s | peak +{r['peak_mb']:.0f} MB "
                  f"({r['peak_mb'] / n * 1e6:.0f} B/pair; anonymous memory kept +{r['anon_mb']:.0f} MB), "
                  f"{r['batches']:,} batches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
