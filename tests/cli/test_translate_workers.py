"""`aiayn translate --workers`: the choice auto makes (exact table), the same bytes with worker
processes as without, and a bad value in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.tiny_world import WORDS, sentences

from aiayn.errors import ConfigError
from aiayn.runtime.process import MAX_AUTO_WORKERS, MIN_LINES_PER_WORKER, decode_workers


@pytest.mark.parametrize(("requested", "device", "threads", "lines", "expected"), [
    ("auto", "cpu", 2, 2 * MIN_LINES_PER_WORKER, (2, 1)),       # a file with enough lines per worker
    ("auto", "cpu", 2, 2 * MIN_LINES_PER_WORKER - 1, (1, 2)),   # one line short: in this process
    ("auto", "cpu", 4, 3 * MIN_LINES_PER_WORKER, (3, 1)),       # as many workers as the lines feed
    ("auto", "cpu", 4, 10**6, (4, 1)),
    ("auto", "cpu", 64, 10**6, (MAX_AUTO_WORKERS, 64 // MAX_AUTO_WORKERS)),  # many cores: threads shared
    ("auto", "cpu", 20, 10**6, (8, 2)),
    ("auto", "cpu", 1, 10**6, (1, 1)),                          # one thread: nothing to share
    ("auto", "cpu", 2, None, (1, 2)),                           # a stream
    ("auto", "cuda", 8, 10**6, (1, 8)),                         # a GPU decodes in this process
    ("3", "cpu", 8, 5, (3, 2)),                                 # a number: the threads split among them
    ("2", "cpu", 1, None, (2, 1)),
    ("1", "cpu", 2, 10**6, (1, 2)),
])
def test_the_workers_auto_chooses(requested: str, device: str, threads: int, lines: int | None,
                                  expected: tuple[int, int]) -> None:
    assert decode_workers(requested, device, threads, lines) == expected


@pytest.mark.parametrize(("value", "message"), [
    ("x", "--workers 'x': give auto or a whole number of processes"),
    ("0", "--workers 0: at least 1 (1 decodes in this process)"),
    ("-2", "--workers -2: at least 1 (1 decodes in this process)"),
])
def test_a_bad_workers_value_is_one_line(value: str, message: str, tiny_checkpoint: Path, tmp_path: Path,
                                          run_cli) -> None:
    with pytest.raises(ConfigError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        decode_workers(value, "cpu", 2, 100)
    source = tmp_path / "in.txt"
    source.write_text("a man\n", encoding="utf-8")
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(source),
                              "--workers", value])
    assert (code, out, err.strip().splitlines()) == (2, b"", [f"aiayn translate: error: {message}"])


def test_worker_processes_write_the_same_bytes(tiny_checkpoint: Path, tmp_path: Path, run_cli) -> None:
    source = tmp_path / "in.txt"
    source.write_text("\n".join([*sentences(2 * MIN_LINES_PER_WORKER, 3, WORDS), ""]), encoding="utf-8")
    base = ["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(source), "--beam", "2",
            "--max-len-b", "4", "--batch-tokens", "64", "--scores", "--compile", "off"]
    code, alone, err = run_cli([*base, "--workers", "1", "--threads", "2", "--quiet"])
    assert code == 0, err
    code, pooled, err = run_cli([*base, "--threads", "2"])  # auto: 2 workers of 1 thread
    assert code == 0, err
    assert f"workers auto -> 2 processes of 1 thread(s) ({2 * MIN_LINES_PER_WORKER} lines)" in err.splitlines()
    assert pooled == alone and pooled.count(b"\n") == 2 * MIN_LINES_PER_WORKER
    code, named, err = run_cli([*base, "--workers", "2", "--threads", "1"])  # a number: no line about it
    assert code == 0 and named == alone and "workers auto" not in err
