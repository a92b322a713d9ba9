"""A run's checkpoints: step-named directories in ``RUN/checkpoints``, the ``last`` and
``best`` pointers, and rotation.

The periodic saves (every ``save_every`` steps or ``save_every_minutes``, and the final one)
are ``step_*``: the series that ``aiayn average --last N`` and ``keep_last`` count. A
checkpoint written only because validation improved is ``best_step_*``, outside that
series; it is removed once ``best`` and ``last`` both name other checkpoints. A pointer is
replaced (write, fsync, rename) only after the checkpoint it names is complete.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

from torch import nn

from aiayn.checkpoint.directory import is_checkpoint_dir, read_pointer, save_checkpoint
from aiayn.checkpoint.layout import BEST_POINTER, CHECKPOINTS_DIR, LAST_POINTER, MANIFEST_FILE, MODEL_FILE, TMP_PREFIX
from aiayn.config import Config
from aiayn.errors import AiaynError, CheckpointError
from aiayn.fileio import remove_dir, write_atomic

log = logging.getLogger(__name__)

_STEP_RE = re.compile(r"^step_(\d+)$")
_BEST_ONLY_RE = re.compile(r"^best_step_(\d+)$")


def _write_pointer(path: Path, name: str) -> None:
    # The temporary starts with TMP_PREFIX, so that clean_incomplete removes one left by a kill.
    write_atomic(path, name + "\n", prefix=f"{TMP_PREFIX}{path.name}-")


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
        return read_pointer(pointer) if pointer.is_file() else None

    def best(self) -> Path | None:
        pointer = self.dir / BEST_POINTER
        if not pointer.is_file():
            return None
        try:
            return read_pointer(pointer)
        except CheckpointError:
            return None

    def clean_incomplete(self) -> None:
        """Remove temporary directories left by a process killed while saving."""
        if not self.dir.is_dir():
            return
        for p in self.dir.iterdir():
            if p.name.startswith(TMP_PREFIX):
                log.info("removing incomplete checkpoint %s", p)
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)

    def remove_half_deleted(self) -> list[Path]:
        """Remove checkpoint directories a kill left half-deleted (pruning by an older version
        deleted file by file): a ``step_N`` / ``best_step_N`` missing its manifest or a file
        the manifest lists, that no pointer names. A save never leaves one (it renames a
        complete directory into place), so such a directory can only be a deletion cut short.
        The removed paths."""
        if not self.dir.is_dir():
            return []
        try:
            named = {p.name for p in (self.last(), self.best()) if p is not None}
        except AiaynError:  # a broken pointer: resolving the resume point says so
            return []
        removed = []
        for p in sorted(self.dir.iterdir()):
            if (saved_step(p) is not None and p.is_dir() and not p.is_symlink()
                    and not _all_listed_files(p) and p.name not in named):
                log.warning("removing %s: a checkpoint whose deletion was interrupted", p)
                remove_dir(p, prefix=f"{TMP_PREFIX}{p.name}-")
                removed.append(p)
        return removed

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
                # Renamed first: a kill midway leaves a temporary that clean_incomplete
                # removes, never a half-deleted step_N.
                remove_dir(p, prefix=f"{TMP_PREFIX}{p.name}-")


def _all_listed_files(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` has its manifest and every file the manifest lists (no hashing)."""
    try:
        lines = (checkpoint / MANIFEST_FILE).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return False
    names = [line.partition("  ")[2] for line in lines if line.strip()]
    return MODEL_FILE in names and all((checkpoint / name).is_file() for name in names if name)
