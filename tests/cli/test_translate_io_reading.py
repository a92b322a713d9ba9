"""How `aiayn translate` reads its input (aiayn.cli.translate_io): chunks of a stream that
never wait for a line not yet sent, the reader of pipes across block boundaries, the lines
of a file and their scan, and the identity of the checkpoints a resumed run checks."""

from __future__ import annotations

import gzip
import io
import os
from pathlib import Path

import pytest

from aiayn.cli import translate_io
from aiayn.errors import DataError

# ------------------------------------------------------------------ the stream reader


def test_stream_chunks_end_when_no_further_line_has_arrived() -> None:
    read_fd, write_fd = os.pipe()
    try:
        with os.fdopen(read_fd, "rb", buffering=0) as reader:
            chunks = translate_io.stream_chunks(reader, 10, lambda raw, n: raw.decode())
            os.write(write_fd, b"one\ntwo\nthr")
            assert next(chunks) == ["one", "two"]  # "thr" is not a line yet: no waiting for it
            os.write(write_fd, b"ee\nfour\n")
            assert next(chunks) == ["three", "four"]
            os.write(write_fd, b"".join(b"%d\n" % i for i in range(25)) + b"last")
            os.close(write_fd)
            write_fd = -1
            assert [len(c) for c in chunks] == [10, 10, 6]  # a stream that is ahead fills whole chunks
    finally:
        if write_fd >= 0:
            os.close(write_fd)


def test_stream_chunks_deliver_the_lines_before_a_bad_one() -> None:
    def decode(raw: bytes, n: int) -> str:
        if raw == b"bad":
            raise DataError(f"<stdin>:{n}: bad")
        return raw.decode()

    chunks = translate_io.stream_chunks(io.BytesIO(b"a\nb\nc\nbad\nd\n"), 2, decode)
    assert next(chunks) == ["a", "b"]
    assert next(chunks) == ["c"]
    with pytest.raises(DataError, match="<stdin>:4: bad"):
        next(chunks)


def test_stream_chunks_without_waiting_read_through_the_stream(tmp_path: Path) -> None:
    """``wait=False`` reads the stream's own lines: a gzip file's decompressed text."""
    path = tmp_path / "in.txt.gz"
    path.write_bytes(gzip.compress(b"one\ntwo\nthree\n"))
    with gzip.open(path, "rb") as stream:
        chunks = list(translate_io.stream_chunks(stream, 2, lambda raw, n: raw.decode(), wait=False))
    assert chunks == [["one", "two"], ["three"]]


def test_stream_chunks_read_error_names_stdin_and_the_line() -> None:
    class Failing(io.BytesIO):
        def readline(self, size=-1):
            if self.tell() >= 4:
                raise OSError("device gone")
            return super().readline(size)

    chunks = translate_io.stream_chunks(Failing(b"a\nb\nc\n"), 5, lambda raw, n: raw.decode())
    assert next(chunks) == ["a", "b"]
    with pytest.raises(DataError) as info:
        next(chunks)
    assert str(info.value) == "<stdin>:3: read error (device gone)"


# ------------------------------------------------- the stream reader: block boundaries


def _pipe_reader() -> tuple[translate_io._WaitingReader, int]:
    read_fd, write_fd = os.pipe()
    reader = translate_io._WaitingReader(read_fd)
    return reader, write_fd


def test_waiting_reader_a_block_that_starts_with_a_newline() -> None:
    reader, write_fd = _pipe_reader()
    try:
        os.write(write_fd, b"\n")
        assert reader.line_waiting()  # an empty line is a whole line
        os.write(write_fd, b"x\n")  # arrives after the empty line was seen, in a block of its own
        assert reader.readline() == b"\n"
        assert reader.readline() == b"x\n"
        os.close(write_fd)
        write_fd = -1
        assert reader.line_waiting()  # the end of the input
        assert reader.readline() == b""
    finally:
        os.close(reader.fd)
        if write_fd >= 0:
            os.close(write_fd)


def test_waiting_reader_a_first_block_that_starts_with_a_newline() -> None:
    reader, write_fd = _pipe_reader()
    try:
        os.write(write_fd, b"\nx\ny")
        os.close(write_fd)
        assert [reader.readline() for _ in range(4)] == [b"\n", b"x\n", b"y", b""]
    finally:
        os.close(reader.fd)


def test_waiting_reader_only_polls(monkeypatch) -> None:
    """Telling whether a line is waiting never waits: every select has a zero timeout."""
    timeouts = []
    select = translate_io.select.select

    def spy(rlist, wlist, xlist, timeout=None):
        timeouts.append(timeout)
        return select(rlist, wlist, xlist, 0)  # a wait asked for is recorded, never made

    monkeypatch.setattr(translate_io.select, "select", spy)
    read_fd, write_fd = os.pipe()
    try:
        with os.fdopen(read_fd, "rb", buffering=0) as stream:
            reader = translate_io._WaitingReader.wrap(stream)
            assert reader is not None
            assert not reader.line_waiting()
            os.write(write_fd, b"a")
            assert not reader.line_waiting()  # a line's start, not yet a line
            os.write(write_fd, b"b\n")
            assert reader.line_waiting()
            assert reader.readline() == b"ab\n"
    finally:
        os.close(write_fd)
    assert len(timeouts) >= 4 and set(timeouts) == {0}


# ------------------------------------------------------------------ reading the input


def test_text_lines_keep_spaces_and_drop_only_the_line_end(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(b"  a b  \r\n\tc\t\n \n")
    assert list(translate_io.text_lines(path, "error")) == ["  a b  ", "\tc\t", " "]


def _bad_utf8_file(tmp_path: Path) -> Path:
    path = tmp_path / "in.txt"
    path.write_bytes(b"one\nt\xffo\n")
    return path


def test_text_lines_error_names_the_line_and_the_hint(tmp_path: Path) -> None:
    path = _bad_utf8_file(tmp_path)
    where = f"{path}:2: invalid UTF-8 at byte 1 of the line (byte 5 of the file): invalid start byte"
    with pytest.raises(DataError) as info:
        list(translate_io.text_lines(path, "error"))
    assert str(info.value) == where
    with pytest.raises(DataError) as info:
        list(translate_io.text_lines(path, "error", "use --on-invalid-utf8 replace"))
    assert str(info.value) == f"{where}; use --on-invalid-utf8 replace"
    assert list(translate_io.text_lines(path, "replace")) == ["one", "t\ufffdo"]


def test_scan_text_file_error_names_the_line_and_the_hint(tmp_path: Path) -> None:
    path = _bad_utf8_file(tmp_path)
    where = f"{path}:2: invalid UTF-8 at byte 1 of the line (byte 5 of the file): invalid start byte"
    with pytest.raises(DataError) as info:
        translate_io.scan_text_file(path, "error")
    assert str(info.value) == where
    with pytest.raises(DataError) as info:
        translate_io.scan_text_file(path, "error", hint="use --on-invalid-utf8 replace")
    assert str(info.value) == f"{where}; use --on-invalid-utf8 replace"


def test_scan_text_file_counts_and_hashes_the_decoded_lines(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "in.txt"
    path.write_bytes(b"caf\xc3\xa9\r\nt\xffo\nlast")
    scan = translate_io.scan_text_file(path, "replace")
    assert scan == translate_io.TextScan(3, hashlib.sha256("caf\u00e9\nt\ufffdo\nlast\n".encode()).hexdigest())


def test_scan_text_file_checks_ten_thousand_lines_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(b"x\n" * 10_001)
    seen: list[tuple[int, int]] = []
    scan = translate_io.scan_text_file(path, "error", check=lambda chunk, first: seen.append((len(chunk), first)))
    assert scan.lines == 10_001 and seen == [(10_000, 1), (1, 10_001)]
    seen.clear()
    translate_io.scan_text_file(path, "error", size=4_000, check=lambda chunk, first: seen.append((len(chunk), first)))
    assert seen == [(4_000, 1), (4_000, 4_001), (2_001, 8_001)]


def test_checkpoint_identity_of_a_directory_without_manifest(tmp_path: Path) -> None:
    from aiayn.errors import CheckpointError

    with pytest.raises(CheckpointError) as info:
        translate_io.checkpoint_identity([tmp_path / "missing"])
    assert str(info.value) == f"{tmp_path / 'missing'}: cannot read checksums.sha256 (No such file or directory)"
