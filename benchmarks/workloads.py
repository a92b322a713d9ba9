"""The CPU benchmark workloads, defined once, and the helpers the benchmark scripts share.

- Model: Transformer base (d_model 512, 6+6 layers, 8 heads, d_ff 2048), shared vocabulary
  32,000, post-norm, sinusoidal positions, random weights from a fixed seed, 2 threads.
- Training step: 128 sentence pairs x 32 tokens per side (4,096 target tokens), forward +
  backward + Adam update; figure = target tokens/s.
- Decoding: 64 source sentences of 24 tokens (23 random ids + EOS), beam 4, exactly 40
  generated tokens per sentence (EOS suppressed until then by min/max length), all 64 in one
  call; figure = 64 x 40 / seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

VOCAB = 32000
D_MODEL, D_FF, HEADS, LAYERS = 512, 2048, 8, 6
TRAIN_PAIRS, TRAIN_LEN = 128, 32
DECODE_SENTS, DECODE_SRC_LEN, DECODE_NEW, BEAM = 64, 24, 40, 4
PAD, BOS, EOS = 0, 2, 3
SEED = 1234
THREADS = 2
# Where the benchmarks write their JSON rows when `--json` is given without a file name:
# one file per benchmark, the figures that docs/results.md quotes.
RESULTS = Path(__file__).resolve().parent / "results"


def setup_threads() -> None:
    torch.set_num_threads(THREADS)


def setup_process(system: str) -> None:
    """Threads, and for aiayn the allocator setting its `aiayn` command applies
    (aiayn.runtime.process.tune_allocator). ``--peers-malloc`` (env AIAYN_BENCH_PEERS_MALLOC=1)
    gives the peers the same setting, to separate the allocator's share of the gap."""
    setup_threads()
    if system == "aiayn" or os.environ.get("AIAYN_BENCH_PEERS_MALLOC") == "1":
        from aiayn.runtime.process import tune_allocator
        tune_allocator()


def add_json_arg(ap, name: str, dest: str = "json") -> None:
    """``--json [FILE]``: write the results as JSON to FILE, or to benchmarks/results/NAME."""
    ap.add_argument("--json", dest=dest, nargs="?", const=str(RESULTS / name), metavar="FILE",
                    help=f"write the results as JSON to FILE (no FILE: benchmarks/results/{name})")


def add_common_args(ap, json_name: str) -> None:
    ap.add_argument("--quick", action="store_true", help="one timed run per system (smoke check)")
    ap.add_argument("--runs", type=int, default=3)
    add_json_arg(ap, json_name)
    ap.add_argument("--peers-malloc", action="store_true",
                    help="apply aiayn's allocator setting (aiayn.runtime) to the peers too")
    ap.add_argument("--emulated", action="store_true",
                    help="also measure precisions this CPU only emulates (bf16 without AVX-512 BF16 or AMX), "
                         "each many times slower than float32; skipped by default")


def emulated(dtype: str, include: bool = False) -> str | None:
    """Why the row of precision ``dtype`` (``bf16``, ``bf16+compile``, ...) is skipped on this
    CPU: bf16 where it has no bf16 units (torch converts to float32 around each product, many
    times slower than float32 itself); None when it is measured (``include``: ``--emulated``)."""
    from aiayn.runtime.precision import native_bf16

    if include or not dtype.startswith(("bf16", "bfloat16")) or native_bf16("cpu"):
        return None
    return "bf16 is emulated on this CPU (no AVX-512 BF16 or AMX); --emulated measures it"


def add_decode_args(ap, systems: str) -> None:
    """The decoding benchmarks' --systems, --workdir and internal --one (one system's run)."""
    ap.add_argument("--systems", default=systems)
    ap.add_argument("--workdir", help="where the converted models are kept (default: a temporary dir)")
    ap.add_argument("--one", nargs=3, metavar=("ROOT", "SYSTEM", "DTYPE"), help=argparse.SUPPRESS)


@contextlib.contextmanager
def model_root(workdir: str | None) -> Iterator[Path]:
    """The converted models' folder: ``--workdir``, or a temporary one removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="aiayn-bench-") as tmp:
        root = Path(workdir or tmp)
        root.mkdir(parents=True, exist_ok=True)
        yield root


def apply_common_args(args) -> int:
    """Runs per system; exports --peers-malloc to the per-system processes."""
    if args.peers_malloc:
        os.environ["AIAYN_BENCH_PEERS_MALLOC"] = "1"
    return 1 if args.quick else args.runs


def train_batch(seed: int = SEED) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src (128, 32), tgt_in (128, 32) = BOS + y, tgt_out (128, 32) = y + EOS; no padding."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (TRAIN_PAIRS, TRAIN_LEN), generator=g)
    src[:, -1] = EOS
    y = torch.randint(4, VOCAB, (TRAIN_PAIRS, TRAIN_LEN - 1), generator=g)
    tgt_in = torch.cat([torch.full((TRAIN_PAIRS, 1), BOS), y], dim=1)
    tgt_out = torch.cat([y, torch.full((TRAIN_PAIRS, 1), EOS)], dim=1)
    return src, tgt_in, tgt_out


def decode_sources(seed: int = SEED) -> torch.Tensor:
    """(64, 24): 23 random ids + EOS."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (DECODE_SENTS, DECODE_SRC_LEN), generator=g)
    src[:, -1] = EOS
    return src


def _proc_status_mb(field: str) -> float | None:
    """A memory field of /proc/self/status (``VmHWM``, ``VmRSS``) in MB; None where absent."""
    try:
        for line in open("/proc/self/status", encoding="ascii"):
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB.

    From /proc/self/status (VmHWM): ``getrusage``'s ru_maxrss survives ``execve`` on Linux,
    so a system measured in a child of the benchmark process would report the parent's
    peak (the model conversion's) whenever its own is lower."""
    peak = _proc_status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """Resident set size now, in MB (0 where /proc is missing)."""
    return _proc_status_mb("VmRSS") or 0.0


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from aiayn.runtime.cpu import cpu_kind
    from aiayn.runtime.precision import native_bf16

    # The kind (AMX, AVX-512 BF16, AVX-512 VNNI, AVX2, ...; emulated when narrowed) and whether
    # bf16 is native decide how fast each precision's rows can be (docs/results.md names the
    # kind of every table).
    bf16 = "native bf16" if native_bf16("cpu") else "no native bf16 (emulated)"
    return f"{cpu}, {cpu_kind()}, {os.cpu_count()} cores, {THREADS} threads, {bf16}, torch {torch.__version__}"


@dataclass
class Timing:
    system: str
    dtype: str
    tokens: int
    seconds: list[float] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    skipped: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / statistics.median(self.seconds) if self.seconds else 0.0

    @property
    def best_tokens_per_s(self) -> float:
        return self.tokens / min(self.seconds) if self.seconds else 0.0


def aiayn_translator(root: Path, dtype: str):
    """The benchmark model as a Translator; ``dtype`` 'fp32', 'bf16', 'int8', or one of them
    with '+compile' (the decoding step compiled: aiayn.inference.compiled)."""
    from aiayn.inference.translator import Translator

    base, _, mode = dtype.partition("+")
    return Translator.from_checkpoint(root / "aiayn", dtype=base, compile=mode == "compile")


def time_runs(fn: Callable[[], None], runs: int, warmup: int = 1,
              warmup_seconds: list[float] | None = None) -> list[float]:
    """Seconds of each of ``runs`` calls after ``warmup`` untimed ones (their seconds are
    appended to ``warmup_seconds`` if given: a compiled path's first call compiles)."""
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        if warmup_seconds is not None:
            warmup_seconds.append(time.perf_counter() - t0)
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def matmul_gflops(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    """Measured matmul throughput: the physical ceiling the figures are compared with.
    int8: the kernel aiayn's int8 layers run (``aiayn.inference.quantize``): oneDNN's int8
    linear where torch has it, else ``torch._int_mm`` (int8 x int8 -> int32)."""
    mm: Callable[[], torch.Tensor]
    if dtype == torch.int8:
        from aiayn.inference import quantize

        a8 = torch.randint(-127, 128, (n, n), dtype=torch.int8)
        b8 = torch.randint(-63, 64, (n, n), dtype=torch.int8)
        if quantize.KERNEL == "onednn":
            xu, packed = quantize._as_uint8(a8), torch.ops.onednn.qlinear_prepack(b8, None)
            scale, zero = torch.ones(n), torch.zeros(n, dtype=torch.long)

            def mm() -> torch.Tensor:
                return quantize._onednn_linear(xu, packed, scale, zero)
        else:
            def mm() -> torch.Tensor:
                return torch._int_mm(a8, b8)
    else:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)

        def mm() -> torch.Tensor:
            return torch.matmul(a, b)
    mm()
    t0 = time.perf_counter()
    for _ in range(reps):
        mm()
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9


def run_isolated(script: str, args: list[str]) -> dict:
    """Run one system in a fresh process (so peak RSS is its own) and read its JSON row."""
    out = subprocess.run([sys.executable, script, *args], capture_output=True, text=True)
    if out.returncode != 0:
        return {"skipped": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_table(title: str, rows: list[dict], reference: dict[str, float]) -> None:
    print(f"\n{title}\nmachine: {machine()}")
    head = f"{'system':<16}{'dtype':<14}{'median tok/s':>14}{'best tok/s':>12}{'peak RSS MB':>13}"
    names = list(reference)
    print(head + "".join(f"{'x ' + n:>18}" for n in names))
    for r in rows:
        if r.get("skipped"):
            print(f"{r['system']:<16}{r['dtype']:<14}  skipped: {r['skipped']}")
            continue
        line = (f"{r['system']:<16}{r['dtype']:<14}{r['tokens_per_s']:>14.1f}{r['best_tokens_per_s']:>12.1f}"
                f"{r['peak_rss_mb']:>13.0f}")
        for n in names:
            line += f"{r['tokens_per_s'] / reference[n]:>18.2f}" if reference[n] else f"{'-':>18}"
        print(line)


def report_ceiling(ok: dict[tuple[str, str], float], rows: list[dict], flop_per_token: float,
                   json_path: str | None) -> None:
    """Print the measured matmul ceilings and aiayn's fraction of them; write the JSON rows."""
    # An emulated bf16 ceiling (no bf16 units) takes minutes and bounds no row that ran.
    ceilings = {"fp32": matmul_gflops(torch.float32)}
    if any(dtype.startswith("bf16") for _, dtype in ok):
        ceilings["bf16"] = matmul_gflops(torch.bfloat16)
    if any(system == "aiayn" and dtype.startswith("int8") for system, dtype in ok):
        ceilings["int8"] = matmul_gflops(torch.int8)
    print("\nmatmul ceiling: " + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in ceilings.items())
          + "; limit " + ", ".join(f"~{v * 1e9 / flop_per_token:.0f} tok/s ({k})" for k, v in ceilings.items()))
    for (system, dtype), tps in ok.items():
        if system == "aiayn":
            base = dtype.partition("+")[0]  # e.g. bf16+compile: bf16's limit
            peak = ceilings.get(base, ceilings["fp32"])
            print(f"aiayn {dtype}: {tps * flop_per_token / (peak * 1e9):.0%} of the {base} matmul limit")
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps({"machine": machine(), "matmul_gflops": ceilings,
                                               "rows": rows}, indent=2))
