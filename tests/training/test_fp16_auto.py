"""`train.dtype: auto` on CUDA GPUs, decided from the device's facts (stubbed: no GPU needed):
bf16 where it is native, fp16 with the gradient scaler on Volta/Turing, fp32 before them; the
WMT recipes ask for `auto`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from aiayn.config import load_config
from aiayn.runtime.devices import cuda_fp16_tensor_cores
from aiayn.runtime.precision import resolve_train_dtype
from aiayn.training import amp

REPO = Path(__file__).resolve().parents[2]


def _gpu(monkeypatch: pytest.MonkeyPatch, major: int, minor: int = 0) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(major=major, minor=minor, name=f"sm_{major}{minor}"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # says True on a V100 too


@pytest.mark.parametrize(("major", "minor", "expected"), [
    (6, 0, "fp32"),  # P100: no tensor cores
    (7, 0, "fp16"),  # V100
    (7, 5, "fp16"),  # T4, RTX 20xx
    (8, 0, "bf16"),  # A100
    (9, 0, "bf16"),  # H100, H200
])
def test_auto_picks_fp16_with_the_scaler_where_bf16_is_emulated(monkeypatch: pytest.MonkeyPatch, major: int,
                                                                 minor: int, expected: str) -> None:
    _gpu(monkeypatch, major, minor)
    cuda = torch.device("cuda", 0)
    dtype = resolve_train_dtype("auto", cuda)
    assert dtype == expected and cuda_fp16_tensor_cores(cuda) is (major >= 7)
    amp.check_fp16_device(dtype, cuda)  # fp16 is accepted on CUDA
    scaler = amp.grad_scaler(dtype, cuda)
    assert scaler.is_enabled() is (dtype == "fp16")
    label = amp.dtype_label("auto", dtype)
    assert label.startswith(f"dtype auto -> {dtype}: ")
    assert ("gradient scaler" in label) is (dtype == "fp16")
    # Explicit choices are kept as given.
    assert resolve_train_dtype("bf16", cuda) == "bf16" and resolve_train_dtype("fp32", cuda) == "fp32"


def test_never_fp16_off_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu(monkeypatch, 7, 5)
    assert not cuda_fp16_tensor_cores("cpu")
    assert resolve_train_dtype("auto", "cpu") in ("bf16", "fp32")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not cuda_fp16_tensor_cores("cuda") and resolve_train_dtype("auto", "cuda") == "fp32"


@pytest.mark.parametrize("name", ["wmt14_en_de_base", "wmt14_en_de_big", "wmt14_en_fr_big"])
def test_the_wmt_recipes_leave_the_precision_to_the_device(name: str) -> None:
    assert load_config(REPO / "configs" / f"{name}.yaml").train.dtype == "auto"
