"""Fuzzing the checkpoint readers with untrusted bytes: model.safetensors (its header, its
length prefix, flipped bytes anywhere in the full file), the checksum manifest and
config.yaml. Each reader either refuses with an AiaynError naming the file, or returns what
the untouched file holds (the original weights; a manifest whose every listed file matches;
a valid config): nothing else escapes, and no header can make the reader allocate what it
claims (a 1 TB tensor is refused before any allocation)."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import strategies as st

from aiayn.checkpoint.directory import load_checkpoint, verify_checkpoint
from aiayn.checkpoint.layout import MANIFEST_FILE, MODEL_FILE, REQUIRED_FILES
from aiayn.checkpoint.weights import load_model_tensors, read_model_weights
from aiayn.config import Config, load_config, model_preset
from aiayn.errors import AiaynError
from aiayn.model import build_model

CONFIG = Config(model=model_preset("tiny", src_vocab_size=16, tgt_vocab_size=16, max_positions=16))


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoints: Callable[..., Path]) -> Path:
    """A checkpoint of ``CONFIG`` (no tokenizer), read-only: a damaged one is a copy."""
    return tiny_checkpoints(None, vocab_size=16, max_positions=16)


def _refused_or_loaded(load: Callable[[], Any], path: Path) -> Any:
    """``load()``'s result, or None when it raised an AiaynError whose message names ``path``;
    any other exception, or an error that does not name the file, fails the test."""
    try:
        return load()
    except AiaynError as exc:
        assert str(path) in str(exc), f"the error does not name {path}: {exc}"
        return None


def _expect_aiayn_error(load: Callable[[], Any], path: Path) -> None:
    """``load()`` must raise an AiaynError naming ``path`` (returning is a failure)."""
    with pytest.raises(AiaynError) as exc:
        load()
    assert str(path) in str(exc.value), f"the error does not name {path}: {exc.value}"


def _weights_into_model(path: Path) -> dict[str, torch.Tensor]:
    """model.safetensors read without its checksum, loaded into the model its config builds
    (every name, shape and floating dtype checked)."""
    model = build_model(CONFIG.model)
    load_model_tensors(model, read_model_weights(path), path)
    return model.state_dict()


def _assert_same_weights(loaded: dict[str, torch.Tensor], original: dict[str, torch.Tensor]) -> None:
    assert sorted(loaded) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(loaded[name], tensor), name


# ------------------------------------------------------------------ model.safetensors

DTYPES = st.sampled_from(["F32", "F16", "BF16", "I64", "U8", "BOOL", "F64", "XX", ""])
SHAPES = st.lists(st.one_of(st.integers(0, 8), st.integers(-3, 2**62)), max_size=4)


def _header_bytes(entries: dict) -> bytes:
    header = json.dumps(entries).encode()
    return struct.pack("<Q", len(header)) + header


headers = st.dictionaries(
    st.text(max_size=8),
    st.one_of(st.fixed_dictionaries({"dtype": DTYPES, "shape": SHAPES,
                                     "data_offsets": st.lists(st.integers(-5, 2**62), max_size=3)}),
              st.text(max_size=5), st.integers()),
    max_size=3)


def _flipped(data: bytes, flips: list[tuple[int, int]], span: int) -> bytes:
    buf = bytearray(data)
    for pos, byte in flips:
        buf[pos % span] = byte
    return bytes(buf)


def check_weights(checkpoint: Path, original: dict[str, torch.Tensor], tmp: Path, how: str, header: dict,
                  body: bytes, flips: list[tuple[int, int]], length: int) -> None:
    """One damaged copy of the checkpoint: refused naming model.safetensors, or the original
    weights. ``flips`` are (position, byte) over the whole file; "header-flips" takes the
    positions modulo the header's length."""
    data = (checkpoint / MODEL_FILE).read_bytes()
    header_end = 8 + struct.unpack("<Q", data[:8])[0]
    target = tmp / "ck"
    if not target.exists():
        shutil.copytree(checkpoint, target)
    path = target / MODEL_FILE
    if how == "flips":
        # Anywhere in the full file, through the checkpoint loader (checksums verified first).
        path.write_bytes(_flipped(data, flips, len(data)))
        loaded = _refused_or_loaded(lambda: load_checkpoint(target).model.state_dict(), path)
    else:
        if how == "header":
            path.write_bytes(_header_bytes(header) + body)
        elif how == "length":
            path.write_bytes(struct.pack("<Q", length) + data[8:])
        else:  # "header-flips": the JSON header of the full file, read without the checksum
            path.write_bytes(_flipped(data, flips, header_end))
        loaded = _refused_or_loaded(lambda: _weights_into_model(path), path)
    if loaded is not None:
        _assert_same_weights(loaded, original)


@pytest.fixture
def weights_test(fuzz, checkpoint: Path, tmp_path_factory):
    original = load_checkpoint(checkpoint).model.state_dict()
    tmp = tmp_path_factory.mktemp("weights")
    data = (checkpoint / MODEL_FILE).read_bytes()
    header_end = 8 + struct.unpack("<Q", data[:8])[0]
    # Positions anywhere, and positions in the tensor data (most of the file, and where a
    # damaged byte loads without a parse error: only the checksum can refuse it).
    position = st.one_of(st.integers(0, len(data) - 1), st.integers(header_end, len(data) - 1))
    flips = st.lists(st.tuples(position, st.integers(0, 255)), min_size=1, max_size=8)
    return fuzz(lambda *a: check_weights(checkpoint, original, tmp, *a),
                st.sampled_from(["header", "length", "flips", "header-flips"]),
                headers, st.binary(max_size=64), flips, st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 5000)))


def test_weights(weights_test) -> None:
    weights_test[0]()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_weights_long(weights_test) -> None:
    weights_test[1]()


def test_the_property_holds_on_untouched_files_and_fails_on_silent_damage(checkpoint: Path, tmp_path: Path) -> None:
    original = load_checkpoint(checkpoint).model.state_dict()
    # No flip at all (a byte written with its own value): loads, the original weights.
    data = (checkpoint / MODEL_FILE).read_bytes()
    check_weights(checkpoint, original, tmp_path, "flips", {}, b"", [(100, data[100])], 0)
    # A flipped data byte read without the checksum loads different weights: the property
    # tells them apart (the checksum is what refuses them).
    damaged = tmp_path / "raw" / MODEL_FILE
    damaged.parent.mkdir()
    damaged.write_bytes(_flipped(data, [(len(data) - 1, data[-1] ^ 0x40)], len(data)))
    with pytest.raises(AssertionError):
        _assert_same_weights(_weights_into_model(damaged), original)
    # A refusal must name the file, and returning is not a refusal.
    with pytest.raises(AssertionError, match="does not name"):
        _refused_or_loaded(lambda: (_ for _ in ()).throw(AiaynError("cannot read weights")), damaged)
    with pytest.raises(pytest.fail.Exception):
        _expect_aiayn_error(lambda: None, damaged)


def test_a_header_claiming_a_terabyte_is_refused(tmp_path: Path) -> None:
    path = tmp_path / MODEL_FILE
    path.write_bytes(_header_bytes({"w": {"dtype": "F32", "shape": [2**38], "data_offsets": [0, 2**40]}}) + b"\0" * 8)
    _expect_aiayn_error(lambda: read_model_weights(path), path)


# ------------------------------------------------------------------ manifest and config


def check_manifest(checkpoint: Path, tmp: Path, text: bytes) -> None:
    """Refused naming the checkpoint or its manifest, or accepted only when the required files
    are listed with their true checksums."""
    target = tmp / "ck"
    if not target.exists():
        shutil.copytree(checkpoint, target)
    (target / MANIFEST_FILE).write_bytes(text)
    if _refused_or_loaded(lambda: verify_checkpoint(target) or True, target) is None:
        return
    real = (checkpoint / MANIFEST_FILE).read_text(encoding="utf-8").splitlines()
    listed = text.decode("utf-8").splitlines()
    required = [line for line in real if line.split("  ", 1)[1] in REQUIRED_FILES]
    assert all(line in listed for line in required), "a required file was not checked"
    assert all(line in real for line in listed if line.strip()), "a wrong checksum was accepted"


def check_config(tmp: Path, text: bytes) -> None:
    """Refused naming config.yaml, or a configuration that passes its own validation."""
    path = tmp / "config.yaml"
    path.write_bytes(text)
    cfg = _refused_or_loaded(lambda: load_config(path), path)
    if cfg is not None:
        assert isinstance(cfg, Config)
        cfg.validate()


@pytest.fixture
def manifest_tests(fuzz, checkpoint: Path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("manifest")
    real = (checkpoint / MANIFEST_FILE).read_text(encoding="utf-8")
    lines = st.one_of(st.sampled_from(real.splitlines()),
                      st.tuples(st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
                                st.sampled_from(["../../etc/hostname", "/etc/passwd", "a\0b", "config.yaml", "",
                                                 "x" * 300, "tokenizer/../../x", "."]))
                      .map(lambda t: f"{t[0]}  {t[1]}"),
                      st.text(max_size=40))
    manifest = st.one_of(st.lists(lines, max_size=8).map(lambda ls: "\n".join(ls).encode("utf-8", "surrogatepass")),
                         st.binary(max_size=200))
    yaml_text = st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda t: t.encode("utf-8", "replace")),
                          st.sampled_from([b"model: !!python/object/apply:os.system [ls]", b"a: &a [*a]",
                                           b"model: {d_model: .nan}", b"[1, 2]", b"model: {d_model: 1e999}",
                                           b"\xff\xfe", b"train: {lr: -1}", b"- - - -"]))
    return fuzz(lambda m: check_manifest(checkpoint, tmp, m), manifest), fuzz(lambda y: check_config(tmp, y), yaml_text)


def test_a_file_listed_twice_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    """Found by the long campaign: config.yaml listed with a wrong checksum and again with its
    true one was accepted (the later line won)."""
    target = shutil.copytree(checkpoint, tmp_path / "ck")
    manifest = target / MANIFEST_FILE
    real = manifest.read_text(encoding="utf-8")
    manifest.write_text("0" * 64 + "  config.yaml\n" + real, encoding="utf-8")
    with pytest.raises(AiaynError, match="'config.yaml' is listed twice"):
        verify_checkpoint(target)


def test_a_manifest_name_too_long_for_the_filesystem(checkpoint: Path, tmp_path: Path) -> None:
    # A name longer than the filesystem allows: Path.is_file() raises OSError (ENAMETOOLONG).
    target = shutil.copytree(checkpoint, tmp_path / "ck")
    manifest = target / MANIFEST_FILE
    manifest.write_text(manifest.read_text(encoding="utf-8") + "0" * 64 + "  " + "x" * 300 + "\n", encoding="utf-8")
    with pytest.raises(AiaynError, match="missing"):
        verify_checkpoint(target)


def test_manifest_and_config(manifest_tests) -> None:
    manifest_tests[0][0]()
    manifest_tests[1][0]()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_manifest_and_config_long(manifest_tests) -> None:
    manifest_tests[0][1]()
    manifest_tests[1][1]()
