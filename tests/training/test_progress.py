"""Watching a run: elapsed time and ETA in the log lines (a fake clock makes them exact), and
the progress bar's total for each kind of limit."""

import io
import logging
import types

import pytest
import torch

from aiayn.data.batching import BatchIterator
from aiayn.model import build_model
from aiayn.training import progress
from aiayn.training import trainer as trainer_module
from aiayn.training.progress import BarTotal, advance_bar, bar_total, format_duration, time_left, timing_text
from aiayn.training.stopping import StoppingRules
from aiayn.training.trainer import Trainer


@pytest.mark.parametrize("seconds, text", [
    (0, "0:00:00"), (0.4, "0:00:00"), (59.6, "0:01:00"), (61, "0:01:01"), (3599.4, "0:59:59"),
    (3600, "1:00:00"), (97384, "27:03:04"), (-5, "0:00:00"),
])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_time_left_takes_the_limit_that_ends_first():
    steps = StoppingRules(max_steps=1000)
    assert time_left(steps, step=100, epoch=0.2, elapsed=60, seconds_per_step=0.5, updates_per_epoch=500) == \
        (450.0, "max_steps")
    budget = StoppingRules(max_time_minutes=45)
    assert time_left(budget, step=100, epoch=0.2, elapsed=600, seconds_per_step=0.5, updates_per_epoch=500) == \
        (2100.0, "max_time")
    epochs = StoppingRules(max_epochs=3)
    assert time_left(epochs, step=150, epoch=1.5, elapsed=60, seconds_per_step=0.2, updates_per_epoch=100) == \
        (pytest.approx(30.0), "max_epochs")
    assert time_left(epochs, step=150, epoch=1.5, elapsed=60, seconds_per_step=0.2, updates_per_epoch=None) is None
    both = StoppingRules(max_steps=100_000, max_time_minutes=45)  # 99,900 steps at 0.5 s > 45 min
    assert time_left(both, step=100, epoch=0.2, elapsed=600, seconds_per_step=0.5, updates_per_epoch=None) == \
        (2100.0, "max_time")
    assert time_left(StoppingRules(), step=1, epoch=0.0, elapsed=1, seconds_per_step=1,
                     updates_per_epoch=10) is None
    over = StoppingRules(max_time_minutes=1)  # the budget check stops the run; no negative ETA
    assert time_left(over, step=1, epoch=0.0, elapsed=61, seconds_per_step=1, updates_per_epoch=None) == \
        (0.0, "max_time")


def test_timing_text():
    assert timing_text(100.0, (900.0, "max_steps")) == "elapsed 0:01:40 | eta 0:15:00 (max_steps)"
    assert timing_text(3723.0, None) == "elapsed 1:02:03"


def _fake_clock(monkeypatch, seconds_per_update, tr):
    """Every update takes exactly ``seconds_per_update`` on the clock the trainer and the
    log interval read, whatever the machine."""
    clock = types.SimpleNamespace(now=1000.0)
    fake_time = types.SimpleNamespace(monotonic=lambda: clock.now)
    monkeypatch.setattr(trainer_module, "time", fake_time)
    monkeypatch.setattr(progress, "time", fake_time)
    real_step = tr.train_step

    def timed_step(group):
        clock.now += seconds_per_update
        return real_step(group)

    tr.train_step = timed_step


def _timings(caplog):
    return [m[m.index("| elapsed ") + 2:] for m in caplog.messages if m.startswith("step ") and "| elapsed " in m]


@pytest.mark.parametrize("train, seconds, expected", [
    # 6 steps of 0.5 s: after step 2, 4 steps left = 2 s.
    ({"max_steps": 6}, 0.5, ["elapsed 0:00:01 | eta 0:00:02 (max_steps)",
                             "elapsed 0:00:02 | eta 0:00:01 (max_steps)",
                             "elapsed 0:00:03 | eta 0:00:00 (max_steps)"]),
    # A 12 s budget, 1 s per step: the run stops after step 11 (a 12th would end at 12 s).
    ({"max_steps": 0, "max_time_minutes": 0.2}, 1.0,
     [f"elapsed 0:00:{s:02d} | eta 0:00:{12 - s:02d} (max_time)" for s in (2, 4, 6, 8, 10, 11)]),
    # Both: the budget ends first.
    ({"max_steps": 1000, "max_time_minutes": 0.1}, 1.0,
     [f"elapsed 0:00:{s:02d} | eta 0:00:{6 - s:02d} (max_time)" for s in (2, 4, 5)]),
])
def test_log_lines_show_elapsed_and_eta(make_cfg, make_task, tmp_path, monkeypatch, caplog, train, seconds,
                                        expected):
    cfg = make_cfg(log_every=2, **train)
    torch.manual_seed(0)
    tr = Trainer(cfg, build_model(cfg.model), tmp_path, train_batches=BatchIterator(make_task(n=40), 64, seed=1))
    _fake_clock(monkeypatch, seconds, tr)
    with caplog.at_level(logging.INFO, logger="aiayn"):
        tr.train()
    assert _timings(caplog) == expected


def test_eta_of_an_epoch_limit(make_cfg, make_task, tmp_path, monkeypatch, caplog):
    cfg = make_cfg(max_steps=0, max_epochs=2, log_every=2)
    torch.manual_seed(0)
    batches = BatchIterator(make_task(n=40), 64, seed=1)
    tr = Trainer(cfg, build_model(cfg.model), tmp_path, train_batches=batches)
    _fake_clock(monkeypatch, 1.0, tr)
    with caplog.at_level(logging.INFO, logger="aiayn"):
        tr.train()
    n = len(batches)  # updates per epoch; 2 n in all, at 1 s each
    first = _timings(caplog)[0]
    assert first == f"elapsed 0:00:02 | eta {format_duration(2 * n - 2)} (max_epochs)"


@pytest.mark.parametrize("rules, step, elapsed, per_epoch, total", [
    (StoppingRules(max_steps=800), 100, 30.0, None, BarTotal("step", 800, 100)),
    (StoppingRules(max_epochs=2), 0, 0.0, 30, BarTotal("step", 60, 0)),
    (StoppingRules(max_steps=50, max_epochs=2), 0, 0.0, 30, BarTotal("step", 50, 0)),
    (StoppingRules(max_time_minutes=45), 7, 600.0, 30, BarTotal("min", 45, 10.0)),
    (StoppingRules(max_steps=800, max_time_minutes=45), 7, 600.0, None, BarTotal("step", 800, 7)),
    (StoppingRules(max_epochs=2, max_time_minutes=45), 7, 600.0, None, BarTotal("min", 45, 10.0)),
    (StoppingRules(), 5, 0.0, 30, BarTotal("step", None, 5)),
])
def test_bar_total_per_limit(rules, step, elapsed, per_epoch, total):
    assert bar_total(rules, step=step, elapsed=elapsed, updates_per_epoch=per_epoch) == total


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bars_in_steps_and_in_minutes(monkeypatch):
    screen = _Terminal()
    monkeypatch.setattr(progress.sys, "stderr", screen)
    assert progress.progress_bar(False, BarTotal("step", 10, 0)) is None
    steps = progress.progress_bar(True, BarTotal("step", 800, 100))
    advance_bar(steps, elapsed=5.0)
    assert (steps.unit, steps.total, steps.n) == ("step", 800, 101)
    steps.close()
    minutes = progress.progress_bar(True, BarTotal("min", 45, 10.0))
    advance_bar(minutes, elapsed=900.0)
    assert (minutes.unit, minutes.total, minutes.n) == ("min", 45, 15.0)
    minutes.refresh()
    minutes.close()
    assert "15.0/45.0 min" in screen.getvalue()


def test_the_trainer_bar_counts_the_steps_of_its_epochs(make_cfg, make_task, monkeypatch):
    cfg = make_cfg(max_steps=0, max_epochs=2, update_freq=2)
    made = []
    monkeypatch.setattr(trainer_module, "progress_bar", lambda enabled, total: made.append(total))
    batches = BatchIterator(make_task(n=40), 64, seed=1)
    tr = Trainer(cfg, build_model(cfg.model), None, train_batches=batches)
    tr.train()
    per_epoch = -(-len(batches) // 2)  # groups of 2 batches, never across epochs
    assert made == [BarTotal("step", 2 * per_epoch, 0)] and tr.state.step == 2 * per_epoch
