"""The stopping rules and the signal handler, on their own (the loop's use of them is in
test_trainer.py: max_epochs, wall time, divergence, SIGTERM)."""

import os
import signal

import pytest

from aiayn.training.groups import UpdateGroups
from aiayn.training.stopping import StoppingRules, StopSignals, TrainingError


def test_step_epoch_and_divergence_limits():
    rules = StoppingRules(max_steps=10, max_epochs=2, max_nonfinite=3)
    assert not rules.steps_done(9) and rules.steps_done(10) and rules.steps_done(11)
    assert not StoppingRules(max_steps=0).steps_done(10**9)  # 0: no limit
    assert not rules.epochs_done(2) and rules.epochs_done(3)  # the epoch about to start
    assert not StoppingRules(max_epochs=0).epochs_done(100)
    assert not rules.diverged(2) and rules.diverged(3)


def test_from_config(make_cfg):
    rules = StoppingRules.from_config(make_cfg(max_steps=7, max_epochs=2, max_time_minutes=1.5,
                                               max_nonfinite=4).train)
    assert rules == StoppingRules(max_steps=7, max_epochs=2, max_time_minutes=1.5, max_nonfinite=4)


def test_wall_time_is_a_budget():
    rules = StoppingRules(max_time_minutes=1.0)
    # 50 s done, updates of 4 s, a final validation + save of 5 s: one more update fits...
    assert not rules.out_of_time(50.0, 4.0, 5.0)
    # ...at 51 s it would end the run exactly at the limit: stop before it.
    assert rules.out_of_time(51.0, 4.0, 5.0)
    assert not StoppingRules(max_time_minutes=0).out_of_time(1e9, 1.0, 1.0)


def test_reason_precedence():
    rules = StoppingRules(max_steps=5)
    assert rules.reason(4, out_of_time=False, signalled=False) is None
    assert rules.reason(5, out_of_time=True, signalled=True) == "max_steps"
    assert rules.reason(4, out_of_time=True, signalled=True) == "max_time"
    assert rules.reason(4, out_of_time=False, signalled=True) == "signal"


def test_divergence_error_names_the_last_checkpoint():
    err = StoppingRules(max_nonfinite=3).divergence_error(3, 17, "/runs/x/checkpoints/step_000016")
    assert isinstance(err, TrainingError)
    assert "non-finite for 3 consecutive updates (train.max_nonfinite=3) after step 17" in str(err)
    assert "/runs/x/checkpoints/step_000016" in str(err)
    assert "(none written yet)" in str(StoppingRules().divergence_error(1, 1, None))


def test_signals_request_a_stop_and_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signals = StopSignals()
    with signals.installed():
        assert signal.getsignal(signal.SIGTERM) == signals.handler
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.received == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):  # Ctrl-C after a first signal: abort now
            signals.handler(signal.SIGINT, None)
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_first_sigint_does_not_abort():
    signals = StopSignals()
    signals.handler(signal.SIGINT, None)
    assert signals.received == signal.SIGINT


class _Epochs:
    """Three batches per epoch, with BatchIterator's epoch counter."""

    def __init__(self) -> None:
        self.epoch = 1

    def __iter__(self):
        yield from (f"e{self.epoch}b{i}" for i in range(3))
        self.epoch += 1


def test_update_groups_never_span_epochs_and_stop_after_max_epochs():
    groups = UpdateGroups(_Epochs(), update_freq=2, epochs_done=StoppingRules(max_epochs=2).epochs_done)
    seen = []
    while group := groups.next():
        seen.append(group)
    assert seen == [["e1b0", "e1b1"], ["e1b2"], ["e2b0", "e2b1"], ["e2b2"]]
