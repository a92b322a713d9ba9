"""Single-sentence latency and throughput against batch size: aiayn against CTranslate2.

Model: the synthetic base model of cpu_decode.py (random weights; exported to HF MarianMT
and converted with CTranslate2's converter, so every system decodes the same weights).
Sentences: real Multi30k lengths. The first 256 lines of test_2016_flickr (English source,
German reference) are counted in Moses tokens (sacremoses); a sentence becomes that many
random source ids + EOS, and its output is forced to its reference's length (EOS blocked
before, forced after: every system does the same work). Beam 4, length penalty 0.6.

- latency: one sentence per call, the first 200 sentences in order (``--sentences``), after a
  warm-up on 10; p50 / p99 / mean milliseconds per sentence.
- throughput against batch size: the 256 sentences in file order, in batches of 1, 8, 64
  and 256 (``--batches``); a batch generates its longest reference's length for each of its sentences
  (counted as generated tokens); median of ``--runs`` passes after one warm-up batch.

    python benchmarks/cpu_latency.py [--quick] [--workdir DIR] [--data-dir DIR] [--json [FILE]] [--plot PNG]

``make bench`` runs its short pass: ``--auto-only --batches 64 --sentences 100 --runs 1`` (aiayn in
the precision ``--dtype auto`` picks here against CTranslate2 int8).

``--json`` alone writes benchmarks/results/latency.json. Without ``--data-dir`` the
Multi30k files come from the data mirror (``$AIAYN_DATA_MIRROR``) or the download cache.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_decode  # noqa: E402
import workloads as W  # noqa: E402

SYSTEMS = [("aiayn", "fp32"), ("aiayn", "bf16"), ("aiayn", "int8"),
           ("aiayn", "fp32+compile"), ("aiayn", "bf16+compile"), ("aiayn", "int8+compile"),
           ("ctranslate2", "float32"), ("ctranslate2", "int8")]
BATCHES = (1, 8, 64, 256)
LATENCY_SENTS, SWEEP_SENTS, WARMUP_SENTS = 200, 256, 10

# decode(sources, new_tokens) -> None: one call of a system, exactly new_tokens generated each
Decode = Callable[[list[list[int]], int], None]


def real_lengths(data_dir: Path, n: int) -> list[tuple[int, int]]:
    """(source tokens, reference tokens) of the first n test_2016_flickr lines, in Moses tokens."""
    from sacremoses import MosesTokenizer

    from aiayn.data.corpus import read_lines

    src = read_lines(data_dir / "test_2016_flickr.en.gz")[:n]
    ref = read_lines(data_dir / "test_2016_flickr.de.gz")[:n]
    tok_en, tok_de = MosesTokenizer(lang="en"), MosesTokenizer(lang="de")
    return [(len(tok_en.tokenize(s or "")), len(tok_de.tokenize(t or ""))) for s, t in zip(src, ref)]


def multi30k_test_dir() -> Path:
    """The folder holding test_2016_flickr.{en,de}.gz: the mirror's or the download cache's."""
    from aiayn.data.datasets import split_files

    (src, _tgt, _tag), = split_files("multi30k", "test_2016_flickr", "en", "de")
    return src.parent


def sentences(lengths: list[tuple[int, int]]) -> list[tuple[list[int], int]]:
    """Random source ids (+ EOS) of each real length, with the output length to force."""
    g = torch.Generator().manual_seed(W.SEED)
    return [(torch.randint(4, W.VOCAB, (n_src,), generator=g).tolist() + [W.EOS], n_tgt)
            for n_src, n_tgt in lengths]


def aiayn_decoder(root: Path, dtype: str) -> Decode:
    from aiayn.config import DecodeConfig
    from aiayn.inference.search import search

    tr = W.aiayn_translator(root, dtype)

    def decode(batch: list[list[int]], new: int) -> None:
        width = max(map(len, batch))
        src = torch.tensor([s + [W.PAD] * (width - len(s)) for s in batch])
        cfg = DecodeConfig(beam=W.BEAM, lenpen=0.6, min_len=new, max_len_a=0.0, max_len_b=new)
        with torch.inference_mode():  # what Translator.translate runs, minus text in and out
            search(tr.decoder, src, cfg)

    return decode


def ct2_decoder(root: Path, quant: str) -> Decode:
    translator, pieces = cpu_decode.ct2_translator(root, quant)

    def decode(batch: list[list[int]], new: int) -> None:
        translator.translate_batch([[pieces[i] for i in s] for s in batch], beam_size=W.BEAM,
                                   length_penalty=0.6, min_decoding_length=new,
                                   max_decoding_length=new, max_batch_size=len(batch))

    return decode


def latency(decode: Decode, sents: list[tuple[list[int], int]], n: int = LATENCY_SENTS) -> dict:
    t0 = time.perf_counter()
    for src, new in sents[:WARMUP_SENTS]:
        decode([src], new)
    warmup_s = time.perf_counter() - t0  # compiling included, for a compiled path
    ms = []
    for src, new in sents[:n]:
        t0 = time.perf_counter()
        decode([src], new)
        ms.append(1e3 * (time.perf_counter() - t0))
    q = statistics.quantiles(ms, n=100)
    return {"p50_ms": statistics.median(ms), "p99_ms": q[98], "mean_ms": statistics.fmean(ms),
            "tokens_per_s": 1e3 * sum(new for _, new in sents[:n]) / sum(ms), "warmup_s": warmup_s}


def throughput(decode: Decode, sents: list[tuple[list[int], int]], batch: int, runs: int) -> float:
    """Generated tokens/s over ``sents`` in batches of ``batch`` (median of runs)."""
    chunks = [sents[i:i + batch] for i in range(0, len(sents), batch)]
    work = [([s for s, _ in c], max(n for _, n in c)) for c in chunks]
    tokens = sum(len(srcs) * new for srcs, new in work)
    decode(*work[0])  # warm-up

    def one_pass() -> float:
        t0 = time.perf_counter()
        for srcs, new in work:
            decode(srcs, new)
        return time.perf_counter() - t0

    return tokens / statistics.median(one_pass() for _ in range(runs))


def run_one(root: Path, system: str, dtype: str, runs: int, data_dir: Path, batches: tuple[int, ...] = BATCHES,
            latency_sents: int = LATENCY_SENTS) -> dict:
    W.setup_process(system)
    sents = sentences(real_lengths(data_dir, SWEEP_SENTS))
    decode = aiayn_decoder(root, dtype) if system == "aiayn" else ct2_decoder(root, dtype)
    row = latency(decode, sents, latency_sents)
    # Batch 1 = the latency pass (one sentence per call); larger batches timed here.
    sweep = {1: row["tokens_per_s"]}
    sweep.update({b: throughput(decode, sents, b, runs) for b in batches if b > 1})
    return {**row, "latency_sentences": latency_sents, "batch_tokens_per_s": sweep, "peak_rss_mb": W.peak_rss_mb()}


def selected_rows(systems: set[str], auto_only: bool) -> list[tuple[str, str]]:
    """The (system, dtype) rows to run: every row of the selected systems, or with
    ``auto_only`` aiayn in the precision ``--dtype auto`` picks on this CPU (eager) and
    CTranslate2 int8."""
    if not auto_only:
        return [(system, dtype) for system, dtype in SYSTEMS if system in systems]
    from aiayn.runtime.precision import resolve_inference_dtype

    auto = resolve_inference_dtype("auto").dtype
    return [row for row in (("aiayn", auto), ("ctranslate2", "int8")) if row[0] in systems]


def parse_batches(text: str) -> tuple[int, ...]:
    """``--batches``: sentences per call, comma-separated; batch 1 (the latency pass) always runs."""
    try:
        sizes = {int(b) for b in text.split(",") if b.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated batch sizes, e.g. 8,64") from None
    if any(b < 1 for b in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: batch sizes are 1 or more")
    return tuple(sorted(sizes | {1}))


def measured_batches(rows: list[dict]) -> list[int]:
    """The batch sizes the rows measured (JSON keys: strings), ascending."""
    return sorted(int(b) for b in rows[0]["batch_tokens_per_s"]) if rows else list(BATCHES)


def print_tables(rows: list[dict]) -> None:
    ok = [r for r in rows if not r.get("skipped")]
    ct2 = next((r for r in ok if (r["system"], r["dtype"]) == ("ctranslate2", "int8")), None)
    batches = measured_batches(ok)
    n = ok[0].get("latency_sentences", LATENCY_SENTS) if ok else LATENCY_SENTS
    print(f"\nsingle-sentence latency, beam 4, {n} Multi30k-length sentences, 2 threads")
    print(f"{'system':<14}{'dtype':<14}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}{'p50 x ct2 int8':>16}")
    for r in ok:
        rel = f"{r['p50_ms'] / ct2['p50_ms']:.2f}" if ct2 else "-"
        print(f"{r['system']:<14}{r['dtype']:<14}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}{r['mean_ms']:>9.1f}{rel:>16}")
    print("warm-up on 10 single sentences, compiling included: " + ", ".join(
        f"{r['system']} {r['dtype']} {r['warmup_s']:.1f} s" for r in ok))
    print("\ngenerated tokens/s against batch size (sentences per call), beam 4")
    print(f"{'system':<14}{'dtype':<14}" + "".join(f"{b:>9}" for b in batches))
    for r in ok:
        print(f"{r['system']:<14}{r['dtype']:<14}"
              + "".join(f"{r['batch_tokens_per_s'][str(b)]:>9.1f}" for b in batches))
    for r in rows:
        if r.get("skipped"):
            print(f"{r['system']} {r['dtype']}: skipped: {r['skipped']}")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    batches = measured_batches([r for r in rows if not r.get("skipped")])
    for r in rows:
        if not r.get("skipped"):
            ys = [r["batch_tokens_per_s"][str(b)] for b in batches]
            ax.plot(batches, ys, marker="o", linestyle="-" if r["system"] == "aiayn" else "--",
                    label=f"{r['system']} {r['dtype']}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("sentences per call (beam 4)")
    ax.set_ylabel("generated tokens / s")
    ax.set_title(f"Decoding throughput, base model, {W.THREADS} threads", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    W.add_common_args(ap, "latency.json")
    W.add_decode_args(ap, "aiayn,ctranslate2")
    ap.add_argument("--data-dir", help="a folder with Multi30k's test_2016_flickr.{en,de}.gz (default: the "
                    "data mirror $AIAYN_DATA_MIRROR or the download cache, as `aiayn prepare` finds them)")
    ap.add_argument("--plot", help="write throughput against batch size as a PNG here")
    ap.add_argument("--auto-only", action="store_true", help="aiayn in the precision `--dtype auto` picks on "
                    "this CPU (eager) and CTranslate2 int8 only")
    ap.add_argument("--batches", type=parse_batches, default=BATCHES,
                    help="sentences per call of the throughput sweep, comma-separated (default 1,8,64,256; "
                         "1 is the latency pass and always runs)")
    ap.add_argument("--sentences", type=int, default=LATENCY_SENTS,
                    help=f"sentences of the latency pass, one per call (default {LATENCY_SENTS})")
    args = ap.parse_args()
    if not 2 <= args.sentences <= SWEEP_SENTS:
        ap.error(f"--sentences {args.sentences}: from 2 to {SWEEP_SENTS}")
    runs = W.apply_common_args(args)
    if args.data_dir is None:
        args.data_dir = str(multi30k_test_dir())
    if args.one:
        root, system, dtype = args.one
        print(json.dumps(run_one(Path(root), system, dtype, runs, Path(args.data_dir), args.batches,
                                 args.sentences)))
        return
    W.setup_threads()
    with W.model_root(args.workdir) as root:
        cpu_decode.build_models(root)
        rows = []
        for system, dtype in selected_rows(set(args.systems.split(",")), args.auto_only):
            if skip := W.emulated(dtype, args.emulated):
                rows.append({"system": system, "dtype": dtype, "skipped": skip})
                print(f"  {system} {dtype}: skipped: {skip}", file=sys.stderr)
                continue
            row = W.run_isolated(__file__, ["--one", str(root), system, dtype, "--runs", str(runs),
                                            "--data-dir", args.data_dir, "--sentences", str(args.sentences),
                                            "--batches", ",".join(map(str, args.batches))])
            rows.append({"system": system, "dtype": dtype, **row})
            print(f"  {system} {dtype}: p50 {row.get('p50_ms', 0):.1f} ms {row.get('skipped', '')}",
                  file=sys.stderr)
    print(f"machine: {W.machine()}")
    print_tables(rows)
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": W.machine(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
