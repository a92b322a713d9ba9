"""int8 inference: weights quantized once, activations quantized at each call.

A linear layer y = x W^T + b becomes

    W ~ diag(s_w) W8        s_w[n] = max_k |W[n, k]| / 127      (per output row, once)
    x ~ diag(s_x) x8        s_x[m] = max_k |x[m, k]| / 127      (per row of x, every call)
    y ~ (x8 W8^T) * s_w^T * s_x + b

where ``x8 W8^T`` is an exact integer matmul. This is the symmetric per-channel weight,
per-token activation scheme of CTranslate2's ``int8`` compute type.

Two kernels compute the same numbers (tests check them against each other and against an
int64 reference):

* ``onednn`` (x86 builds of torch): oneDNN's int8 linear, the kernel torch's own x86 int8
  path uses. It reads x8 as uint8 with zero point 128 (its fast kernels want an unsigned
  input) and multiplies by s_w inside the matmul, so only s_x and b are left: 2 cheap
  passes. The faster of the two, so it is used wherever it exists.
* ``int_mm``: ``torch._int_mm`` (int8 x int8 -> int32) and the scaling as separate passes,
  wherever oneDNN's op is missing.

Only the inference path uses it: :func:`aiayn.inference.optimize.optimize_for_inference`
swaps these layers into its copy of a model, never into the model itself. The embeddings,
LayerNorms and attention's score/value products stay in float32. A quantized copy cannot
be trained or saved as a checkpoint.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

_QMAX = 127.0
_ZERO_POINT = 128  # int8 -> uint8 for oneDNN: x8 + 128
_TINY = torch.finfo(torch.float32).tiny


def _onednn_available() -> bool:
    # Without VNNI (or AMX) oneDNN's x86 int8 kernels multiply uint8 x int8 pairs with
    # vpmaddubsw, whose int16 sums saturate: wrong results for full-range inputs. There,
    # torch._int_mm computes the exact integer products.
    exact = torch.cpu._is_vnni_supported() or torch.cpu._is_amx_tile_supported()
    return exact and torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")


# Which kernel new Int8Linear layers use; tests switch it to compare the two.
KERNEL = "onednn" if _onednn_available() else "int_mm"


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 quantization of each row: x (M, K) -> x8 (M, K) int8, scale (M, 1).

    All-zero rows get the smallest positive scale (their int8 row is zero either way)."""
    scale = x.abs().amax(dim=1, keepdim=True).div_(_QMAX).clamp_(min=_TINY)
    # round, then convert: float -> int8 truncates (and converts faster than float -> uint8)
    return (x / scale).round_().to(torch.int8), scale


def _as_uint8(x8: Tensor) -> Tensor:
    """x8 + 128 as uint8, in place: flipping the sign bit of the two's-complement byte."""
    return x8.view(torch.uint8).bitwise_xor_(0x80)


class Int8Linear(nn.Module):
    """An ``nn.Linear`` (weight (N, K), bias (N,)) with int8 weights and int8 inputs.

    The weight is kept only in the chosen kernel's layout (oneDNN's packed tensor, or the
    transposed (K, N) matrix ``torch._int_mm`` reads fastest), as a plain attribute: it is
    not a parameter or buffer, and the module has no state dict worth saving.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None, kernel: str | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.kernel = kernel or KERNEL
        w8, scale = quantize_rows(weight.detach().float())  # (N, K) int8, (N, 1)
        self.weight_scale = scale[:, 0].contiguous()  # (N,)
        self.bias = None if bias is None else bias.detach().float().clone()
        if self.kernel == "onednn":
            self.packed_weight = torch.ops.onednn.qlinear_prepack(w8, None)
            self._weight_zero_point = torch.zeros(self.out_features, dtype=torch.long)
        elif self.kernel == "int_mm":
            self.packed_weight = w8.t().contiguous()  # (K, N)
        else:
            raise ValueError(f"Int8Linear: unknown kernel {self.kernel!r} (onednn, int_mm)")

    def forward(self, x: Tensor) -> Tensor:
        # x (..., K) float -> (..., N) float32
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("Int8Linear is for inference; a quantized model cannot be trained")
        lead = x.shape[:-1]
        x = x.reshape(-1, self.in_features).float()  # (M, K)
        x8, x_scale = quantize_rows(x)
        if self.kernel == "onednn":
            xu = _as_uint8(x8)
            # (xu - 128) W8^T * s_w: exact integer products, scaled by s_w in the epilogue
            y = torch.ops.onednn.qlinear_pointwise(
                xu, 1.0, _ZERO_POINT, self.packed_weight, self.weight_scale, self._weight_zero_point,
                None, 1.0, 0, torch.float32, "none", [], "")
        else:
            y = torch._int_mm(x8, self.packed_weight) * self.weight_scale  # int32 -> float32
        y.mul_(x_scale)  # (M, N)
        if self.bias is not None:
            y.add_(self.bias)
        return y.view(*lead, self.out_features)

    def with_int_mm(self) -> Int8Linear:
        """The same layer computing with ``torch._int_mm``: the same integer products, over a
        plain (K, N) int8 weight that ``torch.export`` can trace (oneDNN's packed weight is an
        opaque tensor it cannot). Shares this layer's scales and bias; the weight is unpacked
        from oneDNN's layout, exactly."""
        if self.kernel == "int_mm":
            return self
        twin = copy.copy(self)  # a shallow copy: the same scales and bias
        twin.kernel = "int_mm"
        twin.packed_weight = self.packed_weight.to_dense()  # oneDNN keeps the (K, N) matrix
        if twin.packed_weight.shape != (self.in_features, self.out_features):
            raise RuntimeError(f"Int8Linear: oneDNN's weight unpacks to {tuple(twin.packed_weight.shape)}, "
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
