"""Training state (aiayn.checkpoint.training_state): the optimizer's state in two files, restored
with this optimizer's kernel choice, and the random generators' states, so that a resumed run
continues the interrupted one."""

import base64
import json
import logging
import random

import numpy as np
import pytest
import torch
from safetensors import safe_open

from aiayn.checkpoint.directory import save_checkpoint
from aiayn.checkpoint.layout import OPTIMIZER_FILE, OPTIMIZER_JSON
from aiayn.checkpoint.training_state import (
    capture_rng_state,
    load_optimizer_state,
    restore_optimizer,
    restore_rng_state,
    save_optimizer,
)
from aiayn.errors import CheckpointError
from aiayn.model import build_model
from aiayn.training.optim import build_optimizer

from .conftest import error, optimizer_dict, reseal

LOGGER = "aiayn.checkpoint.training_state"


# ---------------------------------------------------------------------------- optimizer


def test_saved_optimizer_tensors_are_copied_to_the_cpu(tmp_path, monkeypatch):
    calls = []
    to = torch.Tensor.to

    def spy(self, *args, **kwargs):
        calls.append((args, kwargs))
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    save_optimizer({"state": {0: {"m": torch.ones(2)}}, "param_groups": [{"params": [0]}]}, tmp_path)
    assert calls == [(("cpu",), {})]


def _check_optimizer_state(loaded):
    assert sorted(loaded["state"]) == [0, 1]
    assert sorted(loaded["state"][0]) == ["m.v", "step"] and loaded["state"][0]["step"] == 3
    assert torch.equal(loaded["state"][0]["m.v"], torch.tensor([1.0, 2.0]))
    assert loaded["state"][1] == {"step": 4}
    assert loaded["param_groups"] == [{"params": [0, 1], "lr": 0.5, "betas": (0.9, 0.98)}]


def test_optimizer_files_exact_and_round_trip(tmp_path):
    save_optimizer(optimizer_dict(), tmp_path)
    meta = {"format_version": 1, "param_groups": [{"params": [0, 1], "lr": 0.5, "betas": [0.9, 0.98]}],
            "scalars": {"0": {"step": 3}, "1": {"step": 4}}, "param_ids": ["0", "1"]}
    assert (tmp_path / OPTIMIZER_JSON).read_text(encoding="utf-8") == json.dumps(meta, indent=1)
    with safe_open(str(tmp_path / OPTIMIZER_FILE), framework="pt") as f:
        assert f.metadata() == {"format": "pt"} and list(f.keys()) == ["state.0.m.v"]
    _check_optimizer_state(load_optimizer_state(tmp_path))
    # Without the list of parameter ids, the ids come from the tensors and the scalars.
    meta.pop("param_ids")
    (tmp_path / OPTIMIZER_JSON).write_text(json.dumps(meta), encoding="utf-8")
    _check_optimizer_state(load_optimizer_state(tmp_path))


@pytest.mark.parametrize("missing", [OPTIMIZER_FILE, OPTIMIZER_JSON])
def test_optimizer_state_with_one_file_missing(tmp_path, missing):
    save_optimizer(optimizer_dict(), tmp_path)
    (tmp_path / missing).unlink()
    assert error(load_optimizer_state, tmp_path) == \
        f"{tmp_path}: no optimizer state in this checkpoint (optimizer.safetensors / optimizer.json missing)"


def test_unreadable_and_malformed_optimizer_json_messages(tmp_path):
    save_optimizer(optimizer_dict(), tmp_path)
    (tmp_path / OPTIMIZER_JSON).write_text("{", encoding="utf-8")
    with pytest.raises(json.JSONDecodeError) as bad:
        json.loads("{")
    assert error(load_optimizer_state, tmp_path) == f"{tmp_path}: cannot read the optimizer state: {bad.value}"
    (tmp_path / OPTIMIZER_JSON).write_text("{}", encoding="utf-8")
    assert error(load_optimizer_state, tmp_path) == \
        f"{tmp_path / OPTIMIZER_JSON}: malformed optimizer state (KeyError: 'param_groups')"


@pytest.mark.parametrize("text", ["[]", '{"param_ids": ["x"], "param_groups": []}', '{"param_groups": 3}'])
def test_a_malformed_optimizer_json_is_one_clear_error(tmp_path, make_cfg, text):
    """A malformed optimizer.json (read on --resume) is one clear error, not a KeyError/TypeError traceback."""
    cfg = make_cfg()
    model = build_model(cfg.model)
    save_checkpoint(tmp_path / "c", model, cfg, optimizer=build_optimizer(model, cfg.train))
    (tmp_path / "c" / OPTIMIZER_JSON).write_text(text)
    reseal(tmp_path / "c")
    with pytest.raises(CheckpointError, match="optimizer.json: malformed optimizer state"):
        load_optimizer_state(tmp_path / "c")


KERNEL = ("fused", "foreach", "capturable", "differentiable")


def test_restore_optimizer_keeps_this_optimizers_kernel_choice():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    current = {k: opt.param_groups[0][k] for k in KERNEL}
    saved = opt.state_dict()
    saved["param_groups"][0].update(lr=0.5, foreach=True, fused=False, capturable=True, differentiable=True)
    restore_optimizer(opt, saved)
    assert {k: opt.param_groups[0][k] for k in KERNEL} == current
    assert opt.param_groups[0]["lr"] == 0.5


def test_restore_optimizer_that_does_not_fit():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    saved = opt.state_dict()
    two_groups = {"state": {}, "param_groups": saved["param_groups"] + [dict(saved["param_groups"][0], params=[1])]}
    assert error(restore_optimizer, opt, two_groups) == \
        "optimizer state has a different number of parameter groups"
    two_params = {"state": {}, "param_groups": [dict(saved["param_groups"][0], params=[0, 1])]}
    assert error(restore_optimizer, opt, two_params) == (
        "optimizer state does not fit this model: loaded state dict contains a parameter group that "
        "doesn't match the size of optimizer's group")


# ---------------------------------------------------------------------------------- RNG


def test_rng_round_trip():
    import random

    import numpy as np

    state = capture_rng_state()
    a = (random.random(), np.random.rand(), torch.rand(3))
    json.dumps(state)  # JSON-safe
    restore_rng_state(json.loads(json.dumps(state)))
    b = (random.random(), np.random.rand(), torch.rand(3))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def test_rng_state_values():
    random.seed(5)
    np.random.seed(3)
    np.random.standard_normal()  # leaves the second value of a pair cached
    kind, key, pos, has_gauss, cached = np.random.get_state()
    assert has_gauss == 1 and int(cached) != has_gauss
    state = capture_rng_state()
    py = random.getstate()
    assert state == {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": {"kind": kind, "key": key.tolist(), "pos": pos, "has_gauss": 1, "cached_gaussian": cached},
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
    }
    np.random.standard_normal()
    restore_rng_state(json.loads(json.dumps(state)))
    assert np.random.standard_normal() == cached


def test_cuda_rng_state_of_the_training_device_only(monkeypatch, caplog):
    read, written = [], []

    def get_rng_state(device):
        read.append(device)
        return torch.tensor([1, 2, 3], dtype=torch.uint8)

    def set_rng_state(new_state, device):
        written.append((new_state.tolist(), device))

    monkeypatch.setattr(torch.cuda, "get_rng_state", get_rng_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    assert "cuda" not in capture_rng_state("cpu") and read == []
    state = capture_rng_state("cuda:1")
    assert state["cuda"] == "AQID" and read == [torch.device("cuda:1")]
    restore_rng_state(state, "cpu")
    assert written == []
    restore_rng_state(state, "cuda:1")
    assert written == [([1, 2, 3], torch.device("cuda:1"))]
    del state["cuda"]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        restore_rng_state(state, "cuda:0")
    assert len(written) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "checkpoint has no CUDA RNG state (saved on CPU): dropout on this GPU will not repeat the "
        "interrupted run exactly"]
