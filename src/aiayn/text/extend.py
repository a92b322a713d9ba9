"""Adding pieces learned on new text to an existing SentencePiece model, every old id kept
(``aiayn prepare --tokenizer-dir CK --extend-vocab N``; a checkpoint is then fine-tuned with
``train.init_vocab: extend``).

A SentencePiece model of the old model's kind (BPE, unigram, word, char) is trained on the
new text with room for the old vocabulary and ``N`` more pieces; its pieces that the old
model lacks are the candidates, taken in the new model's order (most useful first: BPE merge
order, unigram score), new single characters first. Up to ``N`` of them are appended to the
old model as normal pieces:

* BPE: a piece of several characters is taken only once it can be made by one merge of two
  pieces of the model (old or added), so every added piece can occur. Added pieces score
  below every old piece, and SentencePiece's BPE applies the best-scoring merge first: the
  old model's merges all happen before any added one. Hence the guarantee: a text whose
  old segmentation has no two adjacent pieces that concatenate into an added piece is
  segmented into exactly the same pieces as before.
* unigram: an added piece keeps its score in the new model. Guarantee: a text whose
  normalized form contains no added piece is segmented into the same pieces as before.
* word / char: an added piece is a word (a character) of the new text; a text without the
  added words (characters) is segmented into the same pieces as before.

Same pieces means same ids, except for a character the old model lacked: it was ``<unk>``
and, if added, now has its own id.

Training text with fewer candidates than ``N`` adds fewer (the count is reported).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiayn.text import spm_proto
from aiayn.text.spm_proto import NORMAL, Piece
from aiayn.text.tokenizer import Tokenizer, _chain, _processor, _train_one

log = logging.getLogger(__name__)


@dataclass
class Extension:
    """What :func:`extend_model` added: the pieces, in id order from ``first_id``."""

    first_id: int
    added: list[str] = field(default_factory=list)
    asked: int = 0

    def report(self) -> dict[str, int]:
        return {"old": self.first_id, "new": self.first_id + len(self.added), "added": len(self.added),
                "asked": self.asked}


def extend_model(proto: bytes, sentences: Iterable[str], n: int, *, seed: int = 1, character_coverage: float = 1.0,
                 input_sentence_size: int = 2_000_000, num_threads: int = -1) -> tuple[bytes, Extension]:
    """``proto`` (a serialized SentencePiece model) with up to ``n`` pieces learned on
    ``sentences`` appended; the old pieces keep their ids."""
    old = spm_proto.read_pieces(proto)
    kind = spm_proto.model_type(proto)
    ext = Extension(first_id=len(old), asked=n)
    if n <= 0:
        return proto, ext
    learned = _train_one(_chain(sentences), len(old) + n, kind, character_coverage=character_coverage,
                         input_sentence_size=input_sentence_size, seed=seed, num_threads=num_threads)
    have = {p.piece for p in old}
    candidates = [p for p in spm_proto.read_pieces(learned) if p.type == NORMAL and p.piece not in have]
    # New characters first: a BPE piece made of them can only be reached once they are in.
    candidates.sort(key=lambda p: len(p.piece) > 1)
    chosen = _reachable(candidates, have, n) if kind == "bpe" else candidates[:n]
    if kind == "bpe":
        lowest = min((p.score for p in old if p.type == NORMAL), default=0.0)
        added = [Piece(p.piece, lowest - 1.0 - k, NORMAL) for k, p in enumerate(chosen)]
    else:
        added = [Piece(p.piece, p.score, NORMAL) for p in chosen]
    ext.added = [p.piece for p in added]
    if len(added) < n:
        log.info("vocabulary extension: %d new pieces (asked for %d; the new text has no more)", len(added), n)
    return spm_proto.append_pieces(proto, added), ext


def _reachable(candidates: list[Piece], have: set[str], n: int) -> list[Piece]:
    """Up to ``n`` candidates in order, each either one character or the concatenation of two
    pieces of ``have`` plus those chosen before it (a BPE merge can make it)."""
    vocab = set(have)
    chosen: list[Piece] = []
    waiting = list(candidates)
    progress = True
    while waiting and progress and len(chosen) < n:
        progress = False
        left = []
        for p in waiting:
            if len(chosen) >= n:
                break
            s = p.piece
            if len(s) == 1 or any(s[:i] in vocab and s[i:] in vocab for i in range(1, len(s))):
                chosen.append(p)
                vocab.add(s)
                progress = True
            else:
                left.append(p)
        waiting = left
    return chosen


def extend_tokenizer(tokenizer: Tokenizer, src_texts: Iterable[str], tgt_texts: Iterable[str], n: int,
                     **options: object) -> tuple[Tokenizer, dict[str, dict[str, int]]]:
    """``tokenizer`` with up to ``n`` pieces added per model, learned on the text it encodes
    (a joint model: source and target text; separate models: each its side's); returns it and
    the report per model (``joint``, or ``source`` and ``target``): old and new sizes, pieces
    added and asked for."""
    protos = tokenizer.model_bytes()
    if tokenizer.joint:
        proto, ext = extend_model(protos[0], _chain(src_texts, tgt_texts), n, **options)  # type: ignore[arg-type]
        return Tokenizer(_processor(proto, "extended model"), src_proto=proto), {"joint": ext.report()}
    sp, src_ext = extend_model(protos[0], src_texts, n, **options)  # type: ignore[arg-type]
    tp, tgt_ext = extend_model(protos[1], tgt_texts, n, **options)  # type: ignore[arg-type]
    tok = Tokenizer(_processor(sp, "extended source model"), _processor(tp, "extended target model"),
                    src_proto=sp, tgt_proto=tp)
    return tok, {"source": src_ext.report(), "target": tgt_ext.report()}


def add_source_controls(tokenizer: Tokenizer, pieces: list[str]) -> Tokenizer:
    """``tokenizer`` with the ``pieces`` its source (joint) model lacks appended as control
    pieces (never produced by encoding text; e.g. target-language tags), every old id kept."""
    missing = [p for p in pieces if not tokenizer.has_src_piece(p)]
    if not missing:
        return tokenizer
    protos = tokenizer.model_bytes()
    src = spm_proto.append_pieces(protos[0], [Piece(p, 0.0, spm_proto.CONTROL) for p in missing])
    log.info("added %s to the source vocabulary", ", ".join(missing))
    if tokenizer.joint:
        return Tokenizer(_processor(src, "tagged model"), src_proto=src)
    return Tokenizer(_processor(src, "tagged source model"), _processor(protos[1], "target model"),
                     src_proto=src, tgt_proto=protos[1])
