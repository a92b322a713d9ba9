import logging

import pytest
import torch

from aiayn.checkpoint.average import average_checkpoints, average_weights, last_checkpoints
from aiayn.checkpoint.directory import (
    is_checkpoint_dir,
    load_checkpoint,
    load_checkpoint_config,
    read_state,
    save_checkpoint,
)
from aiayn.checkpoint.layout import MODEL_FILE
from aiayn.checkpoint.manager import CheckpointManager
from aiayn.checkpoint.weights import load_model_weights
from aiayn.cli.main import main
from aiayn.errors import CheckpointError
from aiayn.model import build_model


def _constant_model(cfg, value):
    model = build_model(cfg.model)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    return model


def test_average_of_two_known_checkpoints(tmp_path, make_cfg):
    cfg = make_cfg()
    a = save_checkpoint(tmp_path / "a", _constant_model(cfg, 1.0), cfg, state={"step": 10})
    b = save_checkpoint(tmp_path / "b", _constant_model(cfg, 4.0), cfg, state={"step": 20})
    out = average_checkpoints([a, b], tmp_path / "avg")
    loaded = load_checkpoint(out)  # a normal, verified checkpoint
    for p in loaded.model.parameters():
        assert torch.equal(p, torch.full_like(p, 2.5))
    assert loaded.state["averaged_steps"] == [10, 20] and loaded.state["step"] == 20
    assert loaded.model.src_embed.weight is loaded.model.tgt_embed.weight


def test_average_cli_last_n(tmp_path, make_cfg, capsys):
    cfg = make_cfg()
    mgr = CheckpointManager(tmp_path / "run", keep_last=10)
    for step, value in ((1, 0.0), (2, 1.0), (3, 2.0), (4, 6.0)):
        mgr.save(step, _constant_model(cfg, value), cfg, state={"step": step})
    assert [p.name for p in last_checkpoints(tmp_path / "run", 3)] == \
        ["step_000002", "step_000003", "step_000004"]
    with pytest.raises(SystemExit) as exc:
        main(["average", str(tmp_path / "run"), "--last", "3", "--out", str(tmp_path / "avg")])
    assert exc.value.code == 0
    p = next(load_checkpoint(tmp_path / "avg").model.parameters())
    assert torch.equal(p, torch.full_like(p, 3.0))
    assert "averaged 3 checkpoints" in capsys.readouterr().out
    assert [p.name for p in last_checkpoints(tmp_path / "run", 1)] == ["step_000004"]
    d = tmp_path / "run" / "checkpoints"
    assert _error(last_checkpoints, tmp_path / "run", 5) == (
        f"{d}: asked for the last 5 checkpoints but only 4 exist (step_000001, step_000002, step_000003, "
        "step_000004); raise train.keep_last to keep more")


def _error(call, *args) -> str:
    with pytest.raises(CheckpointError) as exc:
        call(*args)
    return str(exc.value)


def _with_buffer(cfg, value, name, tensor):
    model = _constant_model(cfg, value)
    model.register_buffer(name, tensor)
    return model


def test_average_rejects_different_models(tmp_path, make_cfg):
    cfg = make_cfg()
    other = make_cfg(vocab=20)
    a = save_checkpoint(tmp_path / "a", _constant_model(other, 1.0), other)
    b = save_checkpoint(tmp_path / "b", _constant_model(cfg, 1.0), cfg)
    c = save_checkpoint(tmp_path / "c", _constant_model(cfg, 1.0), cfg)
    assert _error(average_checkpoints, [a, b, c], tmp_path / "avg") == \
        f"{a}: a different model than {c}; only checkpoints of one model can be averaged"


def test_average_rejects_different_weight_names(tmp_path, make_cfg):
    cfg = make_cfg()
    a, b = (save_checkpoint(tmp_path / n, _constant_model(cfg, 1.0), cfg) for n in "ab")
    c = save_checkpoint(tmp_path / "c", _with_buffer(cfg, 1.0, "extra", torch.zeros(1)), cfg)
    assert _error(average_weights, [a, b, c]) == f"{c}: its weight names differ from {a}"
    # The same extra weight in every checkpoint: the model built from the config has no place for it.
    d, e, f = (save_checkpoint(tmp_path / n, _with_buffer(cfg, 1.0, "extra", torch.zeros(1)), cfg) for n in "def")
    assert _error(average_checkpoints, [d, e, f], tmp_path / "avg") == (  # named by the last one
        f"{f / MODEL_FILE}: weights do not match the model built from the config (missing: []; "
        "unexpected: ['extra'])")


def test_average_weights_keeps_integer_tensors_and_dtypes(tmp_path, make_cfg):
    # Integer tensors are not averaged: the last checkpoint's is kept. (They were once left
    # out of the name comparison, so a second checkpoint was refused: "weight names differ".)
    cfg = make_cfg()
    first = save_checkpoint(tmp_path / "b", _with_buffer(cfg, 2.0, "a_count", torch.tensor([5])), cfg)
    path = save_checkpoint(tmp_path / "c", _with_buffer(cfg, 10.0, "a_count", torch.tensor([6])), cfg)
    averaged, got_cfg, dirs = average_weights([first, path])
    assert got_cfg == cfg and dirs == [first, path]
    reference = build_model(cfg.model)
    assert sorted(averaged) == sorted([*reference.state_dict(), "a_count"])
    assert torch.equal(averaged["a_count"], torch.tensor([6]))
    for name, p in reference.named_parameters():
        assert averaged[name].dtype == torch.float32 and torch.equal(averaged[name], torch.full_like(p, 6.0)), name


def test_average_of_three_takes_config_state_and_tokenizer_from_the_last(tmp_path, make_cfg, caplog):
    paths = []
    for i, (value, lr) in enumerate(((1.0, 1e-3), (2.0, 2e-3), (6.0, 3e-3)), 1):
        cfg = make_cfg(lr=lr)
        tok = None
        if i > 1:  # the first has no tokenizer; the others each their own
            tok = tmp_path / f"tok{i}"
            tok.mkdir()
            (tok / "spm.model").write_text(f"tokenizer {i}")
        paths.append(save_checkpoint(tmp_path / f"c{i}", _constant_model(cfg, value), cfg, tokenizer=tok,
                                        state={"step": 10 * i, "epoch": i}))
    with caplog.at_level(logging.INFO, logger="aiayn.checkpoint.average"):
        out = average_checkpoints(paths, tmp_path / "avg")
    assert [r.getMessage() for r in caplog.records] == [f"averaged 3 checkpoints (c1, c2, c3) into {out}"]
    assert load_checkpoint_config(out) == cfg
    state = read_state(out)
    assert {k: state[k] for k in ("step", "epoch", "averaged_from", "averaged_steps")} == {
        "step": 30, "epoch": 3, "averaged_from": [str(p) for p in paths], "averaged_steps": [10, 20, 30]}
    assert (out / "tokenizer" / "spm.model").read_text() == "tokenizer 3"
    model = build_model(cfg.model)
    load_model_weights(model, out / MODEL_FILE)
    for p in model.parameters():
        assert torch.equal(p, torch.full_like(p, 3.0))


def test_average_argument_errors(tmp_path, make_cfg):
    assert _error(average_weights, []) == "no checkpoints to average"
    assert _error(average_checkpoints, [], tmp_path / "avg") == "no checkpoints to average"
    cfg = make_cfg()
    a = save_checkpoint(tmp_path / "a", _constant_model(cfg, 1.0), cfg)
    assert _error(average_checkpoints, [a], a) == f"{a.resolve()}: the output would overwrite one of the inputs"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _error(last_checkpoints, empty, 1) == \
        f"{empty}: no checkpoints found (expected step_* directories in {empty})"
    assert _error(last_checkpoints, empty, 0) == "--last: need at least 1 checkpoint, got 0"


def _tree_bytes(root) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["run", "parent", "checkpoint"])
def test_average_never_replaces_a_directory_holding_its_inputs(tmp_path, make_cfg, capsys, monkeypatch, where):
    """`aiayn average RUN --last 2 --out RUN` (or `--out .`) is refused: it would replace the
    run directory, checkpoints and all, with the averaged checkpoint."""
    cfg = make_cfg()
    mgr = CheckpointManager(tmp_path / "run", keep_last=10)
    for step in (1, 2):
        mgr.save(step, _constant_model(cfg, float(step)), cfg, state={"step": step})
    before = _tree_bytes(tmp_path)
    out = {"run": tmp_path / "run", "parent": tmp_path, "checkpoint": mgr.last()}[where]
    for force in ([], ["--force"]):
        with pytest.raises(SystemExit) as exc:
            main(["average", str(tmp_path / "run"), "--last", "2", "--out", str(out), *force])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "would replace the input" in err and "Traceback" not in err
    assert _tree_bytes(tmp_path) == before


def test_average_refuses_a_non_empty_output_without_force(tmp_path, make_cfg, capsys):
    cfg = make_cfg()
    mgr = CheckpointManager(tmp_path / "run", keep_last=10)
    for step in (1, 2):
        mgr.save(step, _constant_model(cfg, float(step)), cfg, state={"step": step})
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit) as exc:
        main(["average", str(tmp_path / "run"), "--last", "2", "--out", str(other)])
    assert exc.value.code == 2 and "not empty (use --force" in capsys.readouterr().err
    assert (other / "notes.txt").read_text() == "keep me"
    with pytest.raises(SystemExit) as exc:
        main(["average", str(tmp_path / "run"), "--last", "2", "--out", str(other), "--force"])
    assert exc.value.code == 0
    assert not (other / "notes.txt").exists() and is_checkpoint_dir(other)
