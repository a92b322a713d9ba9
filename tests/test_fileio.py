"""aiayn.fileio: atomic writes (files, groups of files, directories) and the one text-line reader."""

from __future__ import annotations

import gzip
import io
import os
import stat
from pathlib import Path

import pytest

from aiayn.errors import AiaynError, DataError
from aiayn.fileio import (
    LineStats,
    atomic_dir,
    atomic_file,
    atomic_path,
    check_empty_dir,
    count_lines,
    decode_line,
    iter_raw_lines,
    iter_text_lines,
    read_text_lines,
    replace_dir,
    write_all_atomic,
    write_atomic,
)


class Boom(Exception):
    pass


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# ============================================================================ writing


def test_atomic_file_writes_text_and_bytes(tmp_path: Path) -> None:
    with atomic_file(tmp_path / "a.txt") as f:
        f.write("héllo\nworld\n")
    assert (tmp_path / "a.txt").read_bytes() == "héllo\nworld\n".encode()
    with atomic_file(tmp_path / "b.bin", "wb", durable=False) as f:
        f.write(b"\x00\xff")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff"
    assert _names(tmp_path) == ["a.txt", "b.bin"]
    with pytest.raises(ValueError, match="mode 'a'"):
        with atomic_file(tmp_path / "c", "a"):
            pass


def test_atomic_file_failure_leaves_the_old_content_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old\n")
    with pytest.raises(Boom):
        with atomic_file(target) as f:
            f.write("new, half written")
            assert len(_names(tmp_path)) == 2  # the temporary lies beside the target meanwhile
            raise Boom
    assert target.read_text() == "old\n"
    assert _names(tmp_path) == ["out.txt"]
    # Also when there was nothing before: nothing after.
    with pytest.raises(Boom):
        with atomic_file(tmp_path / "new.txt"):
            raise Boom
    assert _names(tmp_path) == ["out.txt"]


def test_atomic_file_permissions_like_open(tmp_path: Path) -> None:
    old_umask = os.umask(0o027)
    try:
        with open(tmp_path / "plain", "w") as f:
            f.write("x")
        write_atomic(tmp_path / "atomic", "x")
        with atomic_path(tmp_path / "by_path") as tmp:
            tmp.write_text("x")
    finally:
        os.umask(old_umask)
    assert _mode(tmp_path / "plain") == 0o640
    assert _mode(tmp_path / "atomic") == _mode(tmp_path / "plain")
    assert _mode(tmp_path / "by_path") == _mode(tmp_path / "plain")


def test_write_atomic_replaces_and_names_temporaries_with_the_prefix(tmp_path: Path) -> None:
    target = tmp_path / "last"
    write_atomic(target, "step_000001\n")
    seen: list[str] = []
    with atomic_file(target, prefix=".tmp-last-") as f:
        seen = [n for n in _names(tmp_path) if n != "last"]
        f.write("step_000002\n")
    assert len(seen) == 1 and seen[0].startswith(".tmp-last-")
    assert target.read_text() == "step_000002\n"
    write_atomic(target, b"bytes\r\n")
    assert target.read_bytes() == b"bytes\r\n"
    assert _names(tmp_path) == ["last"]


def test_atomic_path_takes_any_writer_and_a_failed_check_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "archive.tgz"
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.is_file() and tmp.read_bytes() == b""
        tmp.write_bytes(b"verified")
    assert target.read_bytes() == b"verified"
    with pytest.raises(Boom):
        with atomic_path(target, durable=False) as tmp:
            tmp.write_bytes(b"corrupt download")
            raise Boom  # e.g. a checksum mismatch
    assert target.read_bytes() == b"verified"
    assert _names(tmp_path) == ["archive.tgz"]


def test_write_all_atomic_renames_only_once_every_file_is_written(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    write_all_atomic({a: "a1\n", b: b"b1\n"})
    assert (a.read_text(), b.read_text()) == ("a1\n", "b1\n")
    # The third file cannot be written (no such directory): the first two stay as they were.
    with pytest.raises(AiaynError, match="missing: cannot write there"):
        write_all_atomic({a: "a2\n", b: "b2\n", tmp_path / "missing" / "c.txt": "c2\n"}, durable=False)
    assert (a.read_text(), b.read_text()) == ("a1\n", "b1\n")
    assert _names(tmp_path) == ["a.txt", "b.txt"]


def test_atomic_dir_creates_replaces_and_refuses(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "export"
    with atomic_dir(out) as tmp:
        assert tmp.parent == out.parent and tmp.name.startswith(".export.tmp-")
        (tmp / "model.bin").write_bytes(b"v1")
    assert _names(out) == ["model.bin"]
    with pytest.raises(AiaynError, match=r"export: directory exists and is not empty \(use --force"):
        with atomic_dir(out):
            pass

    class ExportError(AiaynError):
        pass

    with pytest.raises(ExportError, match="not empty"):
        with atomic_dir(out, error=ExportError):
            pass
    with atomic_dir(out, force=True, durable=True) as tmp:
        (tmp / "nested").mkdir()
        (tmp / "nested" / "weights").write_bytes(b"v2")
    assert _names(out) == ["nested"] and (out / "nested" / "weights").read_bytes() == b"v2"
    assert _names(out.parent) == ["export"]  # neither the temporary nor the old one left
    (tmp_path / "file").write_text("x")
    with pytest.raises(AiaynError, match="exists and is not a directory"):
        check_empty_dir(tmp_path / "file", force=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert check_empty_dir(empty) == empty


def test_atomic_dir_failure_leaves_the_old_directory_and_no_temporary(tmp_path: Path) -> None:
    out = tmp_path / "prepared"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    with pytest.raises(Boom):
        with atomic_dir(out, force=True) as tmp:
            (tmp / "summary.json").write_text('{"new": 1}')
            raise Boom
    assert _names(tmp_path) == ["prepared"] and (out / "summary.json").read_text() == "{}"


def test_atomic_dir_prefix_names_the_temporary_and_the_old_directory(tmp_path: Path) -> None:
    out = tmp_path / "step_000006"
    out.mkdir()
    (out / "old").write_text("x")
    with atomic_dir(out, force=True, prefix=".tmp-step_000006-") as tmp:
        assert tmp.name.startswith(".tmp-step_000006-")
        (tmp / "new").write_text("y")
    assert _names(tmp_path) == ["step_000006"] and _names(out) == ["new"]
    aside = tmp_path / "aside"
    replacement = tmp_path / "replacement"
    replacement.mkdir()
    replace_dir(replacement, out, aside=aside)
    assert _names(tmp_path) == ["step_000006"] and _names(out) == []


def test_atomic_dir_permissions_like_mkdir(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)
    try:
        (tmp_path / "plain").mkdir()
        with atomic_dir(tmp_path / "atomic"):
            pass
    finally:
        os.umask(old_umask)
    assert _mode(tmp_path / "atomic") == _mode(tmp_path / "plain") == 0o755


# ============================================================================ reading


def _write(path: Path, data: bytes, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


TRICKY = b"\xef\xbb\xbf  first \r\n\tsecond\t\nthird\x0cstill \xe2\x80\xa8 third\r\n\nlast"


def test_strip_modes(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.txt", TRICKY)
    # "both": surrounding whitespace (\r, tabs, spaces); only \n ends a line (not \x0c, U+2028).
    assert read_text_lines(path) == ["first", "second", "third\x0cstill \u2028 third", "", "last"]
    # "eol": only the line ending, \r\n or \n.
    assert read_text_lines(path, strip="eol") == ["  first ", "\tsecond\t", "third\x0cstill \u2028 third", "",
                                                   "last"]
    # "trailing": sacreBLEU's rstrip.
    assert read_text_lines(path, strip="trailing") == ["  first", "\tsecond", "third\x0cstill \u2028 third", "",
                                                        "last"]
    with pytest.raises(ValueError, match="strip"):
        read_text_lines(path, strip="all")


@pytest.mark.parametrize("name, gz", [("t.txt.gz", True), ("no_suffix", True), ("t.txt", False)])
def test_gzip_by_suffix_or_magic_and_final_line_without_newline(tmp_path: Path, name: str, gz: bool) -> None:
    path = _write(tmp_path / name, b"\xef\xbb\xbfone\ntwo\r\nthree", gz)
    stats = LineStats()
    assert list(iter_text_lines(path, stats=stats)) == ["one", "two", "three"]
    assert (stats.lines, stats.replaced) == (3, 0)
    assert count_lines(path) == 3


def test_empty_file_and_single_newline(tmp_path: Path) -> None:
    assert read_text_lines(_write(tmp_path / "empty", b"")) == []
    assert count_lines(tmp_path / "empty") == 0
    assert read_text_lines(_write(tmp_path / "nl", b"\n")) == [""]
    # A byte-order mark alone (an "empty" file as some editors save it) is an empty file.
    assert read_text_lines(_write(tmp_path / "bom", b"\xef\xbb\xbf")) == []
    assert count_lines(tmp_path / "bom") == 0
    assert read_text_lines(_write(tmp_path / "empty.gz", b"", gz=True)) == []


def test_invalid_utf8_error_names_path_line_and_bytes(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad.txt", b"\xef\xbb\xbffine\nbad \xff here\nok\n")
    with pytest.raises(DataError) as err:
        read_text_lines(path, hint="use --on-invalid-utf8 replace")
    # Line 2 starts at byte 8 of the file (3 BOM + 5), the bad byte is its 5th.
    assert str(err.value) == (f"{path}:2: invalid UTF-8 at byte 4 of the line (byte 12 of the file): "
                              "invalid start byte; use --on-invalid-utf8 replace")
    gz = _write(tmp_path / "bad.gz", b"ok\nok\n\xc3(\n", gz=True)
    with pytest.raises(DataError, match=r"bad\.gz:3: invalid UTF-8 at byte 0 of the line "
                                        r"\(byte 6 of the decompressed file\)"):
        read_text_lines(gz)


def test_invalid_utf8_replace_and_skip_count_lines(tmp_path: Path) -> None:
    # A literal U+FFFD in valid text is not a replacement.
    path = _write(tmp_path / "bad.txt", "fine \ufffd\n".encode() + b"bad \xff here\r\nthird")
    stats = LineStats()
    assert read_text_lines(path, "replace", stats=stats) == ["fine \ufffd", "bad \ufffd here", "third"]
    assert (stats.lines, stats.replaced) == (3, 1)
    stats = LineStats()
    assert read_text_lines(path, "skip", stats=stats) == ["fine \ufffd", None, "third"]
    assert (stats.lines, stats.replaced) == (3, 0)
    with pytest.raises(DataError, match="on_invalid_utf8: 'ignore' is not one of error, replace, skip"):
        read_text_lines(path, "ignore")


def test_missing_directory_and_corrupt_gzip(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.txt: file not found"):
        read_text_lines(tmp_path / "nope.txt")
    with pytest.raises(DataError, match="is a directory, expected a text file"):
        read_text_lines(tmp_path)
    data = gzip.compress(b"".join(b"line %d\n" % i for i in range(20000)))
    truncated = _write(tmp_path / "t.gz", data[: len(data) // 2])
    with pytest.raises(DataError, match=r"t\.gz:\d+: corrupt gzip data"):
        read_text_lines(truncated)
    with pytest.raises(DataError, match=r"t\.gz:\d+: corrupt gzip data"):
        count_lines(truncated)
    with pytest.raises(DataError, match=r"g\.gz:1: corrupt gzip data"):
        read_text_lines(_write(tmp_path / "g.gz", b"not gzip\n"))


def test_raw_lines_of_a_stream_and_decode_line() -> None:
    stream = io.BytesIO(b"\xef\xbb\xbfa\r\nb\n\nc")
    assert list(iter_raw_lines(stream)) == [b"a\r", b"b", b"", b"c"]
    assert decode_line(b"caf\xc3\xa9", "<stdin>", 1) == "café"
    assert decode_line(b"x\xff", "<stdin>", 7, "replace") == "x\ufffd"
    assert decode_line(b"x\xff", "<stdin>", 7, "skip") is None
    with pytest.raises(DataError) as err:
        decode_line(b"x\xff", "<stdin>", 7, hint="try replace")
    assert str(err.value) == "<stdin>:7: invalid UTF-8 at byte 1 of the line: invalid start byte; try replace"


def test_an_unwritable_folder_is_one_user_error_naming_it() -> None:
    """Regression: `prepare --out /proc/x` ended in a FileNotFoundError traceback."""
    with pytest.raises(AiaynError, match=r"^/proc: cannot write there"):
        with atomic_dir("/proc/aiayn-test-output"):
            pass
    with pytest.raises(AiaynError, match=r"^/proc: cannot write there"):
        write_atomic("/proc/aiayn-test-output", "x")


# ---------------------------------------------------------------------- faults


def test_a_full_disk_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    import errno

    from aiayn.errors import EnvironmentFailure
    from aiayn.fileio import atomic_file

    out = tmp_path / "out.txt"
    out.write_text("old\n", encoding="utf-8")
    with pytest.raises(EnvironmentFailure) as exc, atomic_file(out) as f:
        f.write("new")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(exc.value) == f"no space left on device writing {out}; the previous contents are unchanged"
    assert exc.value.exit_code == 1
    assert out.read_text(encoding="utf-8") == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_disk_errno_reads_other_libraries_errors() -> None:
    import errno

    from aiayn.fileio import disk_errno

    assert disk_errno(OSError(errno.EDQUOT, "Disk quota exceeded")) == errno.EDQUOT
    assert disk_errno(RuntimeError('IoError(Os { code: 30, kind: ReadOnlyFilesystem, message: "x" })')) == errno.EROFS
    assert disk_errno(RuntimeError("write failed: No space left on device")) == errno.ENOSPC
    assert disk_errno(OSError(errno.ENOENT, "No such file")) is None
    assert disk_errno(ValueError("model.bin: unexpected end of file")) is None
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert disk_errno(outer) == errno.ENOSPC


def test_an_output_lock_is_held_once_and_leaves_nothing(tmp_path: Path) -> None:
    pytest.importorskip("fcntl", reason="platform: no fcntl (not POSIX)")
    from aiayn.errors import AiaynError
    from aiayn.fileio import output_lock, set_command

    out = tmp_path / "out"
    set_command("aiayn first")
    with output_lock(out):
        assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock"]
        with output_lock(out, reentrant=True):  # the same writer, one level down
            pass
        with pytest.raises(AiaynError, match=r"out: is being written by another run \(pid \d+: aiayn first\)"):
            with output_lock(out):
                pass
    assert list(tmp_path.iterdir()) == []
    with output_lock(out):  # free again
        pass


def test_a_removal_cut_short_leaves_a_temporary_the_next_writer_removes(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from aiayn import fileio

    victim = tmp_path / "step_000001"
    victim.mkdir()
    (victim / "model.safetensors").write_bytes(b"w")

    def killed(path: object, *args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # as a kill during the deletion

    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        fileio.remove_dir(victim)
    monkeypatch.undo()
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".step_000001.tmp-del-")  # never a half-deleted step_000001
    with fileio.atomic_dir(victim) as tmp:
        (tmp / "model.safetensors").write_bytes(b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001"]


def test_input_referents_follow_pointers_and_links(tmp_path: Path) -> None:
    from aiayn.fileio import input_referents

    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "last").write_text("step_000002\n", encoding="utf-8")
    link = tmp_path / "link"
    link.symlink_to(run)
    step = (run / "checkpoints" / "step_000002").resolve()
    assert step in input_referents(run) and step in input_referents(link)
    assert step in input_referents(run / "checkpoints" / "last")
    assert input_referents(tmp_path / "missing") == [(tmp_path / "missing").resolve()]


def test_the_checkpoint_names_it_follows_are_the_checkpoint_layout() -> None:
    """fileio sits below checkpoint/, so it names a run's pointers itself; they must be the
    names the checkpoint layout writes, or input_referents would miss an input."""
    from aiayn import fileio
    from aiayn.checkpoint import layout

    assert set(fileio.POINTER_FILES) == {layout.LAST_POINTER, layout.BEST_POINTER}
    assert fileio.CHECKPOINTS_SUBDIR == layout.CHECKPOINTS_DIR
