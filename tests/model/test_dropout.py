import pytest
import torch

from aiayn.model.dropout import Dropout, dropout, keep_mask


def test_drop_rate_and_scaling():
    torch.manual_seed(0)
    x = torch.ones(1000, 1000)
    y = dropout(x, 0.1)
    kept = y != 0
    # 1M Bernoulli(0.9) draws: standard deviation of the kept fraction is 0.0003
    assert abs(kept.float().mean().item() - 0.9) < 0.002
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.9))
    assert abs(y.mean().item() - 1.0) < 0.003  # inverted dropout keeps the expectation


def test_gradient_uses_the_same_mask():
    torch.manual_seed(1)
    x = torch.randn(64, 33, requires_grad=True)
    y = dropout(x, 0.3)
    y.sum().backward()
    expected = torch.where(y != 0, torch.full_like(x, 1 / 0.7), torch.zeros_like(x))
    assert torch.equal(x.grad, expected)


def test_seeded_and_reproducible_and_uncorrelated_lanes():
    torch.manual_seed(5)
    a = keep_mask(torch.Size([4000, 7]), 0.5, torch.device("cpu"))
    torch.manual_seed(5)
    b = keep_mask(torch.Size([4000, 7]), 0.5, torch.device("cpu"))
    assert torch.equal(a, b)
    # the four 16-bit lanes of each 64-bit draw are independent: neighbours agree ~half the time
    flat = a.flatten()
    agree = (flat[:-1] == flat[1:]).float().mean().item()
    assert abs(agree - 0.5) < 0.02


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5, 0.9, 1 / 65536, 3e-6, 1 - 3e-6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keep_mask_is_the_comparison_of_the_same_draws(p: float, dtype: torch.dtype):
    # Reference: an element is kept when its 16-bit uniform is at or above the threshold.
    shape = torch.Size([301, 33])
    torch.manual_seed(11)
    draws = torch.empty((shape.numel() + 3) // 4, dtype=torch.int64).random_(-(1 << 63), None)
    next_draw = torch.randint(0, 1 << 30, ()).item()
    u = draws.view(torch.int16)[: shape.numel()].view(shape).int()
    expected = (u >= round(p * 65536) - 32768).to(dtype)
    torch.manual_seed(11)
    got = keep_mask(shape, p, torch.device("cpu"), dtype)
    assert got.dtype == dtype and torch.equal(got, expected)
    assert torch.randint(0, 1 << 30, ()).item() == next_draw  # the stream advanced alike


def test_bf16_dropout_equals_scaling_the_kept_elements():
    torch.manual_seed(2)
    x = torch.randn(50, 40).bfloat16().requires_grad_()
    torch.manual_seed(3)
    y = dropout(x, 0.1)
    torch.manual_seed(3)
    keep = keep_mask(x.shape, 0.1, x.device, torch.bool)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, torch.where(keep, x.detach() * (1 / 0.9), 0).bfloat16())
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, torch.where(keep, torch.ones_like(x) * (1 / 0.9), 0).bfloat16())


def test_eval_and_p_zero_are_identity_and_module_matches_nn_dropout_interface():
    x = torch.randn(3, 4)
    m = Dropout(0.2).eval()
    assert m(x) is x and dropout(x, 0.0) is x
    assert m.p == 0.2 and "p=0.2" in repr(m)
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.5)
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
