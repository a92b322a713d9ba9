"""A checkpoint directory (layout: :mod:`aiayn.checkpoint.layout`): written atomically with
a checksum manifest, verified, found from what a user passes, and loaded back.

:func:`resolve_checkpoint` accepts a checkpoint directory, a run directory, a
``checkpoints`` directory or one of the ``last``/``best`` pointer files. Nothing is
unpickled: the weights are safetensors, the rest YAML and JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aiayn.checkpoint.layout import (
    BEST_POINTER,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    FORMAT_VERSION,
    LAST_POINTER,
    MANIFEST_FILE,
    MODEL_FILE,
    REQUIRED_FILES,
    STATE_FILE,
    TMP_PREFIX,
    TOKENIZER_DIR,
)
from aiayn.checkpoint.training_state import load_optimizer_state, save_optimizer
from aiayn.checkpoint.weights import load_model_weights, save_model_weights, without_random_init
from aiayn.config import Config, dump_config, load_config
from aiayn.errors import AiaynError, CheckpointError
from aiayn.fileio import atomic_dir
from aiayn.model import Transformer, build_model
from aiayn.text.tokenizer import Tokenizer

# ------------------------------------------------------------------- file helpers


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


# -------------------------------------------------------------------- save / verify


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    cfg: Config,
    tokenizer: Tokenizer | str | Path | None = None,
    state: dict[str, Any] | None = None,
    optimizer: torch.optim.Optimizer | dict | None = None,
) -> Path:
    """Write a checkpoint directory at ``path`` atomically; returns ``path``.

    ``tokenizer`` is a :class:`~aiayn.text.tokenizer.Tokenizer` (saved with its ``save``)
    or a directory whose files are copied (e.g. another checkpoint's ``tokenizer/``).
    ``state`` must be JSON-serialisable; the format version and library versions are
    added. An existing directory at ``path`` is replaced only once the new one is complete.
    """
    path = Path(path)
    # Re-saving a step (e.g. a resumed run passing a step that a killed run had already
    # written) replaces it only once the new one is complete. Every temporary name, the old
    # step's while it is moved aside included, starts with TMP_PREFIX (clean_incomplete).
    with atomic_dir(path, force=True, prefix=f"{TMP_PREFIX}{path.name}-", durable=True) as tmp:
        _write_checkpoint_files(tmp, model, cfg, tokenizer, state, optimizer)
    return path


def _write_checkpoint_files(tmp: Path, model: nn.Module, cfg: Config, tokenizer: Tokenizer | str | Path | None,
                            state: dict[str, Any] | None, optimizer: torch.optim.Optimizer | dict | None) -> None:
    save_model_weights(model, tmp / MODEL_FILE)
    (tmp / CONFIG_FILE).write_text(dump_config(cfg), encoding="utf-8")
    full_state = dict(state or {})
    full_state.update(format_version=FORMAT_VERSION, torch_version=torch.__version__,
                      saved_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    (tmp / STATE_FILE).write_text(json.dumps(full_state, indent=1), encoding="utf-8")
    if optimizer is not None:
        save_optimizer(optimizer, tmp)
    if tokenizer is not None:
        tok_dir = tmp / TOKENIZER_DIR
        if isinstance(tokenizer, (str, Path)):
            shutil.copytree(tokenizer, tok_dir)
        else:
            tok_dir.mkdir()
            tokenizer.save(tok_dir)
    lines = [f"{_sha256(f)}  {f.relative_to(tmp).as_posix()}" for f in _files(tmp)]
    (tmp / MANIFEST_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")


def verify_checkpoint(path: str | Path) -> None:
    """Check that the checkpoint is complete and every file matches its checksum."""
    path = Path(path)
    manifest = path / MANIFEST_FILE
    listed = _read_manifest(path, manifest)
    for name in REQUIRED_FILES:
        if name not in listed:
            raise CheckpointError(f"{path}: {name} is not listed in {MANIFEST_FILE}")
    for name, digest in listed.items():
        f = path / name
        try:
            present = f.is_file()
        except OSError:  # a name too long for the filesystem
            present = False
        if not present:
            raise CheckpointError(f"{f}: missing (listed in {manifest})")
        actual = _sha256(f)
        if actual != digest:
            raise CheckpointError(
                f"{f}: checksum mismatch (expected sha256 {digest[:12]}..., got {actual[:12]}...); "
                "the file is corrupted or was modified: use another checkpoint")


def _read_manifest(path: Path, manifest: Path) -> dict[str, str]:
    """File name -> sha256 from ``checksums.sha256``; every name confined to ``path``."""
    if not manifest.is_file():
        raise CheckpointError(f"{path}: incomplete checkpoint ({MANIFEST_FILE} missing); "
                              "it was probably interrupted while being written")
    try:
        text = manifest.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{manifest}: not UTF-8 text (byte {exc.start}): the checkpoint is corrupted") from None
    listed: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64:
            raise CheckpointError(f"{manifest}:{lineno}: malformed line {line!r}")
        if not _inside(path, path / name):
            raise CheckpointError(f"{manifest}:{lineno}: {name!r} is outside the checkpoint directory")
        if name in listed:  # two checksums for one file: one of them is wrong
            raise CheckpointError(f"{manifest}:{lineno}: {name!r} is listed twice")
        listed[name] = digest
    return listed


def _inside(root: Path, path: Path) -> bool:
    """Whether ``path`` (symlinks and ``..`` resolved) lies inside ``root``."""
    try:
        root_r, path_r = root.resolve(), path.resolve()
    except (OSError, ValueError):  # a NUL in the name, a name too long, a symlink loop
        return False
    return path_r != root_r and root_r in path_r.parents


def is_checkpoint_dir(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST_FILE).is_file() and (path / MODEL_FILE).is_file()


# ------------------------------------------------------------------- resolve / load


def read_pointer(pointer: Path) -> Path:
    name = pointer.read_text(encoding="utf-8").strip()
    target = pointer.parent / name
    if not name or not target.is_dir():
        raise CheckpointError(f"{pointer}: points to {name!r}, which does not exist")
    return target


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory from what a user may pass.

    * a checkpoint directory (has ``model.safetensors``) -> itself;
    * a pointer file (``RUN/checkpoints/last`` or ``.../best``) -> the directory it names;
    * a ``checkpoints`` directory -> the one its ``last`` names;
    * a run directory -> the one ``RUN/checkpoints/last`` names.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such checkpoint or run directory")
    if p.is_file():
        if p.name in (LAST_POINTER, BEST_POINTER):
            return read_pointer(p)
        raise CheckpointError(f"{p}: expected a checkpoint directory, a run directory or a "
                              "last/best pointer file")
    if (p / MODEL_FILE).is_file():
        return p
    if (p / LAST_POINTER).is_file():
        return read_pointer(p / LAST_POINTER)
    if (p / CHECKPOINTS_DIR / LAST_POINTER).is_file():
        return read_pointer(p / CHECKPOINTS_DIR / LAST_POINTER)
    raise CheckpointError(
        f"{p}: no checkpoint found (expected a checkpoint directory with {MODEL_FILE}, or a run "
        f"directory with {CHECKPOINTS_DIR}/{LAST_POINTER})")


def read_state(path: str | Path) -> dict[str, Any]:
    f = Path(path) / STATE_FILE
    try:
        state = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{f}: cannot read: {exc}") from None
    version = state.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(f"{f}: checkpoint format version {version!r} is not supported by "
                              f"this aiayn (knows up to {FORMAT_VERSION})")
    return state


def load_checkpoint_config(path: str | Path) -> Config:
    f = Path(path) / CONFIG_FILE
    try:
        return load_config(f)
    except AiaynError as exc:
        raise CheckpointError(f"{exc}") from None


def load_tokenizer_dir(directory: Path) -> Tokenizer | None:
    if not directory.is_dir():
        return None
    return Tokenizer.load(directory)


@dataclass
class LoadedCheckpoint:
    """A checkpoint read back by [load_checkpoint][aiayn.checkpoint.directory.load_checkpoint].

    Attributes:
        model: The Transformer with the checkpoint's weights, in eval mode, on the device
            asked for.
        config: The whole experiment it was trained with (``config.yaml``).
        tokenizer: Its SentencePiece tokenizer; None if it was saved without one.
        state: ``state.json``: ``step``, ``epoch``, best metric, versions, ...
        path: The checkpoint directory that was read.
        optimizer_state: The optimizer's state (``load_state_dict``-ready), with
            ``load_optimizer=True``.
    """

    model: Transformer  # in eval mode, on the requested device
    config: Config
    tokenizer: Tokenizer | None
    state: dict[str, Any]
    path: Path
    # optimizer.load_state_dict-ready dict, when load_checkpoint(load_optimizer=True).
    optimizer_state: dict[str, Any] | None = None


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu",
                    load_optimizer: bool = False, verify: bool = True) -> LoadedCheckpoint:
    """Verify checksums, rebuild the model from config.yaml and load its weights.

    Nothing is unpickled: the weights are safetensors, the rest YAML and JSON.

    Args:
        path: A checkpoint directory, a run directory or its ``checkpoints`` directory
            (the checkpoint ``last`` names), or a ``last``/``best`` pointer file.
        device: Where the model goes (``cpu``, ``cuda``, ``cuda:N``).
        load_optimizer: Also read the optimizer's state (to continue training).
        verify: Check every file against ``checksums.sha256`` first.

    Returns:
        The model, configuration, tokenizer and state.

    Raises:
        CheckpointError: No checkpoint at ``path``, or an incomplete or corrupted one.

    Example:
        ```python
        loaded = load_checkpoint("runs/mine")
        loaded.state["step"], loaded.config.model.d_model
        ```
    """

    ckpt = resolve_checkpoint(path)
    if verify:
        verify_checkpoint(ckpt)
    cfg = load_checkpoint_config(ckpt)
    state = read_state(ckpt)
    with without_random_init():  # every parameter is loaded next
        model = build_model(cfg.model)
    load_model_weights(model, ckpt / MODEL_FILE)
    model.to(device).eval()
    tokenizer = load_tokenizer_dir(ckpt / TOKENIZER_DIR)
    opt = load_optimizer_state(ckpt) if load_optimizer else None
    return LoadedCheckpoint(model=model, config=cfg, tokenizer=tokenizer, state=state,
                            path=ckpt, optimizer_state=opt)

