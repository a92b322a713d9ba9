"""Files the project writes: written beside their final name, renamed into place on success.

One rule for every output, file or directory: nothing is ever left half-written under its
final name, and what was there before is replaced only once the new version is complete.
A crash (or Ctrl-C, or SIGKILL) leaves either the old output or the new one, plus at most a
hidden ``.NAME.tmp-*`` beside it.

    with atomic_file(path) as f:          # text by default; mode="wb" for bytes
        f.write(...)
    write_atomic(path, "text or bytes")
    with atomic_dir(out, force=False) as tmp:   # refuses a non-empty `out` unless force
        (tmp / "model.bin").write_bytes(...)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from aiayn.errors import AiaynError


def fsync_dir(path: str | os.PathLike) -> None:
    """Make renames and creations inside ``path`` durable (not possible on every platform)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8",
                durable: bool = True) -> Iterator[IO[Any]]:
    """An open temporary file beside ``path`` that becomes ``path`` when the block succeeds.

    ``durable`` fsyncs the data and the directory (checkpoints, prepared data); outputs that
    can be regenerated may skip it.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file: mode {mode!r} (w or wb)")
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def write_atomic(path: str | os.PathLike, data: str | bytes, durable: bool = True) -> None:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` through :func:`atomic_file`."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w", durable=durable) as f:
        f.write(data)


def check_empty_dir(path: str | os.PathLike, force: bool = False) -> Path:
    """``path`` as a Path, if it may be (re)written as an output directory: absent, empty,
    or ``force``. Anything else raises one line naming it."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise AiaynError(f"{path}: exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise AiaynError(f"{path}: directory exists and is not empty (use --force to replace it)")
    return path


def replace_dir(tmp: str | os.PathLike, out: str | os.PathLike) -> None:
    """Move the finished directory ``tmp`` to ``out``: the old ``out`` is renamed away first
    and deleted only once the new one is in place."""
    tmp, out = Path(tmp), Path(out)
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(out, old)
    os.replace(tmp, out)
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_dir(path: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """A temporary directory beside ``path`` that becomes ``path`` when the block succeeds.

    An existing non-empty ``path`` is refused unless ``force`` (:func:`check_empty_dir`);
    with it, the old directory is replaced only once the new one is complete.
    """
    path = check_empty_dir(path, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        replace_dir(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    # mkstemp creates 0600 files; an output should get the permissions open() would give it.
    mask = os.umask(0)
    os.umask(mask)
    return mask
