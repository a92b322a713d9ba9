import math

import torch
import torch.nn.functional as F

from aiayn.training.loss import label_smoothed_nll_loss


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
    logits = torch.randn(2, 3, 9).bfloat16()
    target = torch.randint(1, 9, (2, 3))
    loss, nll = label_smoothed_nll_loss(logits, target, 0.1)
    assert loss.dtype == torch.float32 and nll.dtype == torch.float32
