import pytest
import torch

from aiayn.model.dropout import Dropout, drop_mask, dropout


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
    a = drop_mask(torch.Size([4000, 7]), 0.5, torch.device("cpu"))
    torch.manual_seed(5)
    b = drop_mask(torch.Size([4000, 7]), 0.5, torch.device("cpu"))
    assert torch.equal(a, b)
    # the four 16-bit lanes of each 64-bit draw are independent: neighbours agree ~half the time
    flat = a.flatten().float()
    agree = (flat[:-1] == flat[1:]).float().mean().item()
    assert abs(agree - 0.5) < 0.02


def test_eval_and_p_zero_are_identity_and_module_matches_nn_dropout_interface():
    x = torch.randn(3, 4)
    m = Dropout(0.2).eval()
    assert m(x) is x and dropout(x, 0.0) is x
    assert m.p == 0.2 and "p=0.2" in repr(m)
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.5)
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
