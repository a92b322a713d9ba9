"""Terminology for translation: which phrases a sentence's translation must contain, and
which it must not, as users give them.

- :class:`SentenceConstraints`: one sentence's ``include`` and ``exclude`` phrases (text).
- :func:`read_constraints`: a constraints file, one JSON value per input line: ``[]``, an
  empty line or ``null`` for none, a list of phrases to include (``["Hund", "roten
  Ball"]``), or an object ``{"include": [...], "exclude": [...]}``.
- :class:`TermDictionary`: a TSV file of ``source<TAB>target`` terms; a line's constraints
  are the targets of the source terms that occur in it (whole words, any case).

The translator (:mod:`aiayn.inference.translator`) segments the phrases with the target
SentencePiece model and searches under :class:`aiayn.inference.phrase_constraints.PhraseConstraint`.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiayn import fileio
from aiayn.errors import DataError

# Bounds of what one sentence's constraints may hold, checked before any work: a phrase's
# characters, and the phrases of one kind (include or exclude) per sentence. A constraint
# longer than any translation can never be met, nor (excluded) ever met by one.
MAX_PHRASE_CHARS = 1000
MAX_PHRASES = 100


@dataclass(frozen=True)
class SentenceConstraints:
    """One sentence's terms: every ``include`` phrase must appear in its translation (in any
    position, in any order), no ``exclude`` phrase may. Phrases are text; the translator
    segments them with the target SentencePiece model as a word inside a sentence (each
    word with its leading word-boundary piece ``▁``)."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude)

    @classmethod
    def coerce(cls, value: Any, where: str = "constraints") -> SentenceConstraints:
        """From what a user writes: None (no constraint), a list of phrases to include, or an
        object ``{"include": [...], "exclude": [...]}`` (either key may be left out); a
        :class:`SentenceConstraints` passes through. Raises ValueError naming ``where``."""
        if value is None:
            return cls()
        if isinstance(value, SentenceConstraints):
            return value
        if isinstance(value, (list, tuple)):
            return cls(_phrases(value, where), ())
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"include", "exclude"})
            if unknown:
                raise ValueError(f"{where}: unknown key {unknown[0]!r}; the keys are 'include' and 'exclude'")
            return cls(_phrases(value.get("include") or [], f"{where}.include"),
                       _phrases(value.get("exclude") or [], f"{where}.exclude"))
        raise ValueError(f"{where}: expected a list of phrases or an object with 'include'/'exclude', "
                         f"got {type(value).__name__}")

    def merged(self, other: SentenceConstraints) -> SentenceConstraints:
        """Both sets of phrases, each phrase once, in order of appearance."""
        return SentenceConstraints(tuple(dict.fromkeys(self.include + other.include)),
                                   tuple(dict.fromkeys(self.exclude + other.exclude)))


def _phrases(items: Any, where: str) -> tuple[str, ...]:
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"{where}: expected a list of phrases, got {type(items).__name__}")
    if len(items) > MAX_PHRASES:
        raise ValueError(f"{where}: {len(items)} phrases; at most {MAX_PHRASES} per sentence")
    out = []
    for k, item in enumerate(items):
        if not isinstance(item, str):
            raise ValueError(f"{where}[{k}]: expected a string, got {type(item).__name__}")
        phrase = " ".join(item.split())
        if not phrase:
            raise ValueError(f"{where}[{k}]: an empty phrase")
        if len(phrase) > MAX_PHRASE_CHARS:
            raise ValueError(f"{where}[{k}]: a phrase of {len(phrase)} characters; at most {MAX_PHRASE_CHARS}")
        bad = next((c for c in phrase if 0xD800 <= ord(c) <= 0xDFFF), None)
        if bad is not None:
            raise ValueError(f"{where}[{k}]: a lone surrogate (U+{ord(bad):04X}), not text; write the character "
                             "itself or its surrogate pair")
        out.append(phrase)
    return tuple(dict.fromkeys(out))


def read_constraints(path: str | os.PathLike, on_invalid_utf8: str = "error") -> Iterator[SentenceConstraints]:
    """One :class:`SentenceConstraints` per line of a constraints file (plain or gzip); a
    line that is not one is a :class:`DataError` naming ``path:line``."""
    for lineno, line in enumerate(fileio.iter_text_lines(path, on_invalid_utf8, strip="both"), 1):
        yield parse_constraints_line(line or "", f"{path}:{lineno}")


def parse_constraints_line(line: str, where: str) -> SentenceConstraints:
    """One line of a constraints file (see the module) -> its constraints; errors name ``where``."""
    if not line.strip():
        return SentenceConstraints()
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not JSON ({exc.msg} at column {exc.colno}); write a list of phrases, "
                        "e.g. [\"Hund\", \"roten Ball\"], or {\"include\": [...], \"exclude\": [...]}") from None
    except RecursionError:
        raise DataError(f"{where}: JSON nested too deeply; a constraint is a list of phrases or an object "
                        "{\"include\": [...], \"exclude\": [...]}") from None
    except ValueError:  # an integer of more digits than Python converts
        raise DataError(f"{where}: a number of more than {sys.get_int_max_str_digits()} digits; a constraint "
                        "holds phrases (JSON strings)") from None
    try:
        return SentenceConstraints.coerce(value, "constraints")
    except ValueError as exc:
        raise DataError(f"{where}: {exc}") from None


class TermDictionary:
    """``source -> target`` terms; :meth:`constraints` gives a text's ``include`` phrases.

    A source term occurs in a text where it stands as whole words (not inside a longer
    word), in any case; where two terms start at the same place, the longer one counts.
    """

    def __init__(self, terms: Mapping[str, str]) -> None:
        self.terms = {" ".join(s.split()).casefold(): t for s, t in terms.items()}
        sources = sorted(self.terms, key=lambda s: (-len(s), s))
        pattern = "|".join(r"\s+".join(re.escape(w) for w in s.split()) for s in sources)
        self._regex = re.compile(rf"(?<!\w)(?:{pattern})(?!\w)", re.IGNORECASE) if sources else None

    @classmethod
    def load(cls, path: str | os.PathLike, on_invalid_utf8: str = "error") -> TermDictionary:
        """From a UTF-8 TSV file: ``source<TAB>target`` per line; empty lines and lines
        starting with ``#`` are skipped. A bad line is a :class:`DataError` naming it."""
        terms: dict[str, str] = {}
        first_line: dict[str, int] = {}
        for lineno, line in enumerate(fileio.iter_text_lines(path, on_invalid_utf8, strip="eol"), 1):
            line = line or ""
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fields = line.split("\t")
            if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
                raise DataError(f"{path}:{lineno}: expected 'source<TAB>target' (two non-empty fields), "
                                f"got {len(fields)} field{'s' if len(fields) != 1 else ''}")
            source, target = " ".join(fields[0].split()), " ".join(fields[1].split())
            longest = max(len(source), len(target))
            if longest > MAX_PHRASE_CHARS:
                raise DataError(f"{path}:{lineno}: a term of {longest} characters; at most {MAX_PHRASE_CHARS}")
            key = source.casefold()
            if key in terms and terms[key] != target:
                raise DataError(f"{path}:{lineno}: {source!r} is also given on line {first_line[key]} with "
                                f"another target ({terms[key]!r}); give each source term one target")
            terms[key] = target
            first_line.setdefault(key, lineno)
        return cls(terms)

    def constraints(self, text: str) -> SentenceConstraints:
        """The targets of the terms found in ``text``, in order of occurrence, each once."""
        if self._regex is None:
            return SentenceConstraints()
        found = [self.terms[" ".join(m.group(0).split()).casefold()] for m in self._regex.finditer(text)]
        return SentenceConstraints(tuple(dict.fromkeys(found)), ())


def constraints_list(values: Any, n: int, where: str = "constraints") -> list[SentenceConstraints]:
    """Per-text constraints as the Python API takes them (a sequence of ``n`` values, each
    what :meth:`SentenceConstraints.coerce` takes) -> a list of ``n``; a bad one is a
    :class:`DataError` naming it."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise DataError(f"{where}: expected one entry per text, got {type(values).__name__}")
    if len(values) != n:
        raise DataError(f"{where}: {len(values)} entries for {n} texts; give one per text (None for none)")
    out = []
    for i, value in enumerate(values):
        try:
            out.append(SentenceConstraints.coerce(value, f"{where}[{i}]"))
        except ValueError as exc:
            raise DataError(str(exc)) from None
    return out


__all__ = ["MAX_PHRASES", "MAX_PHRASE_CHARS", "SentenceConstraints", "TermDictionary",
           "constraints_list", "parse_constraints_line", "read_constraints"]
