"""A run's checkpoints (aiayn.checkpoint.manager): step names, the last/best pointers and their
temporaries, which checkpoints listing and pruning keep, best-only saves outside the periodic
window, what a killed or failed save leaves behind, and checkpoints a kill left half-deleted."""

import io
import logging
import os
import shutil
from pathlib import Path

import pytest

from aiayn import fileio
from aiayn.checkpoint import directory
from aiayn.checkpoint.directory import read_state, resolve_checkpoint, verify_checkpoint
from aiayn.checkpoint.layout import MANIFEST_FILE, MODEL_FILE
from aiayn.checkpoint.manager import CheckpointManager, checkpoint_step, list_checkpoints, saved_step
from aiayn.errors import CheckpointError
from aiayn.model import build_model

from .conftest import fake_ckpt, trained

LOGGER = "aiayn.checkpoint.manager"


@pytest.fixture
def reversed_listing(monkeypatch):
    """Directory listings in reverse name order: the order of a result must then come from
    sorting by step, not from the filesystem."""
    iterdir = Path.iterdir
    monkeypatch.setattr(Path, "iterdir", lambda self: iter(sorted(iterdir(self), reverse=True)))


# --------------------------------------------------------------------- pointers, saving


def test_manager_without_pointers(tmp_path):
    mgr = CheckpointManager(tmp_path)
    assert mgr.last() is None and mgr.best() is None
    assert mgr.name(5) == "step_000005" and mgr.name(5, periodic=False) == "best_step_000005"


def test_manager_pointer_files_and_their_temporaries(tmp_path, make_cfg, monkeypatch):
    cfg = make_cfg()
    prefixes = []
    create_unique = fileio._create_unique

    def spy(parent, prefix, create):
        if "probe" not in prefix:  # check_empty_dir's probe of the parent is fileio's own
            prefixes.append(prefix)
        return create_unique(parent, prefix, create)

    monkeypatch.setattr(fileio, "_create_unique", spy)
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "spm.model").write_bytes(b"sp")
    mgr = CheckpointManager(tmp_path / "run")
    first = mgr.save(1, build_model(cfg.model), cfg, tokenizer=tok, state={"step": 1}, is_best=True)
    assert prefixes == [".tmp-step_000001-", ".tmp-last-", ".tmp-best-"]
    assert (mgr.dir / "last").read_text() == (mgr.dir / "best").read_text() == "step_000001\n"
    assert read_state(first)["step"] == 1 and (first / "tokenizer" / "spm.model").read_bytes() == b"sp"
    second = mgr.save(2, build_model(cfg.model), cfg)
    assert mgr.best() == first
    prefixes.clear()
    mgr.mark_best(second)
    assert prefixes == [".tmp-best-"]
    assert (mgr.dir / "best").read_text() == "step_000002\n" and mgr.best() == second


def test_manager_pointers_rotation_and_resolve(tmp_path, make_cfg):
    cfg = make_cfg()
    model, _ = trained(cfg)
    mgr = CheckpointManager(tmp_path, keep_last=2)
    mgr.save(1, model, cfg, state={"step": 1}, is_best=True)
    for step in (2, 3, 4):
        mgr.save(step, model, cfg, state={"step": step})
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["best", "last", "step_000001", "step_000003", "step_000004"]
    assert resolve_checkpoint(tmp_path).name == "step_000004"
    assert resolve_checkpoint(tmp_path / "checkpoints").name == "step_000004"
    assert resolve_checkpoint(tmp_path / "checkpoints" / "best").name == "step_000001"
    # A directory left by a process killed while saving is ignored, then cleaned up.
    stale = tmp_path / "checkpoints" / ".tmp-step_000005-123"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    assert resolve_checkpoint(tmp_path).name == "step_000004"
    mgr.clean_incomplete()
    assert not stale.exists()
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        resolve_checkpoint(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        resolve_checkpoint(stale.parent.parent.parent)


def test_failed_resave_keeps_the_old_step_and_temporaries_are_cleanable(tmp_path, make_cfg, monkeypatch):
    cfg = make_cfg()
    model, opt = trained(cfg)
    mgr = CheckpointManager(tmp_path)
    path = mgr.save(1, model, cfg, state={"step": 1}, optimizer=opt)
    before = {p.name: p.read_bytes() for p in path.iterdir()}

    def fail(optimizer, directory):
        assert directory.name.startswith(".tmp-step_000001-")  # what clean_incomplete removes
        raise OSError("disk full")

    monkeypatch.setattr(directory, "save_optimizer", fail)
    with pytest.raises(OSError, match="disk full"):
        mgr.save(1, model, cfg, state={"step": 1, "again": True}, optimizer=opt)
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before
    assert sorted(p.name for p in mgr.dir.iterdir()) == ["last", "step_000001"]
    verify_checkpoint(path)
    # A pointer's temporary left by a kill has the same prefix and is cleaned like a directory.
    (mgr.dir / ".tmp-last-1a2b3c4d").write_text("step_000002\n")
    mgr.clean_incomplete()
    assert sorted(p.name for p in mgr.dir.iterdir()) == ["last", "step_000001"]
    assert mgr.last() == path


def test_manager_best_only_checkpoints_stay_outside_the_periodic_window(tmp_path, make_cfg):
    cfg = make_cfg()
    model, _ = trained(cfg)
    mgr = CheckpointManager(tmp_path, keep_last=2)
    d = tmp_path / "checkpoints"
    mgr.save(1, model, cfg, state={"step": 1})
    mgr.save(2, model, cfg, state={"step": 2}, is_best=True, periodic=False)
    assert mgr.best() == mgr.last() == d / "best_step_000002"
    for step in (3, 4, 5):
        mgr.save(step, model, cfg, state={"step": step})
    # keep_last 2 keeps two periodic checkpoints; the best-only one is kept beside them
    # and counted by neither the window nor `average --last`.
    assert sorted(p.name for p in d.iterdir()) == ["best", "best_step_000002", "last", "step_000004", "step_000005"]
    assert [p.name for p in list_checkpoints(d)] == ["step_000004", "step_000005"]
    assert saved_step(d / "best_step_000002") == 2 and checkpoint_step(d / "best_step_000002") is None
    # A newer best-only checkpoint replaces the old one.
    mgr.save(6, model, cfg, state={"step": 6}, is_best=True, periodic=False)
    assert sorted(p.name for p in d.iterdir()) == ["best", "best_step_000006", "last", "step_000004", "step_000005"]
    # A periodic save of that same step takes over the `best` pointer; the copy goes.
    mgr.save(6, model, cfg, state={"step": 6})
    assert mgr.best() == mgr.last() == d / "step_000006"
    assert sorted(p.name for p in d.iterdir()) == ["best", "last", "step_000005", "step_000006"]
    with pytest.raises(ValueError, match="^a checkpoint that is not periodic must be the best$"):
        mgr.save(7, model, cfg, periodic=False)


# --------------------------------------------------------------------- listing, pruning


@pytest.mark.parametrize("names, expected", [
    (["step_0", "step_1"], ["step_0", "step_1"]),
    (["step_9", "step_10"], ["step_9", "step_10"]),
])
def test_list_checkpoints_by_step(tmp_path, reversed_listing, names, expected):
    for name in names:
        fake_ckpt(tmp_path, name)
    assert [p.name for p in list_checkpoints(tmp_path)] == expected


@pytest.mark.parametrize("names, expected", [
    (["best_step_0", "best_step_1"], ["best_step_0", "best_step_1"]),
    (["best_step_9", "best_step_10"], ["best_step_9", "best_step_10"]),
])
def test_best_only_by_step(tmp_path, reversed_listing, names, expected):
    mgr = CheckpointManager(tmp_path)
    for name in [*names, "step_5"]:
        fake_ckpt(mgr.dir, name)
    (mgr.dir / "best_step_7").mkdir()  # incomplete
    assert [p.name for p in mgr.best_only()] == expected


@pytest.mark.parametrize("name, step", [
    ("step_000012", 12), ("best_step_000012", 12), ("step_0", 0), ("last", None), ("step_x", None),
])
def test_saved_step(name, step):
    assert saved_step(Path(name)) == step


def _layout(d: Path, names, last=None, best=None) -> None:
    for name in names:
        fake_ckpt(d, name)
    for pointer, target in (("last", last), ("best", best)):
        if target is not None:
            (d / pointer).write_text(target + "\n")


def _left(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


STEPS = [f"step_{i:06d}" for i in range(8)]


@pytest.mark.parametrize("keep_last, names, last, best, left", [
    # A resumed run's `last` is step 3: steps 4..6 of the killed run and its best-only step 5
    # are kept apart from the window of the newest 2 (steps 2, 3); step 1 goes.
    (2, [*STEPS[1:7], "best_step_000005"], STEPS[3], None, [*STEPS[2:7], "best_step_000005"]),
    # No `last` pointer: the newest keep_last of all.
    (1, STEPS[1:4], None, None, STEPS[3:4]),
    # keep_last 0 keeps everything, a best-only checkpoint no pointer names included.
    (0, ["best_step_000002", STEPS[1], STEPS[3]], STEPS[3], STEPS[3], ["best_step_000002", STEPS[1], STEPS[3]]),
    # The best-only copy of step 0 goes once the periodic step 0 holds `best`.
    (1, ["best_step_000000", STEPS[0]], STEPS[0], STEPS[0], [STEPS[0]]),
], ids=["resumed", "no-last", "keep-all", "step-0"])
def test_prune_keeps_exactly(tmp_path, keep_last, names, last, best, left):
    d = tmp_path / "checkpoints"
    _layout(d, names, last, best)
    CheckpointManager(tmp_path, keep_last=keep_last).prune()
    pointers = [p for p, target in (("best", best), ("last", last)) if target is not None]
    assert _left(d) == sorted(left + pointers)


def test_default_keep_last_is_five(tmp_path):
    d = tmp_path / "checkpoints"
    _layout(d, STEPS[1:8], last=STEPS[7])
    CheckpointManager(tmp_path).prune()
    assert _left(d) == sorted(["last", *STEPS[3:8]])


def _removed_concurrently(monkeypatch):
    """Another process (a second resumed run) removes each entry just before this one does."""
    rmtree, unlink = shutil.rmtree, Path.unlink

    def racing_rmtree(path, *args, **kwargs):
        rmtree(path)
        return rmtree(path, *args, **kwargs)

    def racing_unlink(self, *args, **kwargs):
        os.remove(self)
        return unlink(self, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", racing_rmtree)
    monkeypatch.setattr(Path, "unlink", racing_unlink)


def test_prune_logs_each_removal_and_tolerates_a_concurrent_one(tmp_path, monkeypatch, caplog):
    d = tmp_path / "checkpoints"
    _layout(d, STEPS[1:4], last=STEPS[3])
    _removed_concurrently(monkeypatch)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        CheckpointManager(tmp_path, keep_last=1).prune()
    assert _left(d) == ["last", STEPS[3]]
    assert [r.getMessage() for r in caplog.records] == [f"removing old checkpoint {d / s}" for s in STEPS[1:3]]


def test_clean_incomplete_logs_each_removal_and_tolerates_a_concurrent_one(tmp_path, monkeypatch, caplog):
    d = tmp_path / "checkpoints"
    _layout(d, [STEPS[1]], last=STEPS[1])
    (d / ".tmp-step_000002-ab12").mkdir()
    (d / ".tmp-step_000002-ab12" / MODEL_FILE).write_bytes(b"partial")
    (d / ".tmp-last-cd34").write_text("step_000002\n")
    _removed_concurrently(monkeypatch)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        CheckpointManager(tmp_path).clean_incomplete()
    assert _left(d) == ["last", STEPS[1]]
    assert sorted(r.getMessage() for r in caplog.records) == [
        f"removing incomplete checkpoint {d / '.tmp-last-cd34'}",
        f"removing incomplete checkpoint {d / '.tmp-step_000002-ab12'}"]


def test_prune_counts_two_directories_of_one_step(tmp_path, reversed_listing):
    # step_0 beside step_000000 (made by hand): both are step 0 and both count towards keep_last.
    d = tmp_path / "checkpoints"
    _layout(d, ["step_000000", "step_0"], last="step_0")
    CheckpointManager(tmp_path, keep_last=1).prune()
    assert _left(d) == ["last", "step_0"]


# ------------------------------------------------------------ half-deleted checkpoints


def _listed(d: Path, name: str, manifest: bytes | None, files=(MODEL_FILE, "config.yaml")) -> Path:
    """A checkpoint directory holding ``files`` and the manifest ``manifest`` (None: none)."""
    p = d / name
    p.mkdir(parents=True)
    for f in files:
        (p / f).write_bytes(b"x")
    if manifest is not None:
        (p / MANIFEST_FILE).write_bytes(manifest)
    return p


COMPLETE = f"ab12  {MODEL_FILE}\n\ncd34  config.yaml\n".encode()


def test_remove_half_deleted_removes_exactly_the_unnamed_incomplete_checkpoints(tmp_path, caplog):
    d = tmp_path / "checkpoints"
    d.mkdir()
    _listed(d, "step_000001", COMPLETE)
    _listed(d, "step_000002", COMPLETE, files=[MODEL_FILE])  # a listed file gone
    _listed(d, "step_000003", None)  # the manifest gone
    _listed(d, "best_step_000004", b"cd34  config.yaml\n")  # the weights not listed
    _listed(d, "step_000005", f"{MODEL_FILE}\n".encode())  # a line without "HASH  "
    _listed(d, "step_000006", b"\xff\xfe  " + MODEL_FILE.encode() + b"\n")  # not UTF-8
    _listed(d, "step_000007", b"")  # incomplete but `last`
    _listed(d, "best_step_000008", b"")  # incomplete but `best`
    (d / "step_000009").symlink_to(_listed(tmp_path, "elsewhere", b""), target_is_directory=True)
    (d / "step_000010").write_text("not a directory\n")
    _listed(d, "scratch", b"")  # not a checkpoint's name
    (d / "last").write_text("step_000007\n")
    (d / "best").write_text("best_step_000008\n")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        removed = CheckpointManager(tmp_path).remove_half_deleted()
    gone = ["best_step_000004", "step_000002", "step_000003", "step_000005", "step_000006"]
    assert removed == [d / name for name in gone]
    assert caplog.messages == [f"removing {d / name}: a checkpoint whose deletion was interrupted" for name in gone]
    assert _left(d) == ["best", "best_step_000008", "last", "scratch", "step_000001", "step_000007",
                        "step_000009", "step_000010"]
    assert _left(tmp_path / "elsewhere") == sorted([MANIFEST_FILE, MODEL_FILE, "config.yaml"])
    assert CheckpointManager(tmp_path).remove_half_deleted() == []


def test_remove_half_deleted_reads_the_manifest_as_utf8_whatever_the_locale(tmp_path, monkeypatch):
    d = tmp_path / "checkpoints"
    _listed(d, "step_000001", f"ab12  {MODEL_FILE}\ncd34  vocab_ü.txt\n".encode(), files=[MODEL_FILE, "vocab_ü.txt"])
    # A Latin-1 locale: text read without an explicit encoding would be Latin-1.
    text_encoding = io.text_encoding
    monkeypatch.setattr(io, "text_encoding", lambda encoding, *a: text_encoding(encoding or "latin-1", *a))
    assert CheckpointManager(tmp_path).remove_half_deleted() == []
    assert _left(d) == ["step_000001"]


def test_remove_half_deleted_without_a_directory_or_with_a_broken_pointer(tmp_path):
    assert CheckpointManager(tmp_path).remove_half_deleted() == []
    assert not (tmp_path / "checkpoints").exists()
    d = tmp_path / "checkpoints"
    _listed(d, "step_000001", b"")
    (d / "last").write_text("step_000002\n")  # resolving the resume point reports it
    assert CheckpointManager(tmp_path).remove_half_deleted() == []
    assert _left(d) == ["last", "step_000001"]


def test_a_kill_while_removing_a_half_deleted_checkpoint_leaves_a_temporary_that_cleaning_removes(
        tmp_path, monkeypatch):
    d = tmp_path / "checkpoints"
    _listed(d, "step_000001", b"")
    with monkeypatch.context() as m:
        m.setattr(shutil, "rmtree", lambda path, *args, **kwargs: None)  # killed after the rename
        assert CheckpointManager(tmp_path).remove_half_deleted() == [d / "step_000001"]
    [aside] = _left(d)
    assert aside.startswith(".tmp-step_000001-")
    CheckpointManager(tmp_path).clean_incomplete()
    assert _left(d) == []


def test_a_kill_while_pruning_leaves_a_temporary_that_cleaning_removes(tmp_path, monkeypatch):
    d = tmp_path / "checkpoints"
    _layout(d, STEPS[1:3], last=STEPS[2])
    with monkeypatch.context() as m:
        m.setattr(shutil, "rmtree", lambda path, *args, **kwargs: None)  # killed after the rename
        CheckpointManager(tmp_path, keep_last=1).prune()
    [aside] = [name for name in _left(d) if name not in ("last", STEPS[2])]
    assert aside.startswith(f".tmp-{STEPS[1]}-")
    CheckpointManager(tmp_path).clean_incomplete()
    assert _left(d) == ["last", STEPS[2]]
