"""Fixtures and helpers of the checkpoint tests."""

from pathlib import Path

import pytest
import torch

from aiayn.checkpoint.directory import _files, _sha256
from aiayn.checkpoint.layout import MANIFEST_FILE, MODEL_FILE
from aiayn.errors import CheckpointError
from aiayn.model import build_model
from aiayn.training.optim import build_optimizer


@pytest.fixture(autouse=True)
def _tiny_models_on_one_thread(one_thread):
    yield


def trained(cfg):
    """A model of ``cfg`` and its optimizer after one update (seeded)."""
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = build_optimizer(model, cfg.train)
    x = torch.randint(4, cfg.model.src_vocab_size, (3, 5))
    model(x, x).float().pow(2).mean().backward()
    opt.step()
    return model, opt


class Params(torch.nn.Module):
    """One small parameter per name, each with its own storage (so none is an alias)."""

    def __init__(self, names, shape=(1,)):
        super().__init__()
        for name in names:
            self.register_parameter(name, torch.nn.Parameter(torch.zeros(shape)))


def fake_ckpt(d: Path, name: str) -> Path:
    """A directory that listing and pruning take for a complete checkpoint (they look for
    the weights and the manifest only)."""
    p = d / name
    p.mkdir(parents=True)
    (p / MODEL_FILE).write_bytes(b"")
    (p / MANIFEST_FILE).write_text("")
    return p


def error(call, *args) -> str:
    with pytest.raises(CheckpointError) as exc:
        call(*args)
    return str(exc.value)


def reseal(ckpt) -> None:
    """Rewrite the checksum manifest after a deliberate edit (as an attacker or a bad tool could)."""
    lines = [f"{_sha256(f)}  {f.relative_to(ckpt).as_posix()}"
             for f in _files(ckpt) if f.name != MANIFEST_FILE]
    (ckpt / MANIFEST_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")


def optimizer_dict():
    # A dotted state name, a scalar beside a tensor, and a parameter with scalars only.
    return {"state": {0: {"step": 3, "m.v": torch.tensor([1.0, 2.0])}, 1: {"step": 4}},
            "param_groups": [{"params": [0, 1], "lr": 0.5, "betas": (0.9, 0.98)}]}
