"""The guarded optimizer update (aiayn.training.amp) on its own."""

import torch

from aiayn.runtime.precision import torch_dtype
from aiayn.training import amp


def _param(grad: float) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), grad)
    return p


def test_a_finite_update_is_applied_and_clipped():
    p = _param(3.0)  # gradient norm 3 * sqrt(2)
    opt = torch.optim.SGD([p], lr=1.0)
    out = amp.apply_update(opt, amp.grad_scaler("fp32", torch.device("cpu")), [p], clip_norm=1.0,
                           loss_ok=True, device=torch.device("cpu"))
    assert out.updated and not out.nonfinite and not out.overflow
    assert out.grad_norm == torch.tensor(3.0 * 2 ** 0.5).item()
    torch.testing.assert_close(p.detach(), torch.full((2,), 1.0 - 2 ** -0.5))  # clipped to norm 1


def test_a_nonfinite_loss_or_gradient_skips_the_update():
    for grad, loss_ok in ((float("nan"), True), (1.0, False)):
        p = _param(grad)
        opt = torch.optim.SGD([p], lr=1.0)
        out = amp.apply_update(opt, amp.grad_scaler("fp32", torch.device("cpu")), [p], clip_norm=0.0,
                               loss_ok=loss_ok, device=torch.device("cpu"))
        assert out.nonfinite and not out.updated
        assert torch.equal(p.detach(), torch.ones(2))


def test_autocast_and_labels():
    assert [torch_dtype(n) for n in ("fp32", "bf16", "fp16")] == [None, torch.bfloat16, torch.float16]
    with amp.autocast(torch.device("cpu"), torch.bfloat16):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with amp.autocast(torch.device("cpu"), None):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    assert amp.dtype_label("bf16", "bf16") == "bf16"
    assert amp.dtype_label("auto", "fp32") == "dtype auto -> fp32: no native bf16 on this device"
    assert not amp.grad_scaler("bf16", torch.device("cpu")).is_enabled()
