"""Choosing the beam size and length penalty on a development set (``aiayn tune-decoding``).

Every cell of the grid (beam sizes x length penalties) is a full search with that setting,
scored with sacreBLEU's BLEU and chrF against the references: the scores ``aiayn evaluate``
prints for the same checkpoint, sentences and decoding options. Rescoring the finished
n-best list of one search with other penalties would be cheaper but not the same: the
length penalty steers the beam search itself (which hypotheses finish, and when it stops),
so each cell searches. One translator (the model loaded once) serves every cell, and greedy
search (beam 1) is run once: there the penalty only rescales the single hypothesis' score,
so every beam-1 cell has the same output.

The best cell has the highest BLEU, then the highest chrF; among equals, the first in grid
order (beams as given, then penalties as given). Choose on a development split: a setting
chosen on the test set overstates that set's score.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiayn.errors import ConfigError
from aiayn.evaluation.bleu import corpus_scores
from aiayn.inference.translator import Translator


@dataclass
class Cell:
    """One setting of the grid and its scores."""

    beam: int
    lenpen: float
    bleu: float
    chrf: float
    seconds: float  # the search's wall time; 0.0 for a beam-1 cell given an earlier one's output
    hypotheses: list[str] = field(repr=False, default_factory=list)


@dataclass
class Grid:
    """All cells, in grid order (beams outer, penalties inner), and the best one."""

    cells: list[Cell]
    best: Cell
    n_sentences: int
    bleu_signature: str
    chrf_signature: str


def tune_decoding(translator: Translator, sources: Sequence[str], refs: Sequence[Sequence[str]] | Sequence[str],
                  beams: Sequence[int], lenpens: Sequence[float], *, tgt_lang: str | None = None,
                  progress: Callable[[int], None] | None = None, **fixed: Any) -> Grid:
    """Translate ``sources`` with every (beam, lenpen) of the grid and score each output
    against ``refs``: one reference per source, or several reference streams, as
    :func:`~aiayn.evaluation.bleu.corpus_scores` takes them.

    ``fixed``: the other decoding options, the same for every cell (``lenpen_style``,
    ``max_len_a``, ...; unset ones are the checkpoint's). ``tgt_lang``: the target language,
    for sacreBLEU's tokenizer choice. ``progress`` is called with the
    number of sentences of each finished batch, over all searches. A bad value is a
    ConfigError before anything is translated.
    """
    if fixed.get("sampling"):
        raise ConfigError("decode.sampling: tune-decoding compares searches; sampling has no beam "
                          "size or length penalty to tune")
    beams, lenpens = list(dict.fromkeys(beams)), list(dict.fromkeys(lenpens))
    if not beams or not lenpens:
        raise ConfigError("tune-decoding: give at least one beam size and one length penalty")
    for beam in beams:  # every setting checked up front, not after the first searches
        for lenpen in lenpens:
            translator.decode_config(beam=beam, lenpen=lenpen, **fixed)
    cells: list[Cell] = []
    greedy: Cell | None = None
    for beam in beams:
        for lenpen in lenpens:
            if beam == 1 and greedy is not None:
                hyps, seconds = greedy.hypotheses, 0.0
            else:
                hyps, seconds = _search(translator, sources, beam, lenpen, progress, fixed)
            scores = corpus_scores(hyps, refs, tgt_lang=tgt_lang)
            cell = Cell(beam, lenpen, scores["bleu"], scores["chrf"], seconds, hyps)
            greedy = cell if beam == 1 and greedy is None else greedy
            cells.append(cell)
    best = max(cells, key=lambda c: (c.bleu, c.chrf))  # the first of equals
    return Grid(cells, best, len(sources), scores["bleu_signature"], scores["chrf_signature"])


def searches(beams: Sequence[int], lenpens: Sequence[float]) -> int:
    """How many searches :func:`tune_decoding` runs for this grid (beam 1 searches once)."""
    others = set(beams) - {1}
    penalties = len(set(lenpens))
    return len(others) * penalties + (1 in beams and penalties > 0)


def _search(translator: Translator, sources: Sequence[str], beam: int, lenpen: float,
            progress: Callable[[int], None] | None, fixed: dict[str, Any]) -> tuple[list[str], float]:
    """The best translation of each source (as ``aiayn evaluate`` takes it) and the seconds spent."""
    start = time.perf_counter()
    results = translator.translate_detailed(list(sources), nbest=1, progress=progress, beam=beam, lenpen=lenpen,
                                            **fixed)
    hyps = [r.hypotheses[0].text.replace("\n", " ") if r.hypotheses else "" for r in results]
    return hyps, time.perf_counter() - start
