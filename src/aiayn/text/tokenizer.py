"""SentencePiece tokenization: train, load, encode, decode, with fixed special ids.

Every model this project trains reserves the same four ids, so code elsewhere (the
model's padding mask, collation, search) can use the constants below without looking at
the tokenizer:

====  =========  ======================================================
id    piece      meaning
====  =========  ======================================================
0     ``<pad>``  padding (``ModelConfig.pad_id``)
1     ``<unk>``  unknown piece
2     ``<s>``    BOS: first input token of the decoder (``tgt_in``)
3     ``</s>``   EOS: ends every source sequence and every ``tgt_out``
====  =========  ======================================================

Conventions (fairseq's): a source sequence is ``pieces + EOS``; a target sequence is stored
as ``pieces`` only, and collation builds ``BOS + y`` / ``y + EOS`` from it.

Files: a joint vocabulary (the paper's shared BPE, section 5.1) is one model file,
``spm.model``; separate vocabularies are ``spm.src.model`` and ``spm.tgt.model``. The files
live in the prepared-data directory and are copied into every checkpoint directory
(:meth:`Tokenizer.save`), so a checkpoint can be used without the data.
"""

from __future__ import annotations

import copy
import heapq
import io
import logging
import math
import os
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypedDict

import sentencepiece as spm

from aiayn.errors import DataError
from aiayn.fileio import write_atomic
from aiayn.text.shortlist import SHORTLIST_FILE, Shortlist
from aiayn.vocab import BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, SPECIAL_IDS, UNK, UNK_ID

log = logging.getLogger(__name__)


_LANG_TAG = re.compile(r"^>>[^\s<>]+<<$")
_LEADING_TAG = re.compile(r"^\s*(>>[^\s<>]+<<)(?:\s+|$)")


def lang_tag(lang: str) -> str:
    """The target-language tag of ``lang``: ``>>de<<``."""
    return f">>{lang}<<"


def is_lang_tag(piece: str) -> bool:
    return bool(_LANG_TAG.match(piece))


def leading_tag(text: str) -> str | None:
    """The target-language tag ``text`` starts with (``>>fr<< Bonjour`` -> ``>>fr<<``), if any."""
    match = _LEADING_TAG.match(text)
    return match.group(1) if match else None


class EmptyTrainingText(DataError):
    """No sentence to train SentencePiece on (the caller knows which files those were)."""



JOINT_MODEL = "spm.model"
SRC_MODEL = "spm.src.model"
TGT_MODEL = "spm.tgt.model"

MODEL_TYPES = ("bpe", "unigram", "word", "char")

# What a text argument of train_tokenizer may be: sentences (a list, or any iterable, e.g. a
# corpus read lazily), or one plain UTF-8 file.
Texts = Iterable[str] | os.PathLike


class Tokenizer:
    """Source and target SentencePiece processors (one shared processor when ``joint``)."""

    def __init__(self, src: spm.SentencePieceProcessor, tgt: spm.SentencePieceProcessor | None = None,
                 *, src_proto: bytes | None = None, tgt_proto: bytes | None = None) -> None:
        self.joint: bool = tgt is None
        self._src = src
        self._tgt = src if tgt is None else tgt
        # Serialized models: what save() writes and what pickling carries (DataLoader workers).
        self._src_proto = src_proto if src_proto is not None else src.serialized_model_proto()
        if self.joint:
            self._tgt_proto = self._src_proto
        else:
            self._tgt_proto = tgt_proto if tgt_proto is not None else self._tgt.serialized_model_proto()
        self.src_vocab_size: int = self._src.get_piece_size()
        self.tgt_vocab_size: int = self._tgt.get_piece_size()
        for side, proc in (("source", self._src), ("target", self._tgt)):
            _check_special_ids(proc, side)
        # The target-language tag every source sequence starts with (see tagged()).
        self._src_prefix: list[int] = []
        self.src_tag: str | None = None
        # The vocabulary shortlist of the training data, if prepare built one (saved beside
        # the model files: every checkpoint carries it).
        self.shortlist: Shortlist | None = None

    # ------------------------------------------------------------------ language tags

    def lang_tags(self) -> list[str]:
        """The source vocabulary's target-language tags (``>>de<<``, OPUS-MT's convention)."""
        return [p for p in (self._src.id_to_piece(i) for i in range(self.src_vocab_size)) if is_lang_tag(p)]

    def has_src_piece(self, piece: str) -> bool:
        return piece == UNK or self._src.piece_to_id(piece) != UNK_ID

    def tagged(self, tgt_lang: str | None) -> Tokenizer:
        """This tokenizer with every source sequence starting with the tag ``>>tgt_lang<<``
        (one piece of the source vocabulary; a :class:`DataError` when it has none); None:
        without a tag. Encoding the tag's id (not its text) leaves the sentence's own pieces
        as they are untagged, as Marian's tokenizer does."""
        out = copy.copy(self)
        out.src_tag = None if tgt_lang is None else lang_tag(tgt_lang)
        out._src_prefix = []
        if out.src_tag is not None:
            if not self.has_src_piece(out.src_tag):
                tags = self.lang_tags()
                raise DataError(f"the source vocabulary has no target-language tag {out.src_tag}"
                                + (f" (it has {', '.join(tags[:20])}{' ...' if len(tags) > 20 else ''})"
                                   if tags else " (it has none)"))
            out._src_prefix = [self._src.piece_to_id(out.src_tag)]
        return out

    # ------------------------------------------------------------------ encode/decode

    def encode_src(self, text: str) -> list[int]:
        """Piece ids of ``text`` followed by EOS (the encoder sees where the sentence ends),
        after a target-language tag: the text's own (see :meth:`split_tag`), else that of a
        :meth:`tagged` tokenizer."""
        prefix, rest = self.split_tag(text)
        return prefix + self._src.encode(rest) + [EOS_ID]

    def split_tag(self, text: str) -> tuple[list[int], str]:
        """(tag id(s), the rest of ``text``): a text that starts with a target-language tag
        of the source vocabulary (``>>fr<< Bonjour``, as Marian's tokenizer reads it) gives
        that tag's id and the text after it; any other text, this tokenizer's own tag (none
        unless :meth:`tagged`) and the text unchanged."""
        match = _LEADING_TAG.match(text)
        if match and self.has_src_piece(match.group(1)):
            return [self._src.piece_to_id(match.group(1))], text[match.end():]
        return self._src_prefix, text

    def encode_tgt(self, text: str) -> list[int]:
        """Piece ids only: collation adds BOS (decoder input) and EOS (decoder output)."""
        return self._tgt.encode(text)

    def encode_src_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
        """:meth:`encode_src` over many sentences, multi-threaded inside SentencePiece."""
        split = [self.split_tag(t) for t in texts]
        encoded = self._src.encode([rest for _, rest in split], num_threads=_threads(num_threads))
        return [prefix + ids + [EOS_ID] for (prefix, _), ids in zip(split, encoded)]

    def encode_tgt_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
        """:meth:`encode_tgt` over many sentences, multi-threaded inside SentencePiece."""
        return self._tgt.encode(list(texts), num_threads=_threads(num_threads))

    def decode_src(self, ids: Iterable[int]) -> str:
        """Detokenized text; PAD, BOS and EOS are dropped."""
        return self._src.decode(_strip_special(ids))

    def decode_tgt(self, ids: Iterable[int]) -> str:
        """Detokenized text; PAD, BOS and EOS are dropped (pass the raw search output)."""
        return self._tgt.decode(_strip_special(ids))

    def src_pieces(self, ids: Iterable[int]) -> list[str]:
        """One piece string per id, specials included (EOS -> ``</s>``), e.g. attention labels."""
        return [self._src.id_to_piece(i) for i in _ints(ids)]

    def tgt_pieces(self, ids: Iterable[int]) -> list[str]:
        return [self._tgt.id_to_piece(i) for i in _ints(ids)]

    def tokenize_src(self, text: str) -> list[str]:
        """Piece strings of ``text`` (no EOS), for display."""
        return self._src.encode(text, out_type=str)

    def tokenize_tgt(self, text: str) -> list[str]:
        return self._tgt.encode(text, out_type=str)

    def segmentation_sampler(self, side: str) -> SegmentationSampler:
        """What draws other segmentations of this side's encoded sentences (subword
        regularization); ``side`` is ``src`` or ``tgt``."""
        if side not in ("src", "tgt"):
            raise ValueError(f"side must be 'src' or 'tgt', got {side!r}")
        return SegmentationSampler(self._src if side == "src" else self._tgt)

    # ------------------------------------------------------------------ files

    @property
    def model_files(self) -> list[str]:
        """File names save() writes: ``[spm.model]`` or ``[spm.src.model, spm.tgt.model]``."""
        return [JOINT_MODEL] if self.joint else [SRC_MODEL, TGT_MODEL]

    def model_bytes(self) -> list[bytes]:
        """The serialized model(s), in the order of :attr:`model_files` (used for cache keys)."""
        return [self._src_proto] if self.joint else [self._src_proto, self._tgt_proto]

    def save(self, directory: str | os.PathLike) -> list[Path]:
        """Write the model file(s) into ``directory`` (atomically) and return their paths."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, data in zip(self.model_files, self.model_bytes()):
            path = directory / name
            write_atomic(path, data)
            paths.append(path)
        if self.shortlist is not None:
            write_atomic(directory / SHORTLIST_FILE, self.shortlist.to_bytes())
        return paths

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Tokenizer:
        """Load ``directory/spm.model`` (joint) or ``spm.src.model`` + ``spm.tgt.model``."""
        directory = Path(directory)
        joint = directory / JOINT_MODEL
        src, tgt = directory / SRC_MODEL, directory / TGT_MODEL
        if joint.is_file():
            proto = _read_model(joint)
            tok = cls(_processor(proto, joint), src_proto=proto)
        elif src.is_file() and tgt.is_file():
            sp, tp = _read_model(src), _read_model(tgt)
            tok = cls(_processor(sp, src), _processor(tp, tgt), src_proto=sp, tgt_proto=tp)
        else:
            raise DataError(
                f"{directory}: no tokenizer found (expected {JOINT_MODEL}, or {SRC_MODEL} and {TGT_MODEL})")
        shortlist = directory / SHORTLIST_FILE
        if shortlist.is_file():
            tok.shortlist = Shortlist.from_bytes(_read_model(shortlist), str(shortlist), tok.tgt_vocab_size)
        return tok

    # Pickling: SentencePiece processors are rebuilt from their serialized models.
    def __getstate__(self) -> dict[str, Any]:
        return {"src": self._src_proto, "tgt": None if self.joint else self._tgt_proto, "src_tag": self.src_tag,
                "shortlist": None if self.shortlist is None else self.shortlist.to_bytes()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        src = _processor(state["src"], "<pickled>")
        tgt = None if state["tgt"] is None else _processor(state["tgt"], "<pickled>")
        self.__init__(src, tgt, src_proto=state["src"], tgt_proto=state["tgt"])  # type: ignore[misc]
        if state.get("src_tag"):
            self._src_prefix = [self._src.piece_to_id(state["src_tag"])]
            self.src_tag = state["src_tag"]
        if state.get("shortlist") is not None:
            self.shortlist = Shortlist.from_bytes(state["shortlist"], "<pickled>", self.tgt_vocab_size)

    def __repr__(self) -> str:
        if self.joint:
            return f"Tokenizer(joint, vocab={self.src_vocab_size})"
        return f"Tokenizer(src vocab={self.src_vocab_size}, tgt vocab={self.tgt_vocab_size})"


# ---------------------------------------------------------------------- training


def train_tokenizer(
    src_texts: Texts,
    tgt_texts: Texts,
    out_dir: str | os.PathLike,
    vocab_size: int,
    joint: bool = True,
    character_coverage: float = 1.0,
    model_type: str = "bpe",
    input_sentence_size: int = 2_000_000,
    tgt_vocab_size: int | None = None,
    tgt_model_type: str | None = None,
    seed: int = 1,
    num_threads: int = -1,
    src_control_symbols: Sequence[str] = (),
) -> Tokenizer:
    """Train SentencePiece model(s) and write them into ``out_dir``.

    ``src_texts`` / ``tgt_texts``: an iterable of sentences (e.g. ``list[str]``), or a path
    (``pathlib.Path`` / ``os.PathLike``, *not* a plain ``str``, which would be ambiguous with
    a sentence) to a UTF-8 text file with one sentence per line.

    ``joint=True`` (the paper's shared vocabulary) trains one model on source + target text,
    written as ``spm.model``; ``joint=False`` trains ``spm.src.model`` on the source and
    ``spm.tgt.model`` on the target, whose size and type default to the source's.
    ``input_sentence_size`` caps the sentences SentencePiece samples for training (0 = all).
    ``model_type="word"`` makes every whitespace-separated symbol one piece (synthetic tasks,
    the tree side of parsing). The vocabulary limit is soft (``hard_vocab_limit=False``): a
    small corpus yields fewer pieces rather than an error; the real size is on the result.
    ``src_control_symbols`` (e.g. target-language tags, ``>>de<<``) are pieces of the source
    (joint) model that encoding text never produces: their ids are inserted by the caller.
    """
    out_dir = Path(out_dir)
    tgt_vocab_size = vocab_size if tgt_vocab_size is None else tgt_vocab_size
    tgt_model_type = model_type if tgt_model_type is None else tgt_model_type
    for mt in (model_type, tgt_model_type):
        if mt not in MODEL_TYPES:
            raise DataError(f"unknown SentencePiece model type {mt!r}; choose from {', '.join(MODEL_TYPES)}")
    common = _TrainOptions(character_coverage=character_coverage, input_sentence_size=input_sentence_size,
                           seed=seed, num_threads=num_threads)
    controls = list(src_control_symbols)
    if joint:
        proto = _train_one(_chain(src_texts, tgt_texts), vocab_size, model_type, control_symbols=controls, **common)
        tok = Tokenizer(_processor(proto, "trained model"), src_proto=proto)
    else:
        sp = _train_one(_chain(src_texts), vocab_size, model_type, control_symbols=controls, **common)
        tp = _train_one(_chain(tgt_texts), tgt_vocab_size, tgt_model_type, **common)
        tok = Tokenizer(_processor(sp, "trained source model"), _processor(tp, "trained target model"),
                        src_proto=sp, tgt_proto=tp)
    for side, asked, got in (("source", vocab_size, tok.src_vocab_size),
                             ("target", tgt_vocab_size, tok.tgt_vocab_size)):
        if got < asked and model_type != "word":
            log.info("%s vocabulary: %d pieces (asked for %d; the training text supports no more)",
                     side, got, asked)
        if joint:
            break
    tok.save(out_dir)
    return tok


class _TrainOptions(TypedDict):
    """The SentencePiece options both sides of a separate vocabulary share."""

    character_coverage: float
    input_sentence_size: int
    seed: int
    num_threads: int


def _train_one(sentences: Iterator[str], vocab_size: int, model_type: str, *, character_coverage: float,
               input_sentence_size: int, seed: int, num_threads: int,
               control_symbols: Sequence[str] = ()) -> bytes:
    buf = io.BytesIO()
    # SentencePiece samples input sentences with its own global generator; seeding it makes
    # the trained model (and hence every id downstream) reproducible.
    spm.set_random_generator_seed(seed)
    options: dict[str, Any] = dict(
        vocab_size=vocab_size, model_type=model_type, character_coverage=character_coverage,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        pad_piece=PAD, unk_piece=UNK, bos_piece=BOS, eos_piece=EOS,
        input_sentence_size=input_sentence_size, shuffle_input_sentence=True,
        # Soft limit: small corpora (tests, synthetic tasks, word models) give fewer pieces
        # instead of "Vocabulary size too high".
        hard_vocab_limit=False,
        num_threads=_threads(num_threads), minloglevel=2,
        # Long sentences (WMT has some) are otherwise skipped silently by the trainer.
        max_sentence_length=1 << 16,
    )
    if control_symbols:
        options["control_symbols"] = list(control_symbols)
    if model_type == "word":
        # Symbols like "s10" must stay whole, digits included.
        options["split_digits"] = False
    # An error raised while reading the text (bad UTF-8, misaligned files...) would come back
    # wrapped in SentencePiece's RuntimeError; keep it and re-raise it as it was.
    failure: list[BaseException] = []
    seen = [0]

    def guarded() -> Iterator[str]:
        try:
            for sentence in sentences:
                seen[0] += 1
                yield sentence
        except Exception as exc:  # re-raised below, unchanged
            failure.append(exc)

    try:
        spm.SentencePieceTrainer.train(sentence_iterator=guarded(), model_writer=buf, **options)
    except RuntimeError as exc:
        if failure:
            raise failure[0] from None
        if seen[0] == 0:
            raise EmptyTrainingText("no sentences to train the tokenizer on: the training text is empty") from None
        raise DataError(f"SentencePiece training failed: {exc}") from None
    if failure:
        raise failure[0]
    return buf.getvalue()


def _chain(*texts: Texts) -> Iterator[str]:
    for t in texts:
        if isinstance(t, os.PathLike):
            path = Path(t)
            if not path.is_file():
                raise DataError(f"{path}: file not found")
            with path.open(encoding="utf-8", newline="\n") as f:
                for line in f:
                    line = line.strip()
                    if line:
                        yield line
        else:
            if isinstance(t, str):
                raise TypeError("train_tokenizer takes a list of sentences or a pathlib.Path, not a str")
            for line in t:
                if line:
                    yield line


# ---------------------------------------------------------------------- sampling


class SegmentationSampler:
    """Draws another segmentation of an encoded sentence (subword regularization), from a
    random generator the caller seeds.

    SentencePiece can sample by itself (``encode(..., enable_sampling=True)``), but from a
    generator of its own whose seed does not make the draws repeatable from one process to
    the next (sentencepiece 0.2: the same seed gives the same draws within a process, other
    ones in the next), and exact resume needs them repeatable. So the draw is made here, by
    the model's own rules, with a ``random.Random``:

    * BPE models: BPE-dropout (Provilkov et al., 2020) as SentencePiece runs it: starting from
      single characters, the adjacent pair whose merged piece scores best (the leftmost
      among equals) is merged, again and again, and each merge is skipped with probability
      ``alpha``. With ``alpha`` 0 that is SentencePiece's own segmentation (:meth:`replay`).
    * unigram models: SentencePiece's n-best sampling: one of the ``nbest`` most likely
      segmentations (its n-best list), drawn with probability proportional to the
      segmentation's likelihood to the power ``alpha``.

    The text is the sentence's own pieces (their concatenation is the normalized text that
    SentencePiece segmented), so nothing is decoded and re-normalized for BPE. A sentence
    holding a piece that does not stand for its text (unknown, byte, control) is left as it
    is: :meth:`sample` returns None.
    """

    def __init__(self, sp: spm.SentencePieceProcessor) -> None:
        self._sp = sp
        n = sp.get_piece_size()
        self._pieces = [sp.id_to_piece(i) for i in range(n)]
        self._is_text = [not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i)) for i in range(n)]
        self._scores = [float(sp.get_score(i)) for i in range(n)]
        # What a merge may produce: SentencePiece's pieces other than control, unknown, byte.
        self._ids = {p: i for i, p in enumerate(self._pieces) if self._is_text[i]}
        self._merge_scores = {p: self._scores[i] for p, i in self._ids.items()}
        self.kind = "unigram" if _has_nbest(sp) else "bpe"

    def sample(self, ids: Sequence[int], alpha: float, nbest: int, rng: random.Random) -> list[int] | None:
        """Piece ids of a segmentation of the text of ``ids`` (pieces only, no EOS) drawn with
        ``rng``; None if ``ids`` holds a piece that is not text, or the draw holds a piece
        outside the vocabulary."""
        ids = [int(i) for i in ids]
        if not all(self._is_text[i] for i in ids):
            return None
        if self.kind == "unigram":
            return self._nbest_draw(ids, alpha, nbest, rng)
        text = "".join(self._pieces[i] for i in ids)
        return self._to_ids(bpe_merge(text, self._merge_scores, alpha, rng))

    def replay(self, ids: Sequence[int]) -> list[int] | None:
        """The deterministic segmentation recomputed from the text of ``ids`` (UNK for a piece
        outside the vocabulary): ``ids`` again wherever :meth:`sample` follows this model's
        rules, which makes it a check of that; None if ``ids`` holds a piece that is not text."""
        ids = [int(i) for i in ids]
        if not all(self._is_text[i] for i in ids):
            return None
        if self.kind == "unigram":
            return list(self._sp.encode(self._sp.decode(ids)))
        pieces = bpe_merge("".join(self._pieces[i] for i in ids), self._merge_scores, 0.0, None)
        return [self._ids.get(p, UNK_ID) for p in pieces]

    def _to_ids(self, pieces: list[str]) -> list[int] | None:
        out = [self._ids.get(p) for p in pieces]
        return None if any(i is None for i in out) else [i for i in out if i is not None]

    def _nbest_draw(self, ids: list[int], alpha: float, nbest: int, rng: random.Random) -> list[int] | None:
        candidates = self._sp.nbest_encode(self._sp.decode(ids), nbest_size=nbest, out_type=int)
        if not candidates:
            return None
        # A segmentation's log-likelihood is the sum of its pieces' scores (log probabilities).
        logp = [alpha * sum(self._scores[i] for i in c) for c in candidates]
        top = max(logp)
        weights = [math.exp(x - top) for x in logp]
        u = rng.random() * sum(weights)
        for candidate, w in zip(candidates, weights):
            u -= w
            if u < 0:
                return list(candidate)
        return list(candidates[-1])


def bpe_merge(text: str, scores: dict[str, float], alpha: float, rng: random.Random | None) -> list[str]:
    """SentencePiece's BPE encoding of ``text`` (normalized: spaces as U+2581) into pieces,
    skipping each merge with probability ``alpha`` (BPE-dropout; ``rng`` draws, unused at 0).

    As SentencePiece's ``bpe::Model::SampleEncode``: every adjacent pair whose concatenation
    is a piece (``scores``: piece -> score) waits in a queue, best score first and leftmost
    among equals; a popped pair that is out of date (either side merged since) is dropped, a
    valid one is merged -- unless skipped, when it is dropped for good -- and the merged
    symbol's pairs with its new neighbours join the queue.
    """
    symbols = list(text)
    n = len(symbols)
    prev = list(range(-1, n - 1))
    nxt = list(range(1, n + 1))
    if n:
        nxt[-1] = -1
    # Hot loop (every sentence, every epoch): bound methods in locals, pushes inlined.
    get, push, pop = scores.get, heapq.heappush, heapq.heappop
    draw = rng.random if rng is not None and alpha > 0 else None
    agenda: list[tuple[float, int, int, int]] = []
    for i in range(1, n):
        score = get(symbols[i - 1] + symbols[i])
        if score is not None:
            push(agenda, (-score, i - 1, i, 2))
    while agenda:
        _, left, right, size = pop(agenda)
        merged = symbols[left] + symbols[right]
        if not symbols[left] or not symbols[right] or len(merged) != size:
            continue  # out of date: a side was merged into something else since
        if draw is not None and draw() < alpha:
            continue
        symbols[left] = merged
        symbols[right] = ""
        after = nxt[left] = nxt[right]
        if after >= 0:
            prev[after] = left
            score = get(merged + symbols[after])
            if score is not None:
                push(agenda, (-score, left, after, len(merged) + len(symbols[after])))
        before = prev[left]
        if before >= 0:
            score = get(symbols[before] + merged)
            if score is not None:
                push(agenda, (-score, before, left, len(symbols[before]) + len(merged)))
    return [s for s in symbols if s]


def _has_nbest(sp: spm.SentencePieceProcessor) -> bool:
    """Whether the model lists n-best segmentations: unigram models do, BPE models do not."""
    try:
        sp.nbest_encode("a", nbest_size=2)
    except RuntimeError:
        return False
    return True


# ---------------------------------------------------------------------- helpers


def _read_model(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read tokenizer model: {exc.strerror}") from None


def _processor(proto: bytes, where: str | os.PathLike) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(proto)
    except (RuntimeError, OSError) as exc:
        raise DataError(f"{where}: not a SentencePiece model ({exc})") from None
    return sp


def _check_special_ids(sp: spm.SentencePieceProcessor, side: str) -> None:
    got = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if got != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise DataError(
            f"{side} tokenizer: special ids pad/unk/bos/eos are {got}, expected "
            f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)} (train it with aiayn.text.train_tokenizer)")


def _ints(ids: Iterable[int]) -> list[int]:
    # Accepts lists, numpy arrays and (CPU or GPU) tensors.
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    return [int(i) for i in ids]


def _strip_special(ids: Iterable[int]) -> list[int]:
    return [i for i in _ints(ids) if i not in SPECIAL_IDS]


def _threads(n: int) -> int:
    return n if n > 0 else (os.cpu_count() or 1)
