"""The training data path alone, at the paper's batch size, and the time to the first update.

On a WMT-shaped synthetic corpus that this script writes and prepares with `aiayn prepare`
(Zipfian 50,000-word vocabularies, sentence lengths log-normal around WMT14's ~25 words, a
target/source length ratio log-normal around 1.05; a word-level vocabulary of 32,000), it times:

- building the training iterator (sorting by length, cutting 25,000-token batches) and one
  epoch's batch order, as `aiayn train` does before its first update;
- the loader alone over the epoch's first batches: gather from the memory-mapped ids and
  collate to padded tensors (batches/s, target tokens/s); then, as asked, with the batches
  pinned (``--pin``, CUDA only) and copied to the device (``--device cuda``: non-blocking
  from pinned memory), in the loop, and with that work done by the prefetching thread training
  uses (``--prefetch N``: N batches ahead, ``data.prefetch_batches``);
- `aiayn train` (a small 1-layer model) from process start to its training loop and to its
  first update, read from train.log and metrics.jsonl as they are written.

    python benchmarks/loader.py [--pairs 300000] [--max-tokens 25000] [--batches 200]
                                [--device cpu|cuda|auto] [--pin] [--prefetch N]
                                [--workdir DIR] [--threads 1] [--quick] [--json [FILE]]

Without CUDA, ``--pin`` and ``--device cuda`` are reported as unavailable and the rows are
timed on the CPU. ``--quick``: a small corpus (4,000 pairs, 4,000-token batches, a 2,000-word
vocabulary) and the loader only, to check that the script runs. ``--json`` alone writes
benchmarks/results/loader.json. The prepared corpus is kept in ``--workdir`` and reused
when its size matches.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aiayn.data.batching import BatchIterator
from aiayn.data.prefetch import HostTransfer, pinned
from aiayn.data.prepare import load_split

RESULTS = Path(__file__).resolve().parent / "results"
WORDS = 50_000
VOCAB = 32_000


# ------------------------------------------------------------------ the corpus

def _lexicon(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` distinct lower-case words, shorter ones for frequent ranks (as in natural text)."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words: dict[str, None] = {}
    while len(words) < n:
        length = int(np.clip(rng.poisson(2 + 6 * len(words) / n) + 1, 1, 14))
        words.setdefault("".join(rng.choice(letters, length)), None)
    return np.array(list(words))


def write_corpus(out: Path, pairs: int, seed: int = 1) -> dict[str, Path]:
    """train/valid source and target files of a WMT-shaped corpus under ``out``."""
    rng = np.random.default_rng(seed)
    src_words, tgt_words = _lexicon(rng, WORDS), _lexicon(rng, WORDS)
    zipf = 1.0 / np.arange(1, WORDS + 1)  # word of rank k: frequency proportional to 1/k
    zipf /= zipf.sum()
    files = {}
    for split, n in (("train", pairs), ("valid", 1000)):
        src_len = np.clip(rng.lognormal(np.log(22), 0.6, n), 1, 200).astype(np.int64)
        tgt_len = np.clip(src_len * rng.lognormal(np.log(1.05), 0.2, n), 1, 250).astype(np.int64)
        for side, lens, lexicon in (("src", src_len, src_words), ("tgt", tgt_len, tgt_words)):
            ranks = rng.choice(WORDS, int(lens.sum()), p=zipf)
            tokens = lexicon[ranks]
            ends = np.cumsum(lens)
            path = out / f"{split}.{side}"
            with open(path, "w", encoding="utf-8") as f:
                start = 0
                for end in ends:
                    f.write(" ".join(tokens[start:end]) + "\n")
                    start = end
            files[f"{split}_{side}"] = path
    return files


def prepare(workdir: Path, pairs: int, aiayn: list[str], vocab: int = VOCAB) -> tuple[Path, float]:
    """The prepared corpus (reused when it has ``pairs`` pairs); seconds spent preparing."""
    prepared = workdir / f"prepared_{pairs}_{vocab}"
    if (prepared / "summary.json").is_file():
        return prepared, 0.0
    text = workdir / f"text_{pairs}"
    shutil.rmtree(text, ignore_errors=True)
    text.mkdir(parents=True)
    files = write_corpus(text, pairs)
    start = time.perf_counter()
    subprocess.run([*aiayn, "prepare", "--out", str(prepared), "--force", "--quiet",
                    "--train-src", str(files["train_src"]), "--train-tgt", str(files["train_tgt"]),
                    "--valid-src", str(files["valid_src"]), "--valid-tgt", str(files["valid_tgt"]),
                    "--spm-model-type", "word", "--vocab-size", str(vocab),
                    "--spm-input-sentence-size", "200000"], check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    shutil.rmtree(text, ignore_errors=True)
    return prepared, seconds


# ------------------------------------------------------------------ the loader

def loader_setup(device_name: str, pin: bool, prefetch: int) -> tuple[HostTransfer, list[str]]:
    """The transfer the options ask for, and notes on what this machine cannot do: without
    CUDA, batches stay on the CPU and are not pinned (page-locking needs CUDA)."""
    notes = []
    cuda = torch.cuda.is_available()
    if device_name == "auto":
        device_name = "cuda" if cuda else "cpu"
    if device_name == "cuda" and not cuda:
        notes.append("--device cuda: no CUDA device here; batches stay on the CPU")
        device_name = "cpu"
    if pin and not cuda:
        notes.append("--pin: unavailable without CUDA (pinned memory is CUDA's); not pinned")
        pin = False
    device = torch.device(device_name)
    return HostTransfer(device=device, pin_memory=pin, non_blocking=pin, prefetch=prefetch), notes


def _label(transfer: HostTransfer) -> str:
    parts = ["gather + collate"]
    if transfer.pin_memory:
        parts.append("pin")
    if transfer.device.type != "cpu":
        parts.append(f"{'non-blocking ' if transfer.non_blocking else ''}copy to {transfer.device.type}")
    if transfer.prefetch:
        parts.append(f"prefetch {transfer.prefetch}")
    return " + ".join(parts)


def time_loader(prepared: Path, max_tokens: int, n_batches: int, transfer: HostTransfer) -> dict[str, Any]:
    """The iterator's build and epoch order, then rows of batches/s and target tokens/s over
    the epoch's first ``n_batches`` batches: gather + collate alone, then (when ``transfer``
    adds anything) with its pinning and copy to the device in the loop, then with its
    prefetching thread (``aiayn.data.prefetch``, as training uses it)."""
    ds = load_split(prepared, "train")
    start = time.perf_counter()
    it = BatchIterator(ds, max_tokens, seed=1, shuffle=True, mode="real")
    layout_s = time.perf_counter() - start
    start = time.perf_counter()
    order = it.epoch_batches(1)
    order_s = time.perf_counter() - start
    n_batches = min(n_batches, len(order))
    tgt_tokens = int(sum(int(ds.tgt_sizes[idx].sum()) + len(idx) for idx in order[:n_batches]))  # + EOS each
    rows: dict[str, Any] = {}

    def run(row: HostTransfer) -> None:
        copies = row.device.type != "cpu"
        warm = it.make_batch(order[0])  # first touch of the pages and allocators out of the timing
        if row.pin_memory:
            pinned(warm, row.device)
        it.transfer = row
        it.load_state_dict({"epoch": 1, "offset": 0})
        n = tokens = 0
        start = time.perf_counter()
        for batch in it:
            if copies:
                batch = row.to_device(batch)
            tokens += int(batch.n_tgt_tokens)
            n += 1
            if n == n_batches:
                break
        if copies:
            torch.cuda.synchronize(transfer.device)
        seconds = time.perf_counter() - start
        rows[_label(row)] = {"batches_per_s": n / seconds, "tgt_tokens_per_s": tokens / seconds,
                             "seconds": seconds, "pin": row.pin_memory, "copy_to": row.device.type if copies else None,
                             "prefetch": row.prefetch}

    run(HostTransfer(torch.device("cpu"), False, False, 0))
    in_loop = dataclasses.replace(transfer, prefetch=0)
    if in_loop.pin_memory or in_loop.device.type != "cpu":
        run(in_loop)
    if transfer.prefetch:
        run(transfer)
    it.close()
    return {"pairs": len(ds), "epoch_batches": len(order), "timed_batches": n_batches,
            "tgt_tokens_per_batch": tgt_tokens / n_batches, "iterator_build_s": layout_s,
            "epoch_order_s": order_s, "loader": rows}


# ------------------------------------------------------------------ start to first update

def time_first_update(prepared: Path, workdir: Path, aiayn: list[str], threads: int) -> dict[str, float]:
    """Seconds from starting `aiayn train` to its training loop (the log line "training N
    parameters": data loaded, batches laid out, model built) and to its first update done
    (the first line of metrics.jsonl). The model is small (1 layer a side, d_model 64), so that
    the second figure is the start-up plus little compute."""
    run_dir = workdir / "first_update_run"
    shutil.rmtree(run_dir, ignore_errors=True)
    config = workdir / "first_update.yaml"
    config.write_text(
        "model: {n_encoder_layers: 1, n_decoder_layers: 1, d_model: 64, n_heads: 4, d_ff: 256}\n"
        f"data: {{prepared_dir: {json.dumps(str(prepared))}}}\n"
        "train: {max_tokens: 25000, max_tokens_mode: real, max_steps: 1, log_every: 1, valid_every: 0,\n"
        "        save_every: 0, device: cpu, progress_bar: false}\n")
    cmd = [*aiayn, "train", "--config", str(config), "--run-dir", str(run_dir)]
    env = {**os.environ, "AIAYN_NUM_THREADS": str(threads)}
    log, metrics = run_dir / "train.log", run_dir / "metrics.jsonl"
    times: dict[str, float] = {}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None and "first_update_s" not in times:
        now = time.perf_counter() - start
        if "loop_start_s" not in times and log.is_file() and " training " in log.read_text():
            times["loop_start_s"] = now
        if metrics.is_file() and metrics.read_text().strip():
            times["first_update_s"] = now
        time.sleep(0.01)
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"aiayn train failed:\n{err[-2000:]}")
    end = time.perf_counter() - start  # what finished between two looks
    times.setdefault("loop_start_s", end)
    times.setdefault("first_update_s", end)
    shutil.rmtree(run_dir, ignore_errors=True)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=300_000, help="training pairs of the synthetic corpus")
    ap.add_argument("--max-tokens", type=int, default=25_000, help="real tokens per side per batch")
    ap.add_argument("--batches", type=int, default=200, help="batches timed (at most an epoch's)")
    ap.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                    help="where batches are copied (cuda: non-blocking, from pinned memory with --pin)")
    ap.add_argument("--pin", action="store_true", help="pin the collated batches (needs CUDA)")
    ap.add_argument("--prefetch", type=int, default=0, metavar="N",
                    help="also time a prefetching thread N batches ahead (0: not)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (loader and aiayn train)")
    ap.add_argument("--quick", action="store_true",
                    help="a small corpus and the loader only (no aiayn train): checks that the script runs")
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "aiayn_loader_bench"),
                    help="where the corpus is prepared and kept (default: a folder in the temporary directory)")
    ap.add_argument("--json", nargs="?", const=str(RESULTS / "loader.json"), metavar="FILE",
                    help="also write every figure as JSON to FILE (no FILE: benchmarks/results/loader.json)")
    args = ap.parse_args()
    if args.prefetch < 0:
        ap.error("--prefetch: must be 0 or more")
    if args.quick:
        args.pairs, args.max_tokens, args.batches = 4_000, 4_000, min(args.batches, 20)
    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    aiayn = [sys.executable, "-m", "aiayn"]
    transfer, notes = loader_setup(args.device, args.pin, args.prefetch)
    for note in notes:
        print(f"({note})")

    prepared, prepare_s = prepare(workdir, args.pairs, aiayn, vocab=2_000 if args.quick else VOCAB)
    loader = time_loader(prepared, args.max_tokens, args.batches, transfer)
    print(f"corpus: {loader['pairs']:,} pairs, {loader['epoch_batches']:,} batches of {args.max_tokens:,} real "
          f"tokens a side per epoch (~{loader['tgt_tokens_per_batch']:,.0f} target tokens each)"
          + (f"; prepared in {prepare_s:.1f} s" if prepare_s else "; prepared earlier"))
    print(f"iterator build {loader['iterator_build_s']:.3f} s, epoch order {loader['epoch_order_s']:.3f} s")
    print(f"\n| loader ({loader['timed_batches']} batches, {args.threads} thread(s)) | batches/s | target tokens/s |")
    print("|---|---:|---:|")
    for name, row in loader["loader"].items():
        print(f"| {name} | {row['batches_per_s']:,.1f} | {row['tgt_tokens_per_s']:,.0f} |")
    first = None
    if not args.quick:
        first = time_first_update(prepared, workdir, aiayn, args.threads)
        print(f"\naiayn train (1 layer a side, d_model 64): process start to the training loop "
              f"{first['loop_start_s']:.1f} s, to the first update done {first['first_update_s']:.1f} s")

    if args.json:
        out = {"benchmark": "loader", "command": " ".join(sys.argv), "quick": args.quick, "pairs": args.pairs,
               "max_tokens": args.max_tokens, "threads": args.threads, "device": str(transfer.device),
               "pin": transfer.pin_memory, "prefetch": transfer.prefetch, "unavailable": notes,
               "prepare_s": prepare_s or None, **loader, "train_start": first,
               "hardware": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
               "torch": torch.__version__}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
