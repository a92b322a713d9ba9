"""Checkpoints: one directory each, written atomically, verified on load, never pickled.

Layout of a checkpoint directory::

    step_000100/
      model.safetensors      weights; tied matrices stored once (aliases in the metadata);
                             names without `module.` / `_orig_mod.` prefixes
      config.yaml            the whole experiment (model, data/tokenizer, train, decode)
      state.json             step, epoch, data-iterator position, RNG states, best metric,
                             format version ... (whatever the trainer passes, plus versions)
      optimizer.safetensors  optimizer tensors (Adam moments, step counts)   [optional]
      optimizer.json         optimizer scalars and param groups                [optional]
      tokenizer/             the SentencePiece model(s)                        [optional]
      checksums.sha256       SHA-256 of every other file (`sha256sum -c` format)

A run directory keeps its checkpoints in ``RUN/checkpoints/``; the text file
``RUN/checkpoints/last`` names the newest complete one and ``RUN/checkpoints/best`` the best
by the validation metric. The periodic saves (every ``save_every`` steps or
``save_every_minutes``, and the final one) are ``step_*``: the series that ``aiayn average
--last N`` and ``keep_last`` count. A checkpoint written only because validation improved is
``best_step_*``, outside that series; it is removed once ``best`` and ``last`` both name
other checkpoints. :func:`resolve_checkpoint` accepts a checkpoint directory, a run
directory, a ``checkpoints`` directory or one of those pointer files.

Atomicity: everything is written into ``checkpoints/.tmp-<name>-*``, fsynced, then
renamed to ``<name>`` (:func:`aiayn.fileio.atomic_dir`); the ``last`` pointer is replaced
(write, fsync, rename) only after that. A process killed at any moment leaves either the
previous checkpoint as ``last`` or the new one, complete; stale temporaries (``.tmp-*``) are
ignored and cleaned later.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import random
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from aiayn.config import Config, dump_config, load_config
from aiayn.errors import AiaynError, CheckpointError
from aiayn.fileio import atomic_dir, write_atomic
from aiayn.model import Transformer, build_model
from aiayn.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"
STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_JSON = "optimizer.json"
TOKENIZER_DIR = "tokenizer"
MANIFEST_FILE = "checksums.sha256"
CHECKPOINTS_DIR = "checkpoints"
LAST_POINTER = "last"
BEST_POINTER = "best"
REQUIRED_FILES = (MODEL_FILE, CONFIG_FILE, STATE_FILE)
_TMP_PREFIX = ".tmp-"
_PREFIXES = ("module.", "_orig_mod.")
_STEP_RE = re.compile(r"^step_(\d+)$")
_BEST_ONLY_RE = re.compile(r"^best_step_(\d+)$")


# ------------------------------------------------------------------- file helpers


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_pointer(path: Path, name: str) -> None:
    # The temporary starts with _TMP_PREFIX, so that clean_incomplete removes one left by a kill.
    write_atomic(path, name + "\n", prefix=f"{_TMP_PREFIX}{path.name}-")


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


# --------------------------------------------------------------------- model weights


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside DistributedDataParallel and/or torch.compile wrappers."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def _strip_prefixes(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
                changed = True
    return name


def model_tensors(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """CPU tensors to save, each storage once, and ``alias -> saved name`` for tied ones."""
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for raw_name, t in unwrap_model(model).state_dict().items():
        name = _strip_prefixes(raw_name)
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
               tuple(t.stride()), t.dtype)
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.detach().to("cpu").contiguous()
    return tensors, aliases


def save_model_weights(model: nn.Module, path: str | Path) -> None:
    tensors, aliases = model_tensors(model)
    metadata = {"format": "pt", "aiayn_format_version": str(FORMAT_VERSION),
                "aliases": json.dumps(aliases, sort_keys=True)}
    save_file(tensors, str(path), metadata=metadata)


def read_model_weights(path: str | Path, device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """All weight names (aliases included, sharing one tensor) from a model.safetensors."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            metadata = f.metadata() or {}
        tensors = load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read weights: {exc}") from None
    try:
        aliases = json.loads(metadata.get("aliases", "{}"))
    except json.JSONDecodeError:
        raise CheckpointError(f"{path}: corrupt 'aliases' metadata") from None
    for alias, target in aliases.items():
        if target not in tensors:
            raise CheckpointError(f"{path}: alias {alias!r} points to missing tensor {target!r}")
        tensors[alias] = tensors[target]
    for name, t in tensors.items():
        # NaN weights (a diverged run) would decode to empty translations without an error.
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{path}: {name} holds NaN or infinite values (a diverged run?); "
                                  "use another checkpoint")
    return {_strip_prefixes(k): v for k, v in tensors.items()}


def load_model_weights(model: nn.Module, path: str | Path) -> None:
    """Load a model.safetensors into ``model`` (strict: every name must match)."""
    load_model_tensors(model, read_model_weights(path), path)


def load_model_tensors(model: nn.Module, tensors: dict[str, Tensor], path: str | Path) -> None:
    """Load ``tensors`` (read from ``path``, which errors name) into ``model``: every name,
    shape and floating dtype must be the model's."""
    model = unwrap_model(model)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the model built from the config "
            f"(missing: {missing[:5]}{'...' if len(missing) > 5 else ''}; "
            f"unexpected: {unexpected[:5]}{'...' if len(unexpected) > 5 else ''})")
    for name, t in tensors.items():
        _check_tensor(path, name, t, expected[name])
    model.load_state_dict(tensors, strict=True)


def _check_tensor(path: str | Path, name: str, t: Tensor, expected: Tensor) -> None:
    """The shape the config implies and a floating dtype where the model has one (a header
    edited from F32 to I32 would otherwise be cast silently)."""
    if tuple(t.shape) != tuple(expected.shape):
        raise CheckpointError(f"{path}: {name} has shape {tuple(t.shape)}, the config "
                              f"gives {tuple(expected.shape)}")
    if t.is_floating_point() != expected.is_floating_point():
        raise CheckpointError(f"{path}: {name} has dtype {str(t.dtype).removeprefix('torch.')}, "
                              f"the model needs {str(expected.dtype).removeprefix('torch.')}")


# ------------------------------------------------------------------------- optimizer


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, Tensor):
        return value.item()
    return value


def save_optimizer(optimizer: torch.optim.Optimizer | dict, directory: Path) -> None:
    """Optimizer tensors to optimizer.safetensors, everything else to optimizer.json."""
    sd = optimizer.state_dict() if not isinstance(optimizer, dict) else optimizer
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, pstate in sd["state"].items():
        for key, value in pstate.items():
            if isinstance(value, Tensor):
                tensors[f"state.{pid}.{key}"] = value.detach().to("cpu").contiguous()
            else:
                scalars.setdefault(str(pid), {})[key] = _jsonable(value)
    meta = {"format_version": FORMAT_VERSION, "param_groups": _jsonable(sd["param_groups"]),
            "scalars": scalars, "param_ids": [str(p) for p in sd["state"]]}
    save_file(tensors, str(directory / OPTIMIZER_FILE), metadata={"format": "pt"})
    (directory / OPTIMIZER_JSON).write_text(json.dumps(meta, indent=1), encoding="utf-8")


def load_optimizer_state(directory: str | Path) -> dict[str, Any]:
    """An optimizer state dict (tensors on CPU) for ``optimizer.load_state_dict``."""
    directory = Path(directory)
    if not (directory / OPTIMIZER_FILE).is_file() or not (directory / OPTIMIZER_JSON).is_file():
        raise CheckpointError(f"{directory}: no optimizer state in this checkpoint "
                              f"({OPTIMIZER_FILE} / {OPTIMIZER_JSON} missing)")
    try:
        meta = json.loads((directory / OPTIMIZER_JSON).read_text(encoding="utf-8"))
        tensors = load_file(str(directory / OPTIMIZER_FILE))
    except (json.JSONDecodeError, SafetensorError, OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{directory}: cannot read the optimizer state: {exc}") from None
    try:
        return _optimizer_state(meta, tensors)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory / OPTIMIZER_JSON}: malformed optimizer state "
                              f"({type(exc).__name__}: {exc})") from None


def _optimizer_state(meta: dict[str, Any], tensors: dict[str, Tensor]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {int(p): {} for p in meta.get("param_ids", [])}
    for name, t in tensors.items():
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = t
    for pid, values in meta.get("scalars", {}).items():
        state.setdefault(int(pid), {}).update(values)
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    return {"state": state, "param_groups": groups}


def restore_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load ``state`` but keep this optimizer's kernel choice (fused/foreach), which
    depends on the device it now runs on, not the one that saved it."""
    keep = ("fused", "foreach", "capturable", "differentiable")
    groups = []
    for saved, current in zip(state["param_groups"], optimizer.param_groups):
        g = dict(saved)
        for k in keep:
            if k in current:
                g[k] = current[k]
        groups.append(g)
    if len(state["param_groups"]) != len(optimizer.param_groups):
        raise CheckpointError("optimizer state has a different number of parameter groups")
    try:
        optimizer.load_state_dict({"state": state["state"], "param_groups": groups})
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"optimizer state does not fit this model: {exc}") from None


# ------------------------------------------------------------------------------ RNG


def _b64(t: Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def capture_rng_state(device: torch.device | str | None = None) -> dict[str, Any]:
    """Python, NumPy and torch generator states as JSON-safe values.

    With a CUDA ``device``, that device's generator too (the one dropout uses there); only
    that one, so that a rank of a multi-GPU run does not touch the other GPUs.
    """
    py = random.getstate()
    # numpy's stub types this default (legacy=True) call as the dict form; it is the tuple
    # (kind, key, pos, has_gauss, cached_gaussian).
    np_state = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    state: dict[str, Any] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": {"kind": np_state[0], "key": np_state[1].tolist(), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": _b64(torch.get_rng_state()),
    }
    if device is not None and torch.device(device).type == "cuda":
        state["cuda"] = _b64(torch.cuda.get_rng_state(torch.device(device)))
    return state


def restore_rng_state(state: dict[str, Any], device: torch.device | str | None = None) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["kind"], np.asarray(n["key"], dtype=np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(_unb64(state["torch"]))
    if device is not None and torch.device(device).type == "cuda":
        if "cuda" in state:
            torch.cuda.set_rng_state(_unb64(state["cuda"]), torch.device(device))
        else:
            log.warning("checkpoint has no CUDA RNG state (saved on CPU): dropout on this GPU "
                        "will not repeat the interrupted run exactly")


# -------------------------------------------------------------------- save / load


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
    # step's while it is moved aside included, starts with _TMP_PREFIX (clean_incomplete).
    with atomic_dir(path, force=True, prefix=f"{_TMP_PREFIX}{path.name}-", durable=True) as tmp:
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


def _read_pointer(pointer: Path) -> Path:
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
            return _read_pointer(p)
        raise CheckpointError(f"{p}: expected a checkpoint directory, a run directory or a "
                              "last/best pointer file")
    if (p / MODEL_FILE).is_file():
        return p
    if (p / LAST_POINTER).is_file():
        return _read_pointer(p / LAST_POINTER)
    if (p / CHECKPOINTS_DIR / LAST_POINTER).is_file():
        return _read_pointer(p / CHECKPOINTS_DIR / LAST_POINTER)
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
    """A checkpoint read back by [load_checkpoint][aiayn.checkpoint.io.load_checkpoint].

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
    model = build_model(cfg.model)
    load_model_weights(model, ckpt / MODEL_FILE)
    model.to(device).eval()
    tokenizer = load_tokenizer_dir(ckpt / TOKENIZER_DIR)
    opt = load_optimizer_state(ckpt) if load_optimizer else None
    return LoadedCheckpoint(model=model, config=cfg, tokenizer=tokenizer, state=state,
                            path=ckpt, optimizer_state=opt)


# ------------------------------------------------------------- run-directory manager


def checkpoint_step(path: Path) -> int | None:
    """The step of a periodic checkpoint (``step_N``); None for any other name."""
    m = _STEP_RE.match(path.name)
    return int(m.group(1)) if m else None


def saved_step(path: Path) -> int | None:
    """The step of a periodic (``step_N``) or best-only (``best_step_N``) checkpoint."""
    m = _STEP_RE.match(path.name) or _BEST_ONLY_RE.match(path.name)
    return int(m.group(1)) if m else None


def list_checkpoints(checkpoints_dir: str | Path) -> list[Path]:
    """Complete periodic (``step_*``) checkpoints in a checkpoints directory, oldest first;
    best-only checkpoints (``best_step_*``) are not among them."""
    d = Path(checkpoints_dir)
    if not d.is_dir():
        return []
    found = [p for p in d.iterdir() if checkpoint_step(p) is not None and is_checkpoint_dir(p)]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)


class CheckpointManager:
    """Step-named checkpoints in ``RUN/checkpoints``: `last`/`best` pointers, rotation.

    Periodic saves are ``step_N``; a save made only for a new best validation result
    (``periodic=False``) is ``best_step_N`` (:meth:`name`). Keeps the newest ``keep_last``
    periodic checkpoints (0 keeps all) plus the ones ``best`` and ``last`` name. Only the
    process that writes (rank 0) should create one.
    """

    def __init__(self, run_dir: str | Path, keep_last: int = 5) -> None:
        self.dir = Path(run_dir) / CHECKPOINTS_DIR
        self.keep_last = keep_last

    def name(self, step: int, periodic: bool = True) -> str:
        """``step_000100`` (periodic), or ``best_step_000100`` (saved for its validation only)."""
        return f"step_{step:06d}" if periodic else f"best_step_{step:06d}"

    def last(self) -> Path | None:
        pointer = self.dir / LAST_POINTER
        return _read_pointer(pointer) if pointer.is_file() else None

    def best(self) -> Path | None:
        pointer = self.dir / BEST_POINTER
        if not pointer.is_file():
            return None
        try:
            return _read_pointer(pointer)
        except CheckpointError:
            return None

    def clean_incomplete(self) -> None:
        """Remove temporary directories left by a process killed while saving."""
        if not self.dir.is_dir():
            return
        for p in self.dir.iterdir():
            if p.name.startswith(_TMP_PREFIX):
                log.info("removing incomplete checkpoint %s", p)
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)

    def save(self, step: int, model: nn.Module, cfg: Config, tokenizer: Any = None,
             state: dict[str, Any] | None = None, optimizer: Any = None,
             is_best: bool = False, periodic: bool = True) -> Path:
        """Write step ``step``; ``periodic=False``: a save for a new best only (needs ``is_best``),
        kept outside the periodic series. A periodic save of the step the best-only one
        holds takes over the ``best`` pointer (the same state), and the copy goes."""
        if not (periodic or is_best):
            raise ValueError("a checkpoint that is not periodic must be the best")
        path = save_checkpoint(self.dir / self.name(step, periodic), model, cfg, tokenizer, state, optimizer)
        _write_pointer(self.dir / LAST_POINTER, path.name)
        best = self.best()
        if is_best or (periodic and best is not None and best.name == self.name(step, periodic=False)):
            _write_pointer(self.dir / BEST_POINTER, path.name)
        self.prune()
        return path

    def mark_best(self, path: Path) -> None:
        _write_pointer(self.dir / BEST_POINTER, path.name)

    def best_only(self) -> list[Path]:
        """Complete best-only checkpoints (``best_step_*``), oldest first."""
        if not self.dir.is_dir():
            return []
        found = [p for p in self.dir.iterdir() if _BEST_ONLY_RE.match(p.name) and is_checkpoint_dir(p)]
        return sorted(found, key=lambda p: saved_step(p) or 0)

    def prune(self) -> None:
        """Keep the newest ``keep_last`` periodic checkpoints and what ``last``/``best`` name;
        best-only checkpoints that neither names go. ``keep_last`` 0 keeps everything."""
        if self.keep_last <= 0:
            return
        last, best = self.last(), self.best()
        keep = {p.name for p in (last, best) if p is not None}
        ckpts, stale = list_checkpoints(self.dir), self.best_only()
        last_step = saved_step(last) if last is not None else None
        if last_step is not None:
            # Checkpoints newer than `last` come from a killed run that a resumed run will
            # overwrite; they do not count towards the window of the newest K.
            keep.update(p.name for p in ckpts + stale if (saved_step(p) or 0) > last_step)
            ckpts = [p for p in ckpts if (saved_step(p) or 0) <= last_step]
        keep.update(p.name for p in ckpts[-self.keep_last:])
        for p in ckpts + stale:
            if p.name not in keep:
                log.debug("removing old checkpoint %s", p)
                shutil.rmtree(p, ignore_errors=True)
