"""Read and rewrite SentencePiece model files (``ModelProto``) without protobuf.

A SentencePiece model is a protobuf ``ModelProto``: repeated ``pieces`` (field 1: piece
string, score, type), a ``trainer_spec`` (2), a ``normalizer_spec`` (3), ``self_test_data``
(4) and a ``denormalizer_spec`` (5). A piece's id is its position in ``pieces``.

Importing a Marian model needs SentencePiece models whose ids are aiayn's (pad 0, unk 1,
bos 2, eos 3, then the model's vocabulary rows): :func:`rebuild_model` writes one from the
Marian model's own file, re-ordering the pieces but keeping each piece's score and type, so
segmentation is unchanged (BPE merges and unigram costs depend on scores, not on ids).
The encoding here is the protobuf wire format, which is small enough to handle directly;
fields this module does not touch are copied through byte for byte.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# ModelProto.SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# TrainerSpec fields for the special ids and their piece strings.
_UNK_ID, _BOS_ID, _EOS_ID, _PAD_ID = 40, 41, 42, 43
_UNK_PIECE, _BOS_PIECE, _EOS_PIECE, _PAD_PIECE = 45, 46, 47, 48
_TRAINER_VOCAB_SIZE = 4
_SPECIAL_FIELDS = {_UNK_ID, _BOS_ID, _EOS_ID, _PAD_ID, _UNK_PIECE, _BOS_PIECE, _EOS_PIECE, _PAD_PIECE,
                   _TRAINER_VOCAB_SIZE}


class ProtoError(ValueError):
    """The bytes are not a well-formed SentencePiece model."""


@dataclass
class Piece:
    piece: str
    score: float = 0.0
    type: int = NORMAL


# ----------------------------------------------------------------------- wire format


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtoError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtoError("varint too long")


def _varint(value: int) -> bytes:
    if value < 0:  # int32 negatives are encoded as 64-bit two's complement
        value += 1 << 64
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf: bytes) -> list[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) triples; value is an int for varints, else bytes."""
    out: list[tuple[int, int, bytes | int]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
            out.append((field, wire, value))
        elif wire == 1:
            out.append((field, wire, buf[pos:pos + 8]))
            pos += 8
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            if pos + length > len(buf):
                raise ProtoError("truncated length-delimited field")
            out.append((field, wire, buf[pos:pos + length]))
            pos += length
        elif wire == 5:
            out.append((field, wire, buf[pos:pos + 4]))
            pos += 4
        else:
            raise ProtoError(f"unsupported wire type {wire}")
    if pos != len(buf):
        raise ProtoError("trailing bytes")
    return out


def _encode(field: int, wire: int, value: bytes | int) -> bytes:
    key = _varint((field << 3) | wire)
    if wire == 0:
        assert isinstance(value, int)
        return key + _varint(value)
    assert isinstance(value, bytes)
    if wire == 2:
        return key + _varint(len(value)) + value
    return key + value


def _int32(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# ----------------------------------------------------------------------- model files


def read_pieces(proto: bytes) -> list[Piece]:
    """The pieces of a serialized SentencePiece model, in id order."""
    pieces = []
    for field, wire, value in _fields(proto):
        if field != 1 or wire != 2:
            continue
        p = Piece("")
        assert isinstance(value, bytes)
        for f, w, v in _fields(value):
            if f == 1 and w == 2:
                p.piece = bytes(v).decode("utf-8")
            elif f == 2 and w == 5:
                p.score = struct.unpack("<f", v)[0]  # type: ignore[arg-type]
            elif f == 3 and w == 0:
                p.type = int(v)
        pieces.append(p)
    return pieces


def _encode_piece(p: Piece) -> bytes:
    body = _encode(1, 2, p.piece.encode("utf-8")) + _encode(2, 5, struct.pack("<f", p.score))
    if p.type != NORMAL:
        body += _encode(3, 0, p.type)
    return body


def rebuild_model(template: bytes, pieces: list[Piece], *, unk_id: int, bos_id: int, eos_id: int,
                  pad_id: int) -> bytes:
    """A model with ``template``'s normalizer and trainer settings and the given pieces.

    The special ids (and their piece strings, taken from ``pieces``) are written into the
    trainer spec, which is where SentencePiece looks them up. The template's self-test data
    is dropped: it was written for the template's pieces.
    """
    out = bytearray()
    for p in pieces:
        out += _encode(1, 2, _encode_piece(p))
    for field, wire, value in _fields(template):
        if field == 1 or field == 4:
            continue
        if field == 2 and wire == 2:
            assert isinstance(value, bytes)
            spec = bytearray()
            for f, w, v in _fields(value):
                if f not in _SPECIAL_FIELDS:
                    spec += _encode(f, w, v)
            spec += _encode(_TRAINER_VOCAB_SIZE, 0, len(pieces))
            for id_field, piece_field, i in ((_UNK_ID, _UNK_PIECE, unk_id), (_BOS_ID, _BOS_PIECE, bos_id),
                                             (_EOS_ID, _EOS_PIECE, eos_id), (_PAD_ID, _PAD_PIECE, pad_id)):
                spec += _encode(id_field, 0, i)
                spec += _encode(piece_field, 2, pieces[i].piece.encode("utf-8"))
            out += _encode(2, 2, bytes(spec))
        else:
            out += _encode(field, wire, value)
    return bytes(out)


def trainer_int(proto: bytes, field: int) -> int | None:
    """An int field of the trainer spec (e.g. 3 = model_type: 1 unigram, 2 bpe, 3 word, 4 char)."""
    for f, w, v in _fields(proto):
        if f == 2 and w == 2:
            assert isinstance(v, bytes)
            for f2, w2, v2 in _fields(v):
                if f2 == field and w2 == 0:
                    return _int32(int(v2))
    return None
