"""Loading a checkpoint builds its model without the random initialization the weights
replace: the loaded values are the saved ones, the global random generator is untouched,
and models built elsewhere are initialized as before."""

from __future__ import annotations

import threading

import torch

from aiayn.checkpoint.directory import load_checkpoint, save_checkpoint
from aiayn.checkpoint.weights import read_model_weights, without_random_init
from aiayn.model import build_model


def test_a_loaded_model_holds_exactly_the_saved_weights_and_draws_no_random_number(tmp_path, make_cfg):
    cfg = make_cfg()
    torch.manual_seed(0)
    path = save_checkpoint(tmp_path / "ck", build_model(cfg.model).eval(), cfg)
    saved = read_model_weights(path / "model.safetensors")
    torch.manual_seed(5)
    before = torch.get_rng_state()
    loaded = load_checkpoint(path)
    assert torch.equal(torch.get_rng_state(), before)
    state = loaded.model.state_dict()
    assert set(state) == set(saved)
    assert all(torch.equal(state[name], saved[name]) for name in saved)
    # The fixed sinusoid tables (not saved) are computed, not drawn.
    torch.manual_seed(1)
    fresh = build_model(cfg.model)
    assert torch.equal(loaded.model.src_positions.table, fresh.src_positions.table)


def test_random_fills_are_skipped_only_inside_and_only_on_its_thread(make_cfg):
    cfg = make_cfg()
    torch.manual_seed(0)
    expected = build_model(cfg.model).state_dict()
    torch.manual_seed(0)
    elsewhere: dict[str, torch.Tensor] = {}

    def build_on_another_thread() -> None:
        torch.manual_seed(0)
        elsewhere.update(build_model(cfg.model).state_dict())

    with without_random_init():
        before = torch.get_rng_state()
        build_model(cfg.model)
        assert torch.equal(torch.get_rng_state(), before)
        worker = threading.Thread(target=build_on_another_thread)
        worker.start()
        worker.join()
    assert all(torch.equal(elsewhere[k], v) for k, v in expected.items())
    torch.manual_seed(0)
    after = build_model(cfg.model).state_dict()
    assert all(torch.equal(after[k], v) for k, v in expected.items())


def test_a_skipped_fill_returns_its_tensor_as_the_fill_would():
    """Code that uses a fill's result (``w = normal_(w, 0, std)``) gets the same tensor back."""
    t = torch.zeros(3)
    with without_random_init():
        assert torch.nn.init.normal_(t, 0.0, 0.02) is t
        assert torch.nn.init.uniform_(t, -0.1, 0.1) is t
        assert t.normal_(0.0, 1.0) is t
    assert torch.equal(t, torch.zeros(3))
