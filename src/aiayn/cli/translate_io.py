"""`aiayn translate`'s files: any size in bounded memory, chunks in, chunks out.

The input is read ``size`` lines at a time (:func:`chunked`, :func:`stream_chunks`); each
chunk is translated as batches (sorted by length within the chunk) and its outputs are
written in input order before the next chunk is read, like Marian's maxi-batches and
CTranslate2's ``translate_file``. Memory holds one chunk, whatever the file's size.

A file output goes through :class:`PartialOutput`: ``OUTPUT.partial`` receives each chunk
(flushed and fsynced) and becomes ``OUTPUT`` by a rename once every line is there, so
``OUTPUT`` is never partly written. A run that stops early can leave ``OUTPUT.partial``
with the finished chunks and ``OUTPUT.partial.json`` saying how many lines and bytes of it
count and what produced them; a later run with ``resume`` continues it only when that
description matches its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import select
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar, cast

from aiayn import fileio
from aiayn.errors import AiaynError, CheckpointError, DataError

T = TypeVar("T")

PARTIAL_SUFFIX = ".partial"
STATE_SUFFIX = ".json"
_READ_SIZE = 1 << 16


# ---------------------------------------------------------------------------- input


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of ``size`` items (the last one shorter)."""
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def text_lines(path: str | os.PathLike, on_invalid_utf8: str, hint: str = "") -> Iterator[str]:
    """The lines of a text file (plain or gzip) through the project's reader, each without
    its ``\\n`` or the ``\\r`` of a ``\\r\\n``; invalid UTF-8 is an error naming the line
    (``error``) or decoded with U+FFFD (``replace``)."""
    for line in fileio.iter_text_lines(path, on_invalid_utf8, strip="eol", hint=hint):
        if line is not None:  # None only under "skip"
            yield line


@dataclass
class TextScan:
    """What one pass over a text file found: its number of lines and the SHA-256 of its
    text (each line as decoded, UTF-8, followed by ``\\n``)."""

    lines: int
    sha256: str


def scan_text_file(path: str | os.PathLike, on_invalid_utf8: str, *, hint: str = "", size: int = 10_000,
                   check: Callable[[list[str], int], None] | None = None) -> TextScan:
    """Read a file once before any work: decoding errors surface here, and ``check(chunk,
    first_line_number)`` sees every line, ``size`` lines at a time (memory stays bounded)."""
    digest = hashlib.sha256()
    n = 0
    for chunk in chunked(text_lines(path, on_invalid_utf8, hint), size):
        for line in chunk:
            digest.update(line.encode("utf-8"))
            digest.update(b"\n")
        if check is not None:
            check(chunk, n + 1)
        n += len(chunk)
    return TextScan(n, digest.hexdigest())


class _WaitingReader:
    """``readline`` over a file descriptor that can also tell whether a whole line (or the
    end of the input) can be read without waiting for the writer."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""  # the last block read; lines start at pos
        self.pos = 0
        self.pending: list[bytes] = []  # earlier blocks' ends, without a newline: a long line's start
        self.eof = False

    @classmethod
    def wrap(cls, stream: IO[bytes]) -> _WaitingReader | None:
        """A reader of ``stream``'s descriptor; None where there is none or ``select`` cannot
        watch it (a BytesIO, a pipe on Windows). ``stream`` must not have buffered anything."""
        try:
            fd = stream.fileno()
            select.select([fd], [], [], 0)
        except (AttributeError, OSError, ValueError):
            return None
        return cls(fd)

    def _fill(self) -> None:
        data = os.read(self.fd, _READ_SIZE)
        if not data:
            self.eof = True
            return
        if self.pos < len(self.buf):
            self.pending.append(self.buf[self.pos:])
        self.buf, self.pos = data, 0

    def line_waiting(self) -> bool:
        while not self.eof and self.buf.find(b"\n", self.pos) < 0:
            if not select.select([self.fd], [], [], 0)[0]:
                return False
            self._fill()
        return True

    def readline(self) -> bytes:
        while (end := self.buf.find(b"\n", self.pos)) < 0 and not self.eof:
            self._fill()
        end = end + 1 if end >= 0 else len(self.buf)
        line, self.pos = self.buf[self.pos:end], end
        if self.pending:
            line = b"".join([*self.pending, line])
            self.pending.clear()
        return line


def stream_chunks(stream: IO[bytes], size: int, decode: Callable[[bytes, int], str], *,
                  name: str = "<stdin>", wait: bool = True) -> Iterator[list[str]]:
    """Chunks of at most ``size`` decoded lines of a byte stream read once (standard input, a
    pipe). With ``wait``, a chunk also ends when no further line has arrived yet, so a
    program writing one line and waiting for its translation gets it at once, while a
    stream that is ahead (a file, a fast pipe) fills whole chunks.

    ``decode(raw line, line number)`` raises :class:`DataError` for a bad line: the lines
    before it are yielded as a chunk first, then the error is raised.
    """
    waiting = _WaitingReader.wrap(stream) if wait else None
    lines = fileio.iter_raw_lines(cast("IO[bytes]", waiting) if waiting is not None else stream, name)
    chunk: list[str] = []
    try:
        for n, raw in enumerate(lines, 1):
            chunk.append(decode(raw, n))
            if len(chunk) >= size or (waiting is not None and not waiting.line_waiting()):
                yield chunk
                chunk = []
    except DataError:
        if chunk:
            yield chunk
        raise
    if chunk:
        yield chunk


# --------------------------------------------------------------------------- output


def checkpoint_identity(directories: Sequence[str | os.PathLike]) -> list[str]:
    """Per checkpoint directory, the SHA-256 of its checksum manifest (which lists the
    SHA-256 of its weights, configuration and tokenizer): the same checkpoint gives the same
    value wherever it lies and whatever pointer named it."""
    from aiayn.checkpoint.layout import MANIFEST_FILE

    out = []
    for d in directories:
        try:
            out.append(hashlib.sha256((Path(d) / MANIFEST_FILE).read_bytes()).hexdigest())
        except OSError as exc:
            raise CheckpointError(f"{d}: cannot read {MANIFEST_FILE} ({exc.strerror or exc})") from None
    return out


class PartialOutput:
    """``path`` written chunk by chunk through ``path.partial``, renamed to ``path`` by
    :meth:`finish`.

    ``identity``: a flat JSON-able description of everything the output depends on (input
    text, checkpoint, options); with it, each chunk also updates ``path.partial.json``
    (``{"identity", "lines", "bytes"}``), so that a later run can ``resume``: it continues
    after the recorded lines when the identities are equal, and refuses otherwise, naming
    what differs. Without ``resume``, whatever an earlier run left is replaced
    (:attr:`replaced` says so). Bytes after the recorded ones (a chunk cut short by a kill)
    are dropped on resuming.
    """

    def __init__(self, path: Path, identity: dict[str, Any] | None = None, resume: bool = False,
                 flag: str = "--output") -> None:
        self.path = path
        self.partial = path.with_name(path.name + PARTIAL_SUFFIX)
        self.state = self.partial.with_name(self.partial.name + STATE_SUFFIX)
        self.identity = identity
        self.flag = flag
        self.lines = 0  # finished lines in the file (resumed ones included)
        self.bytes = 0
        self.replaced = False
        self._lock = contextlib.ExitStack()  # the output's lock (fileio.output_lock), held until the end
        self._lock.enter_context(fileio.output_lock(path, flag=f"{flag} "))
        for left in (path, self.state):  # a killed run's temporaries: removable while the lock is held
            fileio.remove_stale_temporaries(left)
        try:
            self._f = self._open()
        except BaseException:
            self._lock.close()
            raise
        try:
            if resume:
                self._resume()
            else:
                self.replaced = os.fstat(self._f.fileno()).st_size > 0 or self.state.exists()
                self._f.truncate(0)
            self._save_state()
        except BaseException:
            self._close()
            raise

    def _open(self) -> IO[bytes]:
        # Opened once the output's lock is held, not before: it could be another run's file.
        try:
            fd = os.open(self.partial, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            failure = fileio.environment_failure(exc, self.partial, f"{self.path} is unchanged")
            if failure is not None:
                raise failure from None
            raise AiaynError(f"{self.flag} {self.path}: cannot write {self.partial} ({exc.strerror or exc})") from None
        return os.fdopen(fd, "r+b")

    def _close(self) -> None:
        try:
            self._f.close()
        finally:
            self._lock.close()

    def _read_state(self) -> dict[str, Any] | None:
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(self.state.read_text(encoding="utf-8"))
            if isinstance(state, dict) and isinstance(state.get("identity"), dict) \
                    and isinstance(state.get("lines"), int) and isinstance(state.get("bytes"), int):
                return state
        return None

    def _resume(self) -> None:
        if self.identity is None:
            raise ValueError("resume needs an identity")
        size = os.fstat(self._f.fileno()).st_size
        state = self._read_state()
        if state is None:
            if size:
                raise AiaynError(f"--resume: {self.partial} has no readable {self.state.name}, so what it holds "
                                 "is unknown; delete it to start again")
            return
        saved: dict[str, Any] = state["identity"]
        differs = [k for k in sorted(set(saved) | set(self.identity)) if saved.get(k) != self.identity.get(k)]
        if differs:
            raise AiaynError(f"--resume: {self.partial} was written with another {', '.join(differs)}; rerun "
                             f"with the options it was started with, or delete it to start again")
        if size < state["bytes"]:
            raise AiaynError(f"--resume: {self.partial} has {size} bytes, {self.state.name} counts "
                             f"{state['bytes']}; delete both to start again")
        self._f.truncate(state["bytes"])
        self._f.seek(state["bytes"])
        self.lines, self.bytes = state["lines"], state["bytes"]

    def _save_state(self) -> None:
        if self.identity is not None:
            state = {"identity": self.identity, "lines": self.lines, "bytes": self.bytes}
            fileio.write_atomic(self.state, json.dumps(state, indent=1, sort_keys=True) + "\n", durable=False)

    def write(self, data: bytes, lines: int) -> None:
        """Append one finished chunk of ``lines`` lines; it counts once it is on disk."""
        self._f.write(data)
        self._f.flush()
        os.fsync(self._f.fileno())  # before the state says it is there
        self.lines += lines
        self.bytes += len(data)
        self._save_state()

    def finish(self) -> None:
        """Every line is written: the file takes its final name."""
        os.replace(self.partial, self.path)  # still locked: no other run can reopen it meanwhile
        self.state.unlink(missing_ok=True)
        self._close()

    def abort(self) -> bool:
        """The run failed. Keep what can be resumed (an identity, and at least one finished
        chunk) and say so with True; otherwise remove the files."""
        keep = self.identity is not None and self.lines > 0
        if not keep:
            self.partial.unlink(missing_ok=True)
            self.state.unlink(missing_ok=True)
        self._close()
        return keep


__all__ = ["PARTIAL_SUFFIX", "STATE_SUFFIX", "PartialOutput", "TextScan", "checkpoint_identity", "chunked",
           "scan_text_file", "stream_chunks", "text_lines"]
