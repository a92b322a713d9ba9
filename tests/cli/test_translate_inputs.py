"""`aiayn translate`'s side inputs read and refused the same way, and the advice after an
error: a --terms or --constraints pipe is read (the translations equal those of the same
file), and a constraint error at line N keeps the finished lines without advising a
--resume that would stop at line N again."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.tiny_world import sentences, two_checkpoints

from aiayn.cli.main import main


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("translate_inputs")
    w: dict[str, Path] = {}
    w["ck"], _ = two_checkpoints(root)
    w["input"] = root / "input.txt"
    w["input"].write_text("\n".join(["a dog is on the street", *sentences(3, 5)]) + "\n", encoding="utf-8")
    w["terms"] = root / "terms.tsv"
    w["terms"].write_text("dog\tcat\n", encoding="utf-8")
    w["constraints"] = root / "constraints.jsonl"
    w["constraints"].write_text('["red ball"]\n[]\n{"exclude": ["man"]}\n["bike"]\n', encoding="utf-8")
    return w


Run = Callable[[list[str]], tuple[int, str, str]]


@pytest.fixture
def run(capsysbinary: pytest.CaptureFixture[bytes]) -> Run:
    def go(argv: list[str]) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        out, err = capsysbinary.readouterr()
        return int(exc.value.code or 0), out.decode(), err.decode()

    return go


@pytest.fixture
def pipe_of() -> Iterator[Callable[[bytes], str]]:
    """``pipe_of(data)``: a path that reads ``data`` from a pipe whose writer has closed (as
    bash's ``<(command)`` gives one): opened a second time, it is empty."""
    opened: list[int] = []

    def make(data: bytes) -> str:
        r, w = os.pipe()
        os.write(w, data)  # small: within the pipe's buffer
        os.close(w)
        opened.append(r)
        return f"/dev/fd/{r}"

    yield make
    for fd in opened:
        os.close(fd)


@pytest.mark.parametrize("flag", ["--terms", "--constraints"])
def test_a_pipe_is_read_like_the_same_file(flag: str, world: dict[str, Path], run: Run,
                                           pipe_of: Callable[[bytes], str]) -> None:
    base = ["translate", "--checkpoint", str(world["ck"]), "-i", str(world["input"]), "-q"]
    name = {"--terms": "terms", "--constraints": "constraints"}[flag]
    code, from_file, err = run([*base, flag, str(world[name])])
    assert code == 0, err
    code, unconstrained, err = run(base)
    assert code == 0, err
    assert from_file != unconstrained  # the side input changes the translations
    code, from_pipe, err = run([*base, flag, pipe_of(world[name].read_bytes())])
    assert code == 0, err
    assert from_pipe == from_file


def test_a_constraint_error_keeps_the_lines_done_and_does_not_advise_resume(world: dict[str, Path], run: Run,
                                                                            tmp_path: Path) -> None:
    constraints = tmp_path / "constraints.jsonl"
    constraints.write_text('[]\n[]\n[]\n["zebra"]\n', encoding="utf-8")  # no piece spells "zebra"
    out = tmp_path / "out.txt"
    argv = ["translate", "--checkpoint", str(world["ck"]), "-i", str(world["input"]), "-o", str(out),
            "--constraints", str(constraints), "--chunk-size", "1", "-q"]
    for attempt in (argv, [*argv, "--resume"]):
        code, _, err = run(attempt)
        lines = [line for line in err.splitlines() if line.startswith("aiayn ")]
        assert code == 2 and len(lines) == 1, err
        assert f"{world['input']}:4: constraint 'zebra': the target vocabulary cannot spell it" in lines[0]
        assert lines[0].endswith(f"; {out}.partial keeps the first 3 lines"), lines[0]
        assert "--resume" not in err
        assert not out.exists()
        assert len(Path(f"{out}.partial").read_text(encoding="utf-8").splitlines()) == 3


def test_a_pipe_run_cannot_be_resumed_and_says_why(world: dict[str, Path], run: Run, tmp_path: Path,
                                                   pipe_of: Callable[[bytes], str]) -> None:
    code, _, err = run(["translate", "--checkpoint", str(world["ck"]), "-i", str(world["input"]), "-o",
                        str(tmp_path / "out.txt"), "--terms", pipe_of(world["terms"].read_bytes()), "--resume"])
    assert code == 2
    assert "--resume: needs a regular --input file (and --prefix-file, --constraints, --terms)" in err
