"""Every command that README.md and docs/results.md give runs as written, as far as its parser
can tell without running it: an `aiayn` command through the `aiayn` parsers, a
`python benchmarks/X.py` or `python scripts/X.py` command through the parser of that script
(imported as a module, its `main` stopped once its arguments are parsed), a `make` command
through `make -n` (whose config overrides must reach the recipe's command line, not vanish as
make variables), a `bash scripts/X.sh` command through `bash -n`. A flag that no longer exists,
a target that is gone or an override that make swallows fails here.

A command is a code span or a line of a bash block that starts with one of those programs,
after `NAME=value` words of the environment; placeholders in capitals (RUN, DIR, FILE, ...)
stand for paths. Prose that names a command without its required arguments (`aiayn serve`)
is a mention: its subcommand and flags must exist, and only missing required arguments are
forgiven; MENTIONS lists them, and an entry no page has any more fails too.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aiayn.cli.main import build_parser

REPO = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/results.md")
PROGRAMS = {"aiayn", "make", "python", "bash"}
# Placeholders that stand for a value of a fixed kind, not a path.
VALUES = {"D": "int8", "N": "1000"}
# Prose naming a command without its required arguments: (page, text of the command).
MENTIONS = {
    ("README.md", "aiayn serve"),
    ("README.md", "aiayn export hf"),
    ("README.md", "aiayn export ctranslate2"),
    ("README.md", "aiayn import hf"),
    ("README.md", "aiayn train"),
    ("README.md", "aiayn translate"),
    ("docs/results.md", "aiayn translate"),
    ("docs/results.md", "aiayn parse"),
    ("docs/results.md", "aiayn serve"),
    ("docs/results.md", "aiayn serve --ctranslate2"),
    ("docs/results.md", "aiayn prepare --vocab-size 32000"),
    ("docs/results.md", "aiayn prepare --workers 2"),
    ("docs/results.md", "aiayn evaluate"),
    ("docs/results.md", "aiayn export hf"),
}
# What argparse says of a mention: arguments left out, not a flag or value that is wrong.
MISSING = re.compile(r"the following arguments are required|one of the arguments .* is required|"
                     r"argument --[\w-]+: expected one argument$")
SHELL_OPERATORS = {"|", "||", "&&", ";", "&"}
ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=")
OVERRIDE = re.compile(r"^(?:model|data|train|decode)\.\w+=")


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str
    env: tuple[tuple[str, str], ...]
    words: tuple[str, ...]

    def __str__(self) -> str:
        env = "".join(f"{name}={value} " for name, value in self.env)
        return f"{self.page}:{self.line}: {env}{self.text}"


def _fenced(text: str) -> Iterator[tuple[int, str, str]]:
    """(line number, language, line) of each fenced block's lines, continuations joined."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^```(\w*)$", lines[i])
        i += 1
        if not opening:
            continue
        while i < len(lines) and lines[i] != "```":
            start, line = i + 1, lines[i]
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1] + " " + lines[i].strip()
            yield start, opening.group(1), line
            i += 1
        i += 1


def _prose(text: str) -> str:
    """The page with its fenced blocks blanked (line numbers kept)."""
    return re.sub(r"^```\w*\n.*?^```$", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.M | re.S)


def _spans(text: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each inline code span; a span may run over a line break."""
    prose = _prose(text)
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose):
        yield prose.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split())


def _command(page: str, line: int, text: str) -> list[Command]:
    """The commands of one shell line (a pipeline is several)."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return []
    out: list[Command] = []
    part: list[str] = []
    for word in [*words, ";"]:
        if word not in SHELL_OPERATORS:
            part.append(word)
            continue
        env = []
        while part and ENV_WORD.match(part[0]):
            name, value = part.pop(0).split("=", 1)
            env.append((name, value))
        # A program named alone ("needs only `make`") is no command.
        if len(part) > 1 and part[0] in PROGRAMS and (part[0] != "python" or part[1].endswith(".py")):
            out.append(Command(page, line, " ".join(part), tuple(env), tuple(part)))
        part = []
    return out


def commands() -> list[Command]:
    found: list[Command] = []
    for page in PAGES:
        text = (REPO / page).read_text(encoding="utf-8")
        for line, language, shell in _fenced(text):
            if language in {"bash", ""}:
                found += _command(page, line, shell)
        for line, span in _spans(text):
            found += _command(page, line, span)
    return found


def _argv(words: tuple[str, ...]) -> list[str]:
    """The words as a parser gets them: `[--flag]` as `--flag`, value placeholders filled in."""
    return [VALUES.get(w, w[1:-1] if re.fullmatch(r"\[--[\w-]+\]", w) else w) for w in words]


def _parse_aiayn(argv: list[str]) -> str | None:
    """None when the aiayn parsers accept ``argv``, else argparse's message."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            return err.getvalue().strip().splitlines()[-1] if exc.code else None
    return None


class _Parsed(Exception):
    """Raised in place of going on, once a script's parser has parsed its arguments."""


def _parse_script(path: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str | None:
    """None when the script's own parser accepts ``argv``, else argparse's message."""
    original = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        result = original(self, args, namespace)
        raise _Parsed(result)

    # benchmarks/ and scripts/ are on pytest's pythonpath: the script is imported by its name.
    module = importlib.import_module(path.stem)
    assert Path(module.__file__ or "").resolve() == path.resolve(), f"{path.stem} is not {path}"
    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_args)
        patch.setattr(sys, "argv", [str(path), *argv])
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                module.main()
            except _Parsed:
                return None
            except SystemExit as exc:
                return err.getvalue().strip().splitlines()[-1] if exc.code else None
    return f"{path.name}: main() returned without parsing its arguments"


def _make_dry_run(command: Command) -> str | None:
    env = {**os.environ, **dict(command.env), "MAKEFLAGS": ""}
    proc = subprocess.run(["make", "-n", *command.words[1:]], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    if proc.returncode != 0:
        return proc.stderr.strip()
    lost = [w for w in command.words if OVERRIDE.match(w) and w not in proc.stdout]
    return f"make passes no {' '.join(lost)} to the recipe" if lost else None


def _bash_check(command: Command) -> str | None:
    script = REPO / command.words[1]
    if not script.is_file():
        return f"no {command.words[1]}"
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
    return proc.stderr.strip() or None


ALL = commands()


def test_the_pages_have_their_commands() -> None:
    """The extraction finds the pages' commands (a change of format fails here, not silently)."""
    texts = {c.text for c in ALL}
    assert "make multi30k-distill train.max_steps=3950 train.max_time_minutes=0" in texts
    assert "python benchmarks/cpu_end_to_end.py --checkpoint runs/multi30k.en-de/member1/averaged --lines " \
           "10,1000,3000 --runs 2 --serve --startup --json" in texts
    assert "aiayn translate --checkpoint checkpoints/opus-en-de" in texts  # after a pipe
    assert {c.page for c in ALL} == set(PAGES)
    assert len(ALL) >= 40


@pytest.mark.parametrize("command", [c for c in ALL if c.words[0] == "aiayn"], ids=str)
def test_aiayn_commands_parse(command: Command) -> None:
    error = _parse_aiayn(_argv(command.words[1:]))
    if (command.page, command.text) in MENTIONS:
        assert error is None or MISSING.search(error), f"{command}: {error}"
    else:
        assert error is None, f"{command}: {error}"


@pytest.mark.parametrize("command", [c for c in ALL if c.words[0] == "python"], ids=str)
def test_script_commands_parse(command: Command, monkeypatch: pytest.MonkeyPatch) -> None:
    script = REPO / command.words[1]
    assert script.is_file(), f"{command}: no {command.words[1]}"
    assert _parse_script(script, _argv(command.words[2:]), monkeypatch) is None, str(command)


@pytest.mark.parametrize("command", sorted({c for c in ALL if c.words[0] == "make"}, key=str), ids=str)
def test_make_commands_dry_run(command: Command) -> None:
    error = _make_dry_run(command)
    assert error is None, f"{command}: {error}"


@pytest.mark.parametrize("command", [c for c in ALL if c.words[0] == "bash"], ids=str)
def test_bash_scripts_exist_and_parse(command: Command) -> None:
    assert _bash_check(command) is None, str(command)


def test_every_mention_is_on_its_page() -> None:
    found = {(c.page, c.text) for c in ALL}
    assert sorted(MENTIONS - found) == []


def test_a_removed_flag_or_a_swallowed_override_fails(tmp_path: Path) -> None:
    """The checks can fail: a flag no parser has, an override make drops."""
    error = _parse_aiayn(["translate", "--checkpoint", "RUN", "--no-such-flag"])
    assert error is not None and error.endswith("unrecognized arguments: --no-such-flag")
    makefile = tmp_path / "Makefile"
    makefile.write_text("multi30k:\n\tbash scripts/multi30k.sh\n", encoding="utf-8")
    swallowed = Command("x", 1, "make multi30k train.max_steps=3", (),
                        ("make", "-f", str(makefile), "multi30k", "train.max_steps=3"))
    assert _make_dry_run(swallowed) == "make passes no train.max_steps=3 to the recipe"
