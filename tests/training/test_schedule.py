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
