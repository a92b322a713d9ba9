"""Read and rewrite SentencePiece model files (``ModelProto``) with the protobuf classes the
sentencepiece wheel ships (``sentencepiece.sentencepiece_model_pb2``; needs ``protobuf``,
part of the ``interop`` extra).

Importing a Marian model needs SentencePiece models whose ids are aiayn's (pad 0, unk 1,
bos 2, eos 3, then the model's vocabulary rows): :func:`rebuild_model` writes one from the
Marian model's own file, re-ordering the pieces but keeping each piece's score and type, so
segmentation is unchanged (BPE merges and unigram costs depend on scores, not on ids). A
piece's id is its position in ``ModelProto.pieces``. Extending a vocabulary
(:mod:`aiayn.text.extend`) appends pieces with :func:`append_pieces`, every earlier id kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiayn.errors import InteropError

# ModelProto.SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


class ProtoError(ValueError):
    """The bytes are not a well-formed SentencePiece model."""


@dataclass
class Piece:
    piece: str
    score: float = 0.0
    type: int = NORMAL


def _model(proto: bytes) -> Any:
    """The parsed ``ModelProto`` (a :class:`ProtoError` for bytes that are not one)."""
    try:
        from google.protobuf.message import DecodeError
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:
        raise InteropError("this needs the 'protobuf' package: pip install 'aiayn[interop]'") from None

    model = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated at import
    try:
        model.ParseFromString(proto)
    except DecodeError as exc:
        raise ProtoError(str(exc) or "not a protobuf message") from None
    return model


def read_pieces(proto: bytes) -> list[Piece]:
    """The pieces of a serialized SentencePiece model, in id order."""
    return [Piece(p.piece, p.score, p.type) for p in _model(proto).pieces]


def rebuild_model(template: bytes, pieces: list[Piece], *, unk_id: int, bos_id: int, eos_id: int,
                  pad_id: int) -> bytes:
    """A model with ``template``'s normalizer and trainer settings and the given pieces.

    The special ids (and their piece strings, taken from ``pieces``) are written into the
    trainer spec, which is where SentencePiece looks them up.
    """
    model = _model(template)
    del model.pieces[:]
    for p in pieces:
        model.pieces.add(piece=p.piece, score=p.score, type=p.type)
    # The wheel's ModelProto leaves out self_test_data (field 4), so it is kept as an unknown
    # field: dropped here, since it was written for the template's pieces.
    model.DiscardUnknownFields()
    spec = model.trainer_spec
    spec.vocab_size = len(pieces)
    spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id = unk_id, bos_id, eos_id, pad_id
    spec.unk_piece, spec.bos_piece = pieces[unk_id].piece, pieces[bos_id].piece
    spec.eos_piece, spec.pad_piece = pieces[eos_id].piece, pieces[pad_id].piece
    return bytes(model.SerializeToString())


def model_type(proto: bytes) -> str:
    """The model's algorithm: ``unigram``, ``bpe``, ``word`` or ``char``."""
    names = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}
    return names.get(int(_model(proto).trainer_spec.model_type), "unigram")


def append_pieces(proto: bytes, pieces: list[Piece]) -> bytes:
    """``proto`` with ``pieces`` added after its own (whose ids do not change); a piece the
    model already has is a :class:`ProtoError`."""
    model = _model(proto)
    have = {p.piece for p in model.pieces}
    for p in pieces:
        if p.piece in have:
            raise ProtoError(f"the model already has the piece {p.piece!r}")
        have.add(p.piece)
        model.pieces.add(piece=p.piece, score=p.score, type=p.type)
    # self_test_data (an unknown field to the wheel's ModelProto) was written for the old pieces.
    model.DiscardUnknownFields()
    model.trainer_spec.vocab_size = len(model.pieces)
    return bytes(model.SerializeToString())
