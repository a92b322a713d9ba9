"""Files the project writes and text files it reads, one implementation of each.

**Writing.** Nothing is ever left half-written under its final name, and what was there
before is replaced only once the new version is complete. Everything is written beside its
final name and renamed into place, so a crash (or Ctrl-C, or SIGKILL) leaves either the old
output or the new one, plus at most a hidden ``.NAME.tmp-*`` beside it (``prefix`` chooses
another name where a cleaner must recognise it, e.g. checkpoints)::

    with atomic_file(path) as f:          # text by default; mode="wb" for bytes
        f.write(...)
    write_atomic(path, "text or bytes")
    with atomic_path(path) as tmp:        # anything that writes to a path, then verify it
        shutil.copyfile(src, tmp)
    with atomic_dir(out, force=False) as tmp:   # refuses a non-empty `out` unless force
        (tmp / "model.bin").write_bytes(...)

Outputs get the permissions ``open()`` / ``mkdir()`` would give them (umask applied).
``durable`` fsyncs the data and the directory entries, for outputs that must survive a
power cut (checkpoints, their pointers); outputs that can be regenerated may skip it.

**Faults.** A full disk or quota, or a read-only file system (:data:`DISK_ERRNOS`), met while
writing through these helpers becomes one :class:`~aiayn.errors.EnvironmentFailure` (exit 1)
naming the output and what was kept; the temporaries are removed first. Whoever writes an
output holds its lock (:func:`output_lock`, a ``.NAME.lock`` file beside it, removed on
release): a second writer of the same output is refused with one line naming the holder's
pid and command. :func:`atomic_dir` takes the lock itself, and once it holds it removes the
temporaries (``PREFIX*``) that a killed writer of the same output left behind. An output
directory may never hold what an input refers to (:func:`input_referents`: symlinks
resolved, a run directory's ``checkpoints/last`` and the checkpoint it names), and no output
is, holds or lies inside an input (:func:`check_not_input`, the one rule every command's
outputs follow).

**Reading.** :func:`iter_text_lines` reads a plain or gzip-compressed (``.gz`` suffix or
the gzip magic bytes) UTF-8 text file line by line: lines end at ``\\n`` only (so a stray
U+2028 or form feed inside a sentence cannot shift a line count), a leading byte-order mark
is dropped, and what else is stripped is the caller's choice (``strip``). Invalid UTF-8 is
an error naming ``path:line`` and the byte, or its line is decoded with U+FFFD
(``replace``), or it is given as ``None`` (``skip``); a corrupt gzip stream is an error
naming the line where it broke.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import logging
import os
import re
import secrets
import shutil
import stat
import sys
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from aiayn.errors import AiaynError, DataError, EnvironmentFailure

try:
    import fcntl
except ImportError:  # not POSIX: outputs are not locked
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

# ============================================================================ faults

# The errors of the machine rather than of the input: one line, exit code 1.
DISK_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
               errno.EROFS: "read-only file system"}
# How other libraries' errors carry an errno in their text (safetensors: "Os { code: 28, ...",
# Rust's "(os error 28)"), or its C library message (C++ converters: "No space left on device").
_OS_ERROR_CODE = re.compile(r"(?:os error |code: )(\d+)")
_OS_ERROR_TEXT = {os.strerror(code).lower(): code for code in DISK_ERRNOS}


def disk_errno(exc: BaseException | None) -> int | None:
    """The errno of :data:`DISK_ERRNOS` behind ``exc`` (or what caused it), else None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno is not None:
            if exc.errno in DISK_ERRNOS:
                return exc.errno
        elif isinstance(exc, Exception) and not isinstance(exc, AiaynError):
            text = str(exc)[:2000]
            match = _OS_ERROR_CODE.search(text)
            if match and int(match.group(1)) in DISK_ERRNOS:
                return int(match.group(1))
            for message, code in _OS_ERROR_TEXT.items():
                if message in text.lower():
                    return code
        exc = exc.__cause__ or exc.__context__
    return None


def environment_failure(exc: BaseException, path: str | os.PathLike, kept: str,
                        within: Path | None = None) -> EnvironmentFailure | None:
    """``exc`` as one line naming ``path`` and what was ``kept``, if the disk or the file
    system caused it (None otherwise). A failure already worded for a path inside
    ``within`` (the temporary being written as ``path``) is worded again for ``path``."""
    if isinstance(exc, EnvironmentFailure):
        inner = getattr(exc, "path", None)
        if within is None or inner is None or not Path(inner).is_relative_to(within):
            return exc
        code: int | None = getattr(exc, "errno", None)
    else:
        code = disk_errno(exc)
    if code is None:
        return None
    failure = EnvironmentFailure(f"{DISK_ERRNOS[code]} writing {path}; {kept}")
    failure.path, failure.errno = str(path), code  # type: ignore[attr-defined]
    return failure


def _kept(existed: bool) -> str:
    return "the previous contents are unchanged" if existed else "nothing was left there"


# The command line named in lock files (the CLI sets it; a library caller gets its argv).
_command: str | None = None


def set_command(command: str) -> None:
    """What :func:`output_lock` records as the holder's command."""
    global _command
    _command = command


def _holder_line() -> str:
    command = _command if _command is not None else " ".join(sys.argv)
    if len(command) > 200:
        command = command[:200] + "..."
    return f"pid {os.getpid()}: {command}"


def lock_file(path: str | os.PathLike) -> Path:
    """The lock file of the output ``path``: ``.NAME.lock`` beside it."""
    path = Path(path)
    return Path(os.path.realpath(path.parent)) / f".{path.name}.lock"


_held: dict[str, list[Any]] = {}  # lock file -> [nesting depth, holder line], in this process


def _acquire(lock: Path, path: Path, flag: str, holder_line: str) -> int | None:
    """An fd holding ``lock`` (None when no lock file can be made there: the writer's own
    checks then say why it cannot write)."""
    assert fcntl is not None
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                lines = os.read(fd, 300).decode("utf-8", "replace").strip().splitlines()
                holder = lines[0] if lines else "pid unknown"
            finally:
                os.close(fd)
            raise AiaynError(f"{flag}{path}: is being written by another run ({holder}); wait for it "
                             "to finish, or write elsewhere") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:  # released (and removed) between the open and the flock
            same = False
        if same:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.write(fd, (holder_line + "\n").encode("utf-8", "replace"))
            return fd
        os.close(fd)


@contextmanager
def output_lock(path: str | os.PathLike, *, reentrant: bool = False, flag: str = "") -> Iterator[None]:
    """Hold the lock of the output ``path`` (a file or a directory, existing or not) for the
    block. Another process holding it, or this one unless ``reentrant``, is refused with one
    line naming the holder; ``flag`` prefixes the path in it (e.g. ``"--output "``)."""
    path = Path(path)
    if fcntl is None:
        yield
        return
    lock = lock_file(path)
    key = str(lock)
    if key in _held:
        if not reentrant:
            raise AiaynError(f"{flag}{path}: is being written by another run ({_held[key][1]}); "
                             "wait for it to finish, or write elsewhere")
        _held[key][0] += 1
        try:
            yield
        finally:
            _held[key][0] -= 1
        return
    holder = _holder_line()
    fd = _acquire(lock, path, flag, holder)
    if fd is None:
        yield
        return
    _held[key] = [1, holder]
    try:
        yield
    finally:
        del _held[key]
        with contextlib.suppress(OSError):
            lock.unlink()  # still held: a writer that opened it meanwhile sees it gone and retries
        os.close(fd)


def holds_lock(path: str | os.PathLike) -> bool:
    """Whether this process holds the lock of the output ``path``."""
    return str(lock_file(path)) in _held


def remove_stale_temporaries(path: str | os.PathLike, prefix: str | None = None) -> list[Path]:
    """Remove what a killed writer of ``path`` left beside it (``PREFIX*``, default
    ``.NAME.tmp-*``); the removed paths. Only for a caller holding ``path``'s lock: any
    other writer of it is then gone."""
    path = Path(path)
    prefix = prefix if prefix is not None else temp_prefix(path)
    removed = []
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return []
    for p in entries:
        if p.name.startswith(prefix):
            log.warning("removing %s, left by an interrupted run", p)
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()
            removed.append(p)
    return removed


def remove_dir(path: str | os.PathLike, prefix: str | None = None) -> None:
    """Delete the directory ``path`` so that a kill midway cannot leave a half-deleted
    directory under its name: it is renamed to a temporary (``PREFIX*``, default
    ``.NAME.tmp-``) first, which the next writer's cleaning removes."""
    path = Path(path)
    prefix = prefix if prefix is not None else temp_prefix(path)
    aside = path.with_name(f"{prefix}del-{secrets.token_hex(4)}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


# The pointer files of a checkpoints directory: each names a checkpoint beside it.
POINTER_FILES = ("last", "best")
CHECKPOINTS_SUBDIR = "checkpoints"


def input_referents(path: str | os.PathLike) -> list[Path]:
    """Everything an input path refers to, resolved (symlinks followed): itself; for a
    pointer file (``last``/``best``) or a directory holding pointers (a checkpoints
    directory, a run directory's ``checkpoints/``), the pointers and the directories they
    name. Replacing any of them would destroy the input."""
    p = Path(path)
    found = [p.resolve()]

    def pointers(directory: Path, names: Sequence[str] = POINTER_FILES) -> None:
        for name in names:
            pointer = directory / name
            if not pointer.is_file():
                continue
            found.append(pointer.resolve())
            with contextlib.suppress(OSError, ValueError):
                with open(pointer, "rb") as f:
                    target = f.read(4096).decode("utf-8", "replace").strip()
                if target and (directory / target).exists():
                    found.append((directory / target).resolve())

    if p.is_file() and p.name in POINTER_FILES:
        pointers(p.parent, [p.name])
    elif p.is_dir():
        pointers(p)
        if (p / CHECKPOINTS_SUBDIR).is_dir():
            pointers(p / CHECKPOINTS_SUBDIR)
    return found


# ============================================================================ writing


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


def fsync_tree(directory: str | os.PathLike) -> None:
    """fsync every file below ``directory``, then every directory (the entries naming them)."""
    directory = Path(directory)
    dirs = [directory]
    for p in sorted(directory.rglob("*")):
        if p.is_dir():
            dirs.append(p)
        elif p.is_file():
            fsync_file(p)
    for d in dirs:
        fsync_dir(d)


def temp_prefix(path: Path) -> str:
    """The default prefix of the temporaries written for ``path``."""
    return f".{path.name}.tmp-"


def _create_unique(parent: Path, prefix: str, create: Callable[[Path], None]) -> Path:
    # tempfile's mkstemp/mkdtemp create 0600/0700 entries; an output should get the
    # permissions open()/mkdir() give (umask applied), so the entry is made here.
    for _ in range(100):
        candidate = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            create(candidate)
        except FileExistsError:
            continue
        except OSError as exc:  # /proc, a read-only or missing folder: one line
            failure = environment_failure(exc, parent, "nothing was changed")
            if failure is not None:
                raise failure from None
            raise AiaynError(f"{parent}: cannot write there ({exc.strerror or exc})") from None
        return candidate
    raise FileExistsError(f"{parent}: no unused temporary name {prefix}*")


def _create_file(path: Path) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


@contextmanager
def atomic_path(path: str | os.PathLike, durable: bool = True, prefix: str | None = None) -> Iterator[Path]:
    """The path of a new empty file beside ``path``; it becomes ``path`` when the block succeeds.

    For writers that take a path (copies, downloads, savers of other libraries) and for
    checking a file before it goes into place. A failure removes it and leaves ``path`` as it was.
    """
    path = Path(path)
    prefix = prefix if prefix is not None else temp_prefix(path)
    if holds_lock(path):
        remove_stale_temporaries(path, prefix)
    existed = path.exists()
    tmp = _create_unique(path.parent, prefix, _create_file)
    try:
        yield tmp
        if durable:
            fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        failure = environment_failure(exc, path, _kept(existed), within=tmp)
        if failure is not None and failure is not exc:
            raise failure from None
        raise
    if durable:
        fsync_dir(path.parent)


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8",
                durable: bool = True, prefix: str | None = None) -> Iterator[IO[Any]]:
    """An open temporary file beside ``path`` that becomes ``path`` when the block succeeds."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file: mode {mode!r} (w or wb)")
    with atomic_path(path, durable, prefix) as tmp, \
            open(tmp, mode, encoding=None if "b" in mode else encoding) as f:
        yield f


def write_atomic(path: str | os.PathLike, data: str | bytes, durable: bool = True,
                 prefix: str | None = None) -> None:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` through :func:`atomic_file`."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w", durable=durable, prefix=prefix) as f:
        f.write(data)


def write_all_atomic(contents: Mapping[Path, str | bytes], durable: bool = True) -> None:
    """Write several files that belong together: every temporary is complete before the first
    rename, so a failure while writing leaves all the old files (or none) in place."""
    with ExitStack() as stack:
        for path, data in contents.items():
            f = stack.enter_context(atomic_file(path, "wb" if isinstance(data, bytes) else "w",
                                                durable=durable))
            f.write(data)


def check_empty_dir(path: str | os.PathLike, force: bool = False,
                    error: type[AiaynError] = AiaynError, *, inputs: Sequence[str | os.PathLike] = (),
                    own: Callable[[Path], bool] | None = None, flag: str = "--out",
                    hint: str = "use --force to replace it",
                    folders: Sequence[str | os.PathLike | None] = ()) -> Path:
    """``path`` as a Path, if it may be (re)written as an output directory. The one rule of
    every command that writes a directory:

    - it must not be, contain or lie inside one of ``inputs``, nor be or contain one of
      ``folders`` (inputs read in part, :func:`check_not_input`), even with ``force``;
    - it must be absent, empty, ``force`` given, or ``own(path)``: a directory this command
      wrote itself and continues (a run directory it resumes, prepared data it rebuilds);
    - its parent must accept a new directory (probed, so the check fails before any work).

    Anything else raises ``error`` with one line naming it (and ``hint``: what to do).
    """
    path = Path(path)
    if inputs or folders:
        check_not_inside(path, inputs, flag, folders)
    if path.exists() and not path.is_dir():
        raise error(f"{path}: exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not force and not (own is not None and own(path)):
        raise error(f"{path}: directory exists and is not empty ({hint})")
    _probe_dir(path, error)
    return path


def _probe_dir(path: Path, error: type[AiaynError]) -> None:
    """Fail now, in one line, if no directory can be created where ``path`` will be."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise error(f"{path}: {parent} is not a directory")
    try:
        probe = _create_unique(parent, f"{temp_prefix(path)}probe-", os.mkdir)
    except EnvironmentFailure as exc:  # worded for the output, not the folder probed
        raise EnvironmentFailure(f"{DISK_ERRNOS[getattr(exc, 'errno', errno.EROFS)]} writing {path}; "
                                 "nothing was changed") from None
    except AiaynError as exc:
        raise error(str(exc)) from None
    with contextlib.suppress(FileNotFoundError):
        probe.rmdir()


def check_output_file(path: str | os.PathLike, inputs: Sequence[str | os.PathLike | None] = (),
                      flag: str = "--output") -> Path:
    """``path`` as a Path, if a file may be written there: not a directory, not one of
    ``inputs`` nor inside one (:func:`check_not_input`), and its folder accepts a new file
    (probed by creating and removing a temporary, so the check fails before any work is done)."""
    path = Path(path)
    if path.is_dir():
        raise AiaynError(f"{flag} {path}: is a directory")
    check_not_input(path, inputs, flag)
    if not path.parent.is_dir():
        raise AiaynError(f"{flag} {path}: directory {path.parent} does not exist")
    probe = path.parent / f"{temp_prefix(path)}probe-{secrets.token_hex(4)}"
    try:
        _create_file(probe)
    except OSError as exc:
        failure = environment_failure(exc, path, "nothing was changed")
        if failure is not None:
            raise failure from None
        raise AiaynError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None
    probe.unlink(missing_ok=True)
    return path


# Files looked at, per input directory, for a hard link of an existing output.
_LINK_SCAN_LIMIT = 10_000


def check_not_input(out: str | os.PathLike, inputs: Sequence[str | os.PathLike | None],
                    flag: str = "--output", directory: bool = False,
                    folders: Sequence[str | os.PathLike | None] = ()) -> Path:
    """``out`` as a Path, if writing it cannot destroy an input: the one rule of every
    command's outputs, files and (``directory``) directories alike. Refused, in one line
    naming both, when ``out`` is an input (any name of the same file: symlinks resolved, hard
    links compared by device and inode), holds one (a directory replaced with an input
    inside it), or lies inside an input directory (a file written into a checkpoint
    directory). An input is everything :func:`input_referents` finds: a pointer and the
    checkpoint it names count. A run directory (one that holds ``last``/``best`` pointers) is
    read only through them: an output may lie inside it, beside its checkpoints, not in the
    checkpoint it points to; so is each of ``folders``, inputs of which a command reads only
    some files (a data mirror): an output may lie inside one, not be or hold it. ``None``
    and ``-`` (standard input) are skipped."""
    out = Path(out)
    target = out.resolve()
    try:
        st = os.stat(out)
    except OSError:
        st = None
    link = (st.st_dev, st.st_ino) if st is not None and not stat.S_ISDIR(st.st_mode) else None
    instead = "write to another directory" if directory else "write to another file"
    partly_read = [f for f in folders if f is not None]
    for inp in [*inputs, *partly_read]:
        if inp is None or str(inp) == "-":
            continue
        given = Path(inp).resolve()
        referents = input_referents(inp)
        for resolved in referents:  # the output is, or holds, an input
            through = "" if resolved == given else f" (through {resolved})"
            same = resolved == target or _same_file(link, resolved)
            if (same and directory) or target in resolved.parents:
                raise AiaynError(f"{flag} {out}: would replace the input {inp}{through}; {instead}")
            if same:
                raise AiaynError(f"{flag} {out}: is also an input ({inp}{through}); {instead}")
        for resolved in referents:  # the output lies inside an input directory
            through = "" if resolved == given else f" (through {resolved})"
            container = resolved == given and (inp in partly_read or _holds_pointers(given))
            if resolved in target.parents and resolved.is_dir() and not container:
                raise AiaynError(f"{flag} {out}: lies inside the input {inp}{through}; write outside it")
            if link is not None and st is not None and st.st_nlink > 1 and resolved.is_dir():
                inside = _linked_inside(resolved, link)
                if inside is not None:
                    raise AiaynError(f"{flag} {out}: is also the input file {inside} (a hard link); {instead}")
    return out


def _holds_pointers(directory: Path) -> bool:
    """A run directory or its ``checkpoints/``: pointers name what is read in it."""
    return any((d / name).is_file() for d in (directory, directory / CHECKPOINTS_SUBDIR) for name in POINTER_FILES)


def _same_file(link: tuple[int, int] | None, path: Path) -> bool:
    if link is None:
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == link


def _linked_inside(directory: Path, link: tuple[int, int]) -> Path | None:
    """The file under ``directory`` that is the file ``link`` (device, inode), if one of the
    first :data:`_LINK_SCAN_LIMIT` is."""
    seen = 0
    for root, _dirs, names in os.walk(directory):
        for name in names:
            seen += 1
            if seen > _LINK_SCAN_LIMIT:
                return None
            if _same_file(link, Path(root) / name):
                return Path(root) / name
    return None


def check_not_inside(out: str | os.PathLike, inputs: Sequence[str | os.PathLike],
                     flag: str = "--out", folders: Sequence[str | os.PathLike | None] = ()) -> Path:
    """``out`` as a Path, if replacing that directory cannot destroy an input
    (:func:`check_not_input`, the rule of every output)."""
    return check_not_input(out, inputs, flag, directory=True, folders=folders)


def make_temp_dir(final: str | os.PathLike, prefix: str | None = None) -> Path:
    """An empty sibling of ``final`` (same filesystem, so a rename moves it into place)."""
    final = Path(final)
    return _create_unique(final.parent, prefix if prefix is not None else temp_prefix(final), os.mkdir)


def replace_dir(tmp: str | os.PathLike, out: str | os.PathLike, aside: str | os.PathLike | None = None) -> None:
    """Move the finished directory ``tmp`` to ``out``: the old ``out`` is renamed to ``aside``
    (default ``.OUT.tmp-old-PID``) first and deleted only once the new one is in place."""
    tmp, out = Path(tmp), Path(out)
    old = None
    if out.exists():
        old = Path(aside) if aside is not None else out.with_name(f"{temp_prefix(out)}old-{os.getpid()}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(out, old)
    os.replace(tmp, out)
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_dir(path: str | os.PathLike, force: bool = False, *, prefix: str | None = None,
               durable: bool = False, error: type[AiaynError] = AiaynError,
               inputs: Sequence[str | os.PathLike] = ()) -> Iterator[Path]:
    """A temporary directory beside ``path`` that becomes ``path`` when the block succeeds.

    An existing non-empty ``path`` is refused unless ``force``, and one that is or holds any
    of ``inputs`` always (:func:`check_empty_dir`, raising ``error``); with ``force``, the
    old directory is replaced only once the new one is complete. Every temporary name starts
    with ``prefix`` (default ``.NAME.tmp-``), the old directory's too while it is moved aside.
    ``durable``: every file and directory is fsynced before the rename.
    """
    path = Path(path)
    prefix = prefix if prefix is not None else temp_prefix(path)
    with output_lock(path, reentrant=True):
        path = check_empty_dir(path, force, error, inputs=inputs)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            failure = environment_failure(exc, path, "nothing was changed")
            if failure is not None:
                raise failure from None
            raise
        if holds_lock(path):
            for stale in {temp_prefix(path), prefix}:
                remove_stale_temporaries(path, stale)
        existed = path.exists()
        tmp = make_temp_dir(path, prefix)
        try:
            yield tmp
            if durable:
                fsync_tree(tmp)
            replace_dir(tmp, path, aside=path.with_name(f"{prefix}old-{os.getpid()}"))
        except BaseException as exc:
            failure = environment_failure(exc, path, _kept(existed), within=tmp)
            if failure is not None and failure is not exc:
                raise failure from None
            raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


# ============================================================================ reading

UTF8_MODES = ("error", "replace", "skip")
# What is removed from a line besides its \n: "both" surrounding whitespace (str.strip:
# \r, Unicode spaces); "eol" only the \r of a \r\n ending; "trailing" trailing whitespace
# (sacreBLEU's command line: str.rstrip).
STRIP_MODES = ("both", "eol", "trailing")
GZIP_MAGIC = b"\x1f\x8b"
# A NUL is valid UTF-8 but no text: a binary file, or a corrupted one. Treated like invalid
# UTF-8 (an error, replaced by U+FFFD, or skipped, as the caller asks).
NUL_REASON = "NUL byte"
BOM = b"\xef\xbb\xbf"


@dataclass
class LineStats:
    """Counters filled while :func:`iter_text_lines` runs."""

    lines: int = 0  # lines read so far (skipped ones included)
    replaced: int = 0  # lines with invalid UTF-8 decoded with U+FFFD


@contextmanager
def open_text_input(path: str | os.PathLike) -> Iterator[tuple[IO[bytes], bool]]:
    """``path`` open for reading bytes, decompressed when it is gzip, and whether it is."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a text file")
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None
    with f:
        try:
            magic = f.peek(2)[:2]  # peek, not read: works on pipes too
        except OSError as exc:
            raise DataError(f"{path}: cannot read ({exc.strerror})") from None
        if path.suffix == ".gz" or magic == GZIP_MAGIC:
            with gzip.GzipFile(fileobj=f, mode="rb") as gz:
                yield gz, True  # type: ignore[misc]
        else:
            yield f, False


# What reading a (possibly gzip) text stream raises on damaged data or a failing disk.
READ_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error, OSError)


def read_error(exc: BaseException, name: str, line: int, compressed: bool) -> DataError:
    """A read failure at ``line`` of ``name`` as one line: corrupt gzip data, or a read error."""
    what = "corrupt gzip data" if compressed else "read error"
    return DataError(f"{name}:{line}: {what} ({exc or type(exc).__name__})")


def _raw_lines(stream: IO[bytes], name: str, compressed: bool) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line without its \\n) for each line; a read error names the line."""
    lineno, offset = 0, 0
    while True:
        try:
            raw = stream.readline()
        except READ_ERRORS as exc:
            raise read_error(exc, name, lineno + 1, compressed) from None
        if not raw:
            return
        lineno += 1
        if lineno == 1 and raw.startswith(BOM):
            raw, offset = raw[len(BOM):], len(BOM)
            if not raw:  # a file holding only a byte-order mark has no lines
                return
        yield offset, raw[:-1] if raw.endswith(b"\n") else raw
        offset += len(raw)


def iter_raw_lines(stream: IO[bytes], name: str = "<stream>", compressed: bool = False) -> Iterator[bytes]:
    """The lines of a byte stream, each without its ``\\n``; a leading byte-order mark dropped."""
    return (raw for _, raw in _raw_lines(stream, name, compressed))


def decode_line(raw: bytes, where: str, lineno: int, on_invalid_utf8: str = "error", *,
                offset: int | None = None, compressed: bool = False, hint: str = "") -> str | None:
    """One line's bytes as text; ``None`` for invalid UTF-8 under ``skip``.

    The error names ``where:lineno``, the byte of the line, and (given the line's ``offset``)
    the byte of the file; ``hint`` says how to go on.
    """
    try:
        if b"\0" in raw:
            raise UnicodeDecodeError("utf-8", raw, raw.index(b"\0"), raw.index(b"\0") + 1, NUL_REASON)
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if on_invalid_utf8 == "replace":
            return raw.decode("utf-8", errors="replace").replace("\0", "\ufffd")
        if on_invalid_utf8 == "skip":
            return None
        if exc.reason == NUL_REASON:
            raise DataError(f"{where}:{lineno}: NUL byte at byte {exc.start} of the line: not a text file?"
                            + (f"; {hint}" if hint else "")) from None
        in_file = ""
        if offset is not None:
            in_file = f" (byte {offset + exc.start} of the {'decompressed ' if compressed else ''}file)"
        raise DataError(f"{where}:{lineno}: invalid UTF-8 at byte {exc.start} of the line{in_file}: "
                        f"{exc.reason}" + (f"; {hint}" if hint else "")) from None


def iter_text_lines(path: str | os.PathLike, on_invalid_utf8: str = "error", *, strip: str = "both",
                    stats: LineStats | None = None, hint: str = "") -> Iterator[str | None]:
    """Each line of a text file as ``strip`` says (see :data:`STRIP_MODES`); ``None`` for a
    line with invalid UTF-8 under ``skip``. ``stats`` counts lines and replaced lines."""
    if on_invalid_utf8 not in UTF8_MODES:
        raise DataError(f"on_invalid_utf8: {on_invalid_utf8!r} is not one of {', '.join(UTF8_MODES)}")
    if strip not in STRIP_MODES:
        raise ValueError(f"strip: {strip!r} is not one of {', '.join(STRIP_MODES)}")
    stats = stats if stats is not None else LineStats()
    with open_text_input(path) as (f, compressed):
        for lineno, (offset, raw) in enumerate(_raw_lines(f, str(path), compressed), 1):
            if strip == "eol" and raw.endswith(b"\r"):
                raw = raw[:-1]
            text: str | None
            try:
                text = raw.decode("utf-8")
                if b"\0" in raw:
                    raise UnicodeDecodeError("utf-8", raw, raw.index(b"\0"), raw.index(b"\0") + 1, NUL_REASON)
            except UnicodeDecodeError:
                text = decode_line(raw, str(path), lineno, on_invalid_utf8, offset=offset,
                                   compressed=compressed, hint=hint)
                if text is not None:
                    stats.replaced += 1
            stats.lines = lineno
            if text is None or strip == "eol":
                yield text
            else:
                yield text.strip() if strip == "both" else text.rstrip()


def read_text_lines(path: str | os.PathLike, on_invalid_utf8: str = "error", *, strip: str = "both",
                    stats: LineStats | None = None, hint: str = "") -> list[str | None]:
    """:func:`iter_text_lines`, read whole (so an error comes before any work on the lines)."""
    return list(iter_text_lines(path, on_invalid_utf8, strip=strip, stats=stats, hint=hint))


def count_lines(path: str | os.PathLike, gzipped: bool = True) -> int | None:
    """Number of lines of a text file (plain or gzip), counted in blocks without decoding: a
    last line without a newline counts, a leading byte-order mark does not. ``gzipped=False``:
    None for a gzip file instead of decompressing it (e.g. only for a progress bar's total)."""
    with open_text_input(path) as (f, compressed):
        if compressed and not gzipped:
            return None
        n, last, first = 0, b"\n", True
        try:
            for block in iter(lambda: f.read(1 << 24), b""):
                if first and block.startswith(BOM):
                    block = block[len(BOM):]
                first = False
                if block:
                    n, last = n + block.count(b"\n"), block[-1:]
        except READ_ERRORS as exc:
            raise read_error(exc, str(path), n + 1, compressed) from None
        return n + (last != b"\n")
