"""What a translation returns: the hypotheses of each input sentence, best first."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from aiayn.inference.search import SearchHypothesis
from aiayn.vocab import EOS_PIECE


@dataclass
class Hypothesis:
    """One translation of one sentence.

    Attributes:
        text: The translation, detokenized.
        tokens: Its target ids, without EOS.
        score: Log-probability / length penalty; hypotheses are sorted by it.
        src_pieces: The source pieces with the final ``</s>``: the attention's columns.
        tgt_pieces: The target pieces plus ``</s>``: the attention's rows.
        attention: Cross-attention weights (layers, heads, target pieces, source pieces),
            float32 on the CPU (or what the request's ``attention_summary`` made of them),
            when asked for; else None.
        log_prob: The summed log-probability (EOS included), before the length penalty.
    """

    text: str
    tokens: list[int]
    score: float
    src_pieces: list[str]
    tgt_pieces: list[str]
    attention: Tensor | None = None
    log_prob: float = 0.0

    @classmethod
    def empty(cls) -> Hypothesis:
        """The translation of an empty text, which never runs the model."""
        return cls("", [], 0.0, [EOS_PIECE], [EOS_PIECE])

    @classmethod
    def from_search(cls, tokenizer: Any, src_tokens: list[int], h: SearchHypothesis,
                    attention_summary: Callable[[Tensor], Tensor] | None = None) -> Hypothesis:
        """A search's hypothesis of the source ``src_tokens`` as text and pieces."""
        attention = h.attention
        if attention is not None and attention_summary is not None:
            attention = attention_summary(attention)
        return cls(text=tokenizer.decode_tgt(h.tokens), tokens=list(h.tokens), score=float(h.score),
                   src_pieces=tokenizer.src_pieces(src_tokens), tgt_pieces=tokenizer.tgt_pieces(h.tokens) + [EOS_PIECE],
                   attention=attention.cpu() if attention is not None else None, log_prob=float(h.log_prob))


@dataclass
class TranslationResult:
    """All hypotheses of one input sentence, best first.

    Attributes:
        source: The input text.
        hypotheses: Its translations, best first; ``best`` is the first.
        src_tokens: The encoder's input ids, EOS included.
    """

    source: str
    hypotheses: list[Hypothesis] = field(default_factory=list)
    src_tokens: list[int] = field(default_factory=list)

    @property
    def best(self) -> Hypothesis:
        return self.hypotheses[0]


__all__ = ["Hypothesis", "TranslationResult"]
