"""A checkpoint directory (aiayn.checkpoint.directory): what lands on disk, the checksum manifest
and every problem it names, the state and config read back, what a path resolves to, and
loading a whole checkpoint; text files are UTF-8 whatever the locale."""

import json
import locale
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from aiayn import fileio
from aiayn.checkpoint import directory
from aiayn.checkpoint.directory import (
    _sha256,
    is_checkpoint_dir,
    load_checkpoint,
    load_checkpoint_config,
    read_state,
    resolve_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from aiayn.checkpoint.layout import CONFIG_FILE, FORMAT_VERSION, MANIFEST_FILE, MODEL_FILE, OPTIMIZER_JSON, STATE_FILE
from aiayn.checkpoint.manager import CheckpointManager
from aiayn.checkpoint.training_state import load_optimizer_state, restore_optimizer, save_optimizer
from aiayn.config import load_config
from aiayn.errors import AiaynError, CheckpointError
from aiayn.model import build_model
from aiayn.training.optim import build_optimizer

from .conftest import error, fake_ckpt, optimizer_dict, trained


@pytest.fixture
def ascii_locale():
    """The locale's encoding ASCII (LANG=C without UTF-8 mode): checkpoint files are UTF-8 anyway."""
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    yield
    locale.setlocale(locale.LC_CTYPE, old)


# -------------------------------------------------------------------------- save / load


def test_round_trip(tmp_path, make_cfg):
    cfg = make_cfg()
    model, opt = trained(cfg)
    state = {"step": 7, "epoch": 2, "data": {"epoch": 2, "offset": 3}}
    path = save_checkpoint(tmp_path / "ck", model, cfg, state=state, optimizer=opt)
    names = {p.name for p in path.iterdir()}
    assert {"model.safetensors", "config.yaml", "state.json", "optimizer.safetensors",
            "optimizer.json", "checksums.sha256"} <= names
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    loaded = load_checkpoint(path, load_optimizer=True)
    assert not loaded.model.training
    assert loaded.config == cfg
    assert loaded.state["step"] == 7 and loaded.state["format_version"] == FORMAT_VERSION
    for (k, v), (k2, v2) in zip(model.state_dict().items(), loaded.model.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    # Tied matrices stay tied after loading, and are stored once.
    assert loaded.model.src_embed.weight is loaded.model.tgt_embed.weight
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert "tgt_embed.weight" not in keys and "src_embed.weight" in keys
        assert json.loads(f.metadata()["aliases"]) == {"tgt_embed.weight": "src_embed.weight"}
    opt2 = build_optimizer(loaded.model, cfg.train)
    restore_optimizer(opt2, loaded.optimizer_state)
    a, b = opt.state_dict(), opt2.state_dict()
    for pid in a["state"]:
        for key in a["state"][pid]:
            assert torch.equal(a["state"][pid][key], b["state"][pid][key])


def test_checkpoint_files_exact(tmp_path, make_cfg, monkeypatch):
    cfg = make_cfg()
    monkeypatch.setattr(directory, "time", SimpleNamespace(strftime=lambda fmt: f"<{fmt}>"))
    synced = []
    fsync_tree = fileio.fsync_tree

    def spy(directory):
        synced.append((Path(directory).name, sorted(p.relative_to(directory).as_posix()
                                                    for p in Path(directory).rglob("*"))))
        fsync_tree(directory)

    monkeypatch.setattr(fileio, "fsync_tree", spy)
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "spm  model").write_bytes(b"sp")  # two spaces inside a name: the manifest's separator
    path = save_checkpoint(tmp_path / "ck", build_model(cfg.model), cfg, tokenizer=tok, state={"step": 3})
    assert (path / STATE_FILE).read_text(encoding="utf-8") == json.dumps(
        {"step": 3, "format_version": 1, "torch_version": torch.__version__,
         "saved_at": "<%Y-%m-%dT%H:%M:%S%z>"}, indent=1)
    assert (path / "tokenizer" / "spm  model").read_bytes() == b"sp"
    files = ["config.yaml", "model.safetensors", "state.json", "tokenizer/spm  model"]
    assert (path / MANIFEST_FILE).read_text(encoding="utf-8") == \
        "".join(f"{_sha256(path / f)}  {f}\n" for f in files)
    verify_checkpoint(path)
    assert len(synced) == 1 and synced[0][0].startswith(".tmp-ck-")
    assert synced[0][1] == sorted([*files, MANIFEST_FILE, "tokenizer"])


def test_load_checkpoint_places_the_model_and_names_its_directory(tmp_path, make_cfg):
    cfg = make_cfg()
    CheckpointManager(tmp_path).save(1, build_model(cfg.model), cfg, state={"step": 1})
    loaded = load_checkpoint(tmp_path, device="meta")
    assert loaded.path == tmp_path / "checkpoints" / "step_000001"
    assert {p.device.type for p in loaded.model.parameters()} == {"meta"}


def test_checkpoint_text_files_are_utf8_whatever_the_locale(tmp_path, make_cfg, ascii_locale):
    cfg = make_cfg()
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "modèle.spm").write_bytes(b"sp")
    save_optimizer(optimizer_dict(), tmp_path)  # the optimizer files are read back below
    path = save_checkpoint(tmp_path / "run" / "checkpoints" / "étape_1", build_model(cfg.model), cfg, tokenizer=tok)
    manifest = (path / MANIFEST_FILE).read_bytes().decode("utf-8")
    assert f"{_sha256(path / 'tokenizer' / 'modèle.spm')}  tokenizer/modèle.spm\n" in manifest
    verify_checkpoint(path)
    (path.parent / "last").write_bytes("étape_1\n".encode())
    assert resolve_checkpoint(tmp_path / "run") == path
    (path / STATE_FILE).write_bytes('{"format_version": 1, "note": "réessai"}'.encode())
    assert read_state(path) == {"format_version": 1, "note": "réessai"}
    meta = json.loads((tmp_path / OPTIMIZER_JSON).read_text(encoding="utf-8"))
    meta["param_groups"][0]["name"] = "décodeur"
    (tmp_path / OPTIMIZER_JSON).write_bytes(json.dumps(meta, ensure_ascii=False).encode())
    assert load_optimizer_state(tmp_path)["param_groups"][0]["name"] == "décodeur"


# ------------------------------------------------------------------------------- verify


def test_corrupted_file_is_a_clear_error(tmp_path, make_cfg):
    cfg = make_cfg()
    model, _ = trained(cfg)
    path = save_checkpoint(tmp_path / "ck", model, cfg)
    f = path / "model.safetensors"
    expected = _sha256(f)
    data = bytearray(f.read_bytes())
    data[-5] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(path)
    assert str(exc.value) == (
        f"{f}: checksum mismatch (expected sha256 {expected[:12]}..., got {_sha256(f)[:12]}...); "
        "the file is corrupted or was modified: use another checkpoint")
    (path / "checksums.sha256").unlink()
    with pytest.raises(CheckpointError, match="incomplete checkpoint"):
        load_checkpoint(path)


def _drop(name):
    def edit(lines):
        return [line for line in lines if not line.endswith(f"  {name}")]
    return edit


@pytest.mark.parametrize("edit, message", [
    (lambda lines: lines + [f"{'0' * 64}  gone.txt"], "{ck}/gone.txt: missing (listed in {manifest})"),
    (lambda lines: lines + [f"{'0' * 64}  {'x' * 300}"], "{ck}/" + "x" * 300 + ": missing (listed in {manifest})"),
    (lambda lines: lines[:1] + ["abc  model.safetensors"] + lines[1:],
     "{manifest}:2: malformed line 'abc  model.safetensors'"),
    (lambda lines: lines[:2] + [f"{'0' * 64} gone.txt"], "{manifest}:3: malformed line '" + "0" * 64 + " gone.txt'"),
    (lambda lines: lines + [f"{'0' * 64}  a\0b"], "{manifest}:4: 'a\\x00b' is outside the checkpoint directory"),
    (lambda lines: lines + [next(line for line in lines if line.endswith("  model.safetensors"))],
     "{manifest}:4: 'model.safetensors' is listed twice"),
    (_drop("model.safetensors"), "{ck}: model.safetensors is not listed in checksums.sha256"),
    (_drop("state.json"), "{ck}: state.json is not listed in checksums.sha256"),
], ids=["missing", "name-too-long", "short-digest", "one-space", "nul", "twice", "no-model", "no-state"])
def test_manifest_problems_are_named(tmp_path, make_cfg, edit, message):
    cfg = make_cfg()
    path = save_checkpoint(tmp_path / "ck", build_model(cfg.model), cfg)
    manifest = path / MANIFEST_FILE
    manifest.write_text("\n".join(edit(manifest.read_text().splitlines())) + "\n")
    assert error(verify_checkpoint, path) == message.format(ck=path, manifest=manifest)


def test_blank_manifest_lines_are_skipped(tmp_path, make_cfg):
    cfg = make_cfg()
    path = save_checkpoint(tmp_path / "ck", build_model(cfg.model), cfg)
    manifest = path / MANIFEST_FILE
    lines = manifest.read_text().splitlines()
    manifest.write_text("\n".join(["", lines[0], "  ", *lines[1:]]) + "\n")
    verify_checkpoint(path)
    manifest.write_bytes(b"\n\xff\n")
    assert error(verify_checkpoint, path) == f"{manifest}: not UTF-8 text (byte 1): the checkpoint is corrupted"
    manifest.unlink()
    assert error(verify_checkpoint, path) == (
        f"{path}: incomplete checkpoint (checksums.sha256 missing); it was probably interrupted while being written")


@pytest.mark.parametrize("name", ["../../etc/hostname", "/etc/hostname", "tokenizer/../../outside"])
def test_manifest_entries_outside_the_checkpoint_are_refused(tmp_path, make_cfg, name):
    """A manifest line naming a file outside the checkpoint (../../etc/hostname) is refused, not hashed."""
    cfg = make_cfg()
    save_checkpoint(tmp_path / "run" / "c", build_model(cfg.model), cfg)
    (tmp_path / "outside").write_text("x")
    manifest = tmp_path / "run" / "c" / MANIFEST_FILE
    manifest.write_text(manifest.read_text() + f"{'0' * 64}  {name}\n")
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        verify_checkpoint(tmp_path / "run" / "c")


@pytest.mark.parametrize("files, expected", [
    ([MODEL_FILE, MANIFEST_FILE], True),
    ([MODEL_FILE], False),
    ([MANIFEST_FILE], False),
    ([], False),
])
def test_is_checkpoint_dir(tmp_path, files, expected):
    d = tmp_path / "c"
    d.mkdir()
    for name in files:
        (d / name).write_bytes(b"")
    assert is_checkpoint_dir(d) is expected
    assert is_checkpoint_dir(tmp_path / "absent") is False


# ------------------------------------------------------------------------ state, config


@pytest.mark.parametrize("state, message", [
    (None, "{f}: cannot read: [Errno 2] No such file or directory: '{f}'"),
    ({"step": 1}, "{f}: checkpoint format version None is not supported by this aiayn (knows up to 1)"),
    ({"format_version": "1"}, "{f}: checkpoint format version '1' is not supported by this aiayn (knows up to 1)"),
    ({"format_version": 2}, "{f}: checkpoint format version 2 is not supported by this aiayn (knows up to 1)"),
], ids=["missing", "no-version", "string", "newer"])
def test_read_state_refuses(tmp_path, state, message):
    if state is not None:
        (tmp_path / STATE_FILE).write_text(json.dumps(state))
    assert error(read_state, tmp_path) == message.format(f=tmp_path / STATE_FILE)


def test_read_state_returns_the_saved_state(tmp_path):
    (tmp_path / STATE_FILE).write_text(json.dumps({"format_version": 1, "step": 4}))
    assert read_state(tmp_path) == {"format_version": 1, "step": 4}


def test_a_broken_config_is_a_checkpoint_error_with_its_message(tmp_path):
    f = tmp_path / CONFIG_FILE
    f.write_text("model: {d_model: x}\n")
    with pytest.raises(AiaynError) as direct:
        load_config(f)
    assert error(load_checkpoint_config, tmp_path) == str(direct.value)


# ------------------------------------------------------------------------------ resolve


def test_pointer_to_nothing(tmp_path):
    d = tmp_path / "checkpoints"
    fake_ckpt(d, "step_000001")
    for name, message in (("", "''"), ("step_000009", "'step_000009'")):
        (d / "last").write_text(name + "\n")
        assert error(resolve_checkpoint, d / "last") == f"{d / 'last'}: points to {message}, which does not exist"
    (d / "notes").write_text("step_000001\n")
    assert error(resolve_checkpoint, d / "notes") == \
        f"{d / 'notes'}: expected a checkpoint directory, a run directory or a last/best pointer file"
