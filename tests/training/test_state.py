"""TrainerState: state.json keeps the layout earlier versions wrote, and reads back exactly."""

import json

import torch

from aiayn.checkpoint.directory import resolve_checkpoint, save_checkpoint
from aiayn.checkpoint.layout import STATE_FILE
from aiayn.checkpoint.training_state import capture_rng_state
from aiayn.data.batching import BatchIterator
from aiayn.model import build_model
from aiayn.training.state import NonfiniteCounts, TrainerState, reshard_position
from aiayn.training.trainer import Trainer

# The keys of state.json as the trainer wrote them before TrainerState (in that order), and
# of its nested "nonfinite" object; format_version, torch_version and saved_at follow.
KEYS = ["step", "epoch", "data", "scheduler", "rng", "rng_per_rank", "world_size", "scaler",
        "nonfinite", "tokens_seen", "elapsed", "best", "last_valid"]
NONFINITE_KEYS = ["consecutive", "total", "fp16_overflows"]
# Keys after those, each with the value a state.json without it reads back as.
ADDED = {"validations_since_best": 0}


def _old_format_state(rng: dict) -> dict:
    """A state.json as the trainer wrote it before TrainerState existed (written by hand)."""
    return {
        "step": 6, "epoch": 2, "data": {"epoch": 2, "offset": 1},
        "scheduler": {"kind": "constant", "step": 6, "lr": 0.003},
        "rng": rng, "rng_per_rank": None, "world_size": 1, "scaler": None,
        "nonfinite": {"consecutive": 1, "total": 2, "fp16_overflows": 0},
        "tokens_seen": 321, "elapsed": 12.5,
        "best": {"metric": "valid_loss", "value": 1.25, "step": 4},
        "last_valid": {"step": 6, "valid_loss": 1.5, "valid_nll": 1.4, "valid_ppl": 4.05},
    }


def test_json_round_trip_keeps_the_layout():
    old = {**_old_format_state({"python": [3, [1, 2], None]}), "format_version": 1,
           "torch_version": "2.13.0+cpu", "saved_at": "2026-01-01T00:00:00+0000"}
    state = TrainerState.from_json(old)
    assert state.nonfinite == NonfiniteCounts(consecutive=1, total=2, fp16_overflows=0)
    assert state.best == {"metric": "valid_loss", "value": 1.25, "step": 4}
    out = state.to_json()
    assert list(out) == KEYS + list(ADDED) and list(out["nonfinite"]) == NONFINITE_KEYS
    # Everything the trainer wrote comes back; the checkpoint's own keys are not state.
    assert out == {**{k: v for k, v in old.items() if k in KEYS}, **ADDED}


def test_missing_keys_keep_their_defaults():
    state = TrainerState.from_json({"step": 3, "rng": {}, "nonfinite": None})
    assert (state.step, state.tokens_seen, state.elapsed, state.world_size) == (3, 0, 0.0, 1)
    assert state.nonfinite == NonfiniteCounts() and state.best is None
    assert TrainerState.from_json({"step": 1, "nonfinite": {"total": 4}}).nonfinite == NonfiniteCounts(total=4)


def test_nonfinite_counts():
    nf = NonfiniteCounts()
    for nonfinite in (True, True, False, True):
        nf.add(nonfinite, overflow=False)
    nf.add(False, overflow=True)
    assert nf == NonfiniteCounts(consecutive=0, total=3, fp16_overflows=1)


def test_reshard_position_keeps_the_batches_seen():
    def count() -> int:
        return 40

    assert reshard_position({"epoch": 2, "offset": 5}, 1, 1, count) == {"epoch": 2, "offset": 5}
    assert reshard_position({"epoch": 2, "offset": 5}, None, 1, count) == {"epoch": 2, "offset": 5}
    assert reshard_position({"epoch": 2, "offset": 5}, 2, 1, count) == {"epoch": 2, "offset": 10}
    assert reshard_position({"epoch": 2, "offset": 5}, 1, 2, count) == {"epoch": 2, "offset": 2}
    assert reshard_position({"epoch": 2, "offset": 30}, 4, 1, count) == {"epoch": 2, "offset": 40}


def test_reshard_position_counts_batches_only_when_resharding():
    """With subword sampling the count segments a whole epoch: a same-size resume skips it."""
    def never() -> int:
        raise AssertionError("counted the batches")

    assert reshard_position({"epoch": 3, "offset": 7}, 2, 2, never) == {"epoch": 3, "offset": 7}


def _trainer(cfg, run_dir, task):
    torch.manual_seed(0)
    return Trainer(cfg, build_model(cfg.model), run_dir,
                   train_batches=BatchIterator(task, cfg.train.max_tokens, seed=cfg.train.seed))


def test_trainer_writes_the_same_state_json_layout(make_cfg, make_task, tmp_path):
    cfg = make_cfg(max_steps=3, save_every=3)
    tr = _trainer(cfg, tmp_path, make_task(n=40))
    tr.train()
    state = json.loads((resolve_checkpoint(tmp_path) / STATE_FILE).read_text())
    assert list(state) == [*KEYS, *ADDED, "format_version", "torch_version", "saved_at"]
    assert list(state["nonfinite"]) == NONFINITE_KEYS
    assert state["step"] == 3 and state["data"] == tr.train_batches.state_dict()
    assert state["epoch"] == state["data"]["epoch"] and state["world_size"] == 1
    assert state["scheduler"] == {"kind": "constant", "step": 3, "lr": tr.schedule(3)}


def test_a_checkpoint_in_the_old_format_resumes(make_cfg, make_task, tmp_path):
    """A checkpoint whose state.json is written in the pre-TrainerState format, not by the
    trainer: loading it restores every field, the data position and the RNG."""
    cfg = make_cfg()
    task = make_task(n=40)
    src = _trainer(cfg, None, task)
    torch.manual_seed(1234)
    rng = capture_rng_state("cpu")
    expected = torch.rand(3)
    path = save_checkpoint(tmp_path / "step_000006", src.model, cfg, state=_old_format_state(rng),
                              optimizer=src.optimizer)
    tr = _trainer(cfg, tmp_path / "run", task)
    tr.load(path)
    assert torch.equal(torch.rand(3), expected)
    assert tr.state.to_json() == {**_old_format_state(rng), **ADDED}
    assert tr.train_batches.state_dict() == {"epoch": 2, "offset": 1}
    assert tr.elapsed() == 12.5
    for a, b in zip(src.model.state_dict().values(), tr.model.state_dict().values()):
        assert torch.equal(a, b)
