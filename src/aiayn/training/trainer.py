"""The training loop: the paper's recipe (section 5), exact resume, AMP, torchrun.

One *step* is one optimizer update over ``update_freq`` batches per process (times the
number of processes under torchrun). Its loss is the label-smoothed cross entropy summed
over all target tokens of the update, divided by that token count (as fairseq), so that
accumulating batches, or spreading them over processes, gives the gradient of one large
batch.

Exact resume: the data order is a function of (seed, epoch); a checkpoint stores the
iterator position, optimizer, grad scaler, step (the learning rate is a pure function of
it) and the Python/NumPy/torch RNG states (per process under torchrun), and validation
runs under a forked RNG. A CPU fp32 run stopped at step N and resumed therefore ends at
step 2N with the same weights, bit for bit, as a run that never stopped, provided the
same torch build, thread count (``AIAYN_NUM_THREADS`` / ``OMP_NUM_THREADS``) and data and
batching settings (``max_tokens``, ``update_freq``, ``seed``, number of processes) are used.
Changing those on resume is allowed; training then continues, just not bit-identically.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from aiayn.checkpoint import io as ckpt_io
from aiayn.config import Config, ModelConfig, to_dict
from aiayn.errors import AiaynError, CheckpointError, ConfigError
from aiayn.runtime import resolve_train_dtype
from aiayn.training.distributed import (
    DistInfo,
    all_gather_json,
    all_reduce_sum,
    barrier,
    cleanup,
    init_distributed,
)
from aiayn.training.loss import projected_label_smoothed_loss
from aiayn.training.metrics import MetricsLog, perplexity
from aiayn.training.optim import build_optimizer, set_lr
from aiayn.training.schedule import make_schedule

log = logging.getLogger(__name__)

SUMMARY_FILE = "train_summary.json"
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class TrainingError(AiaynError):
    """Training cannot go on: e.g. the loss stayed non-finite for too many updates."""


@dataclass
class StepResult:
    """What one update did (sums over all processes)."""

    loss_sum: float
    nll_sum: float
    n_tokens: int
    n_sentences: int
    grad_norm: float
    lr: float
    updated: bool  # False: skipped (non-finite loss/gradient, or an fp16 overflow)
    nonfinite: bool  # the loss or gradient was NaN/inf


@dataclass
class _Interval:
    """Accumulates the training records between two log lines."""

    loss: float = 0.0
    nll: float = 0.0
    tokens: int = 0
    steps: int = 0
    grad_norm: float = 0.0
    start: float = field(default_factory=time.monotonic)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ------------------------------------------------------------------------ trainer


class Trainer:
    """Owns the model, optimizer, schedule, data position and checkpoints of one run.

    ``train_batches`` is anything with the :class:`~aiayn.data.batching.BatchIterator`
    protocol (iterate -> the rest of the current epoch; ``epoch``, ``state_dict()``,
    ``load_state_dict()``, ``len()``). ``valid_batches`` is a list of batches. Both may be
    None for tests that drive :meth:`train_step` directly.
    """

    def __init__(
        self,
        cfg: Config,
        model: nn.Module,
        run_dir: str | Path | None = None,
        *,
        train_batches: Any = None,
        valid_batches: list[Any] | None = None,
        valid_text: tuple[list[str], list[str]] | None = None,
        tokenizer: Any = None,
        device: torch.device | str = "cpu",
        dist_info: DistInfo | None = None,
    ) -> None:
        self.cfg = cfg
        self.tc = cfg.train
        self.device = torch.device(device)
        self.dist = dist_info or DistInfo()
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.train_batches = train_batches
        self.valid_batches = valid_batches
        self.valid_text = valid_text
        self.tokenizer = tokenizer
        self.pad_id = cfg.model.pad_id

        # The precision in effect: train.dtype with "auto" resolved for this device.
        self.dtype = resolve_train_dtype(self.tc.dtype, self.device)
        self.amp_dtype = DTYPES[self.dtype]
        if self.dtype == "fp16" and self.device.type != "cuda":
            raise ConfigError("train.dtype: fp16 needs a CUDA device (it relies on a gradient "
                              "scaler); use bf16 on CPU")
        self.model = model.to(self.device)
        self.optimizer = build_optimizer(self.model, self.tc, self.device)
        self.schedule = make_schedule(self.tc, cfg.model.d_model)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == "fp16")
        self.params = [p for p in self.model.parameters() if p.requires_grad]

        wrapped: nn.Module = self.model
        if self.dist.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            # No buffers need syncing at each forward (the sinusoid table is a constant);
            # newer torch renamed the switch.
            ddp_cls = nn.parallel.DistributedDataParallel
            no_sync = "forward_sync_buffers" if "forward_sync_buffers" in \
                inspect.signature(ddp_cls.__init__).parameters else "broadcast_buffers"
            wrapped = ddp_cls(self.model, device_ids=ids, **{no_sync: False})
        self.ddp = wrapped if self.dist.enabled else None
        self.forward_model = torch.compile(wrapped) if self.tc.compile else wrapped

        # Progress, counted in updates actually applied.
        self.step = 0
        self.nonfinite_consecutive = 0
        self.nonfinite_total = 0
        self.overflow_total = 0
        self.tokens_seen = 0
        self.elapsed_before = 0.0  # wall time of earlier segments of this run (resume)
        self.best: dict[str, Any] | None = None
        self.last_valid: dict[str, Any] | None = None
        self._epoch_iter: Iterator[Any] | None = None
        self._stop_signal: int | None = None

        main = self.dist.is_main and self.run_dir is not None
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoints = ckpt_io.CheckpointManager(self.run_dir, self.tc.keep_last) \
            if self.run_dir is not None else None
        self.metrics = MetricsLog(self.run_dir, enabled=main, tensorboard=self.tc.tensorboard)
        self._last_saved_step: int | None = None
        self._last_valid_step: int | None = None
        self._t0: float | None = None

    # ------------------------------------------------------------------ one update

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _grad_norm(self) -> torch.Tensor:
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.tc.clip_norm > 0:
            return torch.nn.utils.clip_grad_norm_(self.params, self.tc.clip_norm)
        if not grads:
            return torch.zeros((), device=self.device)
        if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6
            return torch.nn.utils.get_total_norm(grads)
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))

    def _loss(self, forward: Any, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed smoothed loss and NLL of a batch. ``forward`` gives the decoder states
        (B, T, D); the projection to the vocabulary is fused with the loss."""
        with self._autocast():
            states = forward(batch.src, batch.tgt_in, project=False)
            return projected_label_smoothed_loss(
                states, self.model.output_weight, self.model.output_bias, batch.tgt_out,
                self.tc.label_smoothing, ignore_index=self.pad_id)

    def train_step(self, batches: list[Any]) -> StepResult:
        """Forward/backward over ``batches`` (one update), then one optimizer step."""
        self.model.train()
        batches = [b.to(self.device) for b in batches]
        local_tokens = sum(int(b.n_tgt_tokens) for b in batches)
        local_sents = sum(int(b.src.size(0)) for b in batches)
        total_tokens, _ = all_reduce_sum([local_tokens, local_sents], self.dist, self.device)
        # DDP averages gradients over processes; multiplying by the world size turns that
        # average back into the sum, so every token counts once: grad(sum loss) / tokens.
        scale = self.dist.world_size / max(total_tokens, 1.0)
        loss_acc = torch.zeros((), dtype=torch.float64, device=self.device)
        nll_acc = torch.zeros((), dtype=torch.float64, device=self.device)
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if (self.ddp is None or last) else self.ddp.no_sync()
            with sync:
                loss, nll = self._loss(self.forward_model, batch)
                self.scaler.scale(loss * scale).backward()
            loss_acc += loss.detach().double()
            nll_acc += nll.detach().double()
        stats = all_reduce_sum([loss_acc.item(), nll_acc.item(), local_sents], self.dist, self.device)
        loss_sum, nll_sum, n_sents = stats
        lr = self.schedule(self.step + 1)
        set_lr(self.optimizer, lr)
        loss_ok = math.isfinite(loss_sum)

        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)
            grad_norm = float(self._grad_norm())
            scale_before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)  # skips the update itself on inf/NaN gradients
            self.scaler.update()
            updated = loss_ok and self.scaler.get_scale() >= scale_before
            nonfinite = not loss_ok
            if loss_ok and not updated:
                self.overflow_total += 1
                log.debug("fp16 overflow at step %d: scale %.0f -> %.0f", self.step + 1,
                          scale_before, self.scaler.get_scale())
        else:
            grad_norm = float(self._grad_norm())
            nonfinite = not (loss_ok and math.isfinite(grad_norm))
            updated = not nonfinite
            if updated:
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

        if nonfinite:
            self.nonfinite_consecutive += 1
            self.nonfinite_total += 1
            log.warning("non-finite loss/gradient at step %d (loss %s, grad norm %s): update "
                        "skipped (%d in a row, limit %d)", self.step + 1, loss_sum, grad_norm,
                        self.nonfinite_consecutive, self.tc.max_nonfinite)
        else:
            self.nonfinite_consecutive = 0
        if updated:
            self.step += 1
        self.tokens_seen += int(total_tokens)
        return StepResult(loss_sum=loss_sum, nll_sum=nll_sum, n_tokens=int(total_tokens),
                          n_sentences=int(n_sents), grad_norm=grad_norm, lr=lr,
                          updated=updated, nonfinite=nonfinite)

    # ------------------------------------------------------------------ validation

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Loss, NLL, perplexity (and BLEU with ``train.valid_bleu``) on the validation set.

        Runs on the main process only, under a forked RNG so that it does not change the
        random stream training continues with.
        """
        if not self.valid_batches:
            return {}
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            self.model.eval()
            loss_sum = nll_sum = 0.0
            tokens = 0
            for batch in self.valid_batches:
                batch = batch.to(self.device)
                loss, nll = self._loss(self.model, batch)
                loss_sum += float(loss)
                nll_sum += float(nll)
                tokens += int(batch.n_tgt_tokens)
            result = {"valid_loss": loss_sum / max(tokens, 1), "valid_nll": nll_sum / max(tokens, 1)}
            result["valid_ppl"] = perplexity(result["valid_nll"])
            if self.tc.valid_bleu:
                bleu = self._valid_bleu()
                if bleu is not None:
                    result["valid_bleu"] = bleu
            self.model.train()
        return result

    def _valid_bleu(self) -> float | None:
        if self.valid_text is None or self.tokenizer is None:
            log.info("valid_bleu: no validation text or tokenizer; BLEU skipped")
            return None
        try:  # written by the inference side; optional here
            from aiayn.evaluation.bleu import corpus_bleu
            from aiayn.inference.translator import Translator
        except ImportError as exc:
            log.info("valid_bleu: decoding is not available (%s); BLEU skipped", exc)
            return None
        src, ref = self.valid_text
        translator = Translator(self.model, self.tokenizer, self.cfg.decode, device=self.device)
        hyps = translator.translate(list(src))
        score = corpus_bleu(hyps, list(ref))
        return float(getattr(score, "score", score))

    def _is_better(self, metrics: dict[str, float]) -> bool:
        name = self.tc.best_metric
        if name not in metrics:
            return False
        if self.best is None:
            return True
        value, best = metrics[name], self.best["value"]
        return value > best if name == "valid_bleu" else value < best

    # ------------------------------------------------------------------ state

    def state_dict(self, rng_per_rank: list[Any] | None = None) -> dict[str, Any]:
        """Everything but the weights and optimizer, as JSON (goes into state.json)."""
        data = self.train_batches.state_dict() if self.train_batches is not None else None
        return {
            "step": self.step,
            "epoch": data["epoch"] if data else None,
            "data": data,
            "scheduler": {"kind": self.tc.lr_schedule, "step": self.step,
                          "lr": self.schedule(max(self.step, 1))},
            "rng": rng_per_rank[0] if rng_per_rank else ckpt_io.capture_rng_state(self.device),
            "rng_per_rank": rng_per_rank if rng_per_rank and len(rng_per_rank) > 1 else None,
            "world_size": self.dist.world_size,
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
            "nonfinite": {"consecutive": self.nonfinite_consecutive, "total": self.nonfinite_total,
                          "fp16_overflows": self.overflow_total},
            "tokens_seen": self.tokens_seen,
            "elapsed": self.elapsed(),
            "best": self.best,
            "last_valid": self.last_valid,
        }

    def load(self, path: str | Path) -> None:
        """Restore a checkpoint written by :meth:`save` (weights, optimizer, state, RNG)."""
        path = ckpt_io.resolve_checkpoint(path)
        ckpt_io.verify_checkpoint(path)
        saved = ckpt_io.load_checkpoint_config(path)
        _check_same_model(saved.model, self.cfg.model, path)
        state = ckpt_io.read_state(path)
        ckpt_io.load_model_weights(self.model, path / ckpt_io.MODEL_FILE)
        ckpt_io.restore_optimizer(self.optimizer, ckpt_io.load_optimizer_state(path))
        if state.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(state["scaler"])
        if self.train_batches is not None and state.get("data") is not None:
            data = dict(state["data"])
            saved_world = int(state.get("world_size") or 1)
            if saved_world != self.dist.world_size:
                # The offset counts this shard's batches: keep the number of batches of the
                # epoch already seen (approximately: shards differ), not the offset itself.
                seen = int(data["offset"]) * saved_world
                data["offset"] = min(seen // self.dist.world_size, len(self.train_batches))
            self.train_batches.load_state_dict(data)
        self._epoch_iter = None
        self.step = int(state["step"])
        nf = state.get("nonfinite") or {}
        self.nonfinite_consecutive = int(nf.get("consecutive", 0))
        self.nonfinite_total = int(nf.get("total", 0))
        self.overflow_total = int(nf.get("fp16_overflows", 0))
        self.tokens_seen = int(state.get("tokens_seen", 0))
        self.elapsed_before = float(state.get("elapsed", 0.0))
        self.best = state.get("best")
        self.last_valid = state.get("last_valid")
        self._last_saved_step = self.step
        rng = state["rng"]
        per_rank = state.get("rng_per_rank")
        if self.dist.enabled:
            if per_rank and len(per_rank) == self.dist.world_size:
                rng = per_rank[self.dist.rank]
            else:
                log.warning("checkpoint was written by %s process(es), this run has %d: random "
                            "streams (dropout) will differ from an uninterrupted run",
                            state.get("world_size", 1), self.dist.world_size)
        # Last: building the model and optimizer above consumed random numbers.
        ckpt_io.restore_rng_state(rng, self.device)
        log.info("resumed from %s at step %d (epoch %s)", path, self.step, state.get("epoch"))

    def save(self, is_best: bool = False) -> Path | None:
        """Checkpoint the current step. Collective under torchrun (RNG states are gathered);
        only the main process writes."""
        rng = all_gather_json(ckpt_io.capture_rng_state(self.device), self.dist, self.device)
        path = None
        if self.dist.is_main and self.checkpoints is not None:
            t = time.monotonic()
            path = self.checkpoints.save(
                self.step, self.model, self.cfg, tokenizer=self.tokenizer,
                state=self.state_dict(rng), optimizer=self.optimizer, is_best=is_best)
            log.info("saved %s (%.1f s)", path, time.monotonic() - t)
        self._last_saved_step = self.step
        return path

    # ------------------------------------------------------------------ the loop

    def elapsed(self) -> float:
        return self.elapsed_before + (time.monotonic() - self._t0 if self._t0 is not None else 0.0)

    def _epoch_progress(self) -> float:
        it = self.train_batches
        if it is None:
            return 0.0
        n = max(len(it), 1)
        return round(it.epoch - 1 + it.offset / n, 4) if hasattr(it, "offset") else float(it.epoch)

    def _next_group(self) -> list[Any]:
        """The next ``update_freq`` batches; shorter at the end of an epoch, empty once
        ``max_epochs`` epochs are done. Groups never span two epochs."""
        group: list[Any] = []
        it = self.train_batches
        while len(group) < self.tc.update_freq:
            if self._epoch_iter is None:
                if self.tc.max_epochs and it.epoch > self.tc.max_epochs:
                    break
                self._epoch_iter = iter(it)
            try:
                group.append(next(self._epoch_iter))
            except StopIteration:
                self._epoch_iter = None
                if group:
                    break
        return group

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._stop_signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self._stop_signal = signum
        log.warning("received %s: stopping after this step and saving a checkpoint "
                    "(Ctrl-C again to abort without saving)", signal.Signals(signum).name)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _agree(self, flags: list[bool]) -> list[bool]:
        """Every process takes the same decisions: a flag raised on any rank holds for all."""
        if not self.dist.enabled:
            return flags
        return [v > 0 for v in all_reduce_sum([float(f) for f in flags], self.dist, self.device)]

    def _dtype_label(self) -> str:
        # For the start-of-run log line: what train.dtype resolved to, and why.
        if self.tc.dtype != "auto":
            return self.dtype
        why = "native bf16" if self.dtype == "bf16" else "no native bf16 on this device"
        return f"dtype auto -> {self.dtype}: {why}"

    def _progress_bar(self) -> Any:
        if not (self.dist.is_main and self.tc.progress_bar and sys.stderr.isatty()):
            return None
        from tqdm import tqdm

        total = self.tc.max_steps or None
        return tqdm(total=total, initial=self.step, unit="step", dynamic_ncols=True,
                    file=sys.stderr, leave=True)

    def train(self) -> dict[str, Any]:
        """Train until max_steps / max_epochs / max_time (or SIGINT/SIGTERM); returns the
        summary also written to ``train_summary.json``."""
        if self.train_batches is None:
            raise ValueError("Trainer.train needs train_batches")
        tc = self.tc
        self._t0 = time.monotonic()
        last_time_save = time.monotonic()
        interval = _Interval()
        stop_reason: str | None = None
        trained = False
        finish_seconds = 0.0  # the last validate-and-save: the final one happens after the budget check
        bar = self._progress_bar()
        n_params = sum(p.numel() for p in self.params)
        # Only the main process holds the validation set; every process must know whether
        # validation steps happen, since they are collective points.
        has_valid = self._agree([bool(self.valid_batches)])[0] and bool(tc.valid_every)
        if self.dist.is_main:
            log.info("training %s parameters on %s (%s, %d process(es), update_freq %d) from step %d",
                     f"{n_params:,}", self.device, self._dtype_label(), self.dist.world_size, tc.update_freq,
                     self.step)
        redirect = contextlib.nullcontext()
        if bar is not None:
            from tqdm.contrib.logging import logging_redirect_tqdm
            redirect = logging_redirect_tqdm()
        try:
            with self._signals(), redirect:
                while True:
                    if tc.max_steps and self.step >= tc.max_steps:  # e.g. resumed at the end
                        stop_reason = "max_steps"
                        break
                    group = self._next_group()
                    if not group:
                        stop_reason = "max_epochs"
                        break
                    step_start = time.monotonic()
                    result = self.train_step(group)
                    # The budget check below stops before an update (plus the final
                    # validation and save) that would end past max_time: no overshoot.
                    group_seconds = time.monotonic() - step_start
                    if self.nonfinite_consecutive >= tc.max_nonfinite:
                        stop_reason = "diverged"
                        break
                    interval.loss += result.loss_sum
                    interval.nll += result.nll_sum
                    interval.tokens += result.n_tokens
                    interval.steps += 1
                    interval.grad_norm = result.grad_norm
                    if not result.updated:
                        continue
                    if bar is not None:
                        bar.update(1)
                    trained = True
                    if tc.log_every and self.step % tc.log_every == 0:
                        self._log_train(interval, result.lr, bar)
                        interval = _Interval()
                    now = time.monotonic()
                    time_over = bool(tc.max_time_minutes) and \
                        self.elapsed() + group_seconds + finish_seconds >= tc.max_time_minutes * 60
                    time_save = bool(tc.save_every_minutes) and \
                        now - last_time_save >= tc.save_every_minutes * 60
                    time_over, time_save, signalled = self._agree(
                        [time_over, time_save, self._stop_signal is not None])
                    if tc.max_steps and self.step >= tc.max_steps:
                        stop_reason = "max_steps"
                    elif time_over:
                        stop_reason = "max_time"
                    elif signalled:
                        stop_reason = "signal"
                    final = stop_reason is not None
                    if final and interval.steps:
                        self._log_train(interval, result.lr, bar)
                    valid_now = has_valid and (self.step % tc.valid_every == 0 or final)
                    block_start = time.monotonic()
                    is_best = self._maybe_validate() if valid_now else False
                    save_now = (bool(tc.save_every) and self.step % tc.save_every == 0) \
                        or time_save or final
                    if valid_now or save_now:
                        # Collective on every process (the best-checkpoint decision is the
                        # main process's, so every validation step is a potential save).
                        is_best = self._agree([is_best])[0] and tc.keep_best
                        if save_now or is_best:
                            self.save(is_best=is_best)
                            last_time_save = time.monotonic()
                        if valid_now:
                            finish_seconds = time.monotonic() - block_start
                    if final:
                        break
            if stop_reason == "diverged":
                return self._diverged()
            if trained and self._last_saved_step != self.step:
                # Stopped by max_epochs: the last update could not know it was the last.
                if interval.steps:
                    self._log_train(interval, self.schedule(self.step), bar)
                is_best = False
                if has_valid and self.step != self._last_valid_step:
                    is_best = self._agree([self._maybe_validate()])[0] and tc.keep_best
                self.save(is_best=is_best)
        finally:
            if bar is not None:
                bar.close()
            self.metrics.close()
        return self._finish(stop_reason or "max_steps")

    def _maybe_validate(self) -> bool:
        """Validate (main process); True if the metric improved on the best so far."""
        self._last_valid_step = self.step
        if not self.dist.is_main:
            return False
        metrics = self.validate()
        if not metrics:
            return False
        record = {"split": "valid", "step": self.step, "epoch": self._epoch_progress(), **metrics,
                  "elapsed": round(self.elapsed(), 3)}
        self.metrics.write(record)
        self.last_valid = {"step": self.step, **metrics}
        better = self._is_better(metrics)
        if better:
            self.best = {"metric": self.tc.best_metric, "value": metrics[self.tc.best_metric],
                         "step": self.step}
        text = " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        log.info("step %d: %s%s", self.step, text, " (best)" if better else "")
        return better

    def _log_train(self, interval: _Interval, lr: float, bar: Any) -> None:
        tokens = max(interval.tokens, 1)
        seconds = max(time.monotonic() - interval.start, 1e-9)
        nll = interval.nll / tokens
        record = {
            "split": "train", "step": self.step, "epoch": self._epoch_progress(),
            "loss": interval.loss / tokens, "nll": nll, "ppl": perplexity(nll), "lr": lr,
            "grad_norm": interval.grad_norm, "tokens_per_s": interval.tokens / seconds,
            "elapsed": round(self.elapsed(), 3),
        }
        if self.dist.is_main:
            self.metrics.write(record)
            if bar is not None:
                bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{lr:.2e}",
                                tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
            log.info("step %d | epoch %.2f | loss %.4f | nll %.4f | ppl %.2f | lr %.3e | "
                     "gnorm %.3f | %.0f tok/s", self.step, record["epoch"], record["loss"], nll,
                     record["ppl"], lr, record["grad_norm"], record["tokens_per_s"])

    def _summary(self, stop_reason: str) -> dict[str, Any]:
        last = self.checkpoints.last() if self.checkpoints is not None else None
        best = self.checkpoints.best() if self.checkpoints is not None else None
        return {
            "stop_reason": stop_reason, "step": self.step, "epoch": self._epoch_progress(),
            "elapsed": round(self.elapsed(), 3), "tokens_seen": self.tokens_seen,
            "nonfinite_skipped": self.nonfinite_total, "fp16_overflows": self.overflow_total,
            "last_valid": self.last_valid, "best": self.best,
            "last_checkpoint": str(last) if last else None,
            "best_checkpoint": str(best) if best else None,
            "world_size": self.dist.world_size, "device": str(self.device), "dtype": self.dtype,
        }

    def _write_summary(self, summary: dict[str, Any]) -> None:
        if self.dist.is_main and self.run_dir is not None:
            (self.run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1), encoding="utf-8")

    def _finish(self, stop_reason: str) -> dict[str, Any]:
        summary = self._summary(stop_reason)
        self._write_summary(summary)
        if self.dist.is_main:
            log.info("stopped (%s) at step %d after %.1f s", stop_reason, self.step, self.elapsed())
        return summary

    def _diverged(self) -> dict[str, Any]:
        summary = self._summary("diverged")
        self._write_summary(summary)
        last = summary["last_checkpoint"]
        raise TrainingError(
            f"the loss was non-finite for {self.nonfinite_consecutive} consecutive updates "
            f"(train.max_nonfinite={self.tc.max_nonfinite}) after step {self.step}; training "
            f"stopped. The last good checkpoint is {last or '(none written yet)'}. Try a lower "
            "learning rate (train.lr_scale / train.lr), gradient clipping (train.clip_norm), "
            "or bf16 instead of fp16.")


def _check_same_model(saved: ModelConfig, current: ModelConfig, path: Path) -> None:
    a, b = to_dict(saved), to_dict(current)
    diff = [f"model.{k}: checkpoint {a[k]!r}, config {b[k]!r}" for k in a if a.get(k) != b.get(k)]
    if diff:
        raise CheckpointError(f"{path}: the checkpoint's model differs from the configuration "
                              f"({'; '.join(diff)}); use a new run directory for a different model")


# ------------------------------------------------------------------ whole-run driver


def default_run_dir(config_path: str | Path | None) -> Path:
    """``runs/<config file stem>`` when no --run-dir is given."""
    return Path("runs") / (Path(config_path).stem if config_path else "run")


def _setup_file_logging(run_dir: Path) -> logging.Handler:
    handler = logging.FileHandler(run_dir / "train.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("aiayn").addHandler(handler)
    if logging.getLogger("aiayn").getEffectiveLevel() > logging.INFO:
        logging.getLogger("aiayn").setLevel(logging.INFO)
    return handler


def build_data(cfg: Config, run_dir: Path, info: DistInfo) -> dict[str, Any]:
    """Prepared data for this process: tokenizer, sharded training batches, validation."""
    from aiayn.data.batching import BatchIterator
    from aiayn.data.prepare import ensure_prepared, load_split, load_tokenizer, split_text

    if cfg.data.prepared_dir:
        prepared = Path(cfg.data.prepared_dir)
    else:
        # The main process prepares (tokenizer training, binarizing); the others wait,
        # then find it ready.
        if info.is_main:
            prepared = ensure_prepared(cfg.data, run_dir / "data")
        barrier(info)
        if not info.is_main:
            prepared = ensure_prepared(cfg.data, run_dir / "data")
    tokenizer = load_tokenizer(prepared)
    train_ds = load_split(prepared, "train")
    train_batches = BatchIterator(train_ds, cfg.train.max_tokens, seed=cfg.train.seed, shuffle=True,
                                  num_shards=info.world_size, shard_id=info.rank)
    valid_batches = valid_text = None
    if info.is_main:
        try:
            valid_ds = load_split(prepared, "valid")
        except (AiaynError, FileNotFoundError) as exc:
            log.warning("no validation set (%s): validation skipped", exc)
        else:
            it = BatchIterator(valid_ds, cfg.train.max_tokens, shuffle=False)
            valid_batches = [it.make_batch(idx) for idx in it.epoch_batches(1)]
            if cfg.train.valid_bleu:
                try:
                    valid_text = split_text(prepared, "valid")
                except (AiaynError, FileNotFoundError) as exc:
                    log.warning("validation text unavailable (%s): no validation BLEU", exc)
    return {"prepared": prepared, "tokenizer": tokenizer, "train": train_batches,
            "valid": valid_batches, "valid_text": valid_text}


def _match_vocab(cfg: Config, tokenizer: Any) -> Config:
    """The model's vocabulary sizes follow the tokenizer's, as fairseq's follow its dictionary."""
    src, tgt = int(tokenizer.src_vocab_size), int(tokenizer.tgt_vocab_size)
    m = cfg.model
    if (m.src_vocab_size, m.tgt_vocab_size) != (src, tgt):
        log.info("model vocabulary sizes set from the tokenizer: source %d, target %d", src, tgt)
        m.src_vocab_size, m.tgt_vocab_size = src, tgt
    if m.share_embeddings == "all" and src != tgt:
        raise ConfigError(
            f"model.share_embeddings: 'all' needs one shared vocabulary, but the tokenizer has "
            f"{src} source and {tgt} target pieces (set data.joint_vocab: true, or "
            "model.share_embeddings: decoder)")
    m.validate()
    return cfg


def run_training(cfg: Config, run_dir: str | Path, resume: str | Path | None = None) -> dict[str, Any]:
    """Train ``cfg`` in ``run_dir``: fresh, or resumed from ``resume`` / the run directory's
    last checkpoint. The entry point of ``aiayn train`` (also under torchrun)."""
    from aiayn.model import build_model

    threads = os.environ.get("AIAYN_NUM_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    if cfg.train.dtype == "fp16" and not (cfg.train.device != "cpu" and torch.cuda.is_available()):
        raise ConfigError("train.dtype: fp16 needs a CUDA device (it relies on a gradient "
                          "scaler); use bf16 on CPU")
    info, device = init_distributed(cfg.train.device)
    run_dir = Path(run_dir)
    handler = None
    try:
        if info.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            handler = _setup_file_logging(run_dir)
        else:
            logging.getLogger("aiayn").setLevel(logging.WARNING)
        barrier(info)
        manager = ckpt_io.CheckpointManager(run_dir, cfg.train.keep_last)
        if info.is_main:
            manager.clean_incomplete()
        resume_from = None
        if resume is not None:
            resume_from = ckpt_io.resolve_checkpoint(resume)
        elif manager.last() is not None:
            resume_from = manager.last()
            if info.is_main:
                log.info("%s has a checkpoint: resuming from %s", run_dir, resume_from)

        seed_everything(cfg.train.seed)
        data = build_data(cfg, run_dir, info)
        cfg = _match_vocab(cfg, data["tokenizer"])
        # Same seed on every process: identical initial weights (DDP also broadcasts them).
        seed_everything(cfg.train.seed)
        model = build_model(cfg.model)
        if cfg.train.init_from and resume_from is None:
            src = ckpt_io.resolve_checkpoint(cfg.train.init_from)
            ckpt_io.verify_checkpoint(src)
            ckpt_io.load_model_weights(model, src / ckpt_io.MODEL_FILE)
            log.info("initialised weights from %s", src)
        if info.enabled:
            # Different dropout masks per process; the data already differ by shard.
            torch.manual_seed(cfg.train.seed + 1000003 * info.rank)
        trainer = Trainer(cfg, model, run_dir, train_batches=data["train"],
                          valid_batches=data["valid"], valid_text=data["valid_text"],
                          tokenizer=data["tokenizer"], device=device, dist_info=info)
        if resume_from is not None:
            trainer.load(resume_from)
            trainer.metrics.truncate_after(trainer.step)
        if info.is_main:
            from aiayn.config import save_config
            save_config(cfg, run_dir / "config.yaml")
        summary = trainer.train()
        barrier(info)
        return summary
    finally:
        if handler is not None:
            logging.getLogger("aiayn").removeHandler(handler)
            handler.close()
        cleanup()
