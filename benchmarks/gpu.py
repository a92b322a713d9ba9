"""Everything measured on one GPU, in one run: the CUDA tests, training and decoding speed
against peers on the same device, the matmul ceiling, DDP over every GPU, and optionally
`make multi30k`.

Sections (each one's failure is recorded in the JSON and the run goes on):

- peak: the measured bf16 matmul rate (fp32 on a CPU), the denominator of MFU; the
  datasheet's dense peak of the GPU (:data:`DATASHEET_TFLOPS`) is the second one.
- train: target tokens/s, MFU (against both peaks) and peak memory of one update (forward,
  backward, Adam) of Transformer base and big, vocabulary 32,000, on a WMT-length synthetic
  batch of 768 pairs x 32 tokens (24,576 tokens per side); aiayn through its own ``Trainer``
  (fused loss and optimizer, ``train.dtype``) in every training mode (eager, ``train.compile``,
  ``train.compile_mode: reduce-overhead``), against torch.nn.Transformer and HF MarianMTModel
  (when transformers imports) with the same shapes, dtype and Adam; the fastest aiayn mode
  per model and the hours of the paper's recipes at its speed.
- decode: beam 4, exactly 40 new tokens, 24-token sources, at 1, 64 and 512 sentences;
  aiayn eager and with its CUDA-graph step (``--compile``), against HF ``generate`` and
  CTranslate2 (when its CUDA build loads; a skipped row says why) on the same weights
  (aiayn's export), in the same dtype.
- ddp: aiayn's base training step under torchrun over every GPU this machine has (NCCL), its
  tokens/s against one GPU's: the scaling factor (a world of one elsewhere).
- tests: ``pytest -m cuda`` (every CUDA path; they skip without a GPU): the counts and each
  test's outcome by name, within the time left.
- multi30k (``--multi30k UPDATES``, needs the data mirror): scripts/multi30k.sh on this
  device with ``train.max_steps=UPDATES``: test2016 BLEU and wall time.

Precision: bf16 where the GPU has it (Ampere and later), else fp16 (aiayn with its gradient
scaler); fp32 on a CPU. Nothing is downloaded. The run keeps to ``--budget`` seconds (8
minutes by default, ``--multi30k`` aside): a part that would start past it is recorded as
skipped, with the reason.

    python benchmarks/gpu.py [--json FILE] [--multi30k 4000 --data-dir DIR]
    python benchmarks/gpu.py --device cpu --quick     # tiny sizes: checks the script runs
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
try:
    import aiayn  # noqa: F401
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO / "src"))
import workloads as W  # noqa: E402

# The cuda-marked tests; the full run collects every test directory and keeps the marked ones.
CUDA_TEST_FILES = ["tests/training/test_cuda_training.py", "tests/inference/test_cuda_inference.py",
                   "tests/inference/test_cuda_graph_decoding.py", "tests/serving/test_cuda_serve.py"]
# The cuda tests run last, in the time the budget leaves, but never in less than this.
MIN_TESTS_TIMEOUT = 120.0


@dataclass(frozen=True)
class Sizes:
    """The workload: the full one, or ``--quick``'s tiny one (a check that the script runs)."""

    models: dict[str, dict[str, Any]]  # name -> model_preset overrides
    vocab: int
    train_pairs: int
    train_len: int
    decode_sentences: tuple[int, ...]
    decode_src_len: int
    decode_new: int
    beam: int
    train_steps: int  # timed updates per system
    decode_runs: int
    matmul_n: int


FULL = Sizes(models={"base": {}, "big": {}}, vocab=W.VOCAB, train_pairs=768, train_len=32,
             decode_sentences=(1, 64, 512), decode_src_len=W.DECODE_SRC_LEN, decode_new=W.DECODE_NEW,
             beam=W.BEAM, train_steps=10, decode_runs=3, matmul_n=8192)
TINY = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 1, "n_decoder_layers": 1, "max_positions": 64}
QUICK = Sizes(models={"base": TINY, "big": {**TINY, "d_model": 64, "d_ff": 128}}, vocab=64, train_pairs=8,
              train_len=8, decode_sentences=(1, 4), decode_src_len=6, decode_new=4, beam=2, train_steps=1,
              decode_runs=1, matmul_n=256)

# Dense (no sparsity) tensor-core peaks from NVIDIA's datasheets, TFLOP/s, in the precision
# the run trains in: bf16 from Ampere on, fp16 before (V100, T4 have no bf16). Matched against
# the device's name in this order (the first entry contained in the name wins).
DATASHEET_TFLOPS: list[tuple[str, str, float]] = [
    ("H200 NVL", "bf16", 835.0),
    ("H200", "bf16", 989.0),  # SXM
    ("H100 PCIe", "bf16", 756.0),
    ("H100 NVL", "bf16", 835.0),
    ("H100", "bf16", 989.0),  # SXM
    ("GH200", "bf16", 989.0),
    ("A100", "bf16", 312.0),
    ("A10", "bf16", 125.0),
    ("L40S", "bf16", 362.0),
    ("L40", "bf16", 181.0),
    ("L4", "bf16", 121.0),
    ("A6000", "bf16", 155.0),
    ("V100 PCIE", "fp16", 112.0),
    ("V100", "fp16", 125.0),  # SXM2
    ("T4", "fp16", 65.0),
]


def datasheet_tflops(name: str | None, dtype: str) -> float | None:
    """The datasheet's dense peak of the GPU called ``name`` in ``dtype``; None for a CPU, an
    unlisted GPU, or a precision the table does not give for it."""
    if not name:
        return None
    for key, peak_dtype, tflops in DATASHEET_TFLOPS:
        if key in name.replace("-", " "):
            return tflops if peak_dtype == dtype else None
    return None


# ----------------------------------------------------------------------------- device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_dtype(device: torch.device) -> str:
    """bf16 on GPUs that have it, fp16 on older ones, fp32 on a CPU."""
    from aiayn.runtime.devices import cuda_native_bf16

    if device.type != "cuda":
        return "fp32"
    return "bf16" if cuda_native_bf16(device) else "fp16"


def describe(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "python": platform.python_version()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, capability=f"{props.major}.{props.minor}",
                    memory_gb=round(props.total_memory / 1e9, 1), cuda=torch.version.cuda)
    else:
        info["name"] = W.machine()
    return info


def reset_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gb(device: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(device) / 1e9, 2) if device.type == "cuda" else None


def matmul_tflops(device: torch.device, dtype: torch.dtype, n: int, reps: int = 50) -> float:
    """Measured dense matmul rate in ``dtype``: the ceiling MFU is taken against."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12


def train_flop_per_token(cfg: Any, length: int) -> float:
    """Forward + backward FLOPs per target token (3x the forward's matmuls), equal source and
    target lengths: per layer the projections, the feed-forward and the attention scores."""
    d, ff = cfg.d_model, cfg.d_ff
    attention = 4 * length * d  # QK^T and AV of one token, multiply-adds counted twice
    encoder = cfg.n_encoder_layers * (8 * d * d + 4 * d * ff + attention)
    decoder = cfg.n_decoder_layers * (16 * d * d + 2 * attention + 4 * d * ff)
    return 3.0 * (encoder + decoder + 2 * d * cfg.tgt_vocab_size)


# ----------------------------------------------------------------------------- sections


def run_section(name: str, fn: Callable[[], Any], report: dict[str, Any], path: str | None = None) -> Any:
    """``fn()`` into ``report[name]``; an exception is recorded there and the run goes on. The
    report so far is written to ``path``, if given: a run stopped later keeps this section."""
    t0 = time.perf_counter()
    print(f"== {name}", file=sys.stderr, flush=True)
    try:
        report[name] = fn()
    except Exception as exc:  # a broken section must not lose the others' figures
        traceback.print_exc()
        report[name] = {"error": f"{type(exc).__name__}: {exc}"}
    report.setdefault("section_seconds", {})[name] = round(time.perf_counter() - t0, 1)
    if path:
        Path(path).write_text(json.dumps(report, indent=1))
    return report[name]


TEST_OUTCOME = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
SKIP_REASON = re.compile(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$")


def cuda_tests(paths: list[str], timeout: float, log_path: str | None = None) -> dict[str, Any]:
    """``pytest -m cuda`` over ``paths`` in a child process, counted from its verbose output
    (so that a run stopped at ``timeout`` still reports the tests it finished); the output is
    also written to ``log_path`` when given."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-v", "-rs", "-p", "no:cacheprovider", *paths]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        timed_out = True
    if log_path:
        Path(log_path).write_text(output)
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    key = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped",
           "XFAIL": "skipped"}
    failures, skip_reasons = [], set()
    outcomes: dict[str, str] = {}
    for line in output.splitlines():
        if match := TEST_OUTCOME.match(line):
            counts[key[match[2]]] += 1
            outcomes[match[1]] = key[match[2]]
            if match[2] in ("FAILED", "ERROR"):
                failures.append(match[1])
        elif match := SKIP_REASON.match(line):
            skip_reasons.add(match[1])
    if sum(counts.values()) == 0 and proc.returncode not in (0, 5):  # 5: nothing collected
        raise RuntimeError(f"pytest exited {proc.returncode}: {output[-2000:]}")
    return {**counts, "exit_code": proc.returncode, "timed_out": timed_out, "failures": failures,
            "skip_reasons": sorted(skip_reasons), "outcomes": outcomes, "seconds": round(time.perf_counter() - t0, 1),
            "summary": (output.strip().splitlines() or [""])[-1]}


# ----------------------------------------------------------------------------- training


def train_batch(sizes: Sizes, device: torch.device) -> Any:
    """``train_pairs`` pairs of ``train_len`` tokens per side (source with EOS, target with
    BOS / EOS), no padding, already on ``device``."""
    import numpy as np

    from aiayn.data.batching import collate

    rng = np.random.default_rng(W.SEED)
    n = sizes.train_len
    samples = [(i, np.append(rng.integers(4, sizes.vocab, n - 1), W.EOS), rng.integers(4, sizes.vocab, n - 1))
               for i in range(sizes.train_pairs)]
    return collate(samples).to(device)


def model_config(name: str, sizes: Sizes) -> Any:
    from aiayn.config import model_preset

    return model_preset(name, **{"src_vocab_size": sizes.vocab, "tgt_vocab_size": sizes.vocab,
                                 **sizes.models[name]})


# aiayn's training modes: the eager forward, `train.compile`, and `train.compile_mode: reduce-overhead`
# (CUDA graphs over static shapes).
TRAIN_MODES = {"eager": "aiayn", "compile": "aiayn+compile", "reduce-overhead": "aiayn+reduce-overhead"}


def aiayn_train_step(model_cfg: Any, dtype: str, device: torch.device, sizes: Sizes, mode: str = "eager",
                     dist_info: Any = None) -> Callable:
    """The real ``Trainer`` (its fused loss, optimizer and autocast) on one batch per update, in
    training ``mode`` (:data:`TRAIN_MODES`). The token budget is the batch's own, its lengths
    one bucket: reduce-overhead's static shapes pad nothing."""
    from aiayn.config import Config, DataConfig, TrainConfig
    from aiayn.model import build_model
    from aiayn.training.trainer import Trainer

    train = TrainConfig(dtype=dtype, device=device.type, compile=mode != "eager",
                        compile_mode="reduce-overhead" if mode == "reduce-overhead" else "default",
                        length_multiple=sizes.train_len, lr_schedule="constant", lr=1e-4,
                        warmup_steps=0, max_tokens=sizes.train_pairs * sizes.train_len, log_every=0, valid_every=0,
                        save_every=0, progress_bar=False, label_smoothing=0.1)
    cfg = Config(model=model_cfg, data=DataConfig(), train=train)
    cfg.validate()
    trainer = Trainer(cfg, build_model(model_cfg), device=device, dist_info=dist_info)

    def step(batch: Any) -> None:
        trainer.train_step([batch])
    return step


def _amp(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    from aiayn.runtime.precision import torch_dtype

    amp_dtype = torch_dtype(dtype)
    return torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else contextlib.nullcontext()


def _adam(model: torch.nn.Module, device: torch.device) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                            fused=device.type == "cuda")


def _smoothed_loss(logits: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tgt_out.reshape(-1),
                           ignore_index=W.PAD, label_smoothing=0.1, reduction="sum")


class NNTransformer(torch.nn.Module):
    """torch.nn.Transformer with tied embeddings and sinusoids: the plain-PyTorch peer."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        d = cfg.d_model
        self.d = d
        self.embed = torch.nn.Embedding(cfg.tgt_vocab_size, d, padding_idx=W.PAD)
        self.core = torch.nn.Transformer(d, cfg.n_heads, cfg.n_encoder_layers, cfg.n_decoder_layers, cfg.d_ff,
                                         dropout=cfg.dropout, batch_first=True)
        pos = torch.arange(512)[:, None] / torch.pow(10000, torch.arange(0, d, 2) / d)
        pe = torch.zeros(512, d)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos), torch.cos(pos)
        self.register_buffer("pe", pe)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        def emb(x: torch.Tensor) -> torch.Tensor:
            return self.embed(x) * self.d**0.5 + self.pe[: x.size(1)]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), device=src.device)
        h = self.core(emb(src), emb(tgt_in), tgt_mask=mask, tgt_is_causal=True,
                      src_key_padding_mask=src == W.PAD, memory_key_padding_mask=src == W.PAD)
        return F.linear(h, self.embed.weight)


def nn_train_step(model_cfg: Any, dtype: str, device: torch.device) -> Callable:
    model = NNTransformer(model_cfg).to(device).train()
    opt = _adam(model, device)

    def step(batch: Any) -> None:
        with _amp(device, dtype):
            logits = model(batch.src, batch.tgt_in)
        loss = _smoothed_loss(logits, batch.tgt_out) / batch.n_tgt_tokens
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()  # as the trainer, which reads its loss every update
    return step


def marian_config(model_cfg: Any) -> Any:
    from transformers import MarianConfig

    return MarianConfig(vocab_size=model_cfg.tgt_vocab_size, d_model=model_cfg.d_model,
                        encoder_layers=model_cfg.n_encoder_layers, decoder_layers=model_cfg.n_decoder_layers,
                        encoder_attention_heads=model_cfg.n_heads, decoder_attention_heads=model_cfg.n_heads,
                        encoder_ffn_dim=model_cfg.d_ff, decoder_ffn_dim=model_cfg.d_ff, activation_function="relu",
                        dropout=model_cfg.dropout, attention_dropout=0.0, activation_dropout=0.0,
                        scale_embedding=True, pad_token_id=W.PAD, eos_token_id=W.EOS, decoder_start_token_id=W.BOS,
                        max_position_embeddings=512)


def hf_train_step(model_cfg: Any, dtype: str, device: torch.device) -> Callable:
    from transformers import MarianMTModel

    model = MarianMTModel(marian_config(model_cfg)).to(device).train()
    opt = _adam(model, device)

    def step(batch: Any) -> None:
        with _amp(device, dtype):
            logits = model(input_ids=batch.src, attention_mask=batch.src != W.PAD,
                           decoder_input_ids=batch.tgt_in).logits
        loss = _smoothed_loss(logits, batch.tgt_out) / batch.n_tgt_tokens
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
    return step


def time_train(build: Callable[[], Callable], batch: Any, steps: int, device: torch.device,
               warmup: int = 2) -> dict[str, Any]:
    reset_memory(device)
    torch.manual_seed(W.SEED)
    t0 = time.perf_counter()
    step = build()
    for _ in range(warmup):
        step(batch)
    sync(device)
    first = time.perf_counter() - t0
    seconds = []
    for _ in range(steps):
        t = time.perf_counter()
        step(batch)
        sync(device)
        seconds.append(time.perf_counter() - t)
    tokens = int(batch.n_tgt_tokens)
    out = {"tokens_per_step": tokens, "tokens_per_s": tokens / statistics.median(seconds), "seconds": seconds,
           "build_and_warmup_s": round(first, 2), "peak_memory_gb": peak_memory_gb(device)}
    del step
    reset_memory(device)
    return out


# The paper's training runs (section 5.2): 100,000 updates for base, 300,000 for big, each of
# about 25,000 target tokens.
PAPER_UPDATES = {"base": 100_000, "big": 300_000}
PAPER_TOKENS_PER_UPDATE = 25_000


def paper_recipe_hours(model: str, tokens_per_s: float) -> float | None:
    """Hours the paper's recipe for ``model`` takes on one device at ``tokens_per_s``."""
    updates = PAPER_UPDATES.get(model)
    return None if updates is None else updates * PAPER_TOKENS_PER_UPDATE / tokens_per_s / 3600


@contextlib.contextmanager
def light_compile(enabled: bool) -> Iterator[None]:
    """``--quick`` on a CPU: the compiled training modes trace with dynamo as they would, then
    run the traced graphs through ``aot_eager`` instead of building inductor's C++ kernels
    (minutes on a small CPU): a check that the modes run, not a measurement."""
    if not enabled:
        yield
        return
    import aiayn.training.trainer as trainer_module

    original = trainer_module.compiled_forward
    trainer_module.compiled_forward = lambda model, mode: (  # type: ignore[assignment]
        model if mode is None else torch.compile(model, backend="aot_eager"))
    try:
        yield
    finally:
        trainer_module.compiled_forward = original


class Budget:
    """The run's time limit: what is left of ``seconds`` since it was made."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.perf_counter()

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def exceeded(self, reserve: float = 0.0) -> str | None:
        """Why a part needing about ``reserve`` more seconds must not start, or None."""
        left = self.left()
        return None if left > reserve else f"time budget: {max(left, 0):.0f} s left of {self.seconds:.0f} s"


# Seconds to keep for what follows the compiled training modes (decoding, DDP, the tests).
RESERVE_AFTER_TRAINING = 200.0


def training(sizes: Sizes, device: torch.device, dtype: str, peak_tflops: float | None,
             datasheet: float | None, budget: Budget) -> list[dict[str, Any]]:
    batch = train_batch(sizes, device)
    rows = []
    for name in sizes.models:
        model_cfg = model_config(name, sizes)
        flop = train_flop_per_token(model_cfg, sizes.train_len)
        systems: list[tuple[str, str, Callable[[], Callable]]] = [
            (system, mode, lambda m=model_cfg, mode=mode: aiayn_train_step(m, dtype, device, sizes, mode))
            for mode, system in TRAIN_MODES.items()]
        systems += [("nn.Transformer", "eager", lambda m=model_cfg: nn_train_step(m, dtype, device)),
                    ("hf", "eager", lambda m=model_cfg: hf_train_step(m, dtype, device))]
        for system, mode, build in systems:
            row: dict[str, Any] = {"model": name, "system": system, "mode": mode, "dtype": dtype,
                                   "flop_per_token": flop}
            over = budget.exceeded(RESERVE_AFTER_TRAINING) if mode != "eager" else None
            if over:
                row["skipped"] = over
            else:
                try:
                    with light_compile(sizes is QUICK and device.type == "cpu" and mode != "eager"):
                        row.update(time_train(build, batch, sizes.train_steps, device))
                    if peak_tflops:
                        row["mfu"] = row["tokens_per_s"] * flop / (peak_tflops * 1e12)
                    row["mfu_datasheet"] = row["tokens_per_s"] * flop / (datasheet * 1e12) if datasheet else None
                    row["paper_recipe_hours"] = paper_recipe_hours(name, row["tokens_per_s"])
                except Exception as exc:  # e.g. transformers missing, or out of memory
                    row["skipped"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    reset_memory(device)
            print(f"  train {name} {system}: {row.get('tokens_per_s', 0):,.0f} tok/s {row.get('skipped', '')}",
                  file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def fastest_modes(train: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model, aiayn's fastest training mode in this run, its tokens/s and the hours of
    the paper's recipe at that speed."""
    out: dict[str, dict[str, Any]] = {}
    for r in train:
        if r["system"] in TRAIN_MODES.values() and "skipped" not in r:
            best = out.get(r["model"])
            if best is None or r["tokens_per_s"] > best["tokens_per_s"]:
                out[r["model"]] = {"mode": r["mode"], "tokens_per_s": r["tokens_per_s"],
                                   "paper_recipe_hours": r["paper_recipe_hours"]}
    return out


# ----------------------------------------------------------------------------- DDP


def ddp_worker(path: str, device_name: str, quick: bool) -> None:
    """One rank of :func:`ddp` (under torchrun): aiayn's base training step, the same batch
    per rank; rank 0 writes the world's target tokens/s to ``path``."""
    from aiayn.training.distributed import all_reduce_sum, cleanup, init_distributed

    sizes = QUICK if quick else FULL
    info, device = init_distributed(device_name)
    try:
        dtype = bench_dtype(device)
        batch = train_batch(sizes, device)
        step = aiayn_train_step(model_config("base", sizes), dtype, device, sizes, dist_info=info)
        for _ in range(2):
            step(batch)
        sync(device)
        seconds = []
        for _ in range(sizes.train_steps):
            t = time.perf_counter()
            step(batch)
            sync(device)
            seconds.append(time.perf_counter() - t)
        median_s = all_reduce_sum([statistics.median(seconds)], info, device)[0] / info.world_size  # mean of ranks'
        if info.is_main:
            tokens = int(batch.n_tgt_tokens) * info.world_size
            backend = torch.distributed.get_backend() if info.enabled else None
            Path(path).write_text(json.dumps({"world_size": info.world_size, "backend": backend, "dtype": dtype,
                                              "tokens_per_step": tokens, "tokens_per_s": tokens / median_s}))
    finally:
        cleanup()


def ddp(device: torch.device, quick: bool, single: float | None, timeout: float) -> dict[str, Any]:
    """torchrun over every GPU of this machine (one process elsewhere): the world's tokens/s and
    the scaling factor against one device's (``single``: aiayn's eager base row)."""
    world = torch.cuda.device_count() if device.type == "cuda" else 1
    with tempfile.TemporaryDirectory(prefix="aiayn-gpu-ddp-") as tmp:
        out = Path(tmp) / "ddp.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
               str(Path(__file__).resolve()), "--ddp-worker", str(out), "--device", device.type]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run(cmd + (["--quick"] if quick else []), cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=timeout)
        if proc.returncode != 0 or not out.is_file():
            raise RuntimeError(f"torchrun exited {proc.returncode}: {proc.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(out.read_text())
    scaling = result["tokens_per_s"] / single if single else None
    result.update(single_device_tokens_per_s=single, scaling=scaling,
                  efficiency=scaling / result["world_size"] if scaling else None)
    return result


# ----------------------------------------------------------------------------- decoding


def build_decode_models(root: Path, sizes: Sizes) -> dict[str, Path]:
    """Random base weights and a word tokenizer (one piece per id) -> the aiayn checkpoint,
    its HF export and the CTranslate2 conversion of that, as far as the peers import."""
    from aiayn.checkpoint.directory import save_checkpoint
    from aiayn.config import Config
    from aiayn.errors import InteropError
    from aiayn.model import build_model
    from aiayn.text.tokenizer import train_tokenizer

    words = [f"w{i}" for i in range(sizes.vocab - 4)]
    lines = [" ".join(words[i:i + 20]) for i in range(0, len(words), 20)]
    tok = train_tokenizer(lines, lines, root / "spm", sizes.vocab, model_type="word", input_sentence_size=0)
    torch.manual_seed(W.SEED)
    cfg = Config(model=model_config("base", sizes))
    model = build_model(cfg.model).eval()
    paths = {"aiayn": save_checkpoint(root / "aiayn", model, cfg, tok)}
    try:
        from aiayn.interop.hf_export import save_hf_dir

        save_hf_dir(model, cfg, tok, root / "hf", warn_generation=False)
        paths["hf"] = root / "hf"
    except (ImportError, InteropError) as exc:
        print(f"  HF transformers unavailable: {exc}", file=sys.stderr)
        return paths
    try:
        from aiayn.interop.ctranslate2 import convert_hf_dir

        convert_hf_dir(root / "hf", root / "ct2")
        paths["ctranslate2"] = root / "ct2"
    except (ImportError, InteropError) as exc:  # the peer is not installed: its rows say so
        print(f"  CTranslate2 unavailable: {exc}", file=sys.stderr)
    return paths


def decode_sources(n: int, sizes: Sizes) -> torch.Tensor:
    g = torch.Generator().manual_seed(W.SEED)
    src = torch.randint(4, sizes.vocab, (n, sizes.decode_src_len), generator=g)
    src[:, -1] = W.EOS
    return src


def aiayn_decoder(path: Path, dtype: str, device: torch.device, sizes: Sizes, graphs: bool = False,
                  info: dict[str, Any] | None = None) -> Callable:
    """aiayn's beam search, eager or (``graphs``) with its CUDA-graph step (``--compile`` on a
    GPU); ``info`` receives how many graphs were recorded and whether it fell back to eager."""
    from aiayn.config import DecodeConfig
    from aiayn.inference.cuda_graphs import CudaGraphDecoder, uses_cuda_graphs
    from aiayn.inference.search import search
    from aiayn.inference.translator import Translator

    if graphs and not uses_cuda_graphs(device):
        raise RuntimeError(f"CUDA graphs need a CUDA device, not {device.type}")
    tr = Translator.from_checkpoint(path, device=device, dtype=dtype, compile=graphs)
    cfg = DecodeConfig(beam=sizes.beam, lenpen=0.6, min_len=sizes.decode_new, max_len_a=0.0,
                       max_len_b=sizes.decode_new)

    def run(src: torch.Tensor) -> None:
        with torch.inference_mode():
            search(tr.decoder, src.to(device), cfg)
        if info is not None and isinstance(tr.decoder, CudaGraphDecoder):
            info.update(graphs_recorded=len(tr.decoder.graphs.captured), fell_back=tr.decoder.compiled is None)
    return run


def hf_decoder(path: Path, dtype: str, device: torch.device, sizes: Sizes) -> Callable:
    from transformers import MarianMTModel

    from aiayn.runtime.precision import torch_dtype

    model = MarianMTModel.from_pretrained(path).to(device, dtype=torch_dtype(dtype) or torch.float32).eval()

    def run(src: torch.Tensor) -> None:
        src = src.to(device)
        with torch.inference_mode():
            model.generate(input_ids=src, attention_mask=torch.ones_like(src), num_beams=sizes.beam,
                           min_new_tokens=sizes.decode_new + 1, max_new_tokens=sizes.decode_new + 1,
                           length_penalty=0.6, early_stopping=True, do_sample=False)
    return run


CT2_COMPUTE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def ct2_decoder(path: Path, hf_path: Path, dtype: str, device: torch.device, sizes: Sizes) -> Callable:
    import ctranslate2

    if device.type == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        raise RuntimeError("this ctranslate2 build has no CUDA")
    index = device.index or 0
    translator = ctranslate2.Translator(str(path), device=device.type, device_index=index,
                                       compute_type=CT2_COMPUTE[dtype])
    vocab = json.loads((hf_path / "vocab.json").read_text())
    pieces = {i: p for p, i in vocab.items()}

    def run(src: torch.Tensor) -> None:
        batch = [[pieces[i] for i in row] for row in src.tolist()]
        translator.translate_batch(batch, beam_size=sizes.beam, length_penalty=0.6,
                                   min_decoding_length=sizes.decode_new, max_decoding_length=sizes.decode_new,
                                   max_batch_size=len(batch))
    return run


def decoding(sizes: Sizes, device: torch.device, dtype: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    graphs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="aiayn-gpu-decode-") as tmp:
        paths = build_decode_models(Path(tmp), sizes)
        systems: list[tuple[str, Callable[[], Callable]]] = [
            ("aiayn", lambda: aiayn_decoder(paths["aiayn"], dtype, device, sizes)),
            ("aiayn+cuda-graphs", lambda: aiayn_decoder(paths["aiayn"], dtype, device, sizes, True, graphs)),
            ("hf", lambda: hf_decoder(_built(paths, "hf"), dtype, device, sizes)),
            ("ctranslate2", lambda: ct2_decoder(_built(paths, "ctranslate2"), paths["hf"], dtype, device, sizes))]
        for system, build in systems:
            for row in _decode_rows(system, build, sizes, device, dtype):
                if system == "aiayn+cuda-graphs" and "skipped" not in row:
                    row.update(graphs)  # as of the end of the system's runs
                rows.append(row)
    return rows


def _built(paths: dict[str, Path], system: str) -> Path:
    """The model directory of ``system``; a peer whose package did not import has none."""
    if system not in paths:
        raise RuntimeError(f"{system} is not installed here")
    return paths[system]


def _decode_rows(system: str, build: Callable[[], Callable], sizes: Sizes, device: torch.device,
                 dtype: str) -> list[dict[str, Any]]:
    rows = []
    try:
        reset_memory(device)
        run = build()
    except Exception as exc:  # the peer is not installed, or cannot use this device
        reason = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"  decode {system}: skipped ({reason})", file=sys.stderr)
        return [{"system": system, "dtype": dtype, "sentences": n, "skipped": reason} for n in sizes.decode_sentences]
    for n in sizes.decode_sentences:
        row: dict[str, Any] = {"system": system, "dtype": dtype, "sentences": n}
        src = decode_sources(n, sizes)
        try:
            first: list[float] = []
            seconds = W.time_runs(lambda src=src: run(src), sizes.decode_runs, warmup=1, warmup_seconds=first)
            tokens = n * sizes.decode_new
            row.update(tokens=tokens, tokens_per_s=tokens / statistics.median(seconds), seconds=seconds,
                       first_call_s=round(first[0], 2), peak_memory_gb=peak_memory_gb(device))
        except Exception as exc:
            row["skipped"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"  decode {system} x{n}: {row.get('tokens_per_s', 0):,.0f} tok/s {row.get('skipped', '')}",
              file=sys.stderr, flush=True)
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- multi30k


@contextlib.contextmanager
def aiayn_command(tmp: Path) -> Iterator[Path]:
    """An executable running this interpreter's ``python -m aiayn`` from this checkout."""
    exe = tmp / "aiayn"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO / "src"}${{PYTHONPATH:+:$PYTHONPATH}}" '
                   f'exec "{sys.executable}" -m aiayn "$@"\n')
    exe.chmod(0o755)
    yield exe


def multi30k(updates: int, data_dir: str, device: torch.device, timeout: float) -> dict[str, Any]:
    """scripts/multi30k.sh with the recipe stopped by updates on ``device``."""
    with tempfile.TemporaryDirectory(prefix="aiayn-gpu-multi30k-") as tmp, aiayn_command(Path(tmp)) as exe:
        run = Path(tmp) / "run"
        env = {**os.environ, "AIAYN": str(exe), "DATA_DIR": data_dir, "RUN": str(run),
               "PREPARED": str(Path(tmp) / "prepared")}
        cmd = ["bash", "scripts/multi30k.sh", f"train.max_steps={updates}", "train.max_time_minutes=0",
               f"train.device={device.type}"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        seconds = round(time.perf_counter() - t0, 1)
        if proc.returncode != 0:
            raise RuntimeError(f"multi30k.sh exited {proc.returncode}: {proc.stderr[-2000:]}")
        score = json.loads((run / "test.score.json").read_text())
    return {"updates": updates, "seconds": seconds, "score": score}


# ----------------------------------------------------------------------------- report


def print_report(report: dict[str, Any]) -> None:
    info = report["machine"]
    peak = report.get("peak_tflops")
    print(f"\n{info.get('name')} ({info['device']}, torch {info['torch']}); measured {report.get('peak_dtype')} "
          f"matmul: {_fmt(peak if isinstance(peak, float) else None, '.3g')} TFLOP/s; datasheet: "
          f"{_fmt(report.get('datasheet_tflops'), '.0f')} TFLOP/s")
    tests = report.get("tests") or {}
    if "error" in tests:
        print(f"cuda tests: not run ({tests['error']})")
    elif tests:
        stopped = ", stopped at --tests-timeout" if tests["timed_out"] else ""
        print(f"cuda tests: {tests['passed']} passed, {tests['failed']} failed, {tests['errors']} errors, "
              f"{tests['skipped']} skipped ({tests['seconds']} s{stopped})")
        for name in tests["failures"]:
            print(f"  FAILED {name}")
    train = report.get("train")
    if isinstance(train, list):
        print(f"\n{'training':<10}{'system':<22}{'dtype':<7}{'tok/s':>12}{'MFU':>8}{'peak GB':>9}{'x nn':>7}"
              f"{'MFU sheet':>10}")
        for r in train:
            ref = next((x.get("tokens_per_s") for x in train if x["model"] == r["model"]
                        and x["system"] == "nn.Transformer" and "skipped" not in x), None)
            _print_row(r["model"], r, ref)
        _print_recipe_hours(report.get("fastest_training") or {})
    decode = report.get("decode")
    if isinstance(decode, list):
        print(f"\n{'decoding':<10}{'system':<22}{'dtype':<7}{'tok/s':>12}{'':>8}{'peak GB':>9}{'x hf':>7}")
        for r in decode:
            ref = next((x.get("tokens_per_s") for x in decode if x["sentences"] == r["sentences"]
                        and x["system"] == "hf" and "skipped" not in x), None)
            _print_row(f"{r['sentences']} sent.", r, ref)
    ddp_row = report.get("ddp")
    if ddp_row and "error" not in ddp_row:
        print(f"\nDDP ({ddp_row['backend'] or 'one process'}), world size {ddp_row['world_size']}: "
              f"{ddp_row['tokens_per_s']:,.0f} tok/s, scaling {_fmt(ddp_row['scaling'], '.2f')}x one device")
    m30k = report.get("multi30k")
    if m30k:
        done = "error" not in m30k
        print("\nmulti30k: " + (f"{m30k['updates']} updates, {m30k['seconds']} s, {m30k['score']}" if done
                                 else f"failed ({m30k['error']})"))
    for name, value in report.items():
        if isinstance(value, dict) and "error" in value and name not in ("tests", "multi30k", "ddp", "section_seconds"):
            print(f"{name}: failed ({value['error']})")
    print(f"\ntotal {report['seconds']:.0f} s")


def _print_recipe_hours(fastest: dict[str, dict[str, Any]]) -> None:
    for model, best in fastest.items():
        if best.get("paper_recipe_hours"):
            print(f"the paper's {model} recipe ({PAPER_UPDATES[model]:,} updates of "
                  f"{PAPER_TOKENS_PER_UPDATE:,} tokens) on one such device at aiayn's speed ({best['mode']}): "
                  f"{best['paper_recipe_hours']:.1f} h")


def _print_row(label: str, r: dict[str, Any], ref: float | None) -> None:
    head = f"{label:<10}{r['system']:<22}{r['dtype']:<7}"
    if "skipped" in r:
        print(head + f"  skipped: {r['skipped'][:90]}")
        return
    ratio = r["tokens_per_s"] / ref if ref else None
    print(head + f"{r['tokens_per_s']:>12,.0f}{_fmt(r.get('mfu'), '.0%'):>8}{_fmt(r.get('peak_memory_gb'), '.1f'):>9}"
          f"{_fmt(ratio, '.2f'):>7}" + (f"{_fmt(r.get('mfu_datasheet'), '.0%'):>10}" if "mfu_datasheet" in r else ""))


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one timed run: checks that the script runs")
    ap.add_argument("--json", default="gpu_benchmark.json", help="where the report goes (default %(default)s)")
    ap.add_argument("--budget", type=float, default=480.0,
                    help="seconds the run keeps to, --multi30k aside (default %(default)s)")
    ap.add_argument("--skip-tests", action="store_true", help="no pytest -m cuda")
    ap.add_argument("--tests", nargs="+", help="where pytest looks for the cuda tests "
                    "(default: tests/, or the cuda test files with --quick)")
    ap.add_argument("--tests-timeout", type=float, default=360.0,
                    help="seconds the cuda tests may take at most (and no more than the budget leaves)")
    ap.add_argument("--tests-log", metavar="FILE", help="also write pytest's output there")
    ap.add_argument("--skip-ddp", action="store_true", help="no torchrun over the GPUs")
    ap.add_argument("--ddp-worker", metavar="FILE", help=argparse.SUPPRESS)  # one rank of the ddp section
    ap.add_argument("--multi30k", type=int, metavar="UPDATES", help="run make multi30k stopped by UPDATES updates")
    ap.add_argument("--data-dir", default=os.environ.get("AIAYN_DATA_MIRROR", ""),
                    help="the data mirror for --multi30k (default: $AIAYN_DATA_MIRROR; with neither, downloaded)")
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.ddp_worker:
        ddp_worker(args.ddp_worker, args.device, args.quick)
        return {}
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: CUDA is not available here (--device cpu --quick checks the script)")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    sizes = QUICK if args.quick else FULL
    if device.type == "cpu":
        W.setup_threads()
    dtype = bench_dtype(device)
    t0 = time.perf_counter()
    budget = Budget(args.budget)
    report: dict[str, Any] = {"machine": describe(device), "quick": args.quick, "dtype": dtype,
                              "budget_s": args.budget}
    peak_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16 if dtype == "fp16" else torch.float32
    report["peak_dtype"] = str(peak_dtype).removeprefix("torch.")
    report["datasheet_tflops"] = datasheet = datasheet_tflops(report["machine"].get("name") if device.type == "cuda"
                                                              else None, dtype)

    def section(name: str, fn: Callable[[], Any]) -> Any:
        return run_section(name, fn, report, args.json)

    peak = section("peak_tflops", lambda: matmul_tflops(device, peak_dtype, sizes.matmul_n))
    peak = peak if isinstance(peak, float) else None
    train = section("train", lambda: training(sizes, device, dtype, peak, datasheet, budget))
    report["fastest_training"] = fastest_modes(train) if isinstance(train, list) else None
    section("decode", lambda: decoding(sizes, device, dtype))
    if args.skip_ddp:
        report["ddp"] = None
    else:
        single = next((r["tokens_per_s"] for r in train if r["model"] == "base" and r["system"] == "aiayn"
                       and "skipped" not in r), None) if isinstance(train, list) else None
        section("ddp", lambda: ddp(device, args.quick, single, timeout=max(budget.left(), 120.0)))
    if args.skip_tests:
        report["tests"] = None
    else:
        paths = args.tests or (CUDA_TEST_FILES if args.quick else ["tests"])
        timeout = max(min(args.tests_timeout, budget.left()), MIN_TESTS_TIMEOUT)
        section("tests", lambda: cuda_tests(paths, timeout=timeout, log_path=args.tests_log))
    if args.multi30k:
        section("multi30k", lambda: multi30k(args.multi30k, args.data_dir, device, timeout=1800))
    else:
        report["multi30k"] = None
    report["seconds"] = round(time.perf_counter() - t0, 1)
    Path(args.json).write_text(json.dumps(report, indent=1))
    print_report(report)
    print(f"written {args.json}")
    return report


if __name__ == "__main__":
    main()
