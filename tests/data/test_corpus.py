"""Reading parallel text: formats, and one test per bad input (file + line in the message)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from aiayn.data.corpus import (
    FilterConfig,
    count_lines,
    drop_reason,
    iter_lines,
    read_parallel,
)
from aiayn.errors import AiaynError, DataError


def write(path: Path, data: bytes, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_reads_plain_and_gzip(tmp_path: Path, gz: bool) -> None:
    suffix = ".gz" if gz else ""
    src = write(tmp_path / f"a.en{suffix}", b"\xef\xbb\xbfHello world \r\n  two\n\nlast", gz)
    tgt = write(tmp_path / f"a.de{suffix}", "Hallo Welt\nzwei\u2028zusammen\n\nletzte\n".encode(), gz)
    corpus = read_parallel(src, tgt)
    # BOM, \r and outer whitespace stripped; U+2028 does not split a line; no trailing \n needed.
    assert corpus.pairs == [("Hello world", "Hallo Welt"), ("two", "zwei\u2028zusammen"), ("", ""),
                            ("last", "letzte")]
    assert count_lines(src) == 4


def test_gzip_detected_by_magic_bytes(tmp_path: Path) -> None:
    path = write(tmp_path / "noext", b"one\ntwo\n", gz=True)
    assert list(iter_lines(path)) == ["one", "two"]


def test_tsv(tmp_path: Path) -> None:
    path = write(tmp_path / "pairs.tsv", b"a b\tx y\r\nc\td\n\tonly target\n")
    assert read_parallel(path).pairs == [("a b", "x y"), ("c", "d"), ("", "only target")]


def test_missing_file(tmp_path: Path) -> None:
    src = write(tmp_path / "a.en", b"x\n")
    with pytest.raises(DataError, match=r"b\.de: file not found"):
        read_parallel(src, tmp_path / "b.de")
    with pytest.raises(DataError, match="is a directory"):
        read_parallel(tmp_path, src)


def test_unequal_line_counts_name_both_files_and_counts(tmp_path: Path) -> None:
    src = write(tmp_path / "a.en", b"1\n2\n3\n")
    tgt = write(tmp_path / "a.de", b"1\n2\n3\n4\n5\n")
    with pytest.raises(DataError) as err:
        read_parallel(src, tgt)
    msg = str(err.value)
    assert f"{src} has 3 lines" in msg and f"{tgt} has 5 lines" in msg
    with pytest.raises(DataError, match=r"a\.de has 5 lines, .*a\.en has 3 lines"):
        read_parallel(tgt, src)


def test_invalid_utf8_error_names_file_line_and_byte(tmp_path: Path) -> None:
    src = write(tmp_path / "a.en", b"fine\nbad \xff here\n")
    tgt = write(tmp_path / "a.de", b"gut\nschlecht\n")
    with pytest.raises(DataError) as err:
        read_parallel(src, tgt)
    msg = str(err.value)
    assert f"{src}:2:" in msg and "byte 4 of the line" in msg and "byte 9 of the file" in msg
    assert isinstance(err.value, AiaynError)


def test_invalid_utf8_in_gzip_reports_decompressed_offset(tmp_path: Path) -> None:
    src = write(tmp_path / "a.en.gz", b"ok\nok\n\xc3(\n", gz=True)
    with pytest.raises(DataError, match=r"a\.en\.gz:3: invalid UTF-8 at byte 0 .*byte 6 of the decompressed"):
        list(iter_lines(src))


def test_invalid_utf8_replace_and_skip(tmp_path: Path) -> None:
    src = write(tmp_path / "a.en", b"fine\nbad \xff here\nthird\n")
    tgt = write(tmp_path / "a.de", b"gut\nschlecht\ndritte\n")
    replaced = read_parallel(src, tgt, on_invalid_utf8="replace")
    assert replaced.pairs[1] == ("bad \ufffd here", "schlecht") and replaced.replaced == 1
    skipped = read_parallel(src, tgt, on_invalid_utf8="skip")
    assert skipped.pairs == [("fine", "gut"), ("third", "dritte")]
    assert skipped.dropped == {"invalid_utf8": 1}
    # Evaluation data is never filtered: skip falls back to replace.
    kept = read_parallel(src, tgt, on_invalid_utf8="skip", drop_invalid=False)
    assert len(kept) == 3 and kept.dropped == {}


def test_corrupt_gzip(tmp_path: Path) -> None:
    data = gzip.compress(b"".join(b"line %d\n" % i for i in range(20000)))
    truncated = write(tmp_path / "t.en.gz", data[: len(data) // 2])
    with pytest.raises(DataError, match=r"t\.en\.gz:\d+: corrupt gzip data"):
        list(iter_lines(truncated))
    garbage = write(tmp_path / "g.en.gz", b"this is not gzip at all\n")
    with pytest.raises(DataError, match=r"g\.en\.gz:1: corrupt gzip data"):
        list(iter_lines(garbage))
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    bad = write(tmp_path / "f.en.gz", bytes(flipped))
    with pytest.raises(DataError, match=r"f\.en\.gz:\d+: corrupt gzip data"):
        list(iter_lines(bad))


def test_tsv_line_without_two_columns(tmp_path: Path) -> None:
    path = write(tmp_path / "pairs.tsv", b"a\tb\nonly one column\nc\td\n")
    with pytest.raises(DataError, match=r"pairs\.tsv:2: expected 2 tab-separated columns .* found 1"):
        read_parallel(path)
    path = write(tmp_path / "three.tsv", b"a\tb\tc\n")
    with pytest.raises(DataError, match=r"three\.tsv:1: .*found 3"):
        read_parallel(path)


def test_unknown_utf8_mode(tmp_path: Path) -> None:
    path = write(tmp_path / "a", b"x\n")
    with pytest.raises(DataError, match="on_invalid_utf8"):
        list(iter_lines(path, on_invalid_utf8="ignore"))


def test_drop_reasons() -> None:
    f = FilterConfig(max_len=10, max_len_ratio=3.0)
    assert drop_reason(0, 5, f) == "empty" and drop_reason(5, 0, f) == "empty"
    assert drop_reason(11, 10, f) == "too_long" and drop_reason(4, 11, f) == "too_long"
    assert drop_reason(2, 7, f) == "ratio" and drop_reason(7, 2, f) == "ratio"
    assert drop_reason(2, 6, f) is None and drop_reason(10, 10, f) is None
    # Defaults: paper-scale limits that keep ordinary sentences.
    assert drop_reason(52, 48, FilterConfig()) is None and drop_reason(16, 3, FilterConfig()) is None
