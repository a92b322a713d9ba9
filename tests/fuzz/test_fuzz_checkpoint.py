"""Fuzzing the checkpoint readers with untrusted bytes: the safetensors header of
model.safetensors, the checksum manifest and config.yaml. Each either loads or raises an
AiaynError naming the file; nothing else escapes, and no header can make the reader
allocate what it claims (a 1 TB tensor is refused before any allocation)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import strategies as st

from aiayn.checkpoint.directory import save_checkpoint, verify_checkpoint
from aiayn.checkpoint.layout import MANIFEST_FILE, MODEL_FILE
from aiayn.checkpoint.weights import read_model_weights
from aiayn.config import Config, load_config, model_preset
from aiayn.errors import AiaynError


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from aiayn.model import build_model

    cfg = Config(model=model_preset("tiny", src_vocab_size=16, tgt_vocab_size=16, max_positions=16))
    torch.manual_seed(0)
    return save_checkpoint(tmp_path_factory.mktemp("fuzz_ck") / "ck", build_model(cfg.model).eval(), cfg,
                           state={"step": 1})


def _expect_aiayn_error(fn, *args) -> None:
    try:
        fn(*args)
    except AiaynError:
        pass


# ------------------------------------------------------------------ model.safetensors header

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


def check_weights(original: bytes, tmp: Path, how: str, header: dict, body: bytes, flips: list[tuple[int, int]],
                  length: int) -> None:
    path = tmp / MODEL_FILE
    if how == "header":
        data = _header_bytes(header) + body
    elif how == "length":
        data = struct.pack("<Q", length) + original[8:]
    else:
        buf = bytearray(original)
        for pos, byte in flips:
            buf[pos % len(buf)] = byte
        data = bytes(buf)
    path.write_bytes(data)
    _expect_aiayn_error(read_model_weights, path)


@pytest.fixture
def weights_test(fuzz, checkpoint: Path, tmp_path_factory):
    original = (checkpoint / MODEL_FILE).read_bytes()[:4096]  # the header and the first tensors
    tmp = tmp_path_factory.mktemp("weights")
    return fuzz(lambda *a: check_weights(original, tmp, *a), st.sampled_from(["header", "length", "flips"]),
                headers, st.binary(max_size=64), st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)),
                                                          max_size=8),
                st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 5000)))


def test_weights_header(weights_test) -> None:
    weights_test[0]()


@pytest.mark.slow
def test_weights_header_long(weights_test) -> None:
    weights_test[1]()


def test_a_header_claiming_a_terabyte_is_refused(tmp_path: Path) -> None:
    path = tmp_path / MODEL_FILE
    path.write_bytes(_header_bytes({"w": {"dtype": "F32", "shape": [2**38], "data_offsets": [0, 2**40]}}) + b"\0" * 8)
    with pytest.raises(AiaynError, match="cannot read weights"):
        read_model_weights(path)


# ------------------------------------------------------------------ manifest and config


def check_manifest(checkpoint: Path, tmp: Path, text: bytes) -> None:
    target = tmp / "ck"
    if not target.exists():
        shutil.copytree(checkpoint, target)
    (target / MANIFEST_FILE).write_bytes(text)
    _expect_aiayn_error(verify_checkpoint, target)


def check_config(tmp: Path, text: bytes) -> None:
    path = tmp / "config.yaml"
    path.write_bytes(text)
    _expect_aiayn_error(load_config, path)


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


def test_a_manifest_name_too_long_for_the_filesystem(checkpoint: Path, tmp_path: Path) -> None:
    # Found by the long campaign: Path.is_file() raised OSError (ENAMETOOLONG).
    target = shutil.copytree(checkpoint, tmp_path / "ck")
    manifest = target / MANIFEST_FILE
    manifest.write_text(manifest.read_text(encoding="utf-8") + "0" * 64 + "  " + "x" * 300 + "\n", encoding="utf-8")
    with pytest.raises(AiaynError, match="missing"):
        verify_checkpoint(target)


def test_manifest_and_config(manifest_tests) -> None:
    manifest_tests[0][0]()
    manifest_tests[1][0]()


@pytest.mark.slow
def test_manifest_and_config_long(manifest_tests) -> None:
    manifest_tests[0][1]()
    manifest_tests[1][1]()
