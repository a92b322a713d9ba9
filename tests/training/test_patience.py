"""Early stopping (train.patience): the run stops at the validation that makes N in a row
without improvement of best_metric, saves, says why, and a resumed run stops at the same one."""

import dataclasses
import json
import logging

import pytest
import torch

from aiayn.checkpoint.directory import resolve_checkpoint
from aiayn.checkpoint.layout import STATE_FILE
from aiayn.config import Config, apply_overrides
from aiayn.data.batching import BatchIterator
from aiayn.errors import ConfigError
from aiayn.model import build_model
from aiayn.training.state import TrainerState
from aiayn.training.stopping import StoppingRules
from aiayn.training.trainer import Trainer
from aiayn.training.validation import record_validation

# Validation every 2 steps: the best is at step 8; 10, 12 and 14 do not improve on it.
SCRIPTED_LOSS = {2: 5.0, 4: 4.0, 6: 4.5, 8: 3.9, 10: 4.0, 12: 3.9, 14: 3.95, 16: 1.0, 18: 0.5, 20: 0.4}
# The same, higher is better (BLEU).
SCRIPTED_BLEU = {step: 10.0 - loss for step, loss in SCRIPTED_LOSS.items()}


def test_the_counter_counts_validations_without_improvement():
    state = TrainerState()
    seen = []
    for step, loss in ((2, 3.0), (4, 3.5), (6, 3.0), (8, 2.0), (10, 2.5)):
        record_validation(state, "valid_loss", {"valid_loss": loss}, step)
        seen.append(state.validations_since_best)
    assert seen == [0, 1, 2, 0, 1]  # a tie (3.0 at step 6) is no improvement
    record_validation(state, "valid_bleu", {"valid_loss": 1.0}, 12)  # BLEU not computed: not counted
    assert state.validations_since_best == 1


def test_rules_and_message():
    rules = StoppingRules(patience=3)
    assert [rules.out_of_patience(n) for n in (0, 2, 3, 4)] == [False, False, True, True]
    assert not StoppingRules(patience=0).out_of_patience(100)
    assert rules.patience_message("valid_loss", {"metric": "valid_loss", "value": 3.9, "step": 8}) == \
        "early stopping: valid_loss has not improved for 3 validation(s) in a row (train.patience=3); " \
        "the best, 3.9000, was at step 8"


@pytest.mark.parametrize("overrides, message", [
    (["train.patience=-1"], "train.patience: must not be negative, got -1"),
    (["train.patience=2", "train.valid_every=0"],
     "train.patience: early stopping counts validations, but train.valid_every is 0 (no validation)"),
    (["train.patience=2", "train.best_metric=valid_bleu"],
     "train.patience: best_metric valid_bleu is never computed without train.valid_bleu: true"),
])
def test_config_errors(overrides, message):
    with pytest.raises(ConfigError) as exc:
        apply_overrides(Config(), overrides)
    assert str(exc.value) == message


def _trainer(cfg, run_dir, task, scripted, metric="valid_loss"):
    torch.manual_seed(0)
    trainer = Trainer(cfg, build_model(cfg.model), run_dir,
                      train_batches=BatchIterator(task, cfg.train.max_tokens, seed=1),
                      valid_batches=[BatchIterator(task, 64, shuffle=False).make_batch([0, 1])])
    trainer.validate = lambda: {metric: scripted[trainer.state.step]}
    return trainer


def _cfg(make_cfg, **train):
    base = make_cfg(**{"max_steps": 20, "valid_every": 2, "log_every": 5, "save_every": 5, "patience": 3,
                       **train})
    # Dropout on: the resumed run must also continue the same random stream.
    return dataclasses.replace(base, model=dataclasses.replace(base.model, dropout=0.1))


@pytest.mark.parametrize("metric, scripted", [("valid_loss", SCRIPTED_LOSS), ("valid_bleu", SCRIPTED_BLEU)])
def test_stops_at_the_third_validation_without_improvement(make_cfg, make_task, tmp_path, caplog, metric,
                                                            scripted):
    cfg = _cfg(make_cfg, best_metric=metric, valid_bleu=metric == "valid_bleu")
    trainer = _trainer(cfg, tmp_path, make_task(n=24), scripted, metric)
    with caplog.at_level(logging.INFO, logger="aiayn"):
        summary = trainer.train()
    assert summary["stop_reason"] == "patience" and summary["step"] == 14
    assert summary["best"] == {"metric": metric, "value": scripted[8], "step": 8}
    assert resolve_checkpoint(tmp_path).name == "step_000014"  # the stop saves
    state = json.loads((tmp_path / "checkpoints" / "step_000014" / STATE_FILE).read_text())
    assert state["validations_since_best"] == 3
    assert f"early stopping: {metric} has not improved for 3 validation(s) in a row (train.patience=3); " \
        f"the best, {scripted[8]:.4f}, was at step 8" in caplog.messages
    assert f"step 12: {metric} {scripted[12]:.4f} (no improvement in {metric} for 2 of 3 validation(s))" \
        in caplog.messages
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["split"], r["step"]) for r in records if r["step"] > 10] == \
        [("valid", 12), ("valid", 14), ("train", 14)]  # the last updates' record after all


def test_a_resumed_run_stops_at_the_same_validation(make_cfg, make_task, tmp_path):
    task = make_task(n=24)
    full = _trainer(_cfg(make_cfg), tmp_path / "full", task, SCRIPTED_LOSS)
    assert full.train()["step"] == 14
    # Stopped at step 10, after one validation without improvement (the count is saved)...
    _trainer(_cfg(make_cfg, max_steps=10), tmp_path / "half", task, SCRIPTED_LOSS).train()
    resumed = _trainer(_cfg(make_cfg), tmp_path / "half", task, SCRIPTED_LOSS)
    resumed.load(tmp_path / "half")
    assert (resumed.state.step, resumed.state.validations_since_best) == (10, 1)
    # ...and continued: two more validations, as in the run that never stopped.
    summary = resumed.train()
    assert (summary["stop_reason"], summary["step"]) == ("patience", 14)
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)
    # Started again after the early stop: nothing more to do.
    again = _trainer(_cfg(make_cfg), tmp_path / "half", task, SCRIPTED_LOSS)
    again.load(tmp_path / "half")
    assert (again.train()["stop_reason"], again.state.step) == ("patience", 14)


def test_patience_off_trains_to_max_steps(make_cfg, make_task, tmp_path):
    summary = _trainer(_cfg(make_cfg, patience=0), tmp_path, make_task(n=24), SCRIPTED_LOSS).train()
    assert (summary["stop_reason"], summary["step"]) == ("max_steps", 20)
