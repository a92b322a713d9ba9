"""Binarized splits: ids as encoded, filters counted, cache reused and invalidated."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from aiayn.data.batching import BatchIterator, collate
from aiayn.data.binarize import TokenDataset, binarize, binarize_files
from aiayn.data.corpus import FilterConfig
from aiayn.errors import DataError
from aiayn.text import EOS_ID, Tokenizer, train_tokenizer

SRC = ["a small dog runs", "the red house", "two men play football in the park", "hello"] * 6
TGT = ["ein kleiner hund rennt", "das rote haus", "zwei männer spielen fußball im park", "hallo"] * 6


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return train_tokenizer(SRC, TGT, tmp_path_factory.mktemp("tok"), vocab_size=120)


def write_pair(d: Path, src: list[str], tgt: list[str]) -> tuple[Path, Path]:
    d.mkdir(parents=True, exist_ok=True)
    (d / "x.src").write_text("\n".join(src) + "\n", encoding="utf-8")
    (d / "x.tgt").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return d / "x.src", d / "x.tgt"


def test_ids_match_tokenizer_and_are_memory_mapped(tok: Tokenizer, tmp_path: Path) -> None:
    pairs = list(zip(SRC[:4], TGT[:4]))
    ds = binarize(pairs, tok, tmp_path / "split")
    assert len(ds) == 4
    for i, (s, t) in enumerate(pairs):
        x, y = ds[i]
        assert x.tolist() == tok.encode_src(s) and x[-1] == EOS_ID
        assert y.tolist() == tok.encode_tgt(t)
        assert x.dtype == np.int64
    assert ds.src_sizes.tolist() == [len(tok.encode_src(s)) for s in SRC[:4]]
    assert ds.tgt_sizes.tolist() == [len(tok.encode_tgt(t)) for t in TGT[:4]]
    assert isinstance(TokenDataset(tmp_path / "split")._src, np.memmap)
    assert ds.meta["dtype"] == "uint16"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_filters_drop_and_count_training_pairs_only(tok: Tokenizer, tmp_path: Path) -> None:
    long = " ".join(["house"] * 40)
    pairs = [("a small dog", "ein kleiner hund"), ("", "leer"), ("hello", ""), (long, long),
             ("hello", "zwei männer spielen fußball im park zwei männer spielen fußball im park")]
    filters = FilterConfig(max_len=30, max_len_ratio=5.0)
    train = binarize(pairs, tok, tmp_path / "train", filters)
    assert len(train) == 1
    assert train.stats["dropped"] == {"empty": 2, "too_long": 1, "ratio": 1}
    assert train.kept_lines.tolist() == [0]
    valid = binarize(pairs, tok, tmp_path / "valid", None)  # evaluation: every line kept
    assert len(valid) == len(pairs) and valid.stats["dropped"] == {}
    assert valid.tgt_sizes[1] > 0 and valid.tgt_sizes[2] == 0


def test_cache_reused_when_unchanged(tok: Tokenizer, tmp_path: Path) -> None:
    src, tgt = write_pair(tmp_path / "in", SRC, TGT)
    ds, reused = binarize_files(src, tgt, tok, tmp_path / "cache", FilterConfig())
    assert not reused and len(ds) == len(SRC)
    stamp = os.stat(tmp_path / "cache" / "src.ids.npy").st_mtime_ns
    again, reused = binarize_files(src, tgt, tok, tmp_path / "cache", FilterConfig())
    assert reused and again.key == ds.key
    assert os.stat(tmp_path / "cache" / "src.ids.npy").st_mtime_ns == stamp


def test_cache_invalidated_by_input_tokenizer_or_filters(tok: Tokenizer, tmp_path: Path) -> None:
    src, tgt = write_pair(tmp_path / "in", SRC, TGT)
    ds, _ = binarize_files(src, tgt, tok, tmp_path / "cache", FilterConfig())
    keys = {ds.key}

    src.write_text("\n".join(SRC[:-1] + ["hello hello"]) + "\n", encoding="utf-8")
    ds, reused = binarize_files(src, tgt, tok, tmp_path / "cache", FilterConfig())
    assert not reused and ds.key not in keys and ds[len(ds) - 1][0].tolist() == tok.encode_src("hello hello")
    keys.add(ds.key)

    other = train_tokenizer(SRC, TGT, tmp_path / "tok2", vocab_size=60)
    ds, reused = binarize_files(src, tgt, other, tmp_path / "cache", FilterConfig())
    assert not reused and ds.key not in keys
    keys.add(ds.key)

    ds, reused = binarize_files(src, tgt, other, tmp_path / "cache", FilterConfig(max_len=3))
    assert not reused and ds.key not in keys and ds.stats["dropped"]["too_long"] > 0


def test_damaged_split_is_a_data_error(tok: Tokenizer, tmp_path: Path) -> None:
    binarize(list(zip(SRC, TGT)), tok, tmp_path / "split")
    (tmp_path / "split" / "src.offsets.npy").write_bytes(b"garbage")
    with pytest.raises(DataError, match="split"):
        TokenDataset(tmp_path / "split")
    with pytest.raises(DataError, match="not a binarized split"):
        TokenDataset(tmp_path / "nothing")


def test_vectorized_collation_matches_collate(tok: Tokenizer, tmp_path: Path) -> None:
    ds = binarize(list(zip(SRC, TGT)) + [("", "")], tok, tmp_path / "split")
    it = BatchIterator(ds, max_tokens=60, seed=1)
    for idx in it.epoch_batches(1):
        fast = it.make_batch(idx)
        slow = collate([(int(i), *ds[int(i)]) for i in idx])
        for name in ("src", "tgt_in", "tgt_out", "ids"):
            assert getattr(fast, name).equal(getattr(slow, name)), name
        assert (fast.n_src_tokens, fast.n_tgt_tokens) == (slow.n_src_tokens, slow.n_tgt_tokens)
