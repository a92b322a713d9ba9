"""`aiayn train` / the run driver: config printing, errors, validation BLEU, init_from."""

import json
from pathlib import Path

import pytest
import torch
import yaml

from aiayn.cli.main import main
from aiayn.config import DataConfig
from aiayn.data.prepare import ensure_prepared

REPO = Path(__file__).resolve().parents[2]


def _main(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code


def test_print_config_resolves_overrides(capsys):
    code = _main(["train", "--config", str(REPO / "configs" / "tiny_synthetic.yaml"),
                  "--print-config", "--dtype", "bf16", "train.max_steps=7"])
    assert code == 0
    out = capsys.readouterr().out
    data = yaml.safe_load(out)
    assert data["train"]["max_steps"] == 7 and data["train"]["dtype"] == "bf16"
    assert set(data) == {"model", "data", "train", "decode"}
    assert "runs/tiny_synthetic" in out


def test_user_errors_are_one_line(capsys, tmp_path):
    assert _main(["train"]) == 2
    assert "give --config FILE" in capsys.readouterr().err
    assert _main(["train", "--config", str(REPO / "configs" / "tiny_synthetic.yaml"),
                  "--run-dir", str(tmp_path / "r"), "--dtype", "fp16", "train.device=cpu"]) == 2
    assert "fp16 needs a CUDA device" in capsys.readouterr().err
    assert _main(["train", "--config", str(REPO / "configs" / "tiny_synthetic.yaml"),
                  "train.max_stepz=3", "--print-config"]) == 2
    assert "did you mean 'max_steps'" in capsys.readouterr().err
    assert _main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no such checkpoint or run directory" in capsys.readouterr().err


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    cfg = DataConfig(synthetic="reverse", synthetic_train_size=120, synthetic_valid_size=12,
                     synthetic_min_len=2, synthetic_max_len=5, synthetic_vocab=8,
                     spm_model_type="word")
    return ensure_prepared(cfg, tmp_path_factory.mktemp("cli") / "prepared")


def _config(tmp: Path, prepared: Path, **train) -> Path:
    t = {"max_tokens": 128, "max_steps": 6, "lr_schedule": "constant", "lr": 3e-3,
         "warmup_steps": 0, "log_every": 2, "valid_every": 3, "save_every": 0,
         "progress_bar": False, **train}
    cfg = {"model": {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 1,
                     "n_decoder_layers": 1, "dropout": 0.0, "max_positions": 64},
           "data": {"prepared_dir": str(prepared)}, "train": t, "decode": {"beam": 2}}
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _best_step(valid: list[dict], metric: str, higher_is_better: bool) -> int:
    """The step the `best` pointer must name: the best value, the earliest of a tie (a
    checkpoint becomes best only by improving on the best so far)."""
    sign = 1 if higher_is_better else -1
    best = max(sign * r[metric] for r in valid)
    return next(r["step"] for r in valid if sign * r[metric] == best)


def test_validation_bleu_best_checkpoint_and_init_from(tmp_path, prepared, monkeypatch):
    from aiayn.checkpoint.directory import load_checkpoint, resolve_checkpoint
    from aiayn.checkpoint.manager import saved_step
    from aiayn.recipes import train as recipe

    cfg = _config(tmp_path, prepared, valid_bleu=True, best_metric="valid_bleu")
    run = tmp_path / "run"
    assert _main(["train", "--config", str(cfg), "--run-dir", str(run)]) == 0
    recs = _records(run)
    valid = [r for r in recs if r["split"] == "valid"]
    assert [r["step"] for r in valid] == [3, 6]
    assert all(0.0 <= r["valid_bleu"] <= 100.0 and r["valid_ppl"] > 1.0 for r in valid)
    # `best` names the checkpoint of the best valid_bleu in metrics.jsonl (BLEU is 0.0 at
    # both validations of so short a run: the tie keeps step 3, saved as a best-only copy).
    best_step = _best_step(valid, "valid_bleu", higher_is_better=True)
    best = resolve_checkpoint(run / "checkpoints" / "best")
    assert saved_step(best) == best_step
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["best"] == {"metric": "valid_bleu", "step": best_step,
                               "value": next(r["valid_bleu"] for r in valid if r["step"] == best_step)}
    ckpt = run / "checkpoints" / "step_000006"
    assert (ckpt / "tokenizer").is_dir() and (run / "config.yaml").is_file()
    assert resolve_checkpoint(run) == ckpt  # what init_from=RUN_DIR starts from: the last
    first_loss = next(r["loss"] for r in recs if r["split"] == "train")

    # A fresh run initialised from the first: its model starts with the first run's last
    # weights, every tensor equal (captured as the recipe builds it, before any update).
    built: list[dict] = []

    def spy(*args, **kwargs):
        model = build_model(*args, **kwargs)
        built.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return model

    build_model = recipe._build_model
    monkeypatch.setattr(recipe, "_build_model", spy)
    run2 = tmp_path / "run2"
    assert _main(["train", "--config", str(cfg), "--run-dir", str(run2), f"train.init_from={run}",
                  "train.max_steps=4", "train.valid_every=1", "train.best_metric=valid_loss"]) == 0
    assert "initialised weights from" in (run2 / "train.log").read_text()
    source = load_checkpoint(ckpt).model.state_dict()
    assert len(built) == 1 and list(built[0]) == list(source)
    for name, tensor in source.items():
        assert torch.equal(built[0][name], tensor), name
    recs2 = _records(run2)
    train2 = [r for r in recs2 if r["split"] == "train"]
    assert train2[0]["step"] == 2 and train2[0]["loss"] < first_loss  # it starts where the first ended
    # Lower is better for valid_loss: `best` is its minimum over the 4 validations.
    valid2 = [r for r in recs2 if r["split"] == "valid"]
    assert [r["step"] for r in valid2] == [1, 2, 3, 4]
    assert saved_step(resolve_checkpoint(run2 / "checkpoints" / "best")) == _best_step(
        valid2, "valid_loss", higher_is_better=False)
