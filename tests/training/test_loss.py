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


# eps -0.1: both losses treat it as no smoothing (the fused gradient was 1.1x before the fix).
@pytest.mark.parametrize("eps,ignore,bias,chunk", [(0.1, 0, False, 7), (0.0, 0, True, 5), (0.2, None, True, 64),
                                                   (-0.1, None, False, 4)])
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


def test_label_smoothed_defaults_are_eps_01_and_pad_0():
    torch.manual_seed(3)
    logits = torch.randn(2, 4, 9)
    target = torch.tensor([[3, 1, 0, 0], [8, 2, 5, 0]])
    loss, nll = label_smoothed_nll_loss(logits, target)
    ref_loss, ref_nll = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=0, reduction="sum")
    assert loss.item() == ref_loss.item() and nll.item() == ref_nll.item()


def test_unknown_reduction_is_rejected():
    with pytest.raises(ValueError, match=r"^reduction must be sum, mean or none, got 'max'$"):
        label_smoothed_nll_loss(torch.zeros(1, 3), torch.tensor([1]), reduction="max")


def test_eps_zero_ignores_masked_classes():
    """Without smoothing a class with logit -inf (a masked vocabulary entry) costs nothing:
    the loss is the NLL, finite, not eps * inf = nan."""
    logits = torch.tensor([[0.5, -math.inf, 1.0, 2.0]])
    target = torch.tensor([3])
    loss, nll = label_smoothed_nll_loss(logits, target, epsilon=0.0, ignore_index=None)
    expected = -torch.log_softmax(logits, -1)[0, 3]
    assert loss.item() == nll.item() == expected.item()


@pytest.mark.parametrize(
    ("target", "ignore", "count"),
    [
        ([[4, 0, 0]], 0, 1),  # a single real token: divide by 1
        ([[4, 2, 0]], 0, 2),
        ([[4, 2, 0]], None, 3),  # no padding index: every position counts
        ([[0, 0, 0]], 0, 1),  # only padding: 0 / 1, not 0 / 0
    ],
)
def test_mean_divides_by_the_token_count(target, ignore, count):
    torch.manual_seed(4)
    logits = torch.randn(1, 3, 6)
    target = torch.tensor(target)
    s, n = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=ignore, reduction="sum")
    m, mn = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=ignore, reduction="mean")
    assert m.item() == (s / count).item() and mn.item() == (n / count).item()


def test_losses_stay_on_the_inputs_device_whatever_the_default_device():
    """Every tensor the losses create follows the inputs, not torch's default device."""
    torch.manual_seed(5)
    logits = torch.randn(2, 3, 7)
    target = torch.tensor([[1, 2, 0], [3, 0, 0]])
    h, w, b = torch.randn(6, 4, requires_grad=True), torch.randn(7, 4, requires_grad=True), torch.randn(7)
    b.requires_grad_(True)
    refs = [label_smoothed_nll_loss(logits, target, 0.1, ig, red) for red in ("sum", "mean", "none")
            for ig in (0, None)]
    ref_proj = projected_label_smoothed_loss(h, w, b, target, 0.1, 0, chunk_rows=4)
    ref_grads = torch.autograd.grad(ref_proj[0], [h, w, b])
    with torch.device("meta"):
        outs = [label_smoothed_nll_loss(logits, target, 0.1, ig, red) for red in ("sum", "mean", "none")
                for ig in (0, None)]
        proj = projected_label_smoothed_loss(h, w, b, target, 0.1, 0, chunk_rows=4)
        grads = torch.autograd.grad(proj[0], [h, w, b])
    for (loss, nll), (ref_loss, ref_nll) in zip(outs, refs):
        assert loss.device.type == nll.device.type == "cpu"
        assert torch.equal(loss, ref_loss) and torch.equal(nll, ref_nll)
    assert torch.equal(proj[0], ref_proj[0]) and torch.equal(proj[1], ref_proj[1])
    for g, r in zip(grads, ref_grads):
        assert torch.equal(g, r)


def test_projected_loss_does_not_depend_on_the_default_dtype():
    """The accumulators are float32 by name: a float64 default dtype changes nothing."""
    torch.manual_seed(0)
    h = torch.randn(30, 8, requires_grad=True)
    w = torch.randn(13, 8, requires_grad=True)
    b = torch.randn(13, requires_grad=True)
    t = torch.randint(0, 13, (30,))

    def run():
        loss, nll = projected_label_smoothed_loss(h, w, b, t, 0.1, 0, chunk_rows=7)
        return loss, nll, torch.autograd.grad(loss * 0.37, [h, w, b])

    ref = run()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = run()
    finally:
        torch.set_default_dtype(default)
    assert out[0].dtype == out[1].dtype == torch.float32
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    for g, r in zip(out[2], ref[2]):
        assert torch.equal(g, r)


def test_projected_loss_gradients_are_float32_for_float64_inputs():
    """The gradients are computed and scaled in float32, then cast to the input dtype."""
    torch.manual_seed(6)
    h = torch.randn(10, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    t = torch.randint(1, 11, (10,))
    loss, _ = projected_label_smoothed_loss(h, w, None, t, 0.1, 0, chunk_rows=4)
    gh, gw = torch.autograd.grad(loss * 0.37, [h, w])
    assert gh.dtype == gw.dtype == torch.float64
    assert torch.equal(gh, gh.float().double()) and torch.equal(gw, gw.float().double())


def test_projected_loss_defaults():
    """Defaults: epsilon 0.1, padding index 0, chunks of 1,024 rows (the sums are added in
    the same order: equal to the last bit)."""
    torch.manual_seed(7)
    h, w = torch.randn(2100, 4), torch.randn(9, 4)
    t = torch.randint(0, 9, (2100,))
    loss, nll = projected_label_smoothed_loss(h, w, None, t)
    ref_loss, ref_nll = projected_label_smoothed_loss(h, w, None, t, 0.1, 0, 1024)
    assert loss.item() == ref_loss.item() and nll.item() == ref_nll.item()
    unfused, unfused_nll = _unfused(h, w, None, t, 0.1, 0)
    assert torch.allclose(loss, unfused, rtol=1e-5) and torch.allclose(nll, unfused_nll, rtol=1e-5)


def test_projected_loss_eps_zero_with_masked_classes():
    """A -inf bias masks a class (here class 0): without smoothing the loss is the finite NLL."""
    torch.manual_seed(8)
    h = torch.randn(6, 4, requires_grad=True)
    w = torch.randn(5, 4, requires_grad=True)
    b = torch.tensor([-math.inf, 0.1, 0.2, 0.3, 0.4])
    t = torch.tensor([1, 2, 3, 4, 1, 2])
    loss, nll = projected_label_smoothed_loss(h, w, b, t, 0.0, None, chunk_rows=4)
    ref = F.cross_entropy(F.linear(h, w, b), t, reduction="sum")
    assert torch.isfinite(loss) and loss.item() == nll.item()
    assert torch.allclose(loss, ref, rtol=1e-6)
    gh, gw = torch.autograd.grad(loss, [h, w])
    rh, rw = torch.autograd.grad(ref, [h, w])
    assert torch.allclose(gh, rh, atol=1e-6) and torch.allclose(gw, rw, atol=1e-6)


def test_projected_loss_under_autocast_is_the_loss_of_the_rounded_inputs():
    """Under bf16 autocast the logits are exactly those of bf16 copies of hidden, weight and
    bias (matmul and bias add in bf16); the softmax and loss are float32 on top of them."""
    torch.manual_seed(9)
    h = torch.randn(20, 16, requires_grad=True)
    w = torch.randn(30, 16, requires_grad=True)
    b = torch.randn(30, requires_grad=True)
    t = torch.randint(0, 30, (20,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, nll = projected_label_smoothed_loss(h, w, b, t, 0.1, 0, chunk_rows=8)
    with torch.no_grad():
        ref_loss, ref_nll = projected_label_smoothed_loss(h.bfloat16(), w.bfloat16(), b.bfloat16(), t, 0.1, 0, 8)
    assert loss.dtype == nll.dtype == torch.float32
    assert loss.item() == ref_loss.item() and nll.item() == ref_nll.item()


def test_projected_loss_under_autocast_takes_the_softmax_in_float32():
    """Under bf16 autocast the logits are bf16 (a bf16 matmul and bias add), but the
    log-softmax and the smoothing sum over them run in float32: the loss equals the float64
    loss of those bf16 logits to float32 rounding. (A bf16 log-softmax is off by ~1e-3.)"""
    torch.manual_seed(10)
    h, w, b = torch.randn(20, 16) * 3, torch.randn(30, 16), torch.randn(30)
    t = torch.randint(0, 30, (20,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, nll = projected_label_smoothed_loss(h, w, b, t, 0.1, 0, chunk_rows=64)
    z = torch.mm(h.bfloat16(), w.bfloat16().t())
    z += b.bfloat16()
    lp = torch.log_softmax(z.double(), -1)
    keep = t != 0
    exact_nll = -lp.gather(-1, t[:, None])[:, 0][keep].sum()
    exact_loss = (0.9 - 0.1 / 29) * exact_nll + 0.1 / 29 * -lp.sum(-1)[keep].sum()
    assert math.isclose(nll.item(), exact_nll.item(), rel_tol=1e-6)
    assert math.isclose(loss.item(), exact_loss.item(), rel_tol=1e-6)


def test_the_loss_chunk_is_sized_per_device(monkeypatch):
    from aiayn.training.loss import CPU_CHUNK_ROWS, chunk_rows_for_memory, loss_chunk_rows

    assert loss_chunk_rows(torch.device("cpu"), 32000, torch.float32) == CPU_CHUNK_ROWS == 1024
    # A GPU: a quarter of the free memory, at most 2 GiB, in multiples of 1,024 rows; a row of a
    # 32,000-word vocabulary takes 32000 x 12 B in bf16 (2 x 2 B + 8 B a column), 32000 x 16 B in fp32.
    gib = 1 << 30
    assert chunk_rows_for_memory(60 * gib, 32000, torch.bfloat16) == 5 * 1024  # capped: 2 GiB = 5,592 rows
    assert chunk_rows_for_memory(6 * gib, 32000, torch.bfloat16) == 4 * 1024  # a quarter: 1.5 GiB = 4,194 rows
    assert chunk_rows_for_memory(8 * gib, 32000, torch.float32) == 4 * 1024  # 2 GiB = 4,194 rows
    assert chunk_rows_for_memory(gib, 32000, torch.bfloat16) == CPU_CHUNK_ROWS  # never below the CPU's
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 3 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: gib)
    # 2 GiB free + 2 GiB held by the caching allocator but unused: a quarter is 1 GiB = 2,796 rows.
    assert loss_chunk_rows(torch.device("cuda", 0), 32000, torch.bfloat16) == 2 * 1024


# --------------------------------------------------------------------------- chunk sizes (exact) and
# gradients without smoothing


def test_chunk_rows_are_a_whole_number_of_rows():
    """An int, floored to whole multiples of 1,024 rows, below the cap and at it."""
    from aiayn.training.loss import chunk_rows_for_memory

    gib = 1 << 30
    # a quarter of 6 GiB is 1.5 GiB: 4,194 rows of 32,000 x 12 B (bf16), 3,145 of 32,000 x 16 B (fp32)
    for free, dtype, rows in [(6 * gib, torch.bfloat16, 4096), (6 * gib + 3, torch.bfloat16, 4096),
                              (6 * gib, torch.float32, 3072), (60 * gib, torch.bfloat16, 5120)]:
        got = chunk_rows_for_memory(free, 32000, dtype)
        assert type(got) is int and got == rows


def test_the_loss_chunk_reads_the_memory_of_its_own_device(monkeypatch):
    """The free and cached memory are those of the tensors' device (cuda:1 here, not the
    current device), and the rows are sized for the matmul dtype."""
    from aiayn.training.loss import loss_chunk_rows

    gib = 1 << 30
    asked = []

    def reports(what, value):
        def query(device=None):
            asked.append((what, device))
            return value
        return query

    monkeypatch.setattr(torch.cuda, "mem_get_info", reports("free", (4 * gib, 80 * gib)))
    monkeypatch.setattr(torch.cuda, "memory_reserved", reports("reserved", 3 * gib))
    monkeypatch.setattr(torch.cuda, "memory_allocated", reports("allocated", gib))
    device = torch.device("cuda", 1)
    # 4 GiB free + 2 GiB cached: a quarter is 1.5 GiB, 4,194 rows in bf16 and 3,145 in float32
    assert loss_chunk_rows(device, 32000, torch.bfloat16) == 4096
    assert sorted(asked) == [("allocated", device), ("free", device), ("reserved", device)]
    assert loss_chunk_rows(device, 32000, torch.float32) == 3072


def test_projected_loss_sizes_its_chunks_for_its_device_vocabulary_and_matmul_dtype(monkeypatch):
    import aiayn.training.loss as loss_module

    asked = []

    def chunk_rows(device, vocab, matmul_dtype):
        asked.append((device, vocab, matmul_dtype))
        return 3

    monkeypatch.setattr(loss_module, "loss_chunk_rows", chunk_rows)
    torch.manual_seed(11)
    h, w, t = torch.randn(2, 5, 4), torch.randn(9, 4), torch.randint(0, 9, (2, 5))
    loss, nll = projected_label_smoothed_loss(h, w, None, t)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        projected_label_smoothed_loss(h, w, None, t)
    cpu = torch.device("cpu")
    assert asked == [(cpu, 9, torch.float32), (cpu, 9, torch.bfloat16)]
    assert type(asked[0][1]) is int
    ref_loss, ref_nll = projected_label_smoothed_loss(h, w, None, t, chunk_rows=3)
    assert loss.item() == ref_loss.item() and nll.item() == ref_nll.item()


def test_projected_loss_gradients_without_smoothing_never_read_the_smoothing_sums():
    """epsilon 0: the gradients have no smoothing term, not even 0 times it. The column sums
    that only the smoothing reads (of the weight, and of the kept states) overflow float32 here
    (a weight column and a state column of 1e38 that the logits multiply by 0), and the
    gradients are still those of the plain NLL, finite."""
    torch.manual_seed(12)
    h, w = torch.randn(4, 3), torch.randn(5, 3)
    h[:, 0], h[:, 1] = 0.0, 1e38
    w[:, 0], w[:, 1] = 1e38, 0.0
    h.requires_grad_()
    w.requires_grad_()
    t = torch.tensor([1, 2, 3, 4])
    loss, nll = projected_label_smoothed_loss(h, w, None, t, 0.0, None, chunk_rows=2)
    gh, gw = torch.autograd.grad(loss, [h, w])
    ref = F.cross_entropy(F.linear(h, w), t, reduction="sum")
    rh, rw = torch.autograd.grad(ref, [h, w])
    assert torch.isfinite(gh).all() and torch.isfinite(gw).all()
    assert torch.allclose(loss, ref, rtol=1e-6) and loss.item() == nll.item()
    # the 1e38 columns are sums that cancel to about 0: equal to float32 rounding of 1e38
    assert (gh - rh).abs().max() <= 1e-6 * 1e38 and (gw - rw).abs().max() <= 1e-6 * 1e38
    assert torch.allclose(gh[:, 2], rh[:, 2], rtol=1e-4) and torch.allclose(gw[:, 2], rw[:, 2], rtol=1e-4)


def test_projected_loss_gradients_match_the_unfused_ones_where_the_smoothing_weights_cancel():
    """epsilon 2^60 over two classes: in floating point 1 - eps - eps/(V-1) is -2^61, so the
    softmax's weight a + eps/(V-1) * V in d loss / d z is 0, as it is in the unfused loss's
    gradient (which rounds its weights the same way); the fused gradients are still those."""
    torch.manual_seed(13)
    h = torch.randn(6, 4, requires_grad=True)
    w = torch.randn(2, 4, requires_grad=True)
    t = torch.tensor([0, 1, 1, 0, 1, 0])
    eps = 2.0 ** 60
    loss, _ = projected_label_smoothed_loss(h, w, None, t, eps, None, chunk_rows=4)
    ref, _ = _unfused(h, w, None, t, eps, None)
    grads = torch.autograd.grad(loss, [h, w])
    ref_grads = torch.autograd.grad(ref, [h, w])
    assert torch.allclose(loss, ref, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        assert torch.isfinite(g).all() and torch.allclose(g, r, rtol=1e-5)
