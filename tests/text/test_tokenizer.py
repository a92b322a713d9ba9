"""SentencePiece tokenizer: special ids, encode/decode round trips, save/load, word models."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.errors import DataError
from aiayn.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, train_tokenizer

SRC = [
    "A man in an orange hat starring at something.",
    "Two young, White males are outside near many bushes.",
    "A little girl climbing into a wooden playhouse.",
    "Several men in hard hats are operating a giant pulley system.",
    "A boston terrier is running on lush green grass in front of a white fence.",
] * 8
TGT = [
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "Mehrere Männer mit Schutzhelmen bedienen ein Antriebsradsystem.",
    "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
] * 8


@pytest.fixture(scope="module")
def joint(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return train_tokenizer(SRC, TGT, tmp_path_factory.mktemp("joint"), vocab_size=200)


def test_special_ids_are_fixed(joint: Tokenizer) -> None:
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert joint.src_pieces([PAD_ID, UNK_ID, BOS_ID, EOS_ID]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert joint.joint and joint.src_vocab_size == joint.tgt_vocab_size <= 200


def test_encode_conventions(joint: Tokenizer) -> None:
    src = joint.encode_src(SRC[0])
    tgt = joint.encode_tgt(TGT[0])
    assert src[-1] == EOS_ID and EOS_ID not in src[:-1]
    assert BOS_ID not in tgt and EOS_ID not in tgt and PAD_ID not in tgt
    assert joint.src_pieces(src)[-1] == "</s>"
    assert joint.encode_src_batch(SRC[:3]) == [joint.encode_src(s) for s in SRC[:3]]
    assert joint.encode_tgt_batch(TGT[:3]) == [joint.encode_tgt(t) for t in TGT[:3]]


@pytest.mark.parametrize("i", range(5))
def test_round_trip(joint: Tokenizer, i: int) -> None:
    assert joint.decode_src(joint.encode_src(SRC[i])) == SRC[i]
    assert joint.decode_tgt(joint.encode_tgt(TGT[i])) == TGT[i]


def test_decode_drops_specials_and_takes_tensors(joint: Tokenizer) -> None:
    ids = joint.encode_tgt(TGT[1])
    padded = [BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]
    assert joint.decode_tgt(padded) == TGT[1]
    assert joint.decode_tgt(torch.tensor(padded)) == TGT[1]
    assert joint.decode_tgt(np.array(padded)) == TGT[1]


def test_save_load_round_trip(joint: Tokenizer, tmp_path: Path) -> None:
    paths = joint.save(tmp_path / "ckpt")
    assert [p.name for p in paths] == ["spm.model"]
    again = Tokenizer.load(tmp_path / "ckpt")
    assert again.joint and again.encode_src(SRC[2]) == joint.encode_src(SRC[2])
    clone = pickle.loads(pickle.dumps(joint))
    assert clone.encode_tgt(TGT[3]) == joint.encode_tgt(TGT[3])


def test_separate_vocabularies(tmp_path: Path) -> None:
    tok = train_tokenizer(SRC, TGT, tmp_path, vocab_size=150, joint=False, tgt_vocab_size=120)
    assert not tok.joint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.src.model", "spm.tgt.model"]
    assert tok.src_vocab_size <= 150 and tok.tgt_vocab_size <= 120
    again = Tokenizer.load(tmp_path)
    assert not again.joint and again.decode_tgt(again.encode_tgt(TGT[4])) == TGT[4]
    saved = tok.save(tmp_path / "copy")
    assert [p.name for p in saved] == ["spm.src.model", "spm.tgt.model"]


def test_word_model_one_token_per_symbol(tmp_path: Path) -> None:
    src = ["s1 s2 s10", "s3 s10 s1 s4"] * 5
    tgt = ["s10 s2 s1", "s4 s1 s10 s3"] * 5
    tok = train_tokenizer(src, tgt, tmp_path, vocab_size=100, model_type="word")
    assert tok.src_vocab_size == 4 + 5  # specials + s1 s2 s3 s4 s10: the soft limit
    assert len(tok.encode_src("s3 s10 s1 s4")) == 5  # 4 symbols + EOS
    assert tok.tgt_pieces(tok.encode_tgt("s10 s2")) == ["▁s10", "▁s2"]
    assert tok.decode_tgt(tok.encode_tgt("s4 s1 s10 s3")) == "s4 s1 s10 s3"


def test_train_from_files_and_deterministic(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("\n".join(SRC) + "\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("\n".join(TGT) + "\n", encoding="utf-8")
    one = train_tokenizer(tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "one", vocab_size=120)
    two = train_tokenizer(list(SRC), list(TGT), tmp_path / "two", vocab_size=120)
    assert one.model_bytes() == two.model_bytes()
    with pytest.raises(TypeError):
        train_tokenizer("not a path", TGT, tmp_path / "x", vocab_size=50)  # type: ignore[arg-type]


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no tokenizer found"):
        Tokenizer.load(tmp_path)
    (tmp_path / "spm.model").write_bytes(b"not a model")
    with pytest.raises(DataError, match="spm.model"):
        Tokenizer.load(tmp_path)


def test_an_empty_corpus_is_our_error_not_sentencepieces(tmp_path: Path) -> None:
    """Regression: empty training text gave SentencePiece's internal check message."""
    with pytest.raises(DataError, match="^no sentences to train the tokenizer on"):
        train_tokenizer([], [], tmp_path / "spm", 100)
