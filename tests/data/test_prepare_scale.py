"""The data path at scale: encoding over worker processes and resuming an interrupted
prepare give the same bytes as one uninterrupted process; batch boundaries computed over
runs of equal lengths equal the sentence-by-sentence greedy rule."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from aiayn.config import DataConfig
from aiayn.data import batching
from aiayn.data import binarize as binarize_mod
from aiayn.data.batching import _boundaries, _sort_keys
from aiayn.data.prepare import load_split, partial_dir, prepare_data
from aiayn.fileio import count_lines

WORDS = "the a small red dog cat house runs sleeps in on park garden two men play football".split()


def corpus(d: Path, n: int = 230, seed: int = 0) -> DataConfig:
    rng = np.random.default_rng(seed)
    src = [" ".join(rng.choice(WORDS, rng.integers(1, 12))) for _ in range(n)]
    tgt = [" ".join(rng.choice(WORDS, rng.integers(1, 12))) for _ in range(n)]
    src[5] = " ".join(["dog"] * 150)  # dropped by the length filter
    d.mkdir(parents=True, exist_ok=True)
    for name, lines in (("train.en", src), ("train.de", tgt), ("valid.en", src[:9]), ("valid.de", tgt[:9])):
        (d / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return DataConfig(train_src=str(d / "train.en"), train_tgt=str(d / "train.de"), valid_src=str(d / "valid.en"),
                      valid_tgt=str(d / "valid.de"), vocab_size=60, max_len=100, max_len_ratio=1000.0)


def files(out: Path) -> dict[str, bytes]:
    """Every file's bytes; the summary without its timings and reuse flags."""
    got = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    summary = json.loads(got.pop("summary.json"))
    for volatile in ("time_s", "reused"):
        summary.pop(volatile)
    got["summary.json"] = json.dumps(summary, sort_keys=True).encode()
    return got


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(binarize_mod, "CHUNK", 16)  # 230 pairs: 15 chunks


def test_workers_write_the_same_bytes(tmp_path: Path, small_chunks: None) -> None:
    cfg = corpus(tmp_path / "text")
    prepare_data(cfg, tmp_path / "one", progress=False)
    prepare_data(cfg, tmp_path / "three", progress=False, workers=3)
    one, three = files(tmp_path / "one"), files(tmp_path / "three")
    assert one == three
    assert load_split(tmp_path / "one", "train").meta["dropped"] == {"too_long": 1}


def test_interrupted_prepare_resumes_to_the_same_bytes(tmp_path: Path, small_chunks: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = corpus(tmp_path / "text")
    prepare_data(cfg, tmp_path / "whole", progress=False)

    append = binarize_mod._Staging.append
    calls = {"append": 0, "encode": 0}

    def stop_after_first(self: binarize_mod._Staging, chunk: binarize_mod._EncodedChunk) -> None:
        if calls["append"] == 1:
            raise KeyboardInterrupt  # as Ctrl-C between two chunks
        calls["append"] += 1
        append(self, chunk)

    out = tmp_path / "resumed"
    with monkeypatch.context() as m:
        m.setattr(binarize_mod._Staging, "append", stop_after_first)
        with pytest.raises(KeyboardInterrupt):
            prepare_data(cfg, out, progress=False)
    assert not out.exists()
    work = partial_dir(out)
    assert (work / "tokenizer.key").is_file()
    assert json.loads((work / "train.chunks" / "progress.json").read_text())["chunks"] == 1

    encode = binarize_mod._encode_chunk

    def counting(*args: object, **kwargs: object) -> binarize_mod._EncodedChunk:
        calls["encode"] += 1
        return encode(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(binarize_mod, "_encode_chunk", counting)
    summary = prepare_data(cfg, out, progress=False)
    assert summary["reused"]["tokenizer"] is True  # trained once, before the interruption
    # Training split: 15 chunks, the first found done; validation: 1 chunk.
    assert calls["encode"] == 14 + 1
    assert files(out) == files(tmp_path / "whole")
    assert not work.exists()


def test_bad_input_removes_the_unfinished_work(tmp_path: Path) -> None:
    cfg = corpus(tmp_path / "text")
    (tmp_path / "text" / "valid.de").write_text("only one line\n", encoding="utf-8")
    with pytest.raises(Exception, match="line counts differ"):
        prepare_data(cfg, tmp_path / "out", progress=False)
    assert not partial_dir(tmp_path / "out").exists()


def test_count_lines(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"one\ntwo\nthree")
    (tmp_path / "b").write_bytes(b"one\ntwo\n")
    (tmp_path / "c").write_bytes(b"")
    assert [count_lines(tmp_path / n) for n in "abc"] == [3, 2, 0]
    (tmp_path / "d.gz").write_bytes(gzip.compress(b"one\ntwo\nthree"))
    assert count_lines(tmp_path / "d.gz") == 3  # through the decompressor
    assert count_lines(tmp_path / "d.gz", gzipped=False) is None  # a progress bar's total: not worth it


def reference_boundaries(src: np.ndarray, tgt: np.ndarray, max_tokens: int, mode: str) -> list[int]:
    """The greedy rule one sorted sentence at a time (as the batcher's docstring states it)."""
    order = np.argsort(src * (int(tgt.max()) + 1) + tgt, kind="stable")
    bounds, start, longest, src_sum, tgt_sum = [0], 0, 0, 0, 0
    for i, (a, b) in enumerate(zip(src[order].tolist(), (tgt[order] + 1).tolist())):
        if mode == "padded":
            grown = max(longest, a, b)
            if grown * (i - start + 1) > max_tokens and i > start:
                bounds.append(i)
                start, grown = i, max(a, b)
            longest = grown
        else:
            if (src_sum + a > max_tokens or tgt_sum + b > max_tokens) and i > start:
                bounds.append(i)
                start, src_sum, tgt_sum = i, 0, 0
            src_sum, tgt_sum = src_sum + a, tgt_sum + b
    return bounds + [len(src)]


@pytest.mark.parametrize("table", [True, False])  # length pairs counted in a table, or sorted
@pytest.mark.parametrize("mode", ["padded", "real"])
@pytest.mark.parametrize("seed", range(4))
def test_run_boundaries_equal_the_sentence_by_sentence_rule(mode: str, seed: int, table: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batching, "_KEY_TABLE", 1 << 24 if table else 0)
    monkeypatch.setattr(batching, "_KEY_CHUNK", 1000)  # 3 chunks
    rng = np.random.default_rng(seed)
    n = 3000
    src = rng.integers(1, [4, 30, 200, 60][seed], n)
    tgt = rng.integers(0, [4, 30, 200, 90][seed], n)
    for max_tokens in (1, 5, 64, 333, 4096):
        rank, lengths, counts = _sort_keys(src, tgt)
        assert rank.dtype == np.uint16 and counts.sum() == n
        assert (lengths[rank] == np.stack([src, tgt], axis=1)).all()
        assert _boundaries(lengths, counts, max_tokens, mode) == reference_boundaries(src, tgt, max_tokens, mode)


def test_offsets_are_memory_mapped(tmp_path: Path) -> None:
    prepare_data(corpus(tmp_path / "text"), tmp_path / "out", progress=False)
    data = load_split(tmp_path / "out", "train")
    assert isinstance(data._src_off, np.memmap) and isinstance(data._tgt_off, np.memmap)
    assert data.src_sizes.dtype == np.int32 and len(data.src_sizes) == len(data) == 229


@pytest.mark.parametrize("chunk", [1, 7, 1000, 1 << 20])
def test_chunked_stable_sort_equals_a_global_one(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batching, "_KEY_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    rank = rng.integers(0, 37, 4000).astype(np.uint16)
    items = rng.permutation(4000).astype(np.int32)
    expected = items[np.argsort(rank[items], kind="stable")]
    assert (batching._stable_sort_by_rank(items, rank) == expected).all()
