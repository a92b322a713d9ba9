"""Model weights in safetensors (aiayn.checkpoint.weights): tied matrices stored once, no wrapper
prefixes, read onto the device asked for, and refused with one clear message when they do not
fit the model or hold NaN."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from aiayn.checkpoint import weights
from aiayn.checkpoint.directory import load_checkpoint, save_checkpoint
from aiayn.checkpoint.layout import MODEL_FILE
from aiayn.checkpoint.weights import load_model_weights, read_model_weights, save_model_weights, unwrap_model
from aiayn.errors import CheckpointError
from aiayn.model import build_model

from .conftest import Params, error, reseal, trained


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
    model, _ = trained(cfg)
    wrapped = wrap(model)
    assert any(k.startswith(("_orig_mod.", "module.")) for k in wrapped.state_dict())
    save_checkpoint(tmp_path / "ck", wrapped, cfg)
    with safe_open(str(tmp_path / "ck" / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    assert saved == set(model.state_dict()) - {"tgt_embed.weight"}  # the tied copy is an alias
    loaded = load_checkpoint(tmp_path / "ck").model
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
    model, _ = trained(cfg)
    assert unwrap_model(wrap(model)) is model
    assert unwrap_model(_Holder(model)).module is model  # not a wrapper unwrap_model knows
    save_checkpoint(tmp_path / "ck", model, cfg)
    fresh = build_model(cfg.model)
    load_model_weights(wrap(fresh), tmp_path / "ck" / MODEL_FILE)
    assert torch.equal(fresh.src_embed.weight, model.src_embed.weight)


def test_weights_metadata_and_sorted_aliases(tmp_path):
    m = torch.nn.Module()
    shared = torch.nn.Parameter(torch.ones(2))
    for name in ("z", "b", "a"):  # one tensor under three names, registered out of order
        m.register_parameter(name, shared)
    f = tmp_path / "w.safetensors"
    save_model_weights(m, f)
    with safe_open(str(f), framework="pt") as sf:
        assert sf.metadata() == {"format": "pt", "aiayn_format_version": "1", "aliases": '{"a": "z", "b": "z"}'}
        assert list(sf.keys()) == ["z"]
    weights = read_model_weights(f)
    assert sorted(weights) == ["a", "b", "z"] and weights["a"] is weights["z"] and weights["b"] is weights["z"]


def test_saved_weights_are_copied_to_the_cpu(tmp_path, monkeypatch):
    calls = []
    to = torch.Tensor.to

    def spy(self, *args, **kwargs):
        calls.append((args, kwargs))
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    save_model_weights(Params(["a", "b"]), tmp_path / "w.safetensors")
    assert calls == [(("cpu",), {})] * 2


def test_weights_are_read_onto_the_device_asked_for(tmp_path, monkeypatch):
    f = tmp_path / "w.safetensors"
    save_model_weights(Params(["a"]), f)
    devices = []
    load_file = weights.load_file

    def spy(path, **kwargs):
        devices.append(kwargs.get("device"))
        return load_file(path, **kwargs)

    monkeypatch.setattr(weights, "load_file", spy)
    read_model_weights(f, device=torch.device("cpu"))
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
    assert error(read_model_weights, f) == message.format(f=f)


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}], ids=["no-metadata", "no-aliases"])
def test_weights_without_aliases_metadata_are_read(tmp_path, metadata):
    f = tmp_path / "w.safetensors"
    save_file({"w": torch.ones(2)}, str(f), metadata=metadata)
    weights = read_model_weights(f)
    assert list(weights) == ["w"] and torch.equal(weights["w"], torch.ones(2))


def test_a_file_that_is_not_safetensors_is_a_checkpoint_error(tmp_path):
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"not a safetensors file")
    assert error(read_model_weights, f).startswith(f"{f}: cannot read weights: ")


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
    save_model_weights(Params(saved), f)
    assert error(load_model_weights, Params(model), f) == \
        f"{f}: weights do not match the model built from the config ({message})"


def test_weights_of_another_shape_or_dtype_are_refused(tmp_path):
    f = tmp_path / "w.safetensors"
    save_model_weights(Params(["a"], shape=(2,)), f)
    assert error(load_model_weights, Params(["a"], shape=(3,)), f) == \
        f"{f}: a has shape (2,), the config gives (3,)"
    save_file({"a": torch.zeros(3, dtype=torch.int32)}, str(f))
    assert error(load_model_weights, Params(["a"], shape=(3,)), f) == \
        f"{f}: a has dtype int32, the model needs float32"


def test_nan_weights_are_refused(tmp_path, make_cfg):
    """NaN weights are refused: loaded, they would decode to empty translations with exit status 0."""
    cfg = make_cfg()
    model = build_model(cfg.model)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    save_checkpoint(tmp_path / "c", model, cfg)
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        load_checkpoint(tmp_path / "c")


def test_a_dtype_changed_in_the_header_is_refused(tmp_path, make_cfg):
    """A float32 tensor relabelled int32 in the safetensors header is refused, not cast."""
    from safetensors.torch import load_file, save_file

    cfg = make_cfg()
    save_checkpoint(tmp_path / "c", build_model(cfg.model), cfg)
    path = str(tmp_path / "c" / MODEL_FILE)
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata()
    weights = load_file(path)
    name = sorted(weights)[0]
    weights[name] = weights[name].view(torch.int32)  # same bytes, integer dtype
    save_file(weights, path, metadata=metadata)
    reseal(tmp_path / "c")
    with pytest.raises(CheckpointError, match=f"{name} has dtype int32"):
        load_checkpoint(tmp_path / "c")
