"""Hard word alignments from cross-attention, in the ``src-tgt`` pairs of fast_align.

What is computed, for one hypothesis:

1. the cross-attention of the **last decoder layer, averaged over its heads** (fairseq's
   ``--print-alignment`` default): a matrix with one row per target piece (the EOS step
   included) and one column per source piece (the source EOS included);
2. for each target piece except EOS, the **argmax source piece** among the source pieces
   except EOS (fairseq masks the EOS column the same way; a tie goes to the first piece);
3. both pieces mapped to the **whitespace-separated word** that contains them (0-based),
   giving one ``(source word, target word)`` pair per target piece; duplicates are dropped
   and the pairs sorted (by source word, then target word), written ``"0-0 1-2 2-1"``.

Words are counted the way SentencePiece splits them (:func:`piece_words`): a piece that
starts with ``▁`` starts a word; a piece that is only ``▁`` belongs to the word of the piece
after it. On the source side these are the words of the input line for text whose words
are separated by spaces or tabs (SentencePiece also splits at the characters its
normalization turns into spaces, and drops those it deletes, e.g. U+200B; Python's
``str.split`` also splits at U+001C..U+001F and U+0085). On the target side an ``<unk>``
piece is a word of its own, because it is written `` ⁇ `` between spaces: the target word
indices are the words of the output line as written (``text.split()``).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from aiayn.vocab import BOS, EOS, PAD, UNK

WORD_START = "\u2581"  # SentencePiece's visible space
_SPECIAL = frozenset((PAD, BOS, EOS))
_PENDING = -1  # a piece that is only WORD_START: the word of the next piece
_NO_WORD = -2  # a special piece


def last_layer_mean(attention: Tensor) -> Tensor:
    """Cross-attention (layers, heads, target, source) -> the last layer's mean over heads
    (target, source), float32. What :func:`hard_alignment` reads; passed to
    ``Translator.translate_detailed(attention_summary=...)`` so that only this is kept."""
    return attention[-1].float().mean(dim=0)


def piece_words(pieces: Sequence[str], *, unk_is_word: bool = False) -> list[int | None]:
    """The 0-based word of each piece; None for the special pieces (PAD, BOS, EOS) and for a
    trailing lone ``▁``. ``unk_is_word``: ``<unk>`` is a word by itself and the piece after it
    starts another (how SentencePiece *decodes* it, with spaces around)."""
    words: list[int] = []
    word, boundary = -1, True
    for p in pieces:
        if p in _SPECIAL:
            words.append(_NO_WORD)
            continue
        if unk_is_word and p == UNK:
            word, boundary = word + 1, True
            words.append(word)
            continue
        boundary = boundary or p.startswith(WORD_START)
        if not p.lstrip(WORD_START):
            words.append(_PENDING)
            continue
        if boundary:
            word, boundary = word + 1, False
        words.append(word)
    return _resolve_pending(words)


def _resolve_pending(words: list[int]) -> list[int | None]:
    """A lone ``▁`` takes the word of the next real piece (None if a special comes first)."""
    out: list[int | None] = [w if w >= 0 else None for w in words]
    following: int | None = None
    for k in range(len(words) - 1, -1, -1):
        if words[k] == _PENDING:
            out[k] = following
        else:
            following = out[k]
    return out


def hard_alignment(weights: Tensor | None, src_pieces: Sequence[str],
                   tgt_pieces: Sequence[str]) -> list[tuple[int, int]]:
    """Sorted unique ``(source word, target word)`` pairs (see the module docstring).

    ``weights``: (target, source) -- :func:`last_layer_mean` of a hypothesis' attention --
    with rows for ``tgt_pieces`` (EOS last) and columns for ``src_pieces`` (EOS last);
    None (an empty input line, never decoded) gives no pairs.
    """
    if weights is None:
        return []
    if weights.dim() != 2 or tuple(weights.shape) != (len(tgt_pieces), len(src_pieces)):
        raise ValueError(f"attention summary of shape {tuple(weights.shape)}, expected "
                         f"({len(tgt_pieces)}, {len(src_pieces)}) = (target pieces, source pieces)")
    columns = [(j, w) for j, w in enumerate(piece_words(src_pieces)) if w is not None]
    rows = [(i, w) for i, w in enumerate(piece_words(tgt_pieces, unk_is_word=True)) if w is not None]
    if not columns or not rows:
        return []
    best = weights[[i for i, _ in rows]][:, [j for j, _ in columns]].argmax(dim=1).tolist()
    return sorted({(columns[b][1], t) for (_, t), b in zip(rows, best)})


def format_alignment(pairs: Sequence[tuple[int, int]]) -> str:
    """``[(0, 0), (1, 2)]`` -> ``"0-0 1-2"`` (fast_align / Moses / Marian)."""
    return " ".join(f"{s}-{t}" for s, t in pairs)


__all__ = ["WORD_START", "format_alignment", "hard_alignment", "last_layer_mean", "piece_words"]
