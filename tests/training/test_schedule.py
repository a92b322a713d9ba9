import dataclasses
import math

import pytest

from aiayn.config import TrainConfig
from aiayn.training.schedule import constant_lr, inverse_sqrt_lr, make_schedule, noam_lr


def test_noam_values():
    d, w = 512, 4000
    assert noam_lr(1, d, w) == pytest.approx(512 ** -0.5 * 4000 ** -1.5)
    peak = noam_lr(w, d, w)
    assert peak == pytest.approx(512 ** -0.5 * 4000 ** -0.5)  # ~7.0e-4 (section 5.3)
    assert peak == pytest.approx(6.99e-4, rel=1e-3)
    assert noam_lr(4 * w, d, w) == pytest.approx(peak / 2)
    assert noam_lr(w, d, w, scale=2.0) == pytest.approx(2 * peak)
    assert noam_lr(0, d, w) == noam_lr(1, d, w)


def test_inverse_sqrt_values():
    peak, w, init = 5e-4, 4000, 1e-7
    assert inverse_sqrt_lr(1, peak, w, init) == pytest.approx(init + (peak - init) / w)
    assert inverse_sqrt_lr(w, peak, w, init) == pytest.approx(peak)
    assert inverse_sqrt_lr(4 * w, peak, w, init) == pytest.approx(peak / 2)
    assert inverse_sqrt_lr(2 * w, peak, w) == pytest.approx(peak / math.sqrt(2))


def test_constant_with_warmup():
    assert constant_lr(1, 1e-3, 10, 0.0) == pytest.approx(1e-4)
    assert constant_lr(10, 1e-3, 10) == pytest.approx(1e-3)
    assert constant_lr(40, 1e-3, 10) == pytest.approx(1e-3)
    assert constant_lr(1, 1e-3, 0) == 1e-3


def test_make_schedule_from_config():
    s = make_schedule(TrainConfig(lr_schedule="noam", warmup_steps=4000), d_model=512)
    assert s(4000) == pytest.approx(noam_lr(4000, 512, 4000))
    s = make_schedule(TrainConfig(lr_schedule="inverse_sqrt", lr=1e-3, warmup_steps=100), 512)
    assert s(400) == pytest.approx(5e-4)


@pytest.mark.parametrize("step", [1, 4, 100])
def test_noam_without_warmup_is_inverse_sqrt_of_step(step):
    # warmup 0 would divide by zero in warmup ** -1.5: the warmup term is skipped instead.
    assert noam_lr(step, 512, 0) == 512 ** -0.5 * step ** -0.5
    assert noam_lr(step, 512, 0, scale=3.0) == 3.0 * 512 ** -0.5 * step ** -0.5


@pytest.mark.parametrize(
    ("step", "peak", "warmup", "init", "expected"),
    [
        (1, 1e-3, 10, 0.0, 1e-4),
        (2, 1e-3, 10, 0.0, 2e-4),
        (5, 1e-3, 10, 1e-4, 1e-4 + 9e-4 * 5 / 10),
        (9, 1e-3, 10, 1e-4, 1e-4 + 9e-4 * 9 / 10),
        (40, 1e-3, 10, 1e-4, 5e-4),
        (1, 2e-3, 0, 0.0, 2e-3),
        (4, 2e-3, 0, 0.0, 1e-3),
        (16, 2e-3, 0, 0.5, 5e-4),  # no warmup: init_lr is not used
        (4, 2e-3, 1, 0.0, 1e-3),  # warmup 1: decay from the first update
    ],
)
def test_inverse_sqrt_table(step, peak, warmup, init, expected):
    assert inverse_sqrt_lr(step, peak, warmup, init) == pytest.approx(expected, rel=1e-12)


def test_inverse_sqrt_default_init_is_zero():
    assert inverse_sqrt_lr(3, 1e-3, 10) == pytest.approx(3e-4, rel=1e-12)


def test_end_of_warmup_is_exactly_peak():
    # At step == warmup the decay branch gives peak_lr exactly; the ramp would give
    # init + (peak - init), which rounds to 0.8699999999999999 for these values.
    init, peak = 0.325, 0.87
    assert init + (peak - init) != peak
    assert inverse_sqrt_lr(10, peak, 10, init) == peak
    assert constant_lr(10, peak, 10, init) == peak


@pytest.mark.parametrize(
    ("step", "peak", "warmup", "init", "expected"),
    [
        (2, 1e-3, 10, 0.0, 2e-4),
        (4, 1e-3, 10, 2e-4, 2e-4 + 8e-4 * 4 / 10),
        (9, 1e-3, 10, 2e-4, 2e-4 + 8e-4 * 9 / 10),
        (0, 1e-3, 10, 0.0, 1e-4),
        (11, 1e-3, 10, 2e-4, 1e-3),
    ],
)
def test_constant_table(step, peak, warmup, init, expected):
    assert constant_lr(step, peak, warmup, init) == pytest.approx(expected, rel=1e-12)


def test_constant_defaults():
    assert constant_lr(3, 1e-3) == 1e-3  # no warmup by default
    assert constant_lr(3, 1e-3, 10) == pytest.approx(3e-4, rel=1e-12)  # ramp from 0


@pytest.mark.parametrize("step", [1, 7, 50, 400])
def test_make_schedule_passes_every_setting(step):
    train = TrainConfig(lr_schedule="noam", warmup_steps=50, lr_scale=2.0)
    assert make_schedule(train, 256)(step) == noam_lr(step, 256, 50, 2.0)
    train = TrainConfig(lr_schedule="inverse_sqrt", lr=1e-3, warmup_steps=50, warmup_init_lr=1e-4)
    assert make_schedule(train, 256)(step) == inverse_sqrt_lr(step, 1e-3, 50, 1e-4)
    train = TrainConfig(lr_schedule="constant", lr=1e-3, warmup_steps=50, warmup_init_lr=1e-4)
    assert make_schedule(train, 256)(step) == constant_lr(step, 1e-3, 50, 1e-4)


def test_make_schedule_unknown_kind():
    with pytest.raises(ValueError, match=r"^unknown lr_schedule 'polynomial'$"):
        make_schedule(TrainConfig(lr_schedule="polynomial"), 512)


@pytest.mark.parametrize(("shape", "step", "expected"), [
    ("cosine", 1, 1e-4 + (1e-3 - 1e-4) / 10),  # warmup, as the others
    ("cosine", 10, 1e-3),                      # the peak at the end of the warmup
    ("cosine", 55, 0.5 * (1e-3 + 1e-5)),       # half-way down: the middle of the range
    ("cosine", 32, 1e-5 + (1e-3 - 1e-5) * 0.5 * (1 + math.cos(math.pi * 22 / 90))),
    ("cosine", 100, 1e-5),                     # min_lr at max_steps
    ("cosine", 150, 1e-5),                     # and after it
    ("linear", 55, 0.5 * (1e-3 + 1e-5)),
    ("linear", 28, 1e-3 - (1e-3 - 1e-5) * 0.2),
    ("linear", 100, 1e-5),
])
def test_decay_table(shape, step, expected):
    from aiayn.training.schedule import decay_lr
    assert decay_lr(step, 1e-3, 10, 100, shape=shape, init_lr=1e-4, min_lr=1e-5) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("shape", ["cosine", "linear"])
def test_decay_from_config_falls_monotonically_to_min_lr(shape):
    train = TrainConfig(lr_schedule=shape, lr=2e-3, warmup_steps=20, max_steps=200, min_lr=1e-4, warmup_init_lr=0.0)
    train.validate()
    lrs = [make_schedule(train, 256)(step) for step in range(20, 201)]
    assert lrs[0] == pytest.approx(2e-3)
    assert all(a > b for a, b in zip(lrs, lrs[1:]))
    assert lrs[-1] == pytest.approx(1e-4)


@pytest.mark.parametrize(("fields", "message"), [
    ({"max_steps": 0}, "train.lr_schedule: cosine decays until train.max_steps, which must be above"),
    ({"max_steps": 0, "max_time_minutes": 0}, "or set max_steps 0 and max_time_minutes to decay over a time"),
    ({"max_steps": 100, "warmup_steps": 100}, "train.max_steps, which must be above train.warmup_steps (100), got 100"),
    ({"max_steps": 1000, "min_lr": 1e-3}, "train.min_lr: must be in [0, train.lr)"),
])
def test_decay_needs_a_horizon_past_the_warmup(fields, message):
    from aiayn.errors import ConfigError
    with pytest.raises(ConfigError) as err:
        TrainConfig(**{"lr_schedule": "cosine", "lr": 1e-3, "warmup_steps": 10, **fields}).validate()
    assert message in str(err.value)


@pytest.mark.parametrize(("shape", "step", "elapsed", "expected"), [
    ("cosine", 5, 30.0, 1e-4 + (1e-3 - 1e-4) / 2),       # warmup by updates, whatever the clock
    ("cosine", 10, 0.0, 1e-3),                            # the peak at the warmup's end, at time 0
    ("cosine", 10, 30.0, 0.5 * (1e-3 + 1e-5)),            # half the budget: half-way down
    ("cosine", 10, 15.0, 1e-5 + (1e-3 - 1e-5) * 0.5 * (1 + math.cos(math.pi / 4))),
    ("cosine", 99, 60.0, 1e-5),                           # min_lr at the budget's end
    ("cosine", 99, 75.0, 1e-5),                           # and past it
    ("linear", 40, 45.0, 1e-3 - (1e-3 - 1e-5) * 0.75),
    ("linear", 40, -1.0, 1e-3),                           # no negative progress
])
def test_timed_decay_table(shape, step, elapsed, expected):
    from aiayn.training.schedule import timed_decay_lr
    got = timed_decay_lr(step, elapsed, 60.0, 1e-3, 10, shape=shape, init_lr=1e-4, min_lr=1e-5)
    assert got == pytest.approx(expected, rel=1e-12)


def test_decay_with_no_max_steps_runs_over_the_time_budget():
    """max_steps 0 and max_time_minutes 2: the schedule reads the seconds, not the updates."""
    train = TrainConfig(lr_schedule="linear", lr=1e-3, warmup_steps=10, max_steps=0, max_time_minutes=2.0,
                        warmup_init_lr=0.0)
    train.validate()
    schedule = make_schedule(train, 256)
    assert schedule(500, 0.0) == pytest.approx(1e-3)
    assert schedule(500, 30.0) == pytest.approx(0.75e-3)
    assert schedule(20, 90.0) == pytest.approx(0.25e-3)
    assert schedule(20, 120.0) == 0.0
    stepped = make_schedule(dataclasses.replace(train, max_steps=100), 256)
    assert stepped(55, 90.0) == stepped(55, 0.0) == pytest.approx(0.5e-3)  # a step horizon ignores the clock


@pytest.mark.parametrize(("step", "expected"), [
    (50, 1e-3),                        # held at the peak before the last 20% of the updates
    (82, 1e-3),                        # the decay starts at 10 + 0.8 * 90 updates
    (91, 0.5 * (1e-3 + 1e-5)),         # half-way through the last 20%: half-way down
    (100, 1e-5),
])
def test_warmup_stable_decay_over_updates(step, expected):
    from aiayn.training.schedule import decay_lr
    assert decay_lr(step, 1e-3, 10, 100, shape="cosine", min_lr=1e-5, fraction=0.2) == pytest.approx(expected)


def test_warmup_stable_decay_over_the_time_budget_from_config():
    """decay_fraction 0.25 of a 1-minute budget: lr held for 45 s, then a line down to min_lr."""
    train = TrainConfig(lr_schedule="linear", lr=1e-3, min_lr=1e-5, warmup_steps=10, max_steps=0,
                        max_time_minutes=1.0, decay_fraction=0.25)
    train.validate()
    schedule = make_schedule(train, 256)
    assert [schedule(100, t) for t in (20.0, 45.0)] == [pytest.approx(1e-3)] * 2
    assert schedule(100, 52.5) == pytest.approx(0.5 * (1e-3 + 1e-5))
    assert schedule(100, 60.0) == pytest.approx(1e-5)


@pytest.mark.parametrize("fraction", [0.0, 1.5])
def test_decay_fraction_must_be_a_share(fraction):
    from aiayn.errors import ConfigError
    with pytest.raises(ConfigError, match=r"^train\.decay_fraction: must be in \(0, 1\]"):
        TrainConfig(lr_schedule="cosine", max_steps=100, warmup_steps=10, decay_fraction=fraction).validate()


# --------------------------------------------------------------------------- defaults, boundaries and
# the settings make_schedule passes to the decays (exact values)


def test_inverse_sqrt_after_a_one_update_warmup_is_peak_times_sqrt_of_warmup_over_step():
    """warmup 1 is a warmup (no ramp: step 1 is already past it): peak * sqrt(1 / step), to the
    last bit, not peak * step ** -0.5 of no warmup (the two differ in the last place at step 7)."""
    for step in (1, 2, 7, 15, 21):
        assert inverse_sqrt_lr(step, 1.0, 1) == math.sqrt(1 / step)
    assert math.sqrt(1 / 7) != 7 ** -0.5


def test_decay_defaults_are_a_cosine_from_zero_to_zero_over_the_whole_horizon():
    from aiayn.training.schedule import decay_lr, timed_decay_lr
    for step in (1, 5, 10, 40, 55, 99, 100, 130):
        assert decay_lr(step, 1e-3, 10, 100) == decay_lr(step, 1e-3, 10, 100, shape="cosine", init_lr=0.0,
                                                          min_lr=0.0, fraction=1.0)
    assert decay_lr(5, 1e-3, 10, 100) == 5e-4  # the warmup ramps from 0
    assert decay_lr(55, 1e-3, 10, 100) == pytest.approx(0.5e-3, rel=1e-12)  # a cosine: half-way down
    assert decay_lr(40, 1e-3, 10, 100) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi / 3)), rel=1e-12)
    assert decay_lr(100, 1e-3, 10, 100) == decay_lr(130, 1e-3, 10, 100) == 0.0
    for step, elapsed in ((5, 0.0), (10, 0.0), (20, 20.0), (20, 30.0), (20, 60.0), (20, 90.0)):
        assert timed_decay_lr(step, elapsed, 60.0, 1e-3, 10) == timed_decay_lr(
            step, elapsed, 60.0, 1e-3, 10, shape="cosine", init_lr=0.0, min_lr=0.0, fraction=1.0)
    assert timed_decay_lr(5, 0.0, 60.0, 1e-3, 10) == 5e-4
    assert timed_decay_lr(20, 20.0, 60.0, 1e-3, 10) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi / 3)),
                                                                     rel=1e-12)
    assert timed_decay_lr(20, 60.0, 60.0, 1e-3, 10) == timed_decay_lr(20, 90.0, 60.0, 1e-3, 10) == 0.0


def test_decay_over_one_update_after_the_warmup_reaches_min_lr_at_once():
    from aiayn.training.schedule import decay_lr
    assert decay_lr(10, 1e-3, 10, 11, min_lr=1e-5) == 1e-3
    assert decay_lr(11, 1e-3, 10, 11, min_lr=1e-5) == 1e-5
    assert decay_lr(1, 1e-3, 0, 1, min_lr=1e-5) == 1e-5


@pytest.mark.parametrize("fraction", [0.1, 0.2])
def test_the_end_of_a_short_decay_is_exactly_min_lr(fraction):
    """At the horizon the rate is min_lr itself, not the end of the line: 1 - (1 - 0.1) is not
    0.1 in floating point, and the line would stop 2e-16 of the range above min_lr."""
    from aiayn.training.schedule import decay_lr, timed_decay_lr
    for shape in ("linear", "cosine"):
        assert decay_lr(100, 1.0, 10, 100, shape=shape, fraction=fraction) == 0.0
        assert timed_decay_lr(100, 60.0, 60.0, 1.0, 10, shape=shape, fraction=fraction) == 0.0


@pytest.mark.parametrize("shape", ["cosine", "linear"])
@pytest.mark.parametrize("max_steps", [100, 0])
def test_make_schedule_passes_every_decay_setting(shape, max_steps):
    """Each setting reaches the decay: shape, warmup_init_lr, min_lr and decay_fraction, over
    max_steps updates or (max_steps 0) over max_time_minutes; the values are exact."""
    from aiayn.training.schedule import decay_lr, timed_decay_lr
    train = TrainConfig(lr_schedule=shape, lr=1e-3, warmup_steps=10, warmup_init_lr=1e-4, min_lr=1e-5,
                        decay_fraction=0.5, max_steps=max_steps, max_time_minutes=1.0)
    train.validate()
    schedule = make_schedule(train, 256)
    for step in (1, 3, 9, 10, 20, 55, 60, 70, 80, 99, 100, 120):
        elapsed = 60.0 * step / 100
        if max_steps:
            expected = decay_lr(step, 1e-3, 10, 100, shape=shape, init_lr=1e-4, min_lr=1e-5, fraction=0.5)
        else:
            expected = timed_decay_lr(step, elapsed, 60.0, 1e-3, 10, shape=shape, init_lr=1e-4, min_lr=1e-5,
                                      fraction=0.5)
        assert schedule(step, elapsed) == expected
    assert schedule(3, 12.0) == 1e-4 + (1e-3 - 1e-4) * 3 / 10  # the warmup starts at warmup_init_lr
    # 80 of 100 (or 48 s of 60): 60% into the last half of the horizon (the last half of the
    # updates after the warmup, or of the seconds)
    progress = 0.6 if not max_steps else ((80 - 10) / 90 - 0.5) / 0.5
    remaining = 0.5 * (1 + math.cos(math.pi * progress)) if shape == "cosine" else 1 - progress
    assert schedule(80, 48.0) == pytest.approx(1e-5 + (1e-3 - 1e-5) * remaining, rel=1e-12)


def test_a_time_budget_schedule_called_without_the_seconds_is_at_time_zero():
    train = TrainConfig(lr_schedule="cosine", lr=1e-3, warmup_steps=10, max_steps=0, max_time_minutes=1.0,
                        warmup_init_lr=0.0)
    train.validate()
    schedule = make_schedule(train, 256)
    assert schedule(50) == schedule(50, 0.0) == 1e-3
    assert schedule(50, 1.0) < 1e-3
