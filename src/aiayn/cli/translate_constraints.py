"""`aiayn translate --constraints FILE` / `--terms FILE`: the constraints of each input line,
read chunk by chunk beside the input (see aiayn.inference.terms for the formats)."""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterator
from typing import Any

from aiayn import fileio
from aiayn.errors import DataError
from aiayn.inference.terms import SentenceConstraints, TermDictionary, parse_constraints_line

HELP = """\
terminology (--constraints, --terms)
  --constraints FILE: one JSON value per input line (an empty line, [] or null for none):
  a list of phrases that must appear in the translation, e.g. ["Hund", "roten Ball"], or
  {"include": [...], "exclude": [...]} where "exclude" lists phrases that must not appear.
  --terms FILE: a term dictionary, "source<TAB>target" per line (# starts a comment): the
  target of every source term found in an input line (whole words, any case) must appear
  in its translation. Both may be given; their phrases add up. A phrase is matched as the
  target SentencePiece model segments it inside a sentence. A line whose constraints cannot
  be met (a phrase the vocabulary cannot spell, phrases longer than the length bound allows,
  or none found by the search) is an error naming it, unless --constraints-best-effort:
  then it is translated without them and a warning names it.
"""


def add_flags(p: Any) -> None:
    p.add_argument("--constraints", metavar="FILE",
                   help="per input line, a JSON list of phrases its translation must contain (see 'terminology')")
    p.add_argument("--terms", metavar="FILE",
                   help="a TSV term dictionary source<TAB>target applied where a source term occurs")
    p.add_argument("--constraints-best-effort", action="store_true",
                   help="translate a line whose constraints cannot be met without them (a warning names it)")


def check_paths(constraints: str | None, terms: str | None) -> None:
    """Before any work: each of --constraints and --terms, when given, is a file or a pipe
    (read as it comes); standard input (``-``) is the --input's, a directory or a missing
    file is an error naming it."""
    for flag, path in (("--constraints", constraints), ("--terms", terms)):
        if path is None:
            continue
        if path == "-":
            raise DataError(f"{flag} -: standard input is the --input's; give a file (or a pipe, e.g. <(command))")
        if not os.path.exists(path):
            raise DataError(f"{flag} {path}: file not found")
        if os.path.isdir(path):
            raise DataError(f"{flag} {path}: is a directory, expected a text file")


def file_sha256(path: str | None) -> str | None:
    """The SHA-256 of a file's bytes (None: no file), for --resume to compare."""
    if path is None:
        return None
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 16), b""):
                digest.update(block)
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return digest.hexdigest()


class ConstraintsFile:
    """The constraints of the input lines, taken chunk by chunk: the --constraints file's
    lines (one per input line; a pipe is read as the input is) merged with the ``terms``
    (the --terms dictionary, read once by :func:`check_files`) found in each line."""

    def __init__(self, constraints: str | None, terms: TermDictionary | None, on_invalid_utf8: str,
                 skip: int) -> None:
        self.path = constraints
        self.used = skip
        self.terms = terms
        self._lines: Iterator[str] | None = None
        if constraints is not None:
            lines = (line or "" for line in fileio.iter_text_lines(constraints, on_invalid_utf8, strip="both"))
            self._lines = itertools.islice(lines, skip, None)

    @property
    def active(self) -> bool:
        return self.path is not None or self.terms is not None

    def take(self, texts: list[str]) -> list[SentenceConstraints] | None:
        if not self.active:
            return None
        out = [SentenceConstraints() for _ in texts]
        if self._lines is not None:
            got = list(itertools.islice(self._lines, len(texts)))
            for k, line in enumerate(got):
                out[k] = parse_constraints_line(line, f"{self.path}:{self.used + k + 1}")
            self.used += len(got)
            if len(got) < len(texts):
                raise DataError(f"--constraints {self.path}: {self.used} lines, but the input has more; give one "
                                "line per input line (an empty line for none)")
        if self.terms is not None:
            out = [c.merged(self.terms.constraints(text)) for c, text in zip(out, texts)]
        return out

    def finish(self, input_lines: int) -> None:
        if self._lines is not None and next(self._lines, None) is not None:
            raise DataError(f"--constraints {self.path}: more lines than the {input_lines} of the input; give one "
                            "line per input line (an empty line for none)")


def check_files(constraints: str | None, terms: str | None, on_invalid_utf8: str, input_lines: int | None,
                input_name: str) -> TermDictionary | None:
    """Read the term dictionary (once: a file or a pipe alike) and a regular --constraints
    file through before any work: a bad line, or a line count other than the input's, is an
    error naming it. The term dictionary, if any."""
    dictionary = TermDictionary.load(terms, on_invalid_utf8) if terms is not None else None
    if constraints is None or constraints == "-" or not os.path.isfile(constraints):
        return dictionary
    n = 0
    for n, line in enumerate(fileio.iter_text_lines(constraints, on_invalid_utf8, strip="both"), 1):
        parse_constraints_line(line or "", f"{constraints}:{n}")
    if input_lines is not None and n != input_lines:
        raise DataError(f"--constraints {constraints}: {n} lines, but {input_name} has {input_lines}; give one "
                        "line per input line (an empty line for none)")
    return dictionary
