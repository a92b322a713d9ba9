import json

import pytest
import torch
from safetensors import safe_open

from aiayn.checkpoint import io as ck
from aiayn.errors import CheckpointError
from aiayn.model import build_model
from aiayn.training.optim import build_optimizer


def _trained(cfg):
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = build_optimizer(model, cfg.train)
    x = torch.randint(4, cfg.model.src_vocab_size, (3, 5))
    model(x, x).float().pow(2).mean().backward()
    opt.step()
    return model, opt


def test_round_trip(tmp_path, make_cfg):
    cfg = make_cfg()
    model, opt = _trained(cfg)
    state = {"step": 7, "epoch": 2, "data": {"epoch": 2, "offset": 3}}
    path = ck.save_checkpoint(tmp_path / "ck", model, cfg, state=state, optimizer=opt)
    names = {p.name for p in path.iterdir()}
    assert {"model.safetensors", "config.yaml", "state.json", "optimizer.safetensors",
            "optimizer.json", "checksums.sha256"} <= names
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    loaded = ck.load_checkpoint(path, load_optimizer=True)
    assert not loaded.model.training
    assert loaded.config == cfg
    assert loaded.state["step"] == 7 and loaded.state["format_version"] == ck.FORMAT_VERSION
    for (k, v), (k2, v2) in zip(model.state_dict().items(), loaded.model.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    # Tied matrices stay tied after loading, and are stored once.
    assert loaded.model.src_embed.weight is loaded.model.tgt_embed.weight
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert "tgt_embed.weight" not in keys and "src_embed.weight" in keys
        assert json.loads(f.metadata()["aliases"]) == {"tgt_embed.weight": "src_embed.weight"}
    opt2 = build_optimizer(loaded.model, cfg.train)
    ck.restore_optimizer(opt2, loaded.optimizer_state)
    a, b = opt.state_dict(), opt2.state_dict()
    for pid in a["state"]:
        for key in a["state"][pid]:
            assert torch.equal(a["state"][pid][key], b["state"][pid][key])


class _Compiled(torch.nn.Module):  # what torch.compile looks like from the outside
    def __init__(self, m):
        super().__init__()
        self._orig_mod = m


class _Holder(torch.nn.Module):  # a wrapper whose state dict names start with "module." (as DDP's)
    def __init__(self, m):
        super().__init__()
        self.module = m


@pytest.mark.parametrize("wrap", [_Compiled, _Holder, lambda m: _Holder(_Compiled(_Holder(_Compiled(m))))],
                         ids=["orig_mod", "module", "nested"])
def test_no_wrapper_prefixes(tmp_path, make_cfg, wrap):
    cfg = make_cfg()
    model, _ = _trained(cfg)
    wrapped = wrap(model)
    assert any(k.startswith(("_orig_mod.", "module.")) for k in wrapped.state_dict())
    ck.save_checkpoint(tmp_path / "ck", wrapped, cfg)
    with safe_open(str(tmp_path / "ck" / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    assert saved == set(model.state_dict()) - {"tgt_embed.weight"}  # the tied copy is an alias
    loaded = ck.load_checkpoint(tmp_path / "ck").model
    expected = model.state_dict()
    got = loaded.state_dict()
    assert list(got) == list(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


def _ddp(m):
    """A DistributedDataParallel around ``m`` as unwrap_model sees it (no process group needed)."""
    ddp = torch.nn.parallel.DistributedDataParallel.__new__(torch.nn.parallel.DistributedDataParallel)
    torch.nn.Module.__init__(ddp)
    ddp.module = m
    return ddp


@pytest.mark.parametrize("wrap", [_Compiled, _ddp, lambda m: _ddp(_Compiled(_ddp(m)))],
                         ids=["orig_mod", "ddp", "nested"])
def test_unwrap_model_returns_the_model_itself(tmp_path, make_cfg, wrap):
    cfg = make_cfg()
    model, _ = _trained(cfg)
    assert ck.unwrap_model(wrap(model)) is model
    assert ck.unwrap_model(_Holder(model)).module is model  # not a wrapper unwrap_model knows
    ck.save_checkpoint(tmp_path / "ck", model, cfg)
    fresh = build_model(cfg.model)
    ck.load_model_weights(wrap(fresh), tmp_path / "ck" / ck.MODEL_FILE)
    assert torch.equal(fresh.src_embed.weight, model.src_embed.weight)


def test_rng_round_trip():
    import random

    import numpy as np

    state = ck.capture_rng_state()
    a = (random.random(), np.random.rand(), torch.rand(3))
    json.dumps(state)  # JSON-safe
    ck.restore_rng_state(json.loads(json.dumps(state)))
    b = (random.random(), np.random.rand(), torch.rand(3))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def test_corrupted_file_is_a_clear_error(tmp_path, make_cfg):
    cfg = make_cfg()
    model, _ = _trained(cfg)
    path = ck.save_checkpoint(tmp_path / "ck", model, cfg)
    f = path / "model.safetensors"
    expected = ck._sha256(f)
    data = bytearray(f.read_bytes())
    data[-5] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as exc:
        ck.load_checkpoint(path)
    assert str(exc.value) == (
        f"{f}: checksum mismatch (expected sha256 {expected[:12]}..., got {ck._sha256(f)[:12]}...); "
        "the file is corrupted or was modified: use another checkpoint")
    (path / "checksums.sha256").unlink()
    with pytest.raises(CheckpointError, match="incomplete checkpoint"):
        ck.load_checkpoint(path)


def test_manager_pointers_rotation_and_resolve(tmp_path, make_cfg):
    cfg = make_cfg()
    model, _ = _trained(cfg)
    mgr = ck.CheckpointManager(tmp_path, keep_last=2)
    mgr.save(1, model, cfg, state={"step": 1}, is_best=True)
    for step in (2, 3, 4):
        mgr.save(step, model, cfg, state={"step": step})
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["best", "last", "step_000001", "step_000003", "step_000004"]
    assert ck.resolve_checkpoint(tmp_path).name == "step_000004"
    assert ck.resolve_checkpoint(tmp_path / "checkpoints").name == "step_000004"
    assert ck.resolve_checkpoint(tmp_path / "checkpoints" / "best").name == "step_000001"
    # A directory left by a process killed while saving is ignored, then cleaned up.
    stale = tmp_path / "checkpoints" / ".tmp-step_000005-123"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    assert ck.resolve_checkpoint(tmp_path).name == "step_000004"
    mgr.clean_incomplete()
    assert not stale.exists()
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        ck.resolve_checkpoint(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        ck.resolve_checkpoint(stale.parent.parent.parent)


def test_failed_resave_keeps_the_old_step_and_temporaries_are_cleanable(tmp_path, make_cfg, monkeypatch):
    cfg = make_cfg()
    model, opt = _trained(cfg)
    mgr = ck.CheckpointManager(tmp_path)
    path = mgr.save(1, model, cfg, state={"step": 1}, optimizer=opt)
    before = {p.name: p.read_bytes() for p in path.iterdir()}

    def fail(optimizer, directory):
        assert directory.name.startswith(".tmp-step_000001-")  # what clean_incomplete removes
        raise OSError("disk full")

    monkeypatch.setattr(ck, "save_optimizer", fail)
    with pytest.raises(OSError, match="disk full"):
        mgr.save(1, model, cfg, state={"step": 1, "again": True}, optimizer=opt)
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before
    assert sorted(p.name for p in mgr.dir.iterdir()) == ["last", "step_000001"]
    ck.verify_checkpoint(path)
    # A pointer's temporary left by a kill has the same prefix and is cleaned like a directory.
    (mgr.dir / ".tmp-last-1a2b3c4d").write_text("step_000002\n")
    mgr.clean_incomplete()
    assert sorted(p.name for p in mgr.dir.iterdir()) == ["last", "step_000001"]
    assert mgr.last() == path


def _reseal(ckpt) -> None:
    """Rewrite the checksum manifest after a deliberate edit (as an attacker or a bad tool could)."""
    lines = [f"{ck._sha256(f)}  {f.relative_to(ckpt).as_posix()}"
             for f in ck._files(ckpt) if f.name != ck.MANIFEST_FILE]
    (ckpt / ck.MANIFEST_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_nan_weights_are_refused(tmp_path, make_cfg):
    """Regression: NaN weights loaded silently; translations came out empty, exit 0."""
    cfg = make_cfg()
    model = build_model(cfg.model)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    ck.save_checkpoint(tmp_path / "c", model, cfg)
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        ck.load_checkpoint(tmp_path / "c")


def test_a_dtype_changed_in_the_header_is_refused(tmp_path, make_cfg):
    """Regression: a float32 tensor relabelled int32 in the safetensors header was cast silently."""
    from safetensors.torch import load_file, save_file

    cfg = make_cfg()
    ck.save_checkpoint(tmp_path / "c", build_model(cfg.model), cfg)
    path = str(tmp_path / "c" / ck.MODEL_FILE)
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata()
    weights = load_file(path)
    name = sorted(weights)[0]
    weights[name] = weights[name].view(torch.int32)  # same bytes, integer dtype
    save_file(weights, path, metadata=metadata)
    _reseal(tmp_path / "c")
    with pytest.raises(CheckpointError, match=f"{name} has dtype int32"):
        ck.load_checkpoint(tmp_path / "c")


@pytest.mark.parametrize("name", ["../../etc/hostname", "/etc/hostname", "tokenizer/../../outside"])
def test_manifest_entries_outside_the_checkpoint_are_refused(tmp_path, make_cfg, name):
    """Regression: a manifest line naming ../../etc/hostname was hashed and accepted."""
    cfg = make_cfg()
    ck.save_checkpoint(tmp_path / "run" / "c", build_model(cfg.model), cfg)
    (tmp_path / "outside").write_text("x")
    manifest = tmp_path / "run" / "c" / ck.MANIFEST_FILE
    manifest.write_text(manifest.read_text() + f"{'0' * 64}  {name}\n")
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        ck.verify_checkpoint(tmp_path / "run" / "c")


@pytest.mark.parametrize("text", ["[]", "{}", '{"param_ids": ["x"], "param_groups": []}', '{"param_groups": 3}'])
def test_a_malformed_optimizer_json_is_one_clear_error(tmp_path, make_cfg, text):
    """Regression: a malformed optimizer.json on --resume ended in a KeyError/TypeError traceback."""
    cfg = make_cfg()
    model = build_model(cfg.model)
    ck.save_checkpoint(tmp_path / "c", model, cfg, optimizer=build_optimizer(model, cfg.train))
    (tmp_path / "c" / ck.OPTIMIZER_JSON).write_text(text)
    _reseal(tmp_path / "c")
    with pytest.raises(CheckpointError, match="optimizer.json: malformed optimizer state"):
        ck.load_optimizer_state(tmp_path / "c")


def test_manager_best_only_checkpoints_stay_outside_the_periodic_window(tmp_path, make_cfg):
    cfg = make_cfg()
    model, _ = _trained(cfg)
    mgr = ck.CheckpointManager(tmp_path, keep_last=2)
    d = tmp_path / "checkpoints"
    mgr.save(1, model, cfg, state={"step": 1})
    mgr.save(2, model, cfg, state={"step": 2}, is_best=True, periodic=False)
    assert mgr.best() == mgr.last() == d / "best_step_000002"
    for step in (3, 4, 5):
        mgr.save(step, model, cfg, state={"step": step})
    # keep_last 2 keeps two periodic checkpoints; the best-only one is kept beside them
    # and counted by neither the window nor `average --last`.
    assert sorted(p.name for p in d.iterdir()) == ["best", "best_step_000002", "last", "step_000004", "step_000005"]
    assert [p.name for p in ck.list_checkpoints(d)] == ["step_000004", "step_000005"]
    assert ck.saved_step(d / "best_step_000002") == 2 and ck.checkpoint_step(d / "best_step_000002") is None
    # A newer best-only checkpoint replaces the old one.
    mgr.save(6, model, cfg, state={"step": 6}, is_best=True, periodic=False)
    assert sorted(p.name for p in d.iterdir()) == ["best", "best_step_000006", "last", "step_000004", "step_000005"]
    # A periodic save of that same step takes over the `best` pointer; the copy goes.
    mgr.save(6, model, cfg, state={"step": 6})
    assert mgr.best() == mgr.last() == d / "step_000006"
    assert sorted(p.name for p in d.iterdir()) == ["best", "last", "step_000005", "step_000006"]
    with pytest.raises(ValueError, match="^a checkpoint that is not periodic must be the best$"):
        mgr.save(7, model, cfg, periodic=False)
