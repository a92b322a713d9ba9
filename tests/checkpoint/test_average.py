import pytest
import torch

from aiayn.checkpoint import io as ck
from aiayn.checkpoint.average import average_checkpoints, last_checkpoints
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
    a = ck.save_checkpoint(tmp_path / "a", _constant_model(cfg, 1.0), cfg, state={"step": 10})
    b = ck.save_checkpoint(tmp_path / "b", _constant_model(cfg, 4.0), cfg, state={"step": 20})
    out = average_checkpoints([a, b], tmp_path / "avg")
    loaded = ck.load_checkpoint(out)  # a normal, verified checkpoint
    for p in loaded.model.parameters():
        assert torch.equal(p, torch.full_like(p, 2.5))
    assert loaded.state["averaged_steps"] == [10, 20] and loaded.state["step"] == 20
    assert loaded.model.src_embed.weight is loaded.model.tgt_embed.weight


def test_average_cli_last_n(tmp_path, make_cfg, capsys):
    cfg = make_cfg()
    mgr = ck.CheckpointManager(tmp_path / "run", keep_last=10)
    for step, value in ((1, 0.0), (2, 1.0), (3, 2.0), (4, 6.0)):
        mgr.save(step, _constant_model(cfg, value), cfg, state={"step": step})
    assert [p.name for p in last_checkpoints(tmp_path / "run", 3)] == \
        ["step_000002", "step_000003", "step_000004"]
    with pytest.raises(SystemExit) as exc:
        main(["average", str(tmp_path / "run"), "--last", "3", "--out", str(tmp_path / "avg")])
    assert exc.value.code == 0
    p = next(ck.load_checkpoint(tmp_path / "avg").model.parameters())
    assert torch.equal(p, torch.full_like(p, 3.0))
    assert "averaged 3 checkpoints" in capsys.readouterr().out
    with pytest.raises(CheckpointError, match="only 4 exist"):
        last_checkpoints(tmp_path / "run", 5)


def test_average_rejects_different_models(tmp_path, make_cfg):
    cfg = make_cfg()
    other = make_cfg(vocab=20)
    a = ck.save_checkpoint(tmp_path / "a", _constant_model(cfg, 1.0), cfg)
    b = ck.save_checkpoint(tmp_path / "b", _constant_model(other, 1.0), other)
    with pytest.raises(CheckpointError, match="different model"):
        average_checkpoints([a, b], tmp_path / "avg")


def _tree_bytes(root) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["run", "parent", "checkpoint"])
def test_average_never_replaces_a_directory_holding_its_inputs(tmp_path, make_cfg, capsys, monkeypatch, where):
    """Regression: `aiayn average RUN --last 2 --out RUN` (or `--out .`) used to replace the
    run directory, checkpoints and all, with the averaged checkpoint."""
    cfg = make_cfg()
    mgr = ck.CheckpointManager(tmp_path / "run", keep_last=10)
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
    mgr = ck.CheckpointManager(tmp_path / "run", keep_last=10)
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
    assert not (other / "notes.txt").exists() and ck.is_checkpoint_dir(other)
