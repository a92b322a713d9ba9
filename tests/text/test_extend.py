"""Extending a SentencePiece model with pieces learned on new text: old ids kept, the
segmentation guarantees of aiayn.text.extend."""

from __future__ import annotations

import pytest

from aiayn.text import spm_proto
from aiayn.text.extend import extend_model, extend_tokenizer
from aiayn.text.tokenizer import UNK_ID, train_tokenizer

pytest.importorskip("google.protobuf")

OLD_TEXT = ["a small dog runs in the park", "the red house is old", "two men play football",
            "a woman reads a book", "the dog sleeps", "children play in the garden"] * 20
NEW_TEXT = ["the parliament approved the budget", "inflation rose sharply in the eurozone",
            "the central bank raised interest rates", "parliament debated the budget again",
            "the eurozone economy grew slowly", "ministers met in brussels"] * 20


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train_tokenizer(OLD_TEXT, OLD_TEXT, tmp_path_factory.mktemp("bpe"), 90)


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_old_ids_are_kept_and_n_pieces_added(tmp_path, model_type):
    tok = train_tokenizer(OLD_TEXT, OLD_TEXT, tmp_path, 90, model_type=model_type)
    n = tok.src_vocab_size
    ext, report = extend_tokenizer(tok, NEW_TEXT, NEW_TEXT, 15)
    assert report == {"joint": {"old": n, "new": n + 15, "added": 15, "asked": 15}}
    assert ext.src_vocab_size == n + 15
    assert ext.src_pieces(range(n)) == tok.src_pieces(range(n))
    old_pieces = spm_proto.read_pieces(tok.model_bytes()[0])
    new_pieces = spm_proto.read_pieces(ext.model_bytes()[0])
    assert new_pieces[:n] == old_pieces  # strings, scores and types of the old pieces unchanged
    added = {p.piece for p in new_pieces[n:]}
    assert len(added) == 15 and not added & {p.piece for p in old_pieces}
    assert all(p.type == spm_proto.NORMAL for p in new_pieces[n:])
    # The new text is encoded with the added pieces: fewer pieces than before.
    assert sum(map(len, ext.encode_src_batch(NEW_TEXT))) < sum(map(len, tok.encode_src_batch(NEW_TEXT)))
    assert any(i >= n for ids in ext.encode_src_batch(NEW_TEXT) for i in ids)
    for s in set(OLD_TEXT):  # decoding is unchanged
        assert ext.decode_src(ext.encode_src(s)) == tok.decode_src(tok.encode_src(s))


def test_bpe_segmentation_guarantee(bpe):
    """Every added BPE piece can be produced, and a text whose old segmentation has no two
    adjacent pieces joining into an added piece is segmented into the same pieces."""
    ext, _ = extend_tokenizer(bpe, NEW_TEXT, NEW_TEXT, 40)
    n = bpe.src_vocab_size
    added = set(ext.src_pieces(range(n, ext.src_vocab_size)))
    produced = {p for s in NEW_TEXT for p in ext.tokenize_src(s)} & added
    assert produced, "no added piece is ever produced"
    covered = 0
    for s in set(OLD_TEXT) | set(NEW_TEXT) | {"a dog in the parliament", "zebra quiz 42%"}:
        old = bpe.tokenize_src(s)
        if not any(a + b in added for a, b in zip(old, old[1:])):
            covered += 1
            assert ext.tokenize_src(s) == old, s
            # The same ids, but for characters the old model lacked (<unk>), now added.
            old_ids, new_ids = bpe.encode_src(s), ext.encode_src(s)
            assert all(o == w for o, w in zip(old_ids, new_ids, strict=True) if o != UNK_ID), s
    assert covered >= len(set(OLD_TEXT))  # the old text is covered by the guarantee


def test_fewer_candidates_than_asked_adds_what_there_is(bpe):
    proto = bpe.model_bytes()[0]
    out, ext = extend_model(proto, ["the dog"] * 5, 50)
    assert ext.report()["added"] < 50 and ext.report()["asked"] == 50
    assert len(spm_proto.read_pieces(out)) == bpe.src_vocab_size + len(ext.added)
    same, none = extend_model(proto, NEW_TEXT, 0)
    assert same == proto and none.added == []


def test_separate_models_are_extended_each_on_its_side(tmp_path):
    tok = train_tokenizer(OLD_TEXT, [s.upper() for s in OLD_TEXT], tmp_path, 60, joint=False)
    ext, report = extend_tokenizer(tok, NEW_TEXT, [s.upper() for s in NEW_TEXT], 10)
    assert set(report) == {"source", "target"}
    assert ext.src_vocab_size == tok.src_vocab_size + 10 and ext.tgt_vocab_size == tok.tgt_vocab_size + 10
    assert all(p.isupper() or not p.strip("▁").isalpha()
               for p in ext.tgt_pieces(range(tok.tgt_vocab_size, ext.tgt_vocab_size)))


def test_append_pieces_refuses_a_piece_the_model_has(bpe):
    with pytest.raises(spm_proto.ProtoError, match="already has the piece '▁the'"):
        spm_proto.append_pieces(bpe.model_bytes()[0], [spm_proto.Piece("▁the")])
