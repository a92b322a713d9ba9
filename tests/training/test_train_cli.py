"""`aiayn train` / the run driver: config printing, errors, validation BLEU, init_from."""

import json
from pathlib import Path

import pytest
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


def test_validation_bleu_best_checkpoint_and_init_from(tmp_path, prepared):
    cfg = _config(tmp_path, prepared, valid_bleu=True, best_metric="valid_bleu")
    run = tmp_path / "run"
    assert _main(["train", "--config", str(cfg), "--run-dir", str(run)]) == 0
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in recs if r["split"] == "valid"]
    assert [r["step"] for r in valid] == [3, 6]
    assert all(0.0 <= r["valid_bleu"] <= 100.0 and r["valid_ppl"] > 1.0 for r in valid)
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["best"]["metric"] == "valid_bleu"
    assert (run / "checkpoints" / "best").is_file()
    ckpt = run / "checkpoints" / "step_000006"
    assert (ckpt / "tokenizer").is_dir() and (run / "config.yaml").is_file()
    first_loss = next(r["loss"] for r in recs if r["split"] == "train")

    # A fresh run initialised from the first: it starts where that one ended.
    run2 = tmp_path / "run2"
    assert _main(["train", "--config", str(cfg), "--run-dir", str(run2),
                  f"train.init_from={run}", "train.max_steps=2"]) == 0
    assert "initialised weights from" in (run2 / "train.log").read_text()
    recs2 = [json.loads(x) for x in (run2 / "metrics.jsonl").read_text().splitlines()]
    assert recs2[0]["step"] == 2 and recs2[0]["loss"] < first_loss
