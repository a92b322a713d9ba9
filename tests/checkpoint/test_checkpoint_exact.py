"""The exact contents, messages and choices of aiayn.checkpoint.io: what a user reads in an
error, what lands on disk, which checkpoints a pointer names and which pruning keeps."""

import base64
import json
import locale
import logging
import os
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from aiayn import fileio
from aiayn.checkpoint import io as ck
from aiayn.config import load_config
from aiayn.errors import AiaynError, CheckpointError
from aiayn.model import build_model

LOGGER = "aiayn.checkpoint.io"


class _Params(torch.nn.Module):
    """One small parameter per name, each with its own storage (so none is an alias)."""

    def __init__(self, names, shape=(1,)):
        super().__init__()
        for name in names:
            self.register_parameter(name, torch.nn.Parameter(torch.zeros(shape)))


def _fake_ckpt(d: Path, name: str) -> Path:
    """A directory that listing and pruning take for a complete checkpoint (they look for
    the weights and the manifest only)."""
    p = d / name
    p.mkdir(parents=True)
    (p / ck.MODEL_FILE).write_bytes(b"")
    (p / ck.MANIFEST_FILE).write_text("")
    return p


def _error(call, *args) -> str:
    with pytest.raises(CheckpointError) as exc:
        call(*args)
    return str(exc.value)


@pytest.fixture
def reversed_listing(monkeypatch):
    """Directory listings in reverse name order: the order of a result must then come from
    sorting by step, not from the filesystem."""
    iterdir = Path.iterdir
    monkeypatch.setattr(Path, "iterdir", lambda self: iter(sorted(iterdir(self), reverse=True)))


@pytest.fixture
def ascii_locale():
    """The locale's encoding ASCII (LANG=C without UTF-8 mode): checkpoint files are UTF-8 anyway."""
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    yield
    locale.setlocale(locale.LC_CTYPE, old)


# --------------------------------------------------------------------- weights


def test_weights_metadata_and_sorted_aliases(tmp_path):
    m = torch.nn.Module()
    shared = torch.nn.Parameter(torch.ones(2))
    for name in ("z", "b", "a"):  # one tensor under three names, registered out of order
        m.register_parameter(name, shared)
    f = tmp_path / "w.safetensors"
    ck.save_model_weights(m, f)
    with safe_open(str(f), framework="pt") as sf:
        assert sf.metadata() == {"format": "pt", "aiayn_format_version": "1", "aliases": '{"a": "z", "b": "z"}'}
        assert list(sf.keys()) == ["z"]
    weights = ck.read_model_weights(f)
    assert sorted(weights) == ["a", "b", "z"] and weights["a"] is weights["z"] and weights["b"] is weights["z"]


def test_saved_tensors_are_copied_to_the_cpu(tmp_path, monkeypatch):
    calls = []
    to = torch.Tensor.to

    def spy(self, *args, **kwargs):
        calls.append((args, kwargs))
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    ck.save_model_weights(_Params(["a", "b"]), tmp_path / "w.safetensors")
    ck.save_optimizer({"state": {0: {"m": torch.ones(2)}}, "param_groups": [{"params": [0]}]}, tmp_path)
    assert calls == [(("cpu",), {})] * 3


def test_weights_are_read_onto_the_device_asked_for(tmp_path, monkeypatch):
    f = tmp_path / "w.safetensors"
    ck.save_model_weights(_Params(["a"]), f)
    devices = []
    load_file = ck.load_file

    def spy(path, **kwargs):
        devices.append(kwargs.get("device"))
        return load_file(path, **kwargs)

    monkeypatch.setattr(ck, "load_file", spy)
    ck.read_model_weights(f, device=torch.device("cpu"))
    assert devices == ["cpu"]


@pytest.mark.parametrize("tensors, metadata, message", [
    ({"w": torch.ones(2)}, {"aliases": "{"}, "{f}: corrupt 'aliases' metadata"),
    ({"w": torch.ones(2)}, {"aliases": '{"v": "x"}'}, "{f}: alias 'v' points to missing tensor 'x'"),
    ({"w": torch.tensor([1.0, float("nan")])}, None,
     "{f}: w holds NaN or infinite values (a diverged run?); use another checkpoint"),
    ({"w": torch.tensor([float("-inf")])}, {"format": "pt"},
     "{f}: w holds NaN or infinite values (a diverged run?); use another checkpoint"),
], ids=["corrupt-aliases", "dangling-alias", "nan", "inf"])
def test_unreadable_weights_messages(tmp_path, tensors, metadata, message):
    f = tmp_path / "w.safetensors"
    save_file(tensors, str(f), metadata=metadata)
    assert _error(ck.read_model_weights, f) == message.format(f=f)


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}], ids=["no-metadata", "no-aliases"])
def test_weights_without_aliases_metadata_are_read(tmp_path, metadata):
    f = tmp_path / "w.safetensors"
    save_file({"w": torch.ones(2)}, str(f), metadata=metadata)
    weights = ck.read_model_weights(f)
    assert list(weights) == ["w"] and torch.equal(weights["w"], torch.ones(2))


def test_a_file_that_is_not_safetensors_is_a_checkpoint_error(tmp_path):
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"not a safetensors file")
    assert _error(ck.read_model_weights, f).startswith(f"{f}: cannot read weights: ")


def _names(prefix, n):
    return [f"{prefix}{i}" for i in range(n)]


@pytest.mark.parametrize("saved, model, message", [
    ([], _names("b", 6),
     "missing: ['b0', 'b1', 'b2', 'b3', 'b4']...; unexpected: []"),
    (_names("a", 5), _names("b", 5),
     "missing: ['b0', 'b1', 'b2', 'b3', 'b4']; unexpected: ['a0', 'a1', 'a2', 'a3', 'a4']"),
    (_names("a", 6), [],
     "missing: []; unexpected: ['a0', 'a1', 'a2', 'a3', 'a4']..."),
], ids=["6-missing", "5-each", "6-unexpected"])
def test_weight_names_that_do_not_match_the_model(tmp_path, saved, model, message):
    f = tmp_path / "w.safetensors"
    ck.save_model_weights(_Params(saved), f)
    assert _error(ck.load_model_weights, _Params(model), f) == \
        f"{f}: weights do not match the model built from the config ({message})"


def test_weights_of_another_shape_or_dtype_are_refused(tmp_path):
    f = tmp_path / "w.safetensors"
    ck.save_model_weights(_Params(["a"], shape=(2,)), f)
    assert _error(ck.load_model_weights, _Params(["a"], shape=(3,)), f) == \
        f"{f}: a has shape (2,), the config gives (3,)"
    save_file({"a": torch.zeros(3, dtype=torch.int32)}, str(f))
    assert _error(ck.load_model_weights, _Params(["a"], shape=(3,)), f) == \
        f"{f}: a has dtype int32, the model needs float32"


# ------------------------------------------------------------------- optimizer


def _optimizer_dict():
    # A dotted state name, a scalar beside a tensor, and a parameter with scalars only.
    return {"state": {0: {"step": 3, "m.v": torch.tensor([1.0, 2.0])}, 1: {"step": 4}},
            "param_groups": [{"params": [0, 1], "lr": 0.5, "betas": (0.9, 0.98)}]}


def _check_optimizer_state(loaded):
    assert sorted(loaded["state"]) == [0, 1]
    assert sorted(loaded["state"][0]) == ["m.v", "step"] and loaded["state"][0]["step"] == 3
    assert torch.equal(loaded["state"][0]["m.v"], torch.tensor([1.0, 2.0]))
    assert loaded["state"][1] == {"step": 4}
    assert loaded["param_groups"] == [{"params": [0, 1], "lr": 0.5, "betas": (0.9, 0.98)}]


def test_optimizer_files_exact_and_round_trip(tmp_path):
    ck.save_optimizer(_optimizer_dict(), tmp_path)
    meta = {"format_version": 1, "param_groups": [{"params": [0, 1], "lr": 0.5, "betas": [0.9, 0.98]}],
            "scalars": {"0": {"step": 3}, "1": {"step": 4}}, "param_ids": ["0", "1"]}
    assert (tmp_path / ck.OPTIMIZER_JSON).read_text(encoding="utf-8") == json.dumps(meta, indent=1)
    with safe_open(str(tmp_path / ck.OPTIMIZER_FILE), framework="pt") as f:
        assert f.metadata() == {"format": "pt"} and list(f.keys()) == ["state.0.m.v"]
    _check_optimizer_state(ck.load_optimizer_state(tmp_path))
    # Without the list of parameter ids, the ids come from the tensors and the scalars.
    meta.pop("param_ids")
    (tmp_path / ck.OPTIMIZER_JSON).write_text(json.dumps(meta), encoding="utf-8")
    _check_optimizer_state(ck.load_optimizer_state(tmp_path))


@pytest.mark.parametrize("missing", [ck.OPTIMIZER_FILE, ck.OPTIMIZER_JSON])
def test_optimizer_state_with_one_file_missing(tmp_path, missing):
    ck.save_optimizer(_optimizer_dict(), tmp_path)
    (tmp_path / missing).unlink()
    assert _error(ck.load_optimizer_state, tmp_path) == \
        f"{tmp_path}: no optimizer state in this checkpoint (optimizer.safetensors / optimizer.json missing)"


def test_unreadable_and_malformed_optimizer_json_messages(tmp_path):
    ck.save_optimizer(_optimizer_dict(), tmp_path)
    (tmp_path / ck.OPTIMIZER_JSON).write_text("{", encoding="utf-8")
    with pytest.raises(json.JSONDecodeError) as bad:
        json.loads("{")
    assert _error(ck.load_optimizer_state, tmp_path) == f"{tmp_path}: cannot read the optimizer state: {bad.value}"
    (tmp_path / ck.OPTIMIZER_JSON).write_text("{}", encoding="utf-8")
    assert _error(ck.load_optimizer_state, tmp_path) == \
        f"{tmp_path / ck.OPTIMIZER_JSON}: malformed optimizer state (KeyError: 'param_groups')"


KERNEL = ("fused", "foreach", "capturable", "differentiable")


def test_restore_optimizer_keeps_this_optimizers_kernel_choice():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    current = {k: opt.param_groups[0][k] for k in KERNEL}
    saved = opt.state_dict()
    saved["param_groups"][0].update(lr=0.5, foreach=True, fused=False, capturable=True, differentiable=True)
    ck.restore_optimizer(opt, saved)
    assert {k: opt.param_groups[0][k] for k in KERNEL} == current
    assert opt.param_groups[0]["lr"] == 0.5


def test_restore_optimizer_that_does_not_fit():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    saved = opt.state_dict()
    two_groups = {"state": {}, "param_groups": saved["param_groups"] + [dict(saved["param_groups"][0], params=[1])]}
    assert _error(ck.restore_optimizer, opt, two_groups) == \
        "optimizer state has a different number of parameter groups"
    two_params = {"state": {}, "param_groups": [dict(saved["param_groups"][0], params=[0, 1])]}
    assert _error(ck.restore_optimizer, opt, two_params) == (
        "optimizer state does not fit this model: loaded state dict contains a parameter group that "
        "doesn't match the size of optimizer's group")


# ------------------------------------------------------------------------- RNG


def test_rng_state_values():
    random.seed(5)
    np.random.seed(3)
    np.random.standard_normal()  # leaves the second value of a pair cached
    kind, key, pos, has_gauss, cached = np.random.get_state()
    assert has_gauss == 1 and int(cached) != has_gauss
    state = ck.capture_rng_state()
    py = random.getstate()
    assert state == {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": {"kind": kind, "key": key.tolist(), "pos": pos, "has_gauss": 1, "cached_gaussian": cached},
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
    }
    np.random.standard_normal()
    ck.restore_rng_state(json.loads(json.dumps(state)))
    assert np.random.standard_normal() == cached


def test_cuda_rng_state_of_the_training_device_only(monkeypatch, caplog):
    read, written = [], []

    def get_rng_state(device):
        read.append(device)
        return torch.tensor([1, 2, 3], dtype=torch.uint8)

    def set_rng_state(new_state, device):
        written.append((new_state.tolist(), device))

    monkeypatch.setattr(torch.cuda, "get_rng_state", get_rng_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    assert "cuda" not in ck.capture_rng_state("cpu") and read == []
    state = ck.capture_rng_state("cuda:1")
    assert state["cuda"] == "AQID" and read == [torch.device("cuda:1")]
    ck.restore_rng_state(state, "cpu")
    assert written == []
    ck.restore_rng_state(state, "cuda:1")
    assert written == [([1, 2, 3], torch.device("cuda:1"))]
    del state["cuda"]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ck.restore_rng_state(state, "cuda:0")
    assert len(written) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "checkpoint has no CUDA RNG state (saved on CPU): dropout on this GPU will not repeat the "
        "interrupted run exactly"]


# ---------------------------------------------------------------- save / verify


def test_checkpoint_files_exact(tmp_path, make_cfg, monkeypatch):
    cfg = make_cfg()
    monkeypatch.setattr(ck, "time", SimpleNamespace(strftime=lambda fmt: f"<{fmt}>"))
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
    path = ck.save_checkpoint(tmp_path / "ck", build_model(cfg.model), cfg, tokenizer=tok, state={"step": 3})
    assert (path / ck.STATE_FILE).read_text(encoding="utf-8") == json.dumps(
        {"step": 3, "format_version": 1, "torch_version": torch.__version__,
         "saved_at": "<%Y-%m-%dT%H:%M:%S%z>"}, indent=1)
    assert (path / "tokenizer" / "spm  model").read_bytes() == b"sp"
    files = ["config.yaml", "model.safetensors", "state.json", "tokenizer/spm  model"]
    assert (path / ck.MANIFEST_FILE).read_text(encoding="utf-8") == \
        "".join(f"{ck._sha256(path / f)}  {f}\n" for f in files)
    ck.verify_checkpoint(path)
    assert len(synced) == 1 and synced[0][0].startswith(".tmp-ck-")
    assert synced[0][1] == sorted([*files, ck.MANIFEST_FILE, "tokenizer"])


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
    (_drop("model.safetensors"), "{ck}: model.safetensors is not listed in checksums.sha256"),
    (_drop("state.json"), "{ck}: state.json is not listed in checksums.sha256"),
], ids=["missing", "name-too-long", "short-digest", "one-space", "nul", "no-model", "no-state"])
def test_manifest_problems_are_named(tmp_path, make_cfg, edit, message):
    cfg = make_cfg()
    path = ck.save_checkpoint(tmp_path / "ck", build_model(cfg.model), cfg)
    manifest = path / ck.MANIFEST_FILE
    manifest.write_text("\n".join(edit(manifest.read_text().splitlines())) + "\n")
    assert _error(ck.verify_checkpoint, path) == message.format(ck=path, manifest=manifest)


def test_blank_manifest_lines_are_skipped(tmp_path, make_cfg):
    cfg = make_cfg()
    path = ck.save_checkpoint(tmp_path / "ck", build_model(cfg.model), cfg)
    manifest = path / ck.MANIFEST_FILE
    lines = manifest.read_text().splitlines()
    manifest.write_text("\n".join(["", lines[0], "  ", *lines[1:]]) + "\n")
    ck.verify_checkpoint(path)
    manifest.write_bytes(b"\n\xff\n")
    assert _error(ck.verify_checkpoint, path) == f"{manifest}: not UTF-8 text (byte 1): the checkpoint is corrupted"
    manifest.unlink()
    assert _error(ck.verify_checkpoint, path) == (
        f"{path}: incomplete checkpoint (checksums.sha256 missing); it was probably interrupted while being written")


@pytest.mark.parametrize("files, expected", [
    ([ck.MODEL_FILE, ck.MANIFEST_FILE], True),
    ([ck.MODEL_FILE], False),
    ([ck.MANIFEST_FILE], False),
    ([], False),
])
def test_is_checkpoint_dir(tmp_path, files, expected):
    d = tmp_path / "c"
    d.mkdir()
    for name in files:
        (d / name).write_bytes(b"")
    assert ck.is_checkpoint_dir(d) is expected
    assert ck.is_checkpoint_dir(tmp_path / "absent") is False


@pytest.mark.parametrize("state, message", [
    (None, "{f}: cannot read: [Errno 2] No such file or directory: '{f}'"),
    ({"step": 1}, "{f}: checkpoint format version None is not supported by this aiayn (knows up to 1)"),
    ({"format_version": "1"}, "{f}: checkpoint format version '1' is not supported by this aiayn (knows up to 1)"),
    ({"format_version": 2}, "{f}: checkpoint format version 2 is not supported by this aiayn (knows up to 1)"),
], ids=["missing", "no-version", "string", "newer"])
def test_read_state_refuses(tmp_path, state, message):
    if state is not None:
        (tmp_path / ck.STATE_FILE).write_text(json.dumps(state))
    assert _error(ck.read_state, tmp_path) == message.format(f=tmp_path / ck.STATE_FILE)


def test_read_state_returns_the_saved_state(tmp_path):
    (tmp_path / ck.STATE_FILE).write_text(json.dumps({"format_version": 1, "step": 4}))
    assert ck.read_state(tmp_path) == {"format_version": 1, "step": 4}


def test_a_broken_config_is_a_checkpoint_error_with_its_message(tmp_path):
    f = tmp_path / ck.CONFIG_FILE
    f.write_text("model: {d_model: x}\n")
    with pytest.raises(AiaynError) as direct:
        load_config(f)
    assert _error(ck.load_checkpoint_config, tmp_path) == str(direct.value)


def test_load_checkpoint_places_the_model_and_names_its_directory(tmp_path, make_cfg):
    cfg = make_cfg()
    ck.CheckpointManager(tmp_path).save(1, build_model(cfg.model), cfg, state={"step": 1})
    loaded = ck.load_checkpoint(tmp_path, device="meta")
    assert loaded.path == tmp_path / "checkpoints" / "step_000001"
    assert {p.device.type for p in loaded.model.parameters()} == {"meta"}


# -------------------------------------------------------------- pointers, resolve


def test_pointer_to_nothing(tmp_path):
    d = tmp_path / "checkpoints"
    _fake_ckpt(d, "step_000001")
    for name, message in (("", "''"), ("step_000009", "'step_000009'")):
        (d / "last").write_text(name + "\n")
        assert _error(ck.resolve_checkpoint, d / "last") == f"{d / 'last'}: points to {message}, which does not exist"
    (d / "notes").write_text("step_000001\n")
    assert _error(ck.resolve_checkpoint, d / "notes") == \
        f"{d / 'notes'}: expected a checkpoint directory, a run directory or a last/best pointer file"


def test_manager_without_pointers(tmp_path):
    mgr = ck.CheckpointManager(tmp_path)
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
    mgr = ck.CheckpointManager(tmp_path / "run")
    first = mgr.save(1, build_model(cfg.model), cfg, tokenizer=tok, state={"step": 1}, is_best=True)
    assert prefixes == [".tmp-step_000001-", ".tmp-last-", ".tmp-best-"]
    assert (mgr.dir / "last").read_text() == (mgr.dir / "best").read_text() == "step_000001\n"
    assert ck.read_state(first)["step"] == 1 and (first / "tokenizer" / "spm.model").read_bytes() == b"sp"
    second = mgr.save(2, build_model(cfg.model), cfg)
    assert mgr.best() == first
    prefixes.clear()
    mgr.mark_best(second)
    assert prefixes == [".tmp-best-"]
    assert (mgr.dir / "best").read_text() == "step_000002\n" and mgr.best() == second


# ------------------------------------------------------------- listing, pruning


@pytest.mark.parametrize("names, expected", [
    (["step_0", "step_1"], ["step_0", "step_1"]),
    (["step_9", "step_10"], ["step_9", "step_10"]),
])
def test_list_checkpoints_by_step(tmp_path, reversed_listing, names, expected):
    for name in names:
        _fake_ckpt(tmp_path, name)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == expected


@pytest.mark.parametrize("names, expected", [
    (["best_step_0", "best_step_1"], ["best_step_0", "best_step_1"]),
    (["best_step_9", "best_step_10"], ["best_step_9", "best_step_10"]),
])
def test_best_only_by_step(tmp_path, reversed_listing, names, expected):
    mgr = ck.CheckpointManager(tmp_path)
    for name in [*names, "step_5"]:
        _fake_ckpt(mgr.dir, name)
    (mgr.dir / "best_step_7").mkdir()  # incomplete
    assert [p.name for p in mgr.best_only()] == expected


@pytest.mark.parametrize("name, step", [
    ("step_000012", 12), ("best_step_000012", 12), ("step_0", 0), ("last", None), ("step_x", None),
])
def test_saved_step(name, step):
    assert ck.saved_step(Path(name)) == step


def _layout(d: Path, names, last=None, best=None) -> None:
    for name in names:
        _fake_ckpt(d, name)
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
    ck.CheckpointManager(tmp_path, keep_last=keep_last).prune()
    pointers = [p for p, target in (("best", best), ("last", last)) if target is not None]
    assert _left(d) == sorted(left + pointers)


def test_default_keep_last_is_five(tmp_path):
    d = tmp_path / "checkpoints"
    _layout(d, STEPS[1:8], last=STEPS[7])
    ck.CheckpointManager(tmp_path).prune()
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
        ck.CheckpointManager(tmp_path, keep_last=1).prune()
    assert _left(d) == ["last", STEPS[3]]
    assert [r.getMessage() for r in caplog.records] == [f"removing old checkpoint {d / s}" for s in STEPS[1:3]]


def test_clean_incomplete_logs_each_removal_and_tolerates_a_concurrent_one(tmp_path, monkeypatch, caplog):
    d = tmp_path / "checkpoints"
    _layout(d, [STEPS[1]], last=STEPS[1])
    (d / ".tmp-step_000002-ab12").mkdir()
    (d / ".tmp-step_000002-ab12" / ck.MODEL_FILE).write_bytes(b"partial")
    (d / ".tmp-last-cd34").write_text("step_000002\n")
    _removed_concurrently(monkeypatch)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        ck.CheckpointManager(tmp_path).clean_incomplete()
    assert _left(d) == ["last", STEPS[1]]
    assert sorted(r.getMessage() for r in caplog.records) == [
        f"removing incomplete checkpoint {d / '.tmp-last-cd34'}",
        f"removing incomplete checkpoint {d / '.tmp-step_000002-ab12'}"]


def test_prune_counts_two_directories_of_one_step(tmp_path, reversed_listing):
    # step_0 beside step_000000 (made by hand): both are step 0 and both count towards keep_last.
    d = tmp_path / "checkpoints"
    _layout(d, ["step_000000", "step_0"], last="step_0")
    ck.CheckpointManager(tmp_path, keep_last=1).prune()
    assert _left(d) == ["last", "step_0"]


def test_checkpoint_text_files_are_utf8_whatever_the_locale(tmp_path, make_cfg, ascii_locale):
    cfg = make_cfg()
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "modèle.spm").write_bytes(b"sp")
    ck.save_optimizer(_optimizer_dict(), tmp_path)  # the optimizer files are read back below
    path = ck.save_checkpoint(tmp_path / "run" / "checkpoints" / "étape_1", build_model(cfg.model), cfg, tokenizer=tok)
    manifest = (path / ck.MANIFEST_FILE).read_bytes().decode("utf-8")
    assert f"{ck._sha256(path / 'tokenizer' / 'modèle.spm')}  tokenizer/modèle.spm\n" in manifest
    ck.verify_checkpoint(path)
    (path.parent / "last").write_bytes("étape_1\n".encode())
    assert ck.resolve_checkpoint(tmp_path / "run") == path
    (path / ck.STATE_FILE).write_bytes('{"format_version": 1, "note": "réessai"}'.encode())
    assert ck.read_state(path) == {"format_version": 1, "note": "réessai"}
    meta = json.loads((tmp_path / ck.OPTIMIZER_JSON).read_text(encoding="utf-8"))
    meta["param_groups"][0]["name"] = "décodeur"
    (tmp_path / ck.OPTIMIZER_JSON).write_bytes(json.dumps(meta, ensure_ascii=False).encode())
    assert ck.load_optimizer_state(tmp_path)["param_groups"][0]["name"] == "décodeur"
