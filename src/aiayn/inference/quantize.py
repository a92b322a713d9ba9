"""int8 inference: weights quantized once, activations quantized at each call.

A linear layer y = x W^T + b becomes

    W ~ diag(s_w) W8        s_w[n] = max_k |W[n, k]| / 127      (per output row, once)
    x ~ diag(s_x) x8        s_x[m] = max_k |x[m, k]| / 127      (per row of x, every call)
    y ~ (x8 W8^T) * s_w^T * s_x + b

where ``x8 W8^T`` is an exact integer matmul. This is the symmetric per-channel weight,
per-token activation scheme of CTranslate2's ``int8`` compute type.

Three kernels compute these numbers (tests check them against each other and against an
int64 reference):

* ``onednn`` (x86 builds of torch): oneDNN's int8 linear, the kernel torch's own x86 int8
  path uses. It reads x8 as uint8 with zero point 128 (its fast kernels want an unsigned
  input) and multiplies by s_w inside the matmul, so only s_x and b are left: 2 cheap
  passes. Used on CPUs with int8 dot products (AVX-512 VNNI, AVX-VNNI, AMX).
* ``fbgemm`` (x86 builds of torch): fbgemm's int8 linear over float inputs, given one scale
  and zero point for the whole input. Each row is divided by its own max |x| first, so that
  one scale (1/63, zero point 64) quantizes every row to +-63 around 64: per-token scales as
  above, with 7-bit inputs. Used on x86 CPUs without int8 dot products (AVX2-only, AVX-512
  without VNNI): there its kernels beat both oneDNN's and float32's at every batch size,
  one sentence at a time included (docs/results.md).
* ``int_mm``: ``torch._int_mm`` (int8 x int8 -> int32) and the scaling as separate passes,
  wherever neither library is there. On x86 CPUs without AVX-512 VNNI torch runs it on a
  reference loop, orders of magnitude slower than a float32 matmul.

Without int8 dot products, both libraries' kernels use ``vpmaddubsw``, which adds two
uint8 x int8 products into a saturating int16: 255 * 127 * 2 overflows it. fbgemm's inputs
stay in [1, 127], so full-range weights are exact (127 * 127 * 2 = 32,258 fits). oneDNN's
inputs span [0, 255], so where it must run on such a CPU its weights are quantized to +-63
(``s_w[n] = max_k |W[n, k]| / 63``): 255 * 63 * 2 = 32,130 fits, so the integer products
are exact again, at the cost of one bit of weight resolution (oneDNN's own advice for these
CPUs). Which case holds for oneDNN is measured, not read from the CPU flags:
:func:`full_range_exact` multiplies the worst-case pair once per process, so a narrowed
instruction set (``ONEDNN_MAX_CPU_ISA``) is seen as the kernel really runs.

Only the inference path uses it: :func:`aiayn.inference.optimize.optimize_for_inference`
swaps these layers into its copy of a model, never into the model itself. The embeddings,
LayerNorms and attention's score/value products stay in float32. A quantized copy cannot
be trained or saved as a checkpoint.
"""

from __future__ import annotations

import copy
import functools
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.runtime import cpu
from aiayn.runtime.precision import INT8_DOT_PRODUCTS, int8_kernel

_QMAX = 127.0
_QMAX_7_BITS = 63.0  # oneDNN's weights, fbgemm's inputs, where pair sums saturate (module docstring)
_ZERO_POINT = 128  # int8 -> uint8 for oneDNN: x8 + 128
_FBGEMM_ZERO_POINT = 64  # fbgemm's inputs: x8 + 64, in [1, 127]
_TINY = torch.finfo(torch.float32).tiny
KERNELS = ("onednn", "fbgemm", "int_mm")


# Which kernel new Int8Linear layers use; tests switch it to compare them.
KERNEL = int8_kernel()


def _onednn_linear(xu: Tensor, packed_weight: Tensor, weight_scale: Tensor, weight_zero_point: Tensor) -> Tensor:
    """(xu - 128) W8^T * s_w in float32, by oneDNN: xu uint8 (M, K), W8 packed (N, K), the
    weights' zero points int64 zeros (N,): exact integer products, scaled in the epilogue."""
    return torch.ops.onednn.qlinear_pointwise(xu, 1.0, _ZERO_POINT, packed_weight, weight_scale, weight_zero_point,
                                              None, 1.0, 0, torch.float32, "none", [], "")


def _fbgemm_linear(x_unit: Tensor, packed_weight: Any) -> Tensor:
    """x8 W8^T * s_w / 63 in float32, by fbgemm: ``x_unit`` (M, K) float32 rows scaled into
    [-1, 1], quantized inside the op to x8 = round(63 x_unit) (stored as x8 + 64); the
    per-channel weight and its scales in ``packed_weight``."""
    return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
        x_unit, 1.0 / _QMAX_7_BITS, _FBGEMM_ZERO_POINT, packed_weight)


def _fbgemm_prepack(w8: Tensor, scale: Tensor) -> Any:
    """fbgemm's packed weight of ``w8`` (N, K) int8 with per-row ``scale`` (N,)."""
    engine = torch.backends.quantized.engine
    with warnings.catch_warnings():  # torch marks its quantized tensor type as deprecated
        warnings.simplefilter("ignore", UserWarning)
        qweight = torch._make_per_channel_quantized_tensor(
            w8, scale.double(), torch.zeros(w8.size(0), dtype=torch.long), 0)
        try:
            torch.backends.quantized.engine = "fbgemm"
            return torch.ops.quantized.linear_prepack(qweight, None)
        finally:
            torch.backends.quantized.engine = engine


@functools.lru_cache(maxsize=1)
def full_range_exact() -> bool:
    """Whether oneDNN's int8 linear computes full-range products exactly on this CPU: the
    largest input (uint8 255, i.e. int8 127) times the largest weight (127), summed over 64
    columns, which a saturating int16 pair sum gets wrong. Measured once per process."""
    k = 64
    weight = torch.full((8, k), int(_QMAX), dtype=torch.int8)
    xu = torch.full((4, k), 255, dtype=torch.uint8)
    y = _onednn_linear(xu, torch.ops.onednn.qlinear_prepack(weight, None), torch.ones(8),
                       torch.zeros(8, dtype=torch.long))
    return bool((y == _QMAX * _QMAX * k).all())


@functools.cache
def int_mm_exact(input_qmax: float, weight_qmax: float) -> bool:
    """Whether ``torch._int_mm`` multiplies inputs of up to +-``input_qmax`` by weights of up to
    +-``weight_qmax`` exactly on this CPU. Without int8 dot products, oneDNN (which runs it)
    shifts the inputs to uint8 and sums pairs of products in a saturating int16, so large
    ranges come out wrong. Measured once per pair of ranges, at their extremes."""
    k = 64
    weight = torch.full((k, 8), int(weight_qmax), dtype=torch.int8)
    for sign in (1, -1):
        x8 = torch.full((4, k), sign * int(input_qmax), dtype=torch.int8)
        if not bool((torch._int_mm(x8, weight) == sign * int(input_qmax) * int(weight_qmax) * k).all()):
            return False
    return True


def weight_qmax(kernel: str) -> float:
    """The largest integer a weight is quantized to for ``kernel``: 127, or 63 where oneDNN's
    products of full-range weights would saturate (module docstring)."""
    if kernel == "onednn" and not full_range_exact():
        return _QMAX_7_BITS
    return _QMAX


def quantize_rows(x: Tensor, qmax: float = _QMAX) -> tuple[Tensor, Tensor]:
    """Symmetric int8 quantization of each row: x (M, K) -> x8 (M, K) int8 in [-qmax, qmax],
    scale (M, 1).

    All-zero rows get the smallest positive scale (their int8 row is zero either way)."""
    scale = x.abs().amax(dim=1, keepdim=True).div_(qmax).clamp_(min=_TINY)
    # round, then convert: float -> int8 truncates (and converts faster than float -> uint8)
    return (x / scale).round_().to(torch.int8), scale


def _as_uint8(x8: Tensor) -> Tensor:
    """x8 + 128 as uint8, in place: flipping the sign bit of the two's-complement byte."""
    return x8.view(torch.uint8).bitwise_xor_(0x80)


class Int8Linear(nn.Module):
    """An ``nn.Linear`` (weight (N, K), bias (N,)) with int8 weights and int8 inputs.

    The weight is kept only in the chosen kernel's layout (oneDNN's or fbgemm's packed weight,
    or the transposed (K, N) matrix ``torch._int_mm`` reads fastest), as a plain attribute: it
    is not a parameter or buffer, and the module has no state dict worth saving.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None, kernel: str | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.kernel = kernel or KERNEL
        if self.kernel not in KERNELS:
            raise ValueError(f"Int8Linear: unknown kernel {self.kernel!r} ({', '.join(KERNELS)})")
        # the largest integer an input is quantized to: fbgemm's inputs keep below saturation
        self.input_qmax = _QMAX_7_BITS if self.kernel == "fbgemm" else _QMAX
        w8, scale = quantize_rows(weight.detach().float(), weight_qmax(self.kernel))  # (N, K) int8, (N, 1)
        self.weight_scale = scale[:, 0].contiguous()  # (N,)
        self.bias = None if bias is None else bias.detach().float().clone()
        if self.kernel == "onednn":
            self.packed_weight = torch.ops.onednn.qlinear_prepack(w8, None)
            self._weight_zero_point = torch.zeros(self.out_features, dtype=torch.long)
        elif self.kernel == "fbgemm":
            self.packed_weight = _fbgemm_prepack(w8, self.weight_scale)
        else:
            self.packed_weight = w8.t().contiguous()  # (K, N)

    def forward(self, x: Tensor) -> Tensor:
        # x (..., K) float -> (..., N) float32
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("Int8Linear is for inference; a quantized model cannot be trained")
        lead = x.shape[:-1]
        x = x.reshape(-1, self.in_features).float()  # (M, K)
        if self.kernel == "fbgemm":
            x_max = x.abs().amax(dim=1, keepdim=True).clamp_(min=_TINY)  # (M, 1): s_x = x_max / 63
            y = _fbgemm_linear(x / x_max, self.packed_weight).mul_(x_max)
        else:
            x8, x_scale = quantize_rows(x, self.input_qmax)
            if self.kernel == "onednn":
                y = _onednn_linear(_as_uint8(x8), self.packed_weight, self.weight_scale, self._weight_zero_point)
            else:
                y = torch._int_mm(x8, self.packed_weight) * self.weight_scale  # int32 -> float32
            y.mul_(x_scale)  # (M, N)
        if self.bias is not None:
            y.add_(self.bias)
        return y.view(*lead, self.out_features)

    def int8_weight(self) -> Tensor:
        """The (N, K) int8 weight, unpacked from the kernel's layout, exactly."""
        if self.kernel == "onednn":
            return self.packed_weight.to_dense().t()  # oneDNN keeps the (K, N) matrix
        if self.kernel == "fbgemm":
            return torch.ops.quantized.linear_unpack(self.packed_weight)[0].int_repr()
        return self.packed_weight.t()

    def compiles_well(self) -> bool:
        """Whether :meth:`with_int_mm`, what a compiled step runs, is fast and exact here:
        ``torch._int_mm`` runs oneDNN's int8 kernels only on CPUs with int8 dot products
        (elsewhere a reference loop, orders of magnitude slower), and must compute this layer's
        ranges exactly (:func:`int_mm_exact`)."""
        return bool(cpu.cpu_flags() & INT8_DOT_PRODUCTS) and int_mm_exact(self.input_qmax,
                                                                              weight_qmax(self.kernel))

    def with_int_mm(self) -> Int8Linear:
        """The same layer computing with ``torch._int_mm``: the same integer products, over a
        plain (K, N) int8 weight that ``torch.export`` can trace (oneDNN's and fbgemm's packed
        weights are opaque objects it cannot). Shares this layer's scales, input range and bias;
        the weight is unpacked from the kernel's layout, exactly."""
        if self.kernel == "int_mm":
            return self
        twin = copy.copy(self)  # a shallow copy: the same scales and bias
        twin.kernel = "int_mm"
        twin.packed_weight = self.int8_weight().t().contiguous()
        if twin.packed_weight.shape != (self.in_features, self.out_features):
            raise RuntimeError(f"Int8Linear: the {self.kernel} weight unpacks to {tuple(twin.packed_weight.shape)}, "
                               f"not ({self.in_features}, {self.out_features})")
        return twin

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}"


def replace_linears(module: nn.Module) -> None:
    """Replace every ``nn.Linear`` under ``module`` by its :class:`Int8Linear`, in place."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child.weight, child.bias))
        else:
            replace_linears(child)
