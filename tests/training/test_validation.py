"""Validation on its own: per-token losses, the injected BLEU scorer, RNG isolation, best."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from aiayn.data.batching import collate
from aiayn.model import build_model
from aiayn.training.state import TrainerState
from aiayn.training.trainer import Trainer
from aiayn.training.validation import Validator, is_better, record_validation


class _Batch(SimpleNamespace):
    def to(self, device):
        return self


def _fixed_losses(model, batch):
    # What the trainer's loss gives: summed smoothed loss and NLL of the batch.
    return torch.tensor(batch.loss), torch.tensor(batch.nll)


BATCHES = [_Batch(loss=6.0, nll=5.0, n_tgt_tokens=4), _Batch(loss=3.0, nll=1.0, n_tgt_tokens=2)]


def test_losses_are_per_target_token():
    model = nn.Linear(2, 2)
    result = Validator(BATCHES, _fixed_losses, torch.device("cpu"))(model)
    assert result == {"valid_loss": 9.0 / 6, "valid_nll": 1.0, "valid_ppl": pytest.approx(math.e)}
    assert model.training  # back in training mode
    assert Validator(None, _fixed_losses, torch.device("cpu"))(model) == {}


def test_the_bleu_scorer_gets_the_model_in_eval_mode_and_cannot_move_the_rng():
    model = nn.Linear(2, 2)
    calls = []

    def bleu(m):
        calls.append((m, m.training))
        torch.rand(100)  # e.g. sampling: must not change the stream training continues with
        return 42.5

    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    result = Validator(BATCHES, _fixed_losses, torch.device("cpu"), bleu=bleu)(model)
    assert torch.equal(torch.rand(3), expected)
    assert result["valid_bleu"] == 42.5 and calls == [(model, False)]
    no_score = Validator(BATCHES, _fixed_losses, torch.device("cpu"), bleu=lambda m: None)(model)
    assert "valid_bleu" not in no_score


def test_is_better_and_record_validation():
    assert is_better("valid_loss", {"valid_loss": 2.0}, None)
    assert is_better("valid_loss", {"valid_loss": 1.0}, {"value": 2.0})
    assert not is_better("valid_loss", {"valid_loss": 2.0}, {"value": 2.0})
    assert is_better("valid_bleu", {"valid_bleu": 30.0}, {"value": 20.0})
    assert not is_better("valid_bleu", {"valid_loss": 1.0}, None)  # metric not measured
    state = TrainerState()
    assert record_validation(state, "valid_bleu", {"valid_loss": 2.0, "valid_bleu": 20.0}, 100)
    assert not record_validation(state, "valid_bleu", {"valid_loss": 1.0, "valid_bleu": 10.0}, 200)
    assert state.best == {"metric": "valid_bleu", "value": 20.0, "step": 100}
    assert state.last_valid == {"step": 200, "valid_loss": 1.0, "valid_bleu": 10.0}


def test_the_trainer_reports_the_injected_bleu(make_cfg, make_task):
    cfg = make_cfg()
    task = make_task(n=8)
    batch = collate([(i, *task[i]) for i in range(8)])
    seen = []
    model = build_model(cfg.model)
    tr = Trainer(cfg, model, valid_batches=[batch], bleu=lambda m: seen.append(m) or 12.0)
    metrics = tr.validate()
    assert metrics["valid_bleu"] == 12.0 and seen == [model]
    plain = Trainer(cfg, model, valid_batches=[batch]).validate()
    assert metrics == {**plain, "valid_bleu": 12.0}
