"""A translation request as one value, and its encoding: what the command line, the server and
the Python API ask of a translator, built once and passed unchanged to the search.

    request = TranslationRequest(texts, translator.decode_config(beam=5), constraints=[["Hund"], None])
    results = translator.run(request)

:func:`encode_request` turns it into ids once, with the checkpoint's tokenizer: the sources
(with the target-language tag the options ask for), the forced prefixes and the terminology
phrases, each checked by one rule (:func:`check_source_length`, :func:`encode_phrases`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aiayn.config import DecodeConfig
from aiayn.errors import ConfigError, ConstraintError, DataError
from aiayn.inference.constraints import Constraint
from aiayn.inference.search import max_output_lengths
from aiayn.inference.terms import SentenceConstraints, constraints_list
from aiayn.vocab import EOS_ID, UNK_ID

log = logging.getLogger(__name__)


class SourceTooLong(DataError):
    """A source longer than the model's positions: ``index`` among the texts, its ``length``
    (EOS included) and the model's ``limit``. A command line re-words it as ``FILE:LINE``, the
    server as ``texts[i]``."""

    def __init__(self, index: int, length: int, limit: int) -> None:
        super().__init__(f"texts[{index}]: {length} source tokens (with EOS); the model has {limit} positions")
        self.index, self.length, self.limit = index, length, limit


@dataclass(frozen=True)
class TranslationRequest:
    """Texts and everything asked of their translation.

    Attributes:
        texts: The sentences; an empty (or all-whitespace) one gets one empty hypothesis.
        decode: The decoding options (``nbest`` included), usually
            ``translator.decode_config(**overrides)``.
        attention: Return each hypothesis' cross-attention.
        prefixes: Per text, a target-side text the translation must start with (None or ""
            for none).
        constraints: Terminology, one entry per text (what
            :func:`~aiayn.inference.terms.constraints_list` takes), checked when the request is made.
        best_effort: A text whose constraints cannot be met is translated without them (with
            a warning) instead of raising :class:`~aiayn.errors.ConstraintError`.
        truncate: A source longer than the model's positions is cut to them, with a warning
            (the default: the Python API translates what it is given); False: it raises
            :class:`SourceTooLong` (the command line without ``--truncate``, the server).
        first_number: The number of ``texts[0]`` in warnings (its line, for a chunk of a file).
        grammar: Given the indices of a batch's texts, the constraint their outputs must
            satisfy (the parser's tree grammar); not together with ``constraints``.
        attention_summary: With ``attention``, what each hypothesis keeps instead of its
            (layers, heads, target, source) weights, computed batch by batch.
        progress: Called with the number of texts of each finished batch.
        sources: Each text's source ids as the translator's ``encode_sources`` gave them for
            these options (the server encodes once, to check the lengths before queuing);
            None: encoded when the request runs.
    """

    texts: Sequence[str]
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    attention: bool = False
    prefixes: Sequence[str | None] | None = None
    constraints: Sequence[Any] | None = None
    best_effort: bool = False
    truncate: bool = True
    first_number: int = 1
    grammar: Callable[[list[int]], Constraint] | None = None
    attention_summary: Callable[[Tensor], Tensor] | None = None
    progress: Callable[[int], None] | None = None
    sources: Sequence[list[Any]] | None = None

    def __post_init__(self) -> None:
        for name in ("prefixes", "sources"):
            given = getattr(self, name)
            if given is not None and len(given) != len(self.texts):
                raise ConfigError(f"{name}: {len(given)} given for {len(self.texts)} texts")
        if self.constraints is not None:
            if self.grammar is not None:
                raise ConfigError("constraints: lexical constraints cannot be combined with another constraint")
            object.__setattr__(self, "constraints", constraints_list(self.constraints, len(self.texts)))

    def sentence_constraints(self, index: int) -> SentenceConstraints:
        """Text ``index``'s terminology (empty when there is none)."""
        return self.constraints[index] if self.constraints is not None else SentenceConstraints()


@dataclass
class EncodedSentence:
    """One non-empty text as ids: ``source`` (EOS included), its forced ``prefix``, and its
    terminology as target pieces (``include`` phrases that must appear, ``exclude`` ones that
    must not)."""

    index: int
    source: list[int]
    prefix: list[int] = field(default_factory=list)
    include: list[list[int]] = field(default_factory=list)
    exclude: list[list[int]] = field(default_factory=list)

    @property
    def constrained(self) -> bool:
        return bool(self.include or self.exclude)


@dataclass(frozen=True)
class SourceLimits:
    """What a model can read and write: source positions (EOS included) and decoder steps;
    None: no limit."""

    positions: int | None
    steps: int | None


def check_source_length(ids: list[int], index: int, limit: int | None, request: TranslationRequest) -> list[int]:
    """The one rule for a source longer than the model's positions: cut to them with a warning
    when the request says ``truncate``, else refused (:class:`SourceTooLong`)."""
    if limit is None or len(ids) <= limit:
        return ids
    if not request.truncate:
        raise SourceTooLong(index, len(ids), limit)
    log.warning("sentence %d: %d source tokens, truncated to the model's %d positions",
                index + request.first_number, len(ids), limit)
    return ids[:limit - 1] + [EOS_ID]


def encode_request(request: TranslationRequest, tokenizer: Any, source_tokenizer: Any,
                   limits: SourceLimits) -> list[EncodedSentence]:
    """The request's non-empty texts as ids, in input order: sources encoded by
    ``source_tokenizer`` (the tagged one, where the options ask for a target language) and
    checked against ``limits``; prefixes and phrases encoded by ``tokenizer``'s target side."""
    todo = [i for i, t in enumerate(request.texts) if t.strip()]
    if request.sources is not None:
        sources = [list(request.sources[i]) for i in todo]
    else:
        sources = source_tokenizer.encode_src_batch([request.texts[i] for i in todo], num_threads=1)
    out = []
    for i, ids in zip(todo, sources):
        sentence = EncodedSentence(i, check_source_length(ids, i, limits.positions, request))
        prefix = request.prefixes[i] if request.prefixes is not None else None
        if prefix:
            sentence.prefix = tokenizer.encode_tgt(prefix)
        terms = request.sentence_constraints(i)
        if terms:
            encode_phrases(sentence, terms, tokenizer, request, limits)
        out.append(sentence)
    return out


def encode_phrases(sentence: EncodedSentence, terms: SentenceConstraints, tokenizer: Any,
                   request: TranslationRequest, limits: SourceLimits) -> None:
    """A sentence's constraint phrases as target pieces (SentencePiece's segmentation of the
    phrase as words inside a sentence), checked: every phrase must be spelled without the
    unknown piece, contain no excluded phrase, and all must fit the length bound. A sentence
    that fails raises ConstraintError, or with ``best_effort`` loses what fails (a warning
    says so)."""
    i = sentence.index

    def fail(reason: str, dropped: str = "it") -> None:
        if not request.best_effort:
            raise ConstraintError(i, reason)
        log.warning("sentence %d: %s; translated without %s", i + request.first_number, reason, dropped)

    exclude = [ids for p in terms.exclude if (ids := tokenizer.encode_tgt(p))]
    include = []
    for phrase in terms.include:
        ids = tokenizer.encode_tgt(phrase)
        inside = next((q for q, q_ids in zip(terms.exclude, exclude) if _contains(ids, q_ids)), None)
        if not ids or UNK_ID in ids:
            fail(f"constraint {_short(phrase)}: the target vocabulary cannot spell it (an unknown piece)")
        elif inside is not None:
            fail(f"constraint {_short(phrase)} contains the excluded phrase {_short(inside)}")
        else:
            include.append(ids)
    prefix_len = torch.tensor([len(sentence.prefix)])
    bound = max_output_lengths(torch.tensor([len(sentence.source)]), request.decode, limits.steps, prefix_len)
    room = int(bound[0]) - int(prefix_len[0])
    needed = sum(len(ids) for ids in include)
    if needed > room:
        fail(f"the constraints need {needed} target pieces; the length bound (max_len_a x source length "
             f"+ max_len_b, less any prefix) leaves {room}", dropped="them")
        include = []
    sentence.include, sentence.exclude = include, exclude


# A batch's search takes about sentences x (longest source + this) steps of one row each: the
# output is about as long as the source, and the beams run a few steps past their first end.
_STEPS_PAST_SOURCE = 7


def batches(sentences: Sequence[EncodedSentence], budget: int) -> list[list[EncodedSentence]]:
    """Sentences sorted by source length (longest first), cut so that sentences x longest <=
    ``budget`` padded tokens, the batches then ordered by their estimated search time, the
    longest first (:data:`_STEPS_PAST_SOURCE`). Sorting keeps padding small; a sentence longer
    than the budget is a batch alone. The order lets worker processes that take the next batch
    when free end together: the batches of many short sentences, which cost the most, do not
    come last."""
    order = sorted(range(len(sentences)), key=lambda k: -len(sentences[k].source))
    out: list[list[EncodedSentence]] = []
    current: list[EncodedSentence] = []
    width = 0
    for k in order:
        w = max(width, len(sentences[k].source))
        if current and w * (len(current) + 1) > budget:
            out.append(current)
            current, w = [], len(sentences[k].source)
        current.append(sentences[k])
        width = w
    if current:
        out.append(current)
    return sorted(out, key=lambda batch: -len(batch) * (len(batch[0].source) + _STEPS_PAST_SOURCE))


def _short(phrase: str, limit: int = 60) -> str:
    """A phrase quoted for a message, cut to ``limit`` characters."""
    return repr(phrase if len(phrase) <= limit else phrase[:limit] + "...")


def _contains(seq: list[int], part: list[int]) -> bool:
    """``part`` occurs in ``seq`` as consecutive items."""
    n = len(part)
    return any(seq[k:k + n] == part for k in range(len(seq) - n + 1))


__all__ = ["EncodedSentence", "SourceLimits", "SourceTooLong", "TranslationRequest", "batches",
           "check_source_length", "encode_request"]
