"""Speed A/B of two source trees in one run: the decode and training benchmarks' aiayn rows.

    git worktree add /tmp/before <commit>
    python scripts/ab_speed.py --before /tmp/before --after . --workdir /tmp/decwd --rounds 3

Each measurement runs in a fresh process (``cpu_decode.py --one`` / ``cpu_train.py --one``,
the benchmarks' own isolated rows) with ``PYTHONPATH`` pointing at one tree's ``src``; the
trees alternate within every round, so drift of a shared machine hits both alike. Prints the
median tokens/s per (workload, tree) and the after/before ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKLOADS = [("decode", "fp32"), ("decode", "int8"), ("train", "fp32")]


def measure(tree: Path, workload: str, dtype: str, workdir: Path, runs: int) -> float:
    script = tree / "benchmarks" / ("cpu_decode.py" if workload == "decode" else "cpu_train.py")
    args = ["--one", str(workdir), "aiayn", dtype] if workload == "decode" else ["--one", "aiayn", dtype]
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run([sys.executable, str(script), *args, "--runs", str(runs)], env=env,
                         capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, required=True)
    ap.add_argument("--workdir", type=Path, required=True, help="the decode benchmark's models (cpu_decode.py)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3, help="timed runs per process (its median is one sample)")
    ap.add_argument("--workloads", default=",".join(f"{w}:{d}" for w, d in WORKLOADS),
                    help="comma-separated workload:dtype (default: all)")
    args = ap.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    workloads = [tuple(item.split(":")) for item in args.workloads.split(",")]
    samples: dict[tuple[str, str, str], list[float]] = {}
    for r in range(args.rounds):
        for workload, dtype in workloads:
            order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
            for name, tree in order:
                tps = measure(tree, workload, dtype, args.workdir, args.runs)
                samples.setdefault((workload, dtype, name), []).append(tps)
                print(f"round {r + 1} {workload} {dtype} {name}: {tps:.1f} tok/s", file=sys.stderr, flush=True)
    print("| workload | dtype | before tok/s | after tok/s | after / before |")
    print("|---|---|---|---|---|")
    for workload, dtype in workloads:
        b = statistics.median(samples[(workload, dtype, "before")])
        a = statistics.median(samples[(workload, dtype, "after")])
        print(f"| {workload} | {dtype} | {b:.1f} | {a:.1f} | {a / b:.3f} |")


if __name__ == "__main__":
    main()
