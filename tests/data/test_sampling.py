"""Subword regularization: BPE-dropout and n-best sampling replayed from the ids, drawn
deterministically per (seed, epoch, sentence), on training batches only, within max_tokens."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.config import Config, DataConfig, TrainConfig, apply_overrides
from aiayn.data.batching import BatchIterator, padded_cost, real_cost
from aiayn.data.prepare import load_split, load_tokenizer, prepare_data
from aiayn.data.sampling import SampledPairs, example_seed, training_pairs
from aiayn.errors import ConfigError, DataError
from aiayn.text.tokenizer import Tokenizer, bpe_merge, train_tokenizer
from aiayn.vocab import EOS_ID, UNK_ID

WORDS_EN = ("a man woman dog cat is riding walking along the street with red blue ball bike in park "
            "children playing together near beautiful mountains").split()
WORDS_DE = ("ein mann frau hund katze fährt geht entlang der straße mit rot blau ball fahrrad im park "
            "kinder spielen zusammen nahe schönen bergen").split()


def _sentences(words: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(2, 12))) for _ in range(n)]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A joint BPE vocabulary small enough that words are split into several pieces."""
    root = tmp_path_factory.mktemp("sampling")
    files = {}
    for role, n, seed in (("train", 300, 1), ("valid", 20, 2)):
        for side, words in (("src", WORDS_EN), ("tgt", WORDS_DE)):
            path = root / f"{role}.{side}"
            path.write_text("\n".join(_sentences(words, n, seed)) + "\n", encoding="utf-8")
            files[f"{role}_{side}"] = str(path)
    cfg = DataConfig(vocab_size=90, spm_model_type="bpe", **files)
    prepare_data(cfg, root / "prepared", progress=False)
    return root / "prepared"


@pytest.fixture(scope="module")
def tok(prepared: Path) -> Tokenizer:
    return load_tokenizer(prepared)


def _pairs(prepared: Path, tok: Tokenizer, **kw: float) -> SampledPairs:
    alphas = {"alpha_src": 0.2, "alpha_tgt": 0.2, **kw}
    return SampledPairs(load_split(prepared, "train"), tok, seed=5, **alphas)  # type: ignore[arg-type]


def _ids(samples: list[tuple[int, np.ndarray, np.ndarray]]) -> list[tuple[int, list[int], list[int]]]:
    return [(i, np.asarray(s).tolist(), np.asarray(t).tolist()) for i, s, t in samples]


# ------------------------------------------------------------------ the draws


def test_bpe_merge_without_dropout_is_sentencepiece(prepared: Path, tok: Tokenizer) -> None:
    """The replay follows SentencePiece's merge order exactly: no dropout = its own encoding."""
    train = load_split(prepared, "train")
    sampler = tok.segmentation_sampler("src")
    assert sampler.kind == "bpe"
    for i in range(len(train)):
        src, tgt = train[i]
        assert sampler.replay(src[:-1]) == src[:-1].tolist()
        assert sampler.replay(tgt) == tgt.tolist()
    text = "children playing together near beautiful mountains"
    merge_scores = {tok.src_pieces([i])[0]: tok._src.get_score(i) for i in range(4, tok.src_vocab_size)}
    assert bpe_merge("▁" + text.replace(" ", "▁"), merge_scores, 0.0, None) == tok.tokenize_src(text)


def test_bpe_dropout_draws(tok: Tokenizer) -> None:
    sampler = tok.segmentation_sampler("src")
    ids = tok.encode_src("children playing together near beautiful mountains")[:-1]
    text = "".join(tok.src_pieces(ids))
    draws = [sampler.sample(ids, 0.3, 64, random.Random(seed)) for seed in range(40)]
    assert all(d is not None and "".join(tok.src_pieces(d)) == text for d in draws)  # the same text
    assert draws[0] == sampler.sample(ids, 0.3, 64, random.Random(0))  # a function of the generator
    assert len({tuple(d or []) for d in draws}) > 10
    assert np.mean([len(d or []) for d in draws]) > len(ids)  # skipped merges: more pieces
    # Every merge skipped: single characters.
    assert tok.src_pieces(sampler.sample(ids, 1.0, 64, random.Random(0)) or []) == list(text)
    # An unknown piece stands for characters that are lost: not resampled.
    assert sampler.sample([UNK_ID, *ids], 0.3, 64, random.Random(0)) is None


def test_unigram_nbest_draws(tmp_path: Path) -> None:
    tok = train_tokenizer(_sentences(WORDS_EN, 300, 1), _sentences(WORDS_DE, 300, 2), tmp_path, 120,
                          model_type="unigram")
    sampler = tok.segmentation_sampler("tgt")
    assert sampler.kind == "unigram"
    ids = tok.encode_tgt("kinder spielen zusammen nahe schönen bergen")
    assert sampler.replay(ids) == ids
    best = tok._tgt.nbest_encode(tok.decode_tgt(ids), nbest_size=4, out_type=int)
    draws = [sampler.sample(ids, 0.1, 4, random.Random(seed)) for seed in range(60)]
    assert {tuple(d or []) for d in draws} <= {tuple(b) for b in best}  # one of the 4 best
    assert len({tuple(d or []) for d in draws}) > 1
    # alpha 0: all of them equally likely; large alpha: the best one.
    assert all(sampler.sample(ids, 50.0, 4, random.Random(s)) == best[0] for s in range(10))


def test_a_word_model_cannot_be_sampled(tmp_path: Path, listed_pairs) -> None:
    sents = ["s1 s2 s3", "s2 s3 s4", "s4 s1"]
    tok = train_tokenizer(sents, sents, tmp_path, 12, model_type="word")
    ds = listed_pairs([(tok.encode_src(s), tok.encode_tgt(s)) for s in sents])
    with pytest.raises(ConfigError, match=r"^data\.subword_alpha_tgt: the target tokenizer's segmentation "
                                          r"cannot be replayed"):
        SampledPairs(ds, tok, alpha_src=0.0, alpha_tgt=0.1)


# ------------------------------------------------------------------ determinism


def test_example_seed_is_a_fixed_hash() -> None:
    """The same seed on every machine and in every process (no Python hash randomization)."""
    assert example_seed(1, 1, 0, 0) == 14116994552914813124
    assert len({example_seed(1, e, i, s) for e in (1, 2) for i in range(50) for s in (0, 1)}) == 200


def test_same_seed_epoch_sentence_same_ids(prepared: Path, tok: Tokenizer) -> None:
    a, b = _pairs(prepared, tok), _pairs(prepared, tok)
    batch = np.arange(0, 40)
    first = _ids(a.epoch_pairs(batch, 1))
    assert first == _ids(b.epoch_pairs(batch, 1)) == _ids(a.epoch_pairs(batch, 1))
    assert _ids(a.epoch_pairs(batch[::-1], 1)) == first[::-1]  # per sentence, not per position
    second = _ids(a.epoch_pairs(batch, 2))
    changed = sum(x != y for x, y in zip(first, second))
    assert 20 < changed <= 40
    # A different seed: other draws.
    other = SampledPairs(load_split(prepared, "train"), tok, alpha_src=0.2, alpha_tgt=0.2, seed=6)
    assert _ids(other.epoch_pairs(batch, 1)) != first


def test_same_ids_in_another_process(prepared: Path, tok: Tokenizer) -> None:
    """What SentencePiece's own seeded sampling does not give (exact resume needs it)."""
    script = textwrap.dedent(f"""
        import numpy as np
        from aiayn.data.prepare import load_split, load_tokenizer
        from aiayn.data.sampling import SampledPairs
        p = SampledPairs(load_split({str(prepared)!r}, "train"), load_tokenizer({str(prepared)!r}),
                         alpha_src=0.2, alpha_tgt=0.2, seed=5)
        print([(i, s.tolist(), t.tolist()) for i, s, t in p.epoch_pairs(np.arange(0, 40), 3)])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(_ids(_pairs(prepared, tok).epoch_pairs(np.arange(0, 40), 3)))


# ------------------------------------------------------------------ the training data


def test_alpha_zero_is_the_baseline(prepared: Path, tok: Tokenizer) -> None:
    train = load_split(prepared, "train")
    cfg = Config(data=DataConfig(subword_alpha_src=0.0, subword_alpha_tgt=0.0), train=TrainConfig(max_tokens=200))
    assert training_pairs(train, tok, cfg) is train
    # One side on, the other keeps its ids exactly.
    pairs = _pairs(prepared, tok, alpha_src=0.0)
    src_sizes, tgt_sizes = pairs.epoch_sizes(1)
    assert (src_sizes == train.src_sizes).all() and (tgt_sizes > train.tgt_sizes).any()
    for i, s, _ in pairs.epoch_pairs(np.arange(len(train)), 1):
        assert np.array_equal(s, train[i][0])
    assert any(not np.array_equal(t, train[i][1]) for i, _, t in pairs.epoch_pairs(np.arange(len(train)), 1))


@pytest.mark.parametrize("mode", ["padded", "real"])
def test_batches_same_sentences_new_pieces_within_max_tokens(prepared: Path, tok: Tokenizer, mode: str) -> None:
    train = load_split(prepared, "train")
    pairs = _pairs(prepared, tok)
    it = BatchIterator(pairs, 120, seed=1, mode=mode)
    base = BatchIterator(train, 120, seed=1, mode=mode)
    assert len(it) > len(base)  # longer pieces: fewer sentences a batch
    cost = padded_cost if mode == "padded" else real_cost
    epochs = []
    for epoch in (1, 2, 3):
        batches = list(it)
        sizes = pairs.epoch_sizes(epoch)
        assert len(batches) == len(BatchIterator(_Sized(*sizes), 120, seed=1, mode=mode))  # batched by its lengths
        for b in batches:
            src_lens = b.src.ne(0).sum(1).numpy()
            tgt_lens = b.tgt_out.ne(0).sum(1).numpy() - 1
            assert cost(src_lens, tgt_lens) <= 120
            assert (b.src.gather(1, torch.tensor(src_lens - 1)[:, None]) == EOS_ID).all()
        epochs.append(batches)
    # As full as without sampling: the padding share is about the same.
    assert _padding(epochs[0]) <= _padding(list(base)) + 0.05
    # Each epoch: every sentence once, its text unchanged, its pieces (mostly) new.
    for batches in epochs:
        ids = np.concatenate([b.ids.numpy() for b in batches])
        assert sorted(ids.tolist()) == list(range(len(train)))
    src_text = {int(i): tok.decode_src(row) for b in epochs[0] for i, row in zip(b.ids, b.src)}
    assert src_text == {int(i): tok.decode_src(row) for b in epochs[2] for i, row in zip(b.ids, b.src)}
    assert all(src_text[i] == tok.decode_src(train[i][0]) for i in range(len(train)))
    first = {int(i): row.tolist() for b in epochs[0] for i, row in zip(b.ids, b.src)}
    third = {int(i): row.tolist() for b in epochs[2] for i, row in zip(b.ids, b.src)}
    assert sum(first[i] != third[i] for i in first) > len(train) // 2


class _Sized:
    """Only lengths, for counting the batches a BatchIterator makes of them."""

    def __init__(self, src_sizes: np.ndarray, tgt_sizes: np.ndarray) -> None:
        self.src_sizes, self.tgt_sizes = src_sizes, tgt_sizes

    def __len__(self) -> int:
        return len(self.src_sizes)


def _padding(batches: list) -> float:
    """Padding's share of the batches' target tensors."""
    return float(sum((b.tgt_out == 0).sum() for b in batches) / sum(b.tgt_out.numel() for b in batches))


def test_resume_position_counts_the_epochs_own_batches(prepared: Path, tok: Tokenizer) -> None:
    pairs = _pairs(prepared, tok)
    it = BatchIterator(pairs, 120, seed=1)
    n3 = len(it.epoch_batches(3))
    it.load_state_dict({"epoch": 3, "offset": n3})
    assert it.epoch == 3 and len(it) == n3
    with pytest.raises(DataError, match=rf"^invalid data position epoch=3 offset={n3 + 1} "
                                        rf"\(this shard has {n3} batches in that epoch\)$"):
        it.load_state_dict({"epoch": 3, "offset": n3 + 1})


def test_a_sample_over_max_len_keeps_its_ids(prepared: Path, tok: Tokenizer) -> None:
    """alpha 1 skips every merge: a sentence's sample is its characters, unless there are more
    than max_len of them (and than its deterministic pieces)."""
    train = load_split(prepared, "train")
    pairs = SampledPairs(train, tok, alpha_src=1.0, alpha_tgt=0.0, max_len=12)
    kept = 0
    for i, s, _ in pairs.epoch_pairs(np.arange(len(train)), 1):
        det = train[i][0]
        chars = list("".join(tok.src_pieces(det[:-1])))
        if len(chars) > max(12, len(det) - 1):
            assert np.array_equal(s, det)
            kept += 1
        else:
            assert tok.src_pieces(s[:-1]) == chars and s[-1] == EOS_ID
    assert pairs.fallbacks == kept > 0


def test_validation_is_never_sampled(prepared: Path, tmp_path: Path) -> None:
    from aiayn.recipes.train import build_data
    from aiayn.training.distributed import DistInfo

    plain = Config(data=DataConfig(prepared_dir=str(prepared)), train=TrainConfig(max_tokens=200))
    sampled = apply_overrides(plain, ["data.subword_alpha_src=0.5", "data.subword_alpha_tgt=0.5"])
    a, b = build_data(plain, tmp_path, DistInfo()), build_data(sampled, tmp_path, DistInfo())
    assert isinstance(b.train.dataset, SampledPairs) and not isinstance(a.train.dataset, SampledPairs)
    assert a.valid is not None and b.valid is not None and len(a.valid) == len(b.valid)
    for x, y in zip(a.valid, b.valid):
        assert torch.equal(x.src, y.src) and torch.equal(x.tgt_out, y.tgt_out) and torch.equal(x.ids, y.ids)
