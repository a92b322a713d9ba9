import math

import pytest
import torch
import torch.nn.functional as F

from aiayn.training.loss import label_smoothed_nll_loss, projected_label_smoothed_loss


def test_eps_zero_is_plain_nll():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    target = torch.randint(1, 11, (2, 5))
    target[1, 3:] = 0  # padding
    loss, nll = label_smoothed_nll_loss(logits, target, epsilon=0.0, ignore_index=0)
    ref = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, reduction="sum")
    assert torch.allclose(loss, ref) and torch.allclose(nll, ref)


def test_hand_computed_eps_01():
    # One position, vocabulary of 4, target 2: the smoothed target is 0.9 on class 2 and
    # 0.1 / 3 on each other class; loss = -sum q_v log p_v.
    logits = torch.tensor([[[1.0, 2.0, 3.0, 0.5]]])
    target = torch.tensor([[2]])
    lp = torch.log_softmax(logits[0, 0].double(), -1).tolist()
    expected = -(0.9 * lp[2] + sum(0.1 / 3 * lp[v] for v in (0, 1, 3)))
    loss, nll = label_smoothed_nll_loss(logits, target, epsilon=0.1, ignore_index=None)
    assert math.isclose(loss.item(), expected, rel_tol=1e-6)
    assert math.isclose(nll.item(), -lp[2], rel_tol=1e-6)


def test_padding_ignored_and_mean():
    torch.manual_seed(1)
    logits = torch.randn(1, 4, 7)
    target = torch.tensor([[5, 6, 0, 0]])
    s, n = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=0, reduction="sum")
    s2, n2 = label_smoothed_nll_loss(logits[:, :2], target[:, :2], 0.1, ignore_index=0)
    assert torch.allclose(s, s2) and torch.allclose(n, n2)
    m, _ = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=0, reduction="mean")
    assert torch.allclose(m, s / 2)
    per, _ = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=0, reduction="none")
    assert per.shape == (1, 4) and per[0, 2:].abs().sum() == 0


def test_bf16_logits_computed_in_fp32():
    """bf16 logits give the float32 loss of the same (exactly representable) values: the
    log-softmax runs in float32. A bf16 log-softmax is off by ~1e-2 here (bf16 keeps 8 bits
    of mantissa: log-probs near -5 are rounded to multiples of 1/32)."""
    torch.manual_seed(2)
    logits = (torch.randn(2, 3, 900) * 4).bfloat16()
    target = torch.randint(1, 900, (2, 3))
    target[1, 2] = 0  # padding
    loss, nll = label_smoothed_nll_loss(logits, target, 0.1)
    ref_loss, ref_nll = label_smoothed_nll_loss(logits.float(), target, 0.1)
    assert loss.dtype == torch.float32 and nll.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-6, atol=0.0)
    # The float32 reference itself, spelled out in float64 from the rounded logits.
    lp = torch.log_softmax(logits.double(), -1)
    keep = target != 0
    exact_nll = -lp.gather(-1, target[..., None])[..., 0][keep].sum()
    exact_loss = (0.9 - 0.1 / 899) * exact_nll + 0.1 / 899 * -lp.sum(-1)[keep].sum()
    assert math.isclose(nll.item(), exact_nll.item(), rel_tol=1e-5)
    assert math.isclose(loss.item(), exact_loss.item(), rel_tol=1e-5)


def _unfused(h, w, b, t, eps, ignore):
    return label_smoothed_nll_loss(F.linear(h, w, b), t, eps, ignore_index=ignore)


@pytest.mark.parametrize("eps,ignore,bias,chunk", [(0.1, 0, False, 7), (0.0, 0, True, 5), (0.2, None, True, 64)])
def test_projected_loss_equals_unfused_loss_and_gradients(eps, ignore, bias, chunk):
    """The fused, chunked projection + loss gives the loss, NLL and the gradients of the
    hidden states, the weight and the bias of F.linear + label_smoothed_nll_loss."""
    torch.manual_seed(0)
    h = torch.randn(3, 6, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(13, dtype=torch.float64, requires_grad=True) if bias else None
    t = torch.randint(1, 13, (3, 6))
    t[2, 4:] = 0  # padding (ignored when ignore == 0, a real class otherwise)
    ref_loss, ref_nll = _unfused(h, w, b, t, eps, ignore)
    ref_grads = torch.autograd.grad(ref_loss * 0.37, [x for x in (h, w, b) if x is not None])
    loss, nll = projected_label_smoothed_loss(h, w, b, t, eps, ignore, chunk_rows=chunk)
    grads = torch.autograd.grad(loss * 0.37, [x for x in (h, w, b) if x is not None])
    # the fused loss works in float32 whatever the input dtype: compare at float32 precision
    assert torch.allclose(loss, ref_loss, rtol=1e-5) and torch.allclose(nll, ref_nll, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        assert g.dtype == r.dtype and g.shape == r.shape
        assert torch.allclose(g, r, rtol=1e-4, atol=1e-6)


def test_projected_loss_under_bf16_autocast_matches_autocast_linear():
    torch.manual_seed(1)
    h = torch.randn(40, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    t = torch.randint(1, 50, (40,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_loss, _ = _unfused(h, w, None, t, 0.1, 0)
        loss, _ = projected_label_smoothed_loss(h, w, None, t, 0.1, 0, chunk_rows=16)
    ref_gw, = torch.autograd.grad(ref_loss, [w])
    gw, = torch.autograd.grad(loss, [w])
    assert gw.dtype == torch.float32
    assert torch.allclose(loss, ref_loss, rtol=1e-3)
    assert (gw - ref_gw).abs().max() <= 0.02 * ref_gw.abs().max()


def test_projected_loss_without_grad_is_loss_only():
    h, w, t = torch.randn(5, 4), torch.randn(9, 4), torch.randint(1, 9, (5,))
    with torch.no_grad():
        loss, nll = projected_label_smoothed_loss(h, w, None, t, 0.1, 0)
    ref, ref_nll = _unfused(h, w, None, t, 0.1, 0)
    assert not loss.requires_grad and torch.allclose(loss, ref) and torch.allclose(nll, ref_nll)
