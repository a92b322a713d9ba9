"""Which GPUs compute in bf16 (aiayn.runtime.devices.cuda_native_bf16), decided from the compute
capability with CUDA's answers stubbed: testable without a GPU."""

from types import SimpleNamespace

import pytest
import torch

from aiayn.runtime.devices import cuda_native_bf16
from aiayn.runtime.precision import native_bf16, resolve_train_dtype


@pytest.mark.parametrize(("major", "native"), [(6, False), (7, False), (8, True), (9, True), (10, True)])
def test_bf16_is_native_from_ampere_on(monkeypatch: pytest.MonkeyPatch, major: int, native: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(major=major))
    # torch.cuda.is_bf16_supported() says True on a V100 / T4 too (emulation): not asked.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert cuda_native_bf16("cuda:0") is native and native_bf16("cuda") is native
    # Without native bf16: fp16 (with the gradient scaler) where there are fp16 tensor cores (7.x).
    assert resolve_train_dtype("auto", "cuda:0") == ("bf16" if native else "fp16" if major >= 7 else "fp32")


def test_no_cuda_no_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not cuda_native_bf16() and not native_bf16("cuda")
