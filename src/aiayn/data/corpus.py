"""Reading and validating parallel text: line-aligned file pairs or one two-column TSV file.

Files are plain or gzip-compressed (recognized by the ``.gz`` suffix or the gzip magic
bytes), UTF-8, one sentence per line; lines are split on ``\\n`` only (so a stray U+2028 or
form feed inside a sentence cannot shift the alignment), and surrounding whitespace,
``\\r`` and a leading byte-order mark are stripped (:func:`aiayn.fileio.iter_text_lines`).

Every problem a user can cause is a :class:`DataError` naming the file and the line:
missing file, unequal line counts (both files, both counts), invalid UTF-8 (file, line,
byte offset), corrupt gzip, a TSV line without exactly two columns. Invalid UTF-8 is
handled by ``on_invalid_utf8``:

- ``error`` (default): stop with the error above;
- ``replace``: decode with U+FFFD replacement characters, count the lines, keep them;
- ``skip``: drop the pair and count it as ``invalid_utf8`` (training data only; validation
  and test sets are never filtered, so there ``skip`` acts as ``replace``, with a warning).

Training-pair filters (:class:`FilterConfig`, applied on SentencePiece token counts in
:mod:`aiayn.data.binarize`): a pair is dropped as ``empty`` when either side has no token,
``too_long`` when either side has more than ``max_len`` pieces (BOS/EOS not counted), and
``ratio`` when the longer side has more than ``max_len_ratio`` times the pieces of the
shorter (Moses' ``clean-corpus-n`` rule). Every drop is counted and reported.
On Multi30k (29,000 pairs, 8k joint BPE) the extreme ratio is 5.3 and the longest side 52
pieces, so the defaults (256, 9) keep every pair.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiayn.errors import DataError
from aiayn.fileio import LineStats, count_lines, iter_text_lines

log = logging.getLogger(__name__)

__all__ = ["FilterConfig", "ParallelCorpus", "ReadStats", "count_lines", "drop_reason", "iter_lines",
           "iter_parallel", "iter_tsv", "read_lines", "read_parallel"]


@dataclass(frozen=True)
class FilterConfig:
    """Training-data filters; validation and test data are never filtered."""

    max_len: int = 256
    max_len_ratio: float = 9.0


def drop_reason(src_len: int, tgt_len: int, filters: FilterConfig) -> str | None:
    """Why a training pair of these piece counts is dropped, or None to keep it."""
    if src_len == 0 or tgt_len == 0:
        return "empty"
    if src_len > filters.max_len or tgt_len > filters.max_len:
        return "too_long"
    if max(src_len, tgt_len) > filters.max_len_ratio * min(src_len, tgt_len):
        return "ratio"
    return None


@dataclass
class ParallelCorpus:
    """Aligned sentence pairs plus what reading them cost (dropped / repaired lines)."""

    pairs: list[tuple[str, str]]
    sources: list[str]  # the file(s) read, for messages
    dropped: dict[str, int] = field(default_factory=dict)
    replaced: int = 0  # lines with invalid UTF-8 decoded with replacement characters

    def __len__(self) -> int:
        return len(self.pairs)

    @property
    def src(self) -> list[str]:
        return [s for s, _ in self.pairs]

    @property
    def tgt(self) -> list[str]:
        return [t for _, t in self.pairs]


@dataclass
class ReadStats(LineStats):
    """Counters filled while a reader generator runs: lines, replaced lines, dropped pairs."""

    dropped: Counter[str] = field(default_factory=Counter)


# ------------------------------------------------------------------------ one file

_UTF8_HINT = "use --on-invalid-utf8 replace or skip to go on"


def iter_lines(path: str | os.PathLike, on_invalid_utf8: str = "error",
               stats: ReadStats | None = None, strip: bool = True) -> Iterator[str | None]:
    """Yield each line of a text file, stripped; ``None`` for an invalid line under ``skip``.

    ``strip=False`` removes only the line ending (TSV: a leading tab is an empty column).
    """
    return iter_text_lines(path, on_invalid_utf8, strip="both" if strip else "eol", stats=stats,
                           hint=_UTF8_HINT)


def read_lines(path: str | os.PathLike, on_invalid_utf8: str = "error") -> list[str | None]:
    return list(iter_lines(path, on_invalid_utf8))


# ----------------------------------------------------------------------- parallel


def iter_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike,
                  on_invalid_utf8: str = "error", drop_invalid: bool = True,
                  stats: ReadStats | None = None) -> Iterator[tuple[str, str]]:
    """Stream aligned pairs from two files; unequal line counts raise at the end.

    ``drop_invalid`` (training data): under ``skip`` a pair with an invalid line on either
    side is dropped (counted as ``invalid_utf8``). Without it (evaluation data) every line
    is kept, so ``skip`` falls back to ``replace``.
    """
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    mode = on_invalid_utf8
    if mode == "skip" and not drop_invalid:
        mode = "replace"
    stats = stats if stats is not None else ReadStats()
    s_stats, t_stats = ReadStats(), ReadStats()
    src_it = iter_lines(src_path, mode, s_stats)
    tgt_it = iter_lines(tgt_path, mode, t_stats)
    sentinel = object()
    while True:
        s = next(src_it, sentinel)
        t = next(tgt_it, sentinel)
        if s is sentinel or t is sentinel:
            if s is not sentinel or t is not sentinel:
                # Count the longer file to the end (its reader's counter includes every line).
                for _ in src_it if s is not sentinel else tgt_it:
                    pass
                n_src, n_tgt = s_stats.lines, t_stats.lines
                raise DataError(
                    f"line counts differ: {src_path} has {n_src} lines, {tgt_path} has {n_tgt} lines "
                    f"(the files must be line-aligned translations)")
            break
        stats.lines += 1
        if s is None or t is None:
            stats.dropped["invalid_utf8"] += 1
            continue
        yield s, t  # type: ignore[misc]
    replaced = s_stats.replaced + t_stats.replaced
    stats.replaced += replaced
    if replaced:
        log.warning("%s / %s: %d line(s) with invalid UTF-8 decoded with replacement characters",
                    src_path, tgt_path, replaced)
    if on_invalid_utf8 == "skip" and not drop_invalid and replaced:
        log.warning("evaluation data is never filtered: invalid UTF-8 was replaced, not skipped")


def iter_tsv(path: str | os.PathLike, on_invalid_utf8: str = "error", drop_invalid: bool = True,
             stats: ReadStats | None = None) -> Iterator[tuple[str, str]]:
    """Stream pairs from a ``source<TAB>target`` file; any other column count is an error."""
    path = Path(path)
    mode = "replace" if on_invalid_utf8 == "skip" and not drop_invalid else on_invalid_utf8
    stats = stats if stats is not None else ReadStats()
    line_stats = ReadStats()
    for lineno, line in enumerate(iter_lines(path, mode, line_stats, strip=False), start=1):
        stats.lines = lineno
        if line is None:
            stats.dropped["invalid_utf8"] += 1
            continue
        cols = line.split("\t")
        if len(cols) != 2:
            raise DataError(f"{path}:{lineno}: expected 2 tab-separated columns (source<TAB>target), "
                            f"found {len(cols)}")
        yield cols[0].strip(), cols[1].strip()
    stats.replaced += line_stats.replaced


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike | None = None,
                  on_invalid_utf8: str = "error", drop_invalid: bool = True) -> ParallelCorpus:
    """Read a file pair, or one TSV file when ``tgt_path`` is None, into memory."""
    stats = ReadStats()
    if tgt_path is None:
        pairs = list(iter_tsv(src_path, on_invalid_utf8, drop_invalid, stats))
        sources = [str(src_path)]
    else:
        pairs = list(iter_parallel(src_path, tgt_path, on_invalid_utf8, drop_invalid, stats))
        sources = [str(src_path), str(tgt_path)]
    return ParallelCorpus(pairs, sources, dict(stats.dropped), stats.replaced)
