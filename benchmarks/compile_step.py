"""One decoding step, eager against `torch.compile` with a static key/value cache.

What `--compile` decoding is built on: `aiayn.inference.compiled.static_step`,
the step over a preallocated cache of fixed length ``--max-len`` that it writes at a
position given as a tensor, attending over all positions with the unfilled ones masked
(static shapes: no recompilation as the cache grows); the whole step (embedding, 6
decoder layers, vocabulary projection) compiled by inductor with weight freezing
(constant weights; oneDNN-packed where inductor packs).

Rows: the shipped eager step (`IncrementalDecoder.step`, growing cache), the static step
run eagerly, and compiled: static shapes (one compilation per row count) or dynamic
(one for all row counts). Per step, median of 20 after 2 warm-ups, milliseconds; the
compile time; the largest logit difference against the static eager step; the process's
resident memory after compiling against before. Model: cpu_decode.py's base model.
Each (dtype, mode) runs in its own process.

    python benchmarks/compile_step.py --workdir DIR [--rows 4 256] [--json [FILE]]

``--json`` alone writes benchmarks/results/compile_step.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_decode  # noqa: E402
import workloads as W  # noqa: E402

DTYPES, MODES = ("fp32", "bf16", "int8"), ("static", "dynamic")


def median_ms(fn, n: int = 20) -> float:
    return statistics.median(W.time_runs(fn, n, warmup=2)) * 1e3


def measure(dec, step, compiled, rows: int, max_len: int) -> dict:
    """Times at ``rows`` decoder rows (beam 4 groups) with the cache half filled."""
    group = 4 if rows >= 4 else 1
    filled = max_len // 2
    src = W.decode_sources()[:rows // group]
    state = dec.init_state(src, max_len)
    dec.reorder(state, torch.arange(src.size(0)).repeat_interleave(group))
    tokens = torch.full((rows,), 5)
    for _ in range(filled):
        dec.step(tokens, state)

    def shipped() -> None:
        dec.step(tokens, state)
        state.length -= 1  # the same position again

    layers = state.layers
    lineage = torch.arange(rows).repeat(max_len, 1)  # every hypothesis in its own row
    args = (tokens, torch.tensor(filled), lineage, [c.self_k for c in layers], [c.self_v for c in layers],
            [c.cross_k for c in layers], [c.cross_v for c in layers], state.src_mask)
    before, t0 = W.rss_mb(), time.perf_counter()
    compiled(*args)
    compile_s, grown = time.perf_counter() - t0, W.rss_mb() - before
    diff = (step(*args).float() - compiled(*args).float()).abs().max().item()
    return {"shipped_ms": median_ms(shipped), "static_eager_ms": median_ms(lambda: step(*args)),
            "compiled_ms": median_ms(lambda: compiled(*args)), "compile_s": compile_s,
            "rss_growth_mb": grown, "max_logit_diff": diff}


def run_one(root: Path, dtype: str, mode: str, rows: list[int], max_len: int) -> dict:
    from aiayn.inference.compiled import static_step
    from aiayn.inference.translator import Translator

    W.setup_process("aiayn")
    torch._inductor.config.freezing = True  # this process only measures
    dec = Translator.from_checkpoint(root / "aiayn", dtype=dtype).decoder
    step = static_step(dec.model, dec.project)
    compiled = torch.compile(step, dynamic=mode == "dynamic")
    with torch.inference_mode():
        return {"dtype": dtype, "mode": mode, "rows": {r: measure(dec, step, compiled, r, max_len) for r in rows}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", help="where the converted models are kept (default: a temporary dir)")
    ap.add_argument("--rows", type=int, nargs="+", default=[4, 256], help="decoder rows (beam x sentences)")
    ap.add_argument("--max-len", type=int, default=48, help="the static cache's positions (half filled)")
    W.add_json_arg(ap, "compile_step.json")
    ap.add_argument("--one", nargs=3, metavar=("ROOT", "DTYPE", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(Path(args.one[0]), args.one[1], args.one[2], args.rows, args.max_len)))
        return
    print(W.machine())
    results = []
    with W.model_root(args.workdir) as root:
        cpu_decode.build_models(root)
        for dtype in DTYPES:
            for mode in MODES:
                res = W.run_isolated(__file__, ["--one", str(root), dtype, mode, "--rows", *map(str, args.rows),
                                                "--max-len", str(args.max_len)])
                results.append(res)
                print_rows(dtype, mode, res)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1))


def print_rows(dtype: str, mode: str, res: dict) -> None:
    if "skipped" in res:
        print(f"{dtype:<6}{mode:<9} failed: {res['skipped']}")
        return
    for r, m in res["rows"].items():
        print(f"{dtype:<6}{mode:<9}rows {r:>4}: shipped {m['shipped_ms']:7.2f} ms, static eager "
              f"{m['static_eager_ms']:7.2f}, compiled {m['compiled_ms']:7.2f} "
              f"({m['compiled_ms'] / m['shipped_ms']:.2f}x shipped); compile {m['compile_s']:5.1f} s, "
              f"RSS +{m['rss_growth_mb']:.0f} MB, max |logit diff| {m['max_logit_diff']:.2g}")


if __name__ == "__main__":
    main()
