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

import io
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypedDict

import sentencepiece as spm

from aiayn.errors import DataError
from aiayn.fileio import write_atomic
from aiayn.vocab import BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, SPECIAL_IDS, UNK, UNK_ID

log = logging.getLogger(__name__)


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

    # ------------------------------------------------------------------ encode/decode

    def encode_src(self, text: str) -> list[int]:
        """Piece ids of ``text`` followed by EOS (the encoder sees where the sentence ends)."""
        return self._src.encode(text) + [EOS_ID]

    def encode_tgt(self, text: str) -> list[int]:
        """Piece ids only: collation adds BOS (decoder input) and EOS (decoder output)."""
        return self._tgt.encode(text)

    def encode_src_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
        """:meth:`encode_src` over many sentences, multi-threaded inside SentencePiece."""
        return [ids + [EOS_ID] for ids in self._src.encode(list(texts), num_threads=_threads(num_threads))]

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
        return paths

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Tokenizer:
        """Load ``directory/spm.model`` (joint) or ``spm.src.model`` + ``spm.tgt.model``."""
        directory = Path(directory)
        joint = directory / JOINT_MODEL
        if joint.is_file():
            proto = _read_model(joint)
            return cls(_processor(proto, joint), src_proto=proto)
        src, tgt = directory / SRC_MODEL, directory / TGT_MODEL
        if src.is_file() and tgt.is_file():
            sp, tp = _read_model(src), _read_model(tgt)
            return cls(_processor(sp, src), _processor(tp, tgt), src_proto=sp, tgt_proto=tp)
        raise DataError(
            f"{directory}: no tokenizer found (expected {JOINT_MODEL}, or {SRC_MODEL} and {TGT_MODEL})")

    # Pickling: SentencePiece processors are rebuilt from their serialized models.
    def __getstate__(self) -> dict[str, Any]:
        return {"src": self._src_proto, "tgt": None if self.joint else self._tgt_proto}

    def __setstate__(self, state: dict[str, Any]) -> None:
        src = _processor(state["src"], "<pickled>")
        tgt = None if state["tgt"] is None else _processor(state["tgt"], "<pickled>")
        self.__init__(src, tgt, src_proto=state["src"], tgt_proto=state["tgt"])  # type: ignore[misc]

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
    """
    out_dir = Path(out_dir)
    tgt_vocab_size = vocab_size if tgt_vocab_size is None else tgt_vocab_size
    tgt_model_type = model_type if tgt_model_type is None else tgt_model_type
    for mt in (model_type, tgt_model_type):
        if mt not in MODEL_TYPES:
            raise DataError(f"unknown SentencePiece model type {mt!r}; choose from {', '.join(MODEL_TYPES)}")
    common = _TrainOptions(character_coverage=character_coverage, input_sentence_size=input_sentence_size,
                           seed=seed, num_threads=num_threads)
    if joint:
        proto = _train_one(_chain(src_texts, tgt_texts), vocab_size, model_type, **common)
        tok = Tokenizer(_processor(proto, "trained model"), src_proto=proto)
    else:
        sp = _train_one(_chain(src_texts), vocab_size, model_type, **common)
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
               input_sentence_size: int, seed: int, num_threads: int) -> bytes:
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
