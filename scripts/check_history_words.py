#!/usr/bin/env python3
"""Fail on words that tell how the project was made instead of what the product does.

The code, docs, configs, tests, benchmarks and scripts speak of the product only. This check
finds numbered stints of work ("sixteenth session", "this session", "session 12"), machine
letters ("machine D", "machine-D kind"), issue references ("issue 22", "(#22)", "the
CPU-performance issue"), the makers' first person ("I ran", "we measured", "our run"), "run of
work", "lab notebook", dates of work (ISO dates outside CHANGELOG.md and the results page),
words of an earlier state ("added since", "the previous full run", "its former name", "the old
train.tensorboard", "the earlier recipe", "once on a loaded machine"), and in src/, tests/ and
benchmarks/ (their result files included) the paths of one machine ("../shared", "/work/runs/x").
It prints ``file:line: word`` for each and exits 1; with none it prints nothing and exits 0.

    python scripts/check_history_words.py                 # the product's files (ROOTS)
    python scripts/check_history_words.py docs README.md  # only these files or folders
    python scripts/check_history_words.py --root DIR      # paths relative to DIR

In Python files only comments and strings are read: names such as ``ours`` are code. Real
uses of the same words (pytest's ``scope="session"``, an HTTP library's ``Session``) are
listed in ALLOWED, each as a file pattern and a pattern whose match must contain the word.
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import os
import re
import sys
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# What is checked: the product's folders and files, relative to the repository root.
ROOTS = ("src", "docs", "configs", "tests", "benchmarks", "scripts", "README.md", "CHANGELOG.md",
         "Makefile", "Dockerfile", "pyproject.toml", "mkdocs.yml", ".ci/run")

# This file and its test hold the words on purpose (the patterns, the planted examples).
EXEMPT = ("scripts/check_history_words.py", "tests/test_history_words.py")

# Folders never read: caches, build output, virtual environments.
SKIP_DIRS = {"__pycache__", "node_modules", "site", "mutants", "build", "dist"}

# Ordinal words of numbered stints ("the sixteenth session") are caught by the session rule;
# the rules are (name, pattern); a match is reported with its text.
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("stint of work", re.compile(r"\bsessions?\b(?:\s+\d+)?", re.IGNORECASE)),
    ("stint of work", re.compile(r"\b(?:stints?|runs? of work|lab[- ]notebook|scratch notes)\b", re.IGNORECASE)),
    ("machine letter", re.compile(r"\b[Mm]achines?[- ][A-Z]\b(?!['’]\w)")),
    ("issue reference", re.compile(r"\bissues?\s+#?\d+\b", re.IGNORECASE)),
    ("issue number", re.compile(r"(?<![\w&#/.:=-])#\d+\b(?![\w-])")),
    ("issue reference", re.compile(r"\bissue['’]s\b|\bper the issue\b|\(\s*[\w-]+ issue\s*\)", re.IGNORECASE)),
    ("issue reference", re.compile(
        r"\b(?:[\w]+-)?(?:performance|reliability|GPU|CPU|speed|docs|layout|serving|parsing|training|decoding)"
        r" issue\b", re.IGNORECASE)),
    # "I" not as a numeral: "Table I", "Part I"
    ("first person", re.compile(r"(?<![\w.'\"/-])(?<!Table )(?<!Figure )(?<!Section )(?<!Part )(?<!Appendix )"
                                r"I(?:['’](?:m|ve|d|ll)\b|\s+[a-z]+\b)")),
    ("first person", re.compile(r"\b[Ww]e(?:['’](?:ve|re|d|ll))?\b|\b[Oo]urs?\b")),
    ("date of work", re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")),
    # a first release has no earlier state to speak of: say what the product does now
    ("earlier state", re.compile(
        r"\badded since\b|\bprevious (?:full )?runs?\b|\bformer names?\b|\bearlier recipes?\b"
        r"|\bonce on a (?:loaded|busy) machine\b", re.IGNORECASE)),
    # "the old train.tensorboard", "the old `row_topk`": an option or a function, not "old checkpoints"
    ("earlier state", re.compile(r"\b[Oo]ld `?[a-z][a-z0-9_]*(?:[._][a-z0-9_]+)+`?")),
    ("machine path", re.compile(r"\.\./shared\b|[\"']shared[\"']\s*/\s*[\"']data[\"']"
                                r"|(?<![\w./$-])/(?:work|home|Users|root)/[\w.-]+")),
)

# Rules read only in some files (fnmatch patterns); the others apply everywhere.
RULE_SCOPE = {"machine path": ("src/*", "tests/*", "benchmarks/*")}

# (file pattern, pattern): a hit inside a match of the pattern, in a file the file pattern
# matches (fnmatch: "*" also crosses "/"), is a real use of the word, not history.
ALLOWED: tuple[tuple[str, re.Pattern[str]], ...] = (
    # pytest fixtures that live for the whole test session, and the words for that session
    ("tests/*.py", re.compile(r"""\bscope\s*=\s*["']session["']""")),
    ("tests/*.py", re.compile(r"\b(?:pytest|test) session\b|\bsession-scoped\b")),
    ("docs/testing.md", re.compile(r"\b(?:pytest|test) session\b|scope=\"session\"|\bsession-scoped\b")),
    # library classes named Session (requests, aiohttp, TensorFlow, ONNX Runtime)
    ("*", re.compile(r"\b(?:requests|aiohttp|httpx|tf|ort|onnxruntime)\.\w*Session\b")),
    # a session in the HTTP / browser sense
    ("src/aiayn/serving/*", re.compile(r"\b(?:HTTP|browser|keep-alive|TLS) sessions?\b", re.IGNORECASE)),
    ("docs/serving.md", re.compile(r"\b(?:HTTP|browser|keep-alive|TLS) sessions?\b", re.IGNORECASE)),
    # dates where they belong: releases, the measurements of the results page, result files
    ("CHANGELOG.md", re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")),
    ("docs/results.md", re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")),
    ("*.json", re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")),
    # the README test asserts that the README points at no folder beside the checkout
    ("tests/test_readme.py", re.compile(r"\"\.\./shared\" not in")),
)

# Hex colours (#333) are not issue numbers: no "#N" rule in style and page files.
NO_HASH_RULE = ("*.css", "*.html", "*.js", "*.svg")


@dataclass(frozen=True, order=True)
class Hit:
    path: str
    line: int
    column: int
    word: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.word}"


def _prose_spans(text: str) -> dict[int, list[tuple[int, int]]] | None:
    """Per line (1-based), the column spans of a Python file's comments and strings;
    None when the file does not tokenize (then every character is read)."""
    kinds = {tokenize.COMMENT, tokenize.STRING}
    for name in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END"):  # Python 3.12+
        if hasattr(tokenize, name):
            kinds.add(getattr(tokenize, name))
    spans: dict[int, list[tuple[int, int]]] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type not in kinds:
                continue
            (row, col), (end_row, end_col) = tok.start, tok.end
            for r in range(row, end_row + 1):
                spans.setdefault(r, []).append((col if r == row else 0, end_col if r == end_row else 1 << 30))
    except (tokenize.TokenError, SyntaxError):
        return None
    return spans


def _allowed(path: str, line: str, start: int, end: int) -> bool:
    for pattern, regex in ALLOWED:
        if fnmatch.fnmatchcase(path, pattern) and any(
                m.start() <= start and end <= m.end() for m in regex.finditer(line)):
            return True
    return False


def scan_text(path: str, text: str) -> list[Hit]:
    """The history words of one file; ``path`` is its repository-relative POSIX path."""
    spans = _prose_spans(text) if path.endswith(".py") else None
    hash_rule_off = any(fnmatch.fnmatchcase(path, p) for p in NO_HASH_RULE)
    hits: list[Hit] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line_spans = spans.get(number, []) if spans is not None else None
        found: list[tuple[int, int]] = []
        for rule, regex in RULES:
            if hash_rule_off and rule == "issue number":
                continue
            if rule in RULE_SCOPE and not any(fnmatch.fnmatchcase(path, p) for p in RULE_SCOPE[rule]):
                continue
            for m in regex.finditer(line):
                if line_spans is not None and not any(a <= m.start() < b for a, b in line_spans):
                    continue
                if not _allowed(path, line, m.start(), m.end()):
                    found.append((m.start(), m.end()))
        # one report per place: a match inside another rule's longer match is left out
        for start, end in sorted(set(found)):
            if not any(a <= start and end <= b and (a, b) != (start, end) for a, b in found):
                hits.append(Hit(path, number, start, line[start:end]))
    return hits


def _files(root: Path, paths: Iterable[str]) -> Iterator[Path]:
    for name in paths:
        top = root / name
        if top.is_file():
            yield top
            continue
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS
                             and not d.endswith(".egg-info"))
            yield from (Path(folder) / f for f in sorted(files))


def _read_text(path: Path) -> str | None:
    """The file as text, or None for a binary file (NUL bytes, not UTF-8)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def scan(root: Path, paths: Iterable[str] = ROOTS) -> list[Hit]:
    """Every history word under ``paths`` (files or folders relative to ``root``)."""
    hits: list[Hit] = []
    for file in _files(root, paths):
        rel = file.relative_to(root).as_posix()
        if rel in EXEMPT:
            continue
        text = _read_text(file)
        if text is not None:
            hits += scan_text(rel, text)
    return sorted(hits)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help=f"files or folders (default: {' '.join(ROOTS)})")
    parser.add_argument("--root", type=Path, default=REPO, help="the repository root (default: this checkout)")
    args = parser.parse_args(argv)
    hits = scan(args.root, args.paths or ROOTS)
    for hit in hits:
        print(hit)
    if hits:
        print(f"{len(hits)} development-history word(s): say what the product does "
              f"(figures: docs/results.md); real uses go into ALLOWED in {Path(__file__).name}", file=sys.stderr)
    return 1 if hits else 0


if __name__ == "__main__":
    sys.exit(main())
