"""The partial output of `aiayn translate --output` (aiayn.cli.translate_io.PartialOutput): a
file written chunk by chunk beside the output and renamed onto it when complete, its state
for --resume, what it replaces, its lock and its errors."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from aiayn.cli import translate_io

# ------------------------------------------------------ resuming and aborting an output


def _partial_state(out: Path) -> tuple[Path, Path]:
    partial = out.with_name(out.name + ".partial")
    return partial, partial.with_name(partial.name + ".json")


def _state_text(identity: dict, lines: int, nbytes: int) -> str:
    return json.dumps({"identity": identity, "lines": lines, "bytes": nbytes}, indent=1, sort_keys=True) + "\n"


@pytest.mark.parametrize("state", [
    b"{not json",
    b"\xff\xfe{}",  # not UTF-8
    b"[2, 8]",
    b'{"lines": 2, "bytes": 8}',
    b'{"identity": "abc", "lines": 2, "bytes": 8}',
    b'{"identity": {"input": "abc"}, "lines": "2", "bytes": 8}',
    b'{"identity": {"input": "abc"}, "lines": 2, "bytes": "8"}',
    b'{"identity": {"input": "abc"}, "lines": 2}',
], ids=["json", "utf8", "list", "no-identity", "identity-str", "lines-str", "bytes-str", "no-bytes"])
def test_resume_refuses_a_partial_whose_state_cannot_be_read(tmp_path: Path, state: bytes) -> None:
    from aiayn.errors import AiaynError

    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    partial.write_bytes(b"one\ntwo\n")
    state_file.write_bytes(state)
    with pytest.raises(AiaynError) as info:
        translate_io.PartialOutput(out, {"input": "abc"}, resume=True)
    assert str(info.value) == (f"--resume: {partial} has no readable out.txt.partial.json, so what it holds is "
                               "unknown; delete it to start again")
    assert partial.read_bytes() == b"one\ntwo\n" and state_file.read_bytes() == state
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt.partial", "out.txt.partial.json"]


def test_resume_reads_its_state_as_utf8_whatever_the_locale(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    identity = {"input": "caf\u00e9 \u00fcber"}
    partial.write_bytes(b"one\n")
    # JSON with its non-ASCII text as UTF-8 (the program itself writes \u escapes).
    state_file.write_bytes(json.dumps({"identity": identity, "lines": 1, "bytes": 4}, ensure_ascii=False).encode())
    # A Latin-1 locale: text read without an explicit encoding would be Latin-1.
    text_encoding = io.text_encoding
    monkeypatch.setattr(io, "text_encoding", lambda encoding, *a: text_encoding(encoding or "latin-1", *a))
    second = translate_io.PartialOutput(out, identity, resume=True)
    assert (second.lines, second.bytes) == (1, 4)
    second.write(b"two\n", 1)
    second.finish()
    assert out.read_bytes() == b"one\ntwo\n"


def test_resume_needs_an_identity(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        translate_io.PartialOutput(tmp_path / "out.txt", None, resume=True)
    assert str(info.value) == "resume needs an identity"


def test_resume_names_every_key_only_one_identity_has(tmp_path: Path) -> None:
    from aiayn.errors import AiaynError

    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    first = translate_io.PartialOutput(out, {"input": "abc", "beam": 4})
    first.write(b"one\n", 1)
    first._close()
    state = state_file.read_bytes()
    with pytest.raises(AiaynError) as info:
        translate_io.PartialOutput(out, {"input": "abc", "alpha": 0.6}, resume=True)
    assert str(info.value) == (f"--resume: {partial} was written with another alpha, beam; rerun with the options "
                               "it was started with, or delete it to start again")
    assert partial.read_bytes() == b"one\n" and state_file.read_bytes() == state


def test_resume_refuses_a_partial_shorter_than_its_state_counts(tmp_path: Path) -> None:
    from aiayn.errors import AiaynError

    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    identity = {"input": "abc"}
    first = translate_io.PartialOutput(out, identity)
    first.write(b"one\ntwo\n", 2)
    first._close()
    partial.write_bytes(b"one\n")  # lost its last chunk
    with pytest.raises(AiaynError) as info:
        translate_io.PartialOutput(out, identity, resume=True)
    assert str(info.value) == (f"--resume: {partial} has 4 bytes, out.txt.partial.json counts 8; "
                               "delete both to start again")
    assert partial.read_bytes() == b"one\n"
    assert state_file.read_text(encoding="utf-8") == _state_text(identity, 2, 8)


def test_abort_keeps_exactly_one_finished_chunk(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    identity = {"input": "abc"}
    output = translate_io.PartialOutput(out, identity)
    output.write(b"one\n", 1)
    assert output.abort() is True
    assert partial.read_bytes() == b"one\n"
    assert state_file.read_text(encoding="utf-8") == _state_text(identity, 1, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt.partial", "out.txt.partial.json"]


def test_abort_before_the_first_chunk_removes_the_files(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    output = translate_io.PartialOutput(out, {"input": "abc"})
    assert output.abort() is False
    assert list(tmp_path.iterdir()) == []


def test_abort_tolerates_a_partial_removed_meanwhile(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    output = translate_io.PartialOutput(out, {"input": "abc"})
    partial.unlink()  # removed by hand while the run failed
    assert output.abort() is False
    assert list(tmp_path.iterdir()) == []


def test_a_partial_with_extra_bytes_is_cut_back_on_resume(tmp_path: Path) -> None:
    """A kill between writing a chunk and recording it: the unrecorded bytes are dropped."""
    out = tmp_path / "out.txt"
    identity = {"input": "abc"}
    first = translate_io.PartialOutput(out, identity)
    first.write(b"one\ntwo\n", 2)
    first._f.write(b"thr")  # the next chunk, cut short
    first._f.flush()
    first._close()  # as a killed process would: the file and the output's lock let go
    second = translate_io.PartialOutput(out, identity, resume=True)
    assert (second.lines, second.bytes) == (2, 8)
    second.write(b"three\n", 1)
    second.finish()
    assert out.read_bytes() == b"one\ntwo\nthree\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_two_runs_cannot_write_the_same_partial(tmp_path: Path) -> None:
    pytest.importorskip("fcntl", reason="platform: no fcntl (not POSIX)")
    from aiayn.errors import AiaynError

    out = tmp_path / "out.txt"
    first = translate_io.PartialOutput(out, {"input": "a"})
    with pytest.raises(AiaynError, match="is being written by another run"):
        translate_io.PartialOutput(out, {"input": "a"})
    first.write(b"x\n", 1)
    first.finish()
    assert out.read_bytes() == b"x\n"


# ------------------------------------------------- the partial output's files and messages


def test_partial_output_without_resume_replaces_what_an_earlier_run_left(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    identity = {"input": "abc"}
    partial.write_bytes(b"one\ntwo\n")
    state_file.write_text(_state_text(identity, 2, 8), encoding="utf-8")
    output = translate_io.PartialOutput(out, identity)
    assert (output.lines, output.bytes, output.replaced) == (0, 0, True)
    assert partial.read_bytes() == b""
    assert state_file.read_text(encoding="utf-8") == _state_text(identity, 0, 0)
    output.finish()
    assert out.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


@pytest.mark.parametrize(("content", "state", "replaced"), [
    (None, False, False),
    (b"", False, False),
    (b"x", False, True),
    (b"", True, True),
    (b"x\n", True, True),
], ids=["nothing", "empty", "one-byte", "empty-with-state", "both"])
def test_partial_output_says_whether_it_replaced_anything(tmp_path: Path, content: bytes | None, state: bool,
                                                          replaced: bool) -> None:
    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    if content is not None:
        partial.write_bytes(content)
    if state:
        state_file.write_text(_state_text({"input": "abc"}, 1, 2), encoding="utf-8")
    output = translate_io.PartialOutput(out)
    assert output.replaced is replaced
    assert partial.read_bytes() == b""
    output.finish()
    assert out.read_bytes() == b""


def test_partial_output_resumed_has_replaced_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    identity = {"input": "abc"}
    fresh = translate_io.PartialOutput(out, identity, resume=True)
    assert (fresh.lines, fresh.bytes) == (0, 0) and fresh.replaced is False
    fresh.write(b"one\n", 1)
    fresh._close()
    resumed = translate_io.PartialOutput(out, identity, resume=True)
    assert (resumed.lines, resumed.bytes) == (1, 4) and resumed.replaced is False
    resumed.finish()
    assert out.read_bytes() == b"one\n"


def test_partial_output_counts_and_records_every_chunk(tmp_path: Path, monkeypatch) -> None:
    """Each chunk is fsynced before the state counts it; the state itself is not fsynced
    (a state behind its file only costs rewriting a chunk)."""
    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    identity = {"source": "abc", "beam": 4, "alpha": 0.6}
    output = translate_io.PartialOutput(out, identity)
    assert state_file.read_text(encoding="utf-8") == _state_text(identity, 0, 0)
    synced: list[int] = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), fsync(fd))[1])
    output.write(b"one\ntwo\n", 2)
    output.write(b"three\n", 1)
    assert synced == [output._f.fileno()] * 2
    assert (output.lines, output.bytes) == (3, 14)
    assert partial.read_bytes() == b"one\ntwo\nthree\n"
    assert state_file.read_text(encoding="utf-8") == (
        '{\n "bytes": 14,\n "identity": {\n  "alpha": 0.6,\n  "beam": 4,\n  "source": "abc"\n },\n "lines": 3\n}\n')
    output.finish()
    assert out.read_bytes() == b"one\ntwo\nthree\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_partial_output_without_identity_keeps_no_state(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    output = translate_io.PartialOutput(out)
    output.write(b"one\n", 1)
    assert not _partial_state(out)[1].exists()
    output.finish()
    assert out.read_bytes() == b"one\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_partial_output_is_created_readable_and_writable_as_the_umask_allows(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    umask = os.umask(0o022)
    try:
        output = translate_io.PartialOutput(out)
    finally:
        os.umask(umask)
    output.finish()
    assert out.stat().st_mode & 0o777 == 0o644


def test_partial_output_lock_names_the_flag(tmp_path: Path) -> None:
    pytest.importorskip("fcntl", reason="platform: no fcntl (not POSIX)")
    from aiayn.errors import AiaynError

    out = tmp_path / "out.txt"
    first = translate_io.PartialOutput(out)
    try:
        for flag, kwargs in (("--output", {}), ("-o", {"flag": "-o"})):
            with pytest.raises(AiaynError) as info:
                translate_io.PartialOutput(out, **kwargs)
            assert str(info.value).startswith(f"{flag} {out}: is being written by another run (pid {os.getpid()}")
    finally:
        first.abort()


@pytest.mark.parametrize(("kwargs", "flag"), [({}, "--output"), ({"flag": "-o"}, "-o")])
def test_partial_output_that_cannot_be_opened_is_one_error(tmp_path: Path, kwargs: dict, flag: str) -> None:
    from aiayn.errors import AiaynError

    out = tmp_path / "out.txt"
    partial, _ = _partial_state(out)
    partial.mkdir()
    with pytest.raises(AiaynError) as info:
        translate_io.PartialOutput(out, **kwargs)
    assert str(info.value) == f"{flag} {out}: cannot write {partial} (Is a directory)"
    partial.rmdir()
    translate_io.PartialOutput(out).finish()  # the output's lock was let go
    assert out.read_bytes() == b""


def test_partial_output_on_a_full_disk_names_the_partial(tmp_path: Path, monkeypatch) -> None:
    import errno

    from aiayn.errors import EnvironmentFailure

    out = tmp_path / "out.txt"
    partial, _ = _partial_state(out)
    real_open = os.open

    def full_disk(path, *args, **kwargs):
        if Path(path) == partial:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", full_disk)
    with pytest.raises(EnvironmentFailure) as info:
        translate_io.PartialOutput(out, {"input": "abc"})
    assert str(info.value) == f"no space left on device writing {partial}; {out} is unchanged"
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    translate_io.PartialOutput(out).finish()  # the output's lock was let go
    assert out.read_bytes() == b""
