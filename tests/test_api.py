"""The package root's Python API: what ``from aiayn import ...`` gives (lazily, without
torch), and the functions of aiayn.api: prepare, train, average."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

import aiayn
from aiayn.config import DataConfig, ModelConfig, TrainConfig, to_dict
from aiayn.errors import AiaynError, CheckpointError, ConfigError

REAL = {
    "AiaynError": "aiayn.errors",
    "Config": "aiayn.config",
    "load_config": "aiayn.config",
    "prepare": "aiayn.api",
    "train": "aiayn.api",
    "average": "aiayn.api",
    "load_checkpoint": "aiayn.checkpoint.directory",
    "Translator": "aiayn.inference.translator",
    "TranslationRequest": "aiayn.inference.request",
    "Parser": "aiayn.inference.parser",
    "corpus_scores": "aiayn.evaluation.bleu",
}
SYNTHETIC = {"synthetic": "reverse", "synthetic_train_size": 60, "synthetic_valid_size": 6,
             "synthetic_min_len": 2, "synthetic_max_len": 5, "synthetic_vocab": 8, "spm_model_type": "word"}
TINY_MODEL = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 1, "n_decoder_layers": 1}
TINY_TRAIN = {"max_tokens": 64, "log_every": 0, "valid_every": 0, "progress_bar": False}


# ------------------------------------------------------------------ the package root


def test_the_exports_are_the_real_objects() -> None:
    assert sorted(aiayn.__all__) == sorted(REAL)
    for name, module in REAL.items():
        assert getattr(aiayn, name) is getattr(importlib.import_module(module), name), name


def test_import_aiayn_loads_no_torch_and_every_name_imports() -> None:
    code = ("import sys, aiayn\n"
            "assert 'torch' not in sys.modules, 'import aiayn imported torch'\n"
            "print(aiayn.__version__)\n"
            f"from aiayn import {', '.join(aiayn.__all__)}\n"
            "print(Translator.__module__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [version("aiayn"), "aiayn.inference.translator"]


def test_version_is_the_installed_one() -> None:
    assert aiayn.__version__ == version("aiayn")


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'aiayn' has no attribute 'Translater'"):
        _ = aiayn.Translater  # type: ignore[attr-defined]
    assert set(aiayn.__all__) <= set(dir(aiayn))


# ------------------------------------------------------------------ prepare


def test_prepare_from_keywords(tmp_path: Path) -> None:
    summary = aiayn.prepare(tmp_path / "data", progress=False, **SYNTHETIC)
    assert summary == json.loads((tmp_path / "data" / "summary.json").read_text())
    assert summary["splits"]["train"]["pairs"] == 60 and summary["splits"]["valid"]["pairs"] == 6


def test_prepare_takes_defaults_from_a_config_and_paths(tmp_path: Path) -> None:
    (tmp_path / "a.src").write_text("a b\nc d\n")
    (tmp_path / "a.tgt").write_text("b a\nd c\n")
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"data": {"src_lang": "xx", "spm_model_type": "word", "vocab_size": 9}}))
    summary = aiayn.prepare(tmp_path / "data", config, progress=False,
                            train_src=tmp_path / "a.src", train_tgt=tmp_path / "a.tgt")
    assert summary["source"]["src_lang"] == "xx" and summary["splits"]["train"]["pairs"] == 2


def test_prepare_names_a_wrong_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^data\.train_sr: unknown field \(did you mean 'train_src'\?\)$"):
        aiayn.prepare(tmp_path / "data", train_sr="x")
    with pytest.raises(ConfigError, match=r"^data\.vocab_size: expected an integer, got '8k'$"):
        aiayn.prepare(tmp_path / "data", vocab_size="8k")
    assert not (tmp_path / "data").exists()


# ------------------------------------------------------------------ train


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("api") / "prepared"
    aiayn.prepare(out, progress=False, **SYNTHETIC)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, prepared: Path) -> tuple[Path, dict]:
    """A run of 4 steps with a checkpoint every 2, from a Config object."""
    cfg = aiayn.Config(model=ModelConfig(**TINY_MODEL), data=DataConfig(prepared_dir=str(prepared)),
                       train=TrainConfig(max_steps=4, save_every=2, **TINY_TRAIN))
    before = to_dict(cfg)
    run = tmp_path_factory.mktemp("api") / "run"
    summary = aiayn.train(cfg, run, threads=1)
    assert to_dict(cfg) == before  # the caller's Config is not changed (training sets the vocabulary sizes)
    return run, summary


def test_train_writes_checkpoints_and_returns_the_summary(trained: tuple[Path, dict]) -> None:
    run, summary = trained
    assert summary == json.loads((run / "train_summary.json").read_text())
    assert (summary["stop_reason"], summary["step"]) == ("max_steps", 4)
    assert summary["last_checkpoint"] == str(run / "checkpoints" / "step_000004")
    assert (run / "checkpoints" / "step_000002" / "model.safetensors").is_file()
    loaded = aiayn.load_checkpoint(run)
    assert loaded.path == run / "checkpoints" / "step_000004" and loaded.state["step"] == 4


def test_train_from_a_yaml_file_with_overrides(tmp_path: Path, prepared: Path) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"model": TINY_MODEL, "train": {**TINY_TRAIN, "save_every": 0}}))
    summary = aiayn.train(config, tmp_path / "run", threads=1,
                          overrides=["train.max_steps=2", f"data.prepared_dir={prepared}"])
    assert summary["step"] == 2
    # No config: the run's own, for a longer run; one override may be a plain string.
    summary = aiayn.train(None, tmp_path / "run", "train.max_steps=3", threads=1)
    assert summary["step"] == 3


def test_train_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no checkpoint to take the configuration from; give a config$"):
        aiayn.train(None, tmp_path / "new")
    with pytest.raises(ConfigError, match=r"did you mean 'max_steps'"):
        aiayn.train(aiayn.Config(), tmp_path / "new", ["train.max_stepz=3"])
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------ average


def test_average_the_last_checkpoints_of_a_run(tmp_path: Path, trained: tuple[Path, dict]) -> None:
    run, _ = trained
    out = aiayn.average(run, tmp_path / "avg", last=2)
    assert out == tmp_path / "avg"
    assert aiayn.load_checkpoint(out).state["averaged_steps"] == [2, 4]
    with pytest.raises(AiaynError, match=r"directory exists and is not empty \(pass force=True to replace it\)$"):
        aiayn.average(run, out, last=2)
    assert aiayn.average([run / "checkpoints" / "step_000002", run], out, force=True) == out


def test_average_refuses_what_it_cannot_do(tmp_path: Path, trained: tuple[Path, dict]) -> None:
    run, _ = trained
    with pytest.raises(AiaynError, match=r"^out .*: would replace the input "):
        aiayn.average(run, run, last=2, force=True)
    with pytest.raises(CheckpointError, match=r"^average: last=N takes one run directory, not a list$"):
        aiayn.average([run], tmp_path / "avg", last=2)
    with pytest.raises(CheckpointError, match=r"give last=N with a run directory, or two or more checkpoints$"):
        aiayn.average(run, tmp_path / "avg")
    with pytest.raises(CheckpointError, match=r"only 2 exist"):
        aiayn.average(run, tmp_path / "avg", last=3)
    assert not (tmp_path / "avg").exists()



def test_cli_version_is_the_installed_one(capsys: pytest.CaptureFixture[str]) -> None:
    from aiayn.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"aiayn {version('aiayn')}\n"


def test_docs_site_builds_strictly(tmp_path) -> None:
    """`make docs`: every page, nav entry and link resolves, and the API reference renders
    from the docstrings (mkdocs --strict turns each warning into a failure)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert "from_checkpoint" in api and (tmp_path / "site" / "index.html").is_file()
