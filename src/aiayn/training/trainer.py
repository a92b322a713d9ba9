"""The training loop: the paper's recipe (section 5), exact resume, AMP, torchrun.

One *step* is one optimizer update over ``update_freq`` batches per process (times the
number of processes under torchrun). Its loss is the label-smoothed cross entropy summed
over all target tokens of the update, divided by that token count (as fairseq), so that
accumulating batches, or spreading them over processes, gives the gradient of one large
batch.

Exact resume: the data order is a function of (seed, epoch); a checkpoint stores the
iterator position, optimizer, grad scaler, step (the learning rate is a pure function of
it), the elapsed time, and the Python/NumPy/torch RNG states (per process under torchrun),
and validation runs under a forked RNG. A CPU fp32 run stopped at step N and resumed therefore ends at
step 2N with the same weights, bit for bit, as a run that never stopped, provided the
same torch build, thread count (``AIAYN_NUM_THREADS`` / ``OMP_NUM_THREADS``) and data and
batching settings (``max_tokens``, ``max_tokens_mode``, ``update_freq``, ``seed``, number of
processes) are used.
Changing those on resume is allowed; training then continues, just not bit-identically.
A decay over a time budget (``lr_schedule`` cosine/linear with ``max_steps`` 0) reads the
clock, like any time-stopped run: it resumes where it was in the budget, not bit-identically.

The trainer is handed its pieces (model, optimizer, batches, a validation BLEU scorer,
stopping rules) and knows nothing of how they are built: :mod:`aiayn.recipes.train` does that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from aiayn.checkpoint.manager import CheckpointManager
from aiayn.checkpoint.training_state import capture_rng_state
from aiayn.config import Config, TrainConfig, to_dict
from aiayn.data.prefetch import host_transfer
from aiayn.runtime.precision import resolve_train_dtype, torch_dtype
from aiayn.training import amp, resume
from aiayn.training.distributed import DistInfo, all_gather_json, all_reduce_sum
from aiayn.training.groups import UpdateGroups, epoch_progress
from aiayn.training.loggers import open_loggers
from aiayn.training.loss import projected_label_smoothed_loss
from aiayn.training.metrics import MetricsLog
from aiayn.training.optim import build_optimizer, set_lr
from aiayn.training.progress import (
    Interval,
    StepResult,
    advance_bar,
    bar_total,
    logging_around,
    progress_bar,
    run_summary,
    show_train_record,
    time_left,
)
from aiayn.training.schedule import make_schedule
from aiayn.training.state import TrainerState
from aiayn.training.static_shapes import StaticShapes, compiled_forward, step_begins
from aiayn.training.stopping import StoppingRules, StopSignals, TrainingError
from aiayn.training.validation import BleuFn, Validator, record_validation
from aiayn.training.weight_cast import cast_once_pays, cast_weights_once

if TYPE_CHECKING:
    from aiayn.model import Transformer

log = logging.getLogger(__name__)

SUMMARY_FILE = "train_summary.json"
__all__ = ["SUMMARY_FILE", "StepResult", "Trainer", "TrainingError"]


@dataclass
class _Loop:
    """Bookkeeping of one :meth:`Trainer.train` call (not saved: a resumed run starts anew)."""

    has_valid: bool
    bar: Any = None
    interval: Interval = field(default_factory=Interval)
    trained: bool = False
    last_time_save: float = field(default_factory=time.monotonic)
    update_seconds: float = 0.0  # the last update's
    finish_seconds: float = 0.0  # the last validate-and-save: the final one comes after the budget check


class Trainer:
    """Owns the model, optimizer, schedule, data position and checkpoints of one run.

    ``train_batches`` is anything with the :class:`~aiayn.data.batching.BatchIterator`
    protocol (iterate -> the rest of the current epoch; ``epoch``, ``state_dict()``,
    ``load_state_dict()``, ``len()``). ``valid_batches`` is a list of batches. Both may be
    None for tests that drive :meth:`train_step` directly. ``optimizer`` defaults to
    :func:`~aiayn.training.optim.build_optimizer`'s, ``stopping`` to the config's limits,
    ``scaler`` to :func:`~aiayn.training.amp.grad_scaler`'s (enabled for fp16 only; an
    enabled one runs the scaled update on any device); ``bleu`` adds validation BLEU.

    How batches reach the device is :func:`~aiayn.data.prefetch.host_transfer`'s choice for
    it and ``data.prefetch_batches``: a training iterator with a ``transfer`` attribute is
    given it (pinned batches and a prefetching thread on CUDA), and every batch is copied
    with its ``non_blocking``.
    """

    def __init__(self, cfg: Config, model: Transformer, run_dir: str | Path | None = None, *,
                 train_batches: Any = None, valid_batches: list[Any] | None = None, tokenizer: Any = None,
                 device: torch.device | str = "cpu", dist_info: DistInfo | None = None,
                 optimizer: torch.optim.Optimizer | None = None, bleu: BleuFn | None = None,
                 stopping: StoppingRules | None = None, scaler: torch.amp.GradScaler | None = None) -> None:
        self.cfg, self.train_cfg = cfg, cfg.train
        self.device = torch.device(device)
        self.dist = dist_info or DistInfo()
        self.run_dir = Path(run_dir) if run_dir is not None else None
        # Entries the run adds to train_summary.json (e.g. how init_from's vocabulary mapped).
        self.summary_extra: dict[str, Any] = {}
        self.train_batches = train_batches
        self.transfer = host_transfer(self.device, cfg.data.prefetch_batches)
        if train_batches is not None and hasattr(train_batches, "transfer"):
            train_batches.transfer = self.transfer
        self.tokenizer = tokenizer
        # The precision in effect: train.dtype with "auto" resolved for this device.
        self.dtype = resolve_train_dtype(self.train_cfg.dtype, self.device)
        self.amp_dtype = torch_dtype(self.dtype)  # None: no autocast
        amp.check_fp16_device(self.dtype, self.device)
        self.model = model.to(self.device)
        compile_mode = self.train_cfg.compile_mode if self.train_cfg.compile else None
        if cast_once_pays(self.device, self.amp_dtype, compiled=compile_mode is not None):
            cast_weights_once(self.model)
        self.optimizer = optimizer if optimizer is not None else \
            build_optimizer(self.model, self.train_cfg, self.device)
        self.schedule = make_schedule(self.train_cfg, cfg.model.d_model)
        self.scaler = scaler if scaler is not None else amp.grad_scaler(self.dtype, self.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.ddp = _data_parallel(self.model, self.dist, self.device)
        wrapped = self.ddp if self.ddp is not None else self.model
        self.forward_model = compiled_forward(wrapped, compile_mode)
        # Static shapes for CUDA graphs: every batch padded to its length bucket.
        self.static_shapes = StaticShapes.for_config(self.train_cfg) if compile_mode == "reduce-overhead" else None
        self.validator = Validator(valid_batches, self._loss, self.device, bleu=bleu)
        self.stopping = stopping or StoppingRules.from_config(self.train_cfg)
        self.signals = StopSignals()
        self.state = TrainerState()
        self.groups = UpdateGroups(train_batches, self.train_cfg.update_freq, self.stopping.epochs_done)
        self._last_saved_step: int | None = None  # of the last periodic save
        self._last_valid_step: int | None = None
        self._t0: float | None = None
        self.checkpoints, self.metrics = _run_outputs(self.run_dir, self.dist, self.train_cfg)

    # ------------------------------------------------------------------ one update

    def _loss(self, forward: Any, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed smoothed loss and NLL of a batch. ``forward`` gives the decoder states
        (B, T, D); the projection to the vocabulary is fused with the loss."""
        with amp.autocast(self.device, self.amp_dtype):
            states = forward(batch.src, batch.tgt_in, project=False)
            return projected_label_smoothed_loss(
                states, self.model.output_weight, self.model.output_bias, batch.tgt_out,
                self.train_cfg.label_smoothing, ignore_index=self.cfg.model.pad_id)

    def train_step(self, batches: list[Any]) -> StepResult:
        """Forward/backward over ``batches`` (one update), then one optimizer step."""
        self.model.train()
        local_tokens = sum(int(b.n_tgt_tokens) for b in batches)
        local_sents = sum(int(b.src.size(0)) for b in batches)
        if self.static_shapes is not None:
            batches = [self.static_shapes.pad(b) for b in batches]
        batches = [_on_device(b, self.device, self.transfer.non_blocking) for b in batches]
        total_tokens, _ = all_reduce_sum([local_tokens, local_sents], self.dist, self.device)
        loss_acc, nll_acc = self._backward(batches, total_tokens)
        loss_sum, nll_sum, n_sents, src_tokens, padded, elapsed_sum = all_reduce_sum(
            [loss_acc, nll_acc, local_sents, *_src_and_padded(batches), self.elapsed()], self.dist, self.device)
        # Every rank applies the update itself, so a rate that decays by time must be the same
        # on all of them: their mean clock, not each one's own (weights would drift apart).
        lr = self.schedule(self.state.step + 1, elapsed_sum / self.dist.world_size)
        set_lr(self.optimizer, lr)
        out = amp.apply_update(self.optimizer, self.scaler, self.params, self.train_cfg.clip_norm,
                               math.isfinite(loss_sum), self.device)
        self.optimizer.zero_grad(set_to_none=True)
        self._count(out, loss_sum)
        self.state.tokens_seen += int(total_tokens)
        return StepResult(loss_sum=loss_sum, nll_sum=nll_sum, n_tokens=int(total_tokens),
                          n_sentences=int(n_sents), grad_norm=out.grad_norm, lr=lr,
                          updated=out.updated, nonfinite=out.nonfinite,
                          n_src_tokens=int(src_tokens), n_padded=int(padded))

    def _backward(self, batches: list[Any], total_tokens: float) -> tuple[float, float]:
        """Accumulate the gradients of ``batches``; their summed loss and NLL (this process)."""
        # DDP averages gradients over processes; multiplying by the world size turns that
        # average back into the sum, so every token counts once: grad(sum loss) / tokens.
        scale = self.dist.world_size / max(total_tokens, 1.0)
        # The summed loss and NLL, in float64, read with one device synchronisation per update.
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if (self.ddp is None or last) else self.ddp.no_sync()
            with sync:
                if self.static_shapes is not None:
                    step_begins()
                loss, nll = self._loss(self.forward_model, batch)
                self.scaler.scale(loss * scale).backward()
            sums += torch.stack((loss.detach(), nll.detach()))
        loss_sum, nll_sum = sums.tolist()
        return loss_sum, nll_sum

    def _count(self, out: amp.UpdateOutcome, loss_sum: float) -> None:
        """The step advances on an applied update; skipped ones are counted (divergence)."""
        nf = self.state.nonfinite
        nf.add(out.nonfinite, out.overflow)
        if out.overflow:
            log.debug("fp16 overflow at step %d: scale %.0f -> %.0f", self.state.step + 1,
                      out.scale_before, self.scaler.get_scale())
        if out.nonfinite:
            log.warning("non-finite loss/gradient at step %d (loss %s, grad norm %s): update "
                        "skipped (%d in a row, limit %d)", self.state.step + 1, loss_sum, out.grad_norm,
                        nf.consecutive, self.stopping.max_nonfinite)
        if out.updated:
            self.state.step += 1

    def validate(self) -> dict[str, float]:
        """Loss, NLL, perplexity (and BLEU, given a scorer) on the validation set; on the
        main process only, under a forked RNG (:class:`~aiayn.training.validation.Validator`)."""
        return self.validator(self.model)

    # ------------------------------------------------------------------ state

    def state_dict(self, rng_per_rank: list[Any] | None = None) -> dict[str, Any]:
        """Everything but the weights and optimizer, as JSON (goes into state.json)."""
        data = self.train_batches.state_dict() if self.train_batches is not None else None
        step = self.state.step
        return dataclasses.replace(
            self.state, epoch=data["epoch"] if data else None, data=data,
            scheduler={"kind": self.train_cfg.lr_schedule, "step": step,
                       "lr": self.schedule(max(step, 1), self.elapsed())},
            rng=rng_per_rank[0] if rng_per_rank else capture_rng_state(self.device),
            rng_per_rank=rng_per_rank if rng_per_rank and len(rng_per_rank) > 1 else None,
            world_size=self.dist.world_size,
            scaler=self.scaler.state_dict() if self.scaler.is_enabled() else None,
            elapsed=self.elapsed(),
        ).to_json()

    def load(self, path: str | Path) -> None:
        """Restore a checkpoint written by :meth:`save` (weights, optimizer, state, RNG)."""
        self.state = resume.restore(path, model=self.model, model_cfg=self.cfg.model, optimizer=self.optimizer,
                                    scaler=self.scaler, batches=self.train_batches, dist=self.dist,
                                    device=self.device)
        self.groups.restart()
        self._last_saved_step = self.state.step

    def save(self, is_best: bool = False, periodic: bool = True) -> Path | None:
        """Checkpoint the current step. Collective under torchrun (RNG states are gathered);
        only the main process writes. ``periodic=False`` (a save only because validation
        improved) writes ``best_step_N``, outside the series that ``keep_last`` and
        ``aiayn average --last`` count."""
        rng = all_gather_json(capture_rng_state(self.device), self.dist, self.device)
        path = None
        if self.dist.is_main and self.checkpoints is not None:
            t = time.monotonic()
            path = self.checkpoints.save(
                self.state.step, self.model, self.cfg, tokenizer=self.tokenizer,
                state=self.state_dict(rng), optimizer=self.optimizer, is_best=is_best, periodic=periodic)
            log.info("saved %s (%.1f s)", path, time.monotonic() - t)
        if periodic:
            self._last_saved_step = self.state.step
        return path

    # ------------------------------------------------------------------ the loop

    def elapsed(self) -> float:
        return self.state.elapsed + (time.monotonic() - self._t0 if self._t0 is not None else 0.0)

    def _agree(self, flags: list[bool]) -> list[bool]:
        """Every process takes the same decisions: a flag raised on any rank holds for all."""
        if not self.dist.enabled:
            return flags
        return [v > 0 for v in all_reduce_sum([float(f) for f in flags], self.dist, self.device)]

    def train(self) -> dict[str, Any]:
        """Train until max_steps / max_epochs / max_time / patience (or SIGINT/SIGTERM); returns the
        summary also written to ``train_summary.json``."""
        if self.train_batches is None:
            raise ValueError("Trainer.train needs train_batches")
        self._t0 = time.monotonic()
        # Only the main process holds the validation set; every process must know whether
        # validation steps happen, since they are collective points.
        has_valid = self._agree([bool(self.validator.batches)])[0] and bool(self.train_cfg.valid_every)
        total = bar_total(self.stopping, step=self.state.step, elapsed=self.state.elapsed,
                          updates_per_epoch=self._updates_per_epoch())
        run = _Loop(has_valid, bar=progress_bar(self.dist.is_main and self.train_cfg.progress_bar, total))
        if self.dist.is_main:
            log.info("training %s parameters on %s (%s, %d process(es), update_freq %d) from step %d",
                     f"{sum(p.numel() for p in self.params):,}", self.device,
                     amp.dtype_label(self.train_cfg.dtype, self.dtype), self.dist.world_size,
                     self.train_cfg.update_freq, self.state.step)
            if self.transfer.pin_memory or self.transfer.prefetch:
                log.info("batches: %s, %d prepared ahead by a thread (data.prefetch_batches)",
                         "pinned, copied without blocking" if self.transfer.non_blocking else "in host memory",
                         self.transfer.prefetch)
            if self.stopping.patience and not has_valid:
                log.warning("train.patience: no validation set, so no early stopping")
        try:
            if self.metrics.enabled and self.run_dir is not None:
                self.metrics.attach(open_loggers(self.train_cfg, self.run_dir, to_dict(self.cfg), self.state.step))
            with self.signals.installed(), logging_around(run.bar):
                stop_reason = self._loop(run)
            if stop_reason == "diverged":
                return self._finish(stop_reason)  # raises TrainingError
            self._end_of_data(run)
        finally:
            self.groups.close()  # no prefetching thread outlives the loop
            if run.bar is not None:
                run.bar.close()
            self.metrics.close()
        return self._finish(stop_reason)

    def _loop(self, run: _Loop) -> str:
        """Updates until a stopping rule holds; its name."""
        while True:
            if self.stopping.steps_done(self.state.step):  # e.g. resumed at the end
                return "max_steps"
            if self.stopping.out_of_patience(self.state.validations_since_best):  # resumed after an early stop
                return "patience"
            group = self.groups.next()
            if not group:
                return "max_epochs"
            start = time.monotonic()
            result = self.train_step(group)
            run.update_seconds = time.monotonic() - start
            if self.stopping.diverged(self.state.nonfinite.consecutive):
                return "diverged"
            run.interval.add(result)
            if not result.updated:
                continue
            stop_reason = self._after_update(run, result.lr)
            if stop_reason is not None:
                return stop_reason

    def _after_update(self, run: _Loop, lr: float) -> str | None:
        """Log, validate and save as scheduled; the stop reason if this update is the last."""
        advance_bar(run.bar, self.elapsed())
        run.trained = True
        step = self.state.step
        if self.train_cfg.log_every and step % self.train_cfg.log_every == 0:
            self._log_train(run, lr)
        # The budget check stops before an update (plus the final validation and save)
        # that would end past max_time: no overshoot.
        time_over = self.stopping.out_of_time(self.elapsed(), run.update_seconds, run.finish_seconds)
        time_save = bool(self.train_cfg.save_every_minutes) and \
            time.monotonic() - run.last_time_save >= self.train_cfg.save_every_minutes * 60
        time_over, time_save, signalled = self._agree([time_over, time_save, self.signals.received is not None])
        stop_reason = self.stopping.reason(step, time_over, signalled)
        final = stop_reason is not None
        if final and run.interval.steps:
            self._log_train(run, lr)
        valid_now = run.has_valid and (step % self.train_cfg.valid_every == 0 or final)
        save_now = (bool(self.train_cfg.save_every) and step % self.train_cfg.save_every == 0) or time_save or final
        if self._validate_and_save(run, valid_now, save_now) and not final:
            # Only the validation could tell that this update was the last: its record now.
            stop_reason = "patience"
            if run.interval.steps:
                self._log_train(run, lr)
        return stop_reason

    def _validate_and_save(self, run: _Loop, valid_now: bool, save_now: bool) -> bool:
        """Whether early stopping ends the run here (it saved then)."""
        start = time.monotonic()
        is_best = self._maybe_validate() if valid_now else False
        if not (valid_now or save_now):
            return False
        # Collective on every process (the best-checkpoint and patience decisions are the
        # main process's, so every validation step is a potential save).
        patience_out = valid_now and self.stopping.out_of_patience(self.state.validations_since_best)
        is_best, patience_out = self._agree([is_best, patience_out])
        is_best = is_best and self.train_cfg.keep_best
        if patience_out:
            save_now = True
            if self.dist.is_main:
                log.info(self.stopping.patience_message(self.train_cfg.best_metric, self.state.best))
        if save_now or is_best:
            self.save(is_best=is_best, periodic=save_now)
            run.last_time_save = time.monotonic()
        if valid_now:
            run.finish_seconds = time.monotonic() - start
        return patience_out

    def _end_of_data(self, run: _Loop) -> None:
        """Stopped by max_epochs: the last update could not know it was the last, so its
        record, validation and (periodic) checkpoint come now."""
        if not run.trained or self._last_saved_step == self.state.step:
            return
        if run.interval.steps:
            self._log_train(run, self.schedule(self.state.step, self.elapsed()))
        is_best = False
        if run.has_valid and self.state.step != self._last_valid_step:
            is_best = self._agree([self._maybe_validate()])[0] and self.train_cfg.keep_best
        self.save(is_best=is_best)

    def _maybe_validate(self) -> bool:
        """Validate (main process); True if the metric improved on the best so far."""
        step = self._last_valid_step = self.state.step
        if not self.dist.is_main:
            return False
        metrics = self.validate()
        if not metrics:
            return False
        self.metrics.write({"split": "valid", "step": step, "epoch": epoch_progress(self.train_batches), **metrics,
                            "elapsed": round(self.elapsed(), 3)})
        better = record_validation(self.state, self.train_cfg.best_metric, metrics, step)
        text = " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        log.info("step %d: %s%s", step, text, self._progress_note(better))
        return better

    def _progress_note(self, better: bool) -> str:
        """`` (best)``, or how far early stopping has got."""
        if better:
            return " (best)"
        if self.stopping.patience:
            return (f" (no improvement in {self.train_cfg.best_metric} for {self.state.validations_since_best} of "
                    f"{self.stopping.patience} validation(s))")
        return ""

    def _log_train(self, run: _Loop, lr: float) -> None:
        """The interval's record (metrics.jsonl, log line, bar); a new interval begins."""
        interval, run.interval = run.interval, Interval()
        record = interval.record(self.state.step, epoch_progress(self.train_batches), lr, self.elapsed())
        if self.dist.is_main:
            self.metrics.write(record)
            left = time_left(self.stopping, step=self.state.step, epoch=record["epoch"], elapsed=record["elapsed"],
                             seconds_per_step=interval.seconds() / max(interval.steps, 1),
                             updates_per_epoch=self._updates_per_epoch())
            show_train_record(record, run.bar, log, left)

    def _updates_per_epoch(self) -> int | None:
        """Updates in an epoch of this process's shard (groups never span epochs); None if
        the training iterator has no length."""
        try:
            return math.ceil(len(self.train_batches) / self.train_cfg.update_freq)
        except TypeError:
            return None

    def _finish(self, stop_reason: str) -> dict[str, Any]:
        """Write ``train_summary.json`` and return its content (raise on divergence)."""
        checkpoints = self.checkpoints
        summary = run_summary(stop_reason, self.state, epoch=epoch_progress(self.train_batches),
                              elapsed=self.elapsed(), world_size=self.dist.world_size, device=self.device,
                              dtype=self.dtype, last_checkpoint=checkpoints.last() if checkpoints else None,
                              best_checkpoint=checkpoints.best() if checkpoints else None)
        summary.update(self.summary_extra)
        if self.dist.is_main and self.run_dir is not None:
            (self.run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1), encoding="utf-8")
        if stop_reason == "diverged":
            raise self.stopping.divergence_error(self.state.nonfinite.consecutive, self.state.step,
                                                 summary["last_checkpoint"])
        if self.dist.is_main:
            log.info("stopped (%s) at step %d after %.1f s", stop_reason, self.state.step, self.elapsed())
        return summary


def _on_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """The tensors a training step reads, on ``device`` (a tensor there already is not
    copied; the dataset indices stay where they are: training does not read them);
    ``non_blocking``: copies from pinned memory that do not wait (the loader's choice)."""
    moved = {name: getattr(batch, name) for name in ("src", "tgt_in", "tgt_out")}
    if all(t.device == device for t in moved.values()):
        return batch
    return dataclasses.replace(batch, **{name: t.to(device, non_blocking=non_blocking) for name, t in moved.items()})


def _src_and_padded(batches: list[Any]) -> tuple[int, int]:
    """Real source tokens of ``batches`` and the size of their padded ``src`` plus ``tgt_out``."""
    src = sum(int(b.n_src_tokens) for b in batches)
    padded = sum(int(b.src.numel()) + int(b.tgt_out.numel()) for b in batches)
    return src, padded


def _data_parallel(model: nn.Module, dist: DistInfo, device: torch.device) -> DistributedDataParallel | None:
    """The model wrapped in DDP under torchrun; None otherwise."""
    if not dist.enabled:
        return None
    ids = [device.index] if device.type == "cuda" else None
    # No buffers need syncing at each forward (the sinusoid table is a constant);
    # newer torch renamed the switch.
    no_sync = "forward_sync_buffers" if "forward_sync_buffers" in \
        inspect.signature(DistributedDataParallel.__init__).parameters else "broadcast_buffers"
    options: dict[str, Any] = {no_sync: False}
    return DistributedDataParallel(model, device_ids=ids, **options)


def _run_outputs(run_dir: Path | None, dist: DistInfo, train_cfg: TrainConfig) -> tuple[Any, MetricsLog]:
    """The run's checkpoint manager (None without a run directory) and metrics log; only the
    main process writes (and logs to train.loggers, attached when training starts)."""
    if run_dir is None:
        return None, MetricsLog(None, enabled=False)
    if dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    return CheckpointManager(run_dir, train_cfg.keep_last), MetricsLog(run_dir, enabled=dist.is_main)
