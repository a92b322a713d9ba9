"""Token-budget batching: budget, coverage, determinism, resume, sharding, collation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aiayn.data.batching import Batch, BatchIterator, collate, padded_cost, real_cost
from aiayn.errors import DataError
from aiayn.text.tokenizer import BOS_ID, EOS_ID, PAD_ID


class ListDataset:
    """In-memory stand-in for TokenDataset: random ids of random lengths."""

    def __init__(self, n: int, seed: int = 0, max_len: int = 40) -> None:
        rng = np.random.default_rng(seed)
        self.src = [rng.integers(4, 100, rng.integers(1, max_len)).tolist() + [EOS_ID] for _ in range(n)]
        self.tgt = [rng.integers(4, 100, rng.integers(1, max_len)).tolist() for _ in range(n)]
        self.src_sizes = np.array([len(s) for s in self.src])
        self.tgt_sizes = np.array([len(t) for t in self.tgt])

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return np.array(self.src[i]), np.array(self.tgt[i])


@pytest.fixture(scope="module")
def data() -> ListDataset:
    return ListDataset(700)


def order(it: BatchIterator, epoch: int) -> list[list[int]]:
    return [b.tolist() for b in it.epoch_batches(epoch)]


def test_budget_never_exceeded(data: ListDataset) -> None:
    for max_tokens in (64, 300, 1000):
        it = BatchIterator(data, max_tokens=max_tokens, seed=3)
        for batch in it:
            # Padded size of the larger tensor: what max_tokens bounds.
            assert batch.size * max(batch.src.shape[1], batch.tgt_in.shape[1]) <= max_tokens
            assert padded_cost(data.src_sizes[batch.ids.numpy()], data.tgt_sizes[batch.ids.numpy()]) \
                <= max_tokens


def test_every_sentence_exactly_once_per_epoch(data: ListDataset) -> None:
    it = BatchIterator(data, max_tokens=400, seed=1)
    for epoch in (1, 2, 3):
        seen = np.concatenate([b.ids.numpy() for b in it])
        assert sorted(seen.tolist()) == list(range(len(data)))
        assert it.epoch == epoch + 1 and it.offset == 0


def test_same_seed_same_order_other_epoch_other_order(data: ListDataset) -> None:
    a = BatchIterator(data, max_tokens=400, seed=7)
    b = BatchIterator(data, max_tokens=400, seed=7)
    assert order(a, 1) == order(b, 1)
    assert order(a, 2) == order(b, 2)
    assert order(a, 1) != order(a, 2)
    assert order(a, 1) != order(BatchIterator(data, max_tokens=400, seed=8), 1)
    assert len(order(a, 1)) == len(order(a, 2)) == len(a)  # constant batch count


def test_batches_group_similar_lengths(data: ListDataset) -> None:
    it = BatchIterator(data, max_tokens=400, seed=1)
    sizes = [data.src_sizes[b] for b in it.epoch_batches(1)]
    spread = np.mean([s.max() - s.min() for s in sizes])
    assert spread <= 2  # sorted by length: a batch holds (nearly) one source length


def test_no_shuffle_is_sorted_and_fixed(data: ListDataset) -> None:
    it = BatchIterator(data, max_tokens=400, shuffle=False)
    assert order(it, 1) == order(it, 2)
    flat = np.concatenate(it.epoch_batches(1))
    keys = list(zip(data.src_sizes[flat], data.tgt_sizes[flat]))
    assert keys == sorted(keys)


def test_mid_epoch_restore_continues_exactly(data: ListDataset) -> None:
    full = BatchIterator(data, max_tokens=300, seed=5)
    reference = [b.ids.tolist() for b in full] + [b.ids.tolist() for b in full]  # epochs 1 and 2

    run = BatchIterator(data, max_tokens=300, seed=5)
    got = []
    for batch in run:
        got.append(batch.ids.tolist())
        if len(got) == 7:
            break
    state = json.loads(json.dumps(run.state_dict()))  # JSON-safe, as in a checkpoint
    assert state == {"epoch": 1, "offset": 7}

    resumed = BatchIterator(data, max_tokens=300, seed=5)
    resumed.load_state_dict(state)
    got += [b.ids.tolist() for b in resumed]
    assert resumed.epoch == 2
    got += [b.ids.tolist() for b in resumed]
    assert got == reference


def test_iterating_again_continues_the_same_epoch(data: ListDataset) -> None:
    it = BatchIterator(data, max_tokens=300, seed=5)
    first = []
    for batch in it:
        first.append(batch.ids.tolist())
        if len(first) == 3:
            break
    rest = [b.ids.tolist() for b in it]
    assert first + rest == order(it, 1)


def test_load_state_rejects_bad_positions(data: ListDataset) -> None:
    it = BatchIterator(data, max_tokens=300)
    with pytest.raises(DataError):
        it.load_state_dict({"epoch": 1, "offset": len(it) + 1})
    with pytest.raises(DataError):
        it.load_state_dict({"epoch": 0, "offset": 0})


@pytest.mark.parametrize("num_shards", [2, 3, 4, 7])
def test_shards_disjoint_complete_equal(data: ListDataset, num_shards: int) -> None:
    max_tokens = 500
    shards = [BatchIterator(data, max_tokens, seed=2, num_shards=num_shards, shard_id=k)
              for k in range(num_shards)]
    assert len({len(s) for s in shards}) == 1
    for epoch in (1, 2):
        parts = [np.concatenate(s.epoch_batches(epoch)) for s in shards]
        assert sum(len(p) for p in parts) == len(data)
        assert sorted(np.concatenate(parts).tolist()) == list(range(len(data)))
        for s in shards:
            for b in s.epoch_batches(epoch):
                assert padded_cost(data.src_sizes[b], data.tgt_sizes[b]) <= max_tokens


def test_uneven_batch_count_is_split_to_divide() -> None:
    data = ListDataset(50, seed=1, max_len=10)
    n = len(BatchIterator(data, max_tokens=200, seed=1))
    shards = next(k for k in range(2, 10) if n % k)
    its = [BatchIterator(data, 200, seed=1, num_shards=shards, shard_id=k) for k in range(shards)]
    assert len({len(i) for i in its}) == 1 and len(its[0]) * shards > n  # some batches were split
    assert sorted(np.concatenate([np.concatenate(i.epoch_batches(1)) for i in its]).tolist()) \
        == list(range(50))


def test_too_few_sentences_for_shards() -> None:
    data = ListDataset(3, seed=1)
    with pytest.raises(DataError, match="shards"):
        BatchIterator(data, max_tokens=10_000, num_shards=4, shard_id=0)


def test_oversize_sentence_gets_its_own_batch() -> None:
    data = ListDataset(30, seed=4, max_len=20)
    data.src[5] = list(range(4, 104)) + [EOS_ID]
    data.src_sizes[5] = 101
    it = BatchIterator(data, max_tokens=80, seed=1)
    batches = it.epoch_batches(1)
    assert [5] in [b.tolist() for b in batches]
    assert sorted(np.concatenate(batches).tolist()) == list(range(30))


def test_collate_layout() -> None:
    samples = [(10, np.array([5, 6, 7, EOS_ID]), np.array([8, 9])),
               (11, np.array([5, EOS_ID]), np.array([8, 9, 10, 11]))]
    b = collate(samples)
    assert isinstance(b, Batch)
    assert b.src.tolist() == [[5, 6, 7, EOS_ID], [5, EOS_ID, PAD_ID, PAD_ID]]
    assert b.tgt_in.tolist() == [[BOS_ID, 8, 9, PAD_ID, PAD_ID], [BOS_ID, 8, 9, 10, 11]]
    assert b.tgt_out.tolist() == [[8, 9, EOS_ID, PAD_ID, PAD_ID], [8, 9, 10, 11, EOS_ID]]
    assert b.ids.tolist() == [10, 11]
    assert b.n_src_tokens == 6 and b.n_tgt_tokens == 3 + 5
    assert b.src_pad_mask.sum().item() == 2 and b.tgt_pad_mask.sum().item() == 2
    assert b.to("cpu").tgt_out.equal(b.tgt_out)
    assert all(t.dtype.is_floating_point is False for t in (b.src, b.tgt_in, b.tgt_out, b.ids))


# ---------------------------------------------------------------- real-token bound


class LengthsDataset:
    """Pairs of given lengths (source with EOS, target without), made of token 5."""

    def __init__(self, src_sizes: np.ndarray, tgt_sizes: np.ndarray) -> None:
        self.src_sizes, self.tgt_sizes = np.asarray(src_sizes), np.asarray(tgt_sizes)

    def __len__(self) -> int:
        return len(self.src_sizes)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        src = np.full(int(self.src_sizes[i]), 5)
        src[-1] = EOS_ID
        return src, np.full(int(self.tgt_sizes[i]), 6)


def wmt_like(n: int = 3000, seed: int = 0) -> LengthsDataset:
    """Log-normal source lengths (mean ~28 pieces), target = source x a log-normal ratio."""
    rng = np.random.default_rng(seed)
    src = np.clip(np.rint(rng.lognormal(3.18, 0.55, n)), 1, 200).astype(np.int64)
    tgt = np.clip(np.rint(src * np.exp(rng.normal(0.05, 0.25, n))), 1, 200).astype(np.int64)
    return LengthsDataset(src + 1, tgt)


def _real_sides(b: Batch) -> tuple[int, int]:
    """Non-pad tokens of src and tgt_out, counted in the tensors."""
    return int(b.src.ne(PAD_ID).sum()), int(b.tgt_out.ne(PAD_ID).sum())


@pytest.mark.parametrize("max_tokens", [300, 1000, 3125])
def test_real_bound_respected_and_batches_fuller(max_tokens: int) -> None:
    data = wmt_like()
    real = BatchIterator(data, max_tokens, seed=1, mode="real")
    padded = BatchIterator(data, max_tokens, seed=1)
    real_batches = list(real)
    for b in real_batches:
        src, tgt = _real_sides(b)
        assert (src, tgt) == (b.n_src_tokens, b.n_tgt_tokens)
        assert max(src, tgt) <= max_tokens or b.size == 1
    padded_batches = list(padded)
    for mode_batches in (real_batches, padded_batches):  # every sentence once
        assert sorted(np.concatenate([b.ids.numpy() for b in mode_batches]).tolist()) == list(range(len(data)))

    def fill(batches: list[Batch]) -> float:  # mean real tokens of the fuller side, over the bound
        return float(np.mean([max(_real_sides(b)) for b in batches])) / max_tokens

    assert len(real_batches) < len(padded_batches)
    assert fill(real_batches) > fill(padded_batches)
    assert fill(real_batches) > 0.9


def test_default_mode_is_padded_and_unknown_modes_are_refused(data: ListDataset) -> None:
    assert order(BatchIterator(data, 300, seed=5), 2) == order(BatchIterator(data, 300, seed=5, mode="padded"), 2)
    assert BatchIterator(data, 300).mode == "padded"
    with pytest.raises(DataError, match="batch mode"):
        BatchIterator(data, 300, mode="tokens")


def test_real_mode_mid_epoch_restore_continues_exactly(data: ListDataset) -> None:
    full = BatchIterator(data, max_tokens=300, seed=5, mode="real")
    expected = [b.ids.tolist() for b in full] + [b.ids.tolist() for b in full]
    run = BatchIterator(data, max_tokens=300, seed=5, mode="real")
    got = []
    for b in run:
        got.append(b.ids.tolist())
        if len(got) == 4:
            break
    resumed = BatchIterator(data, max_tokens=300, seed=5, mode="real")
    resumed.load_state_dict(json.loads(json.dumps(run.state_dict())))
    got += [b.ids.tolist() for b in resumed] + [b.ids.tolist() for b in resumed]
    assert got == expected


def test_real_mode_shards_are_disjoint_and_bounded(data: ListDataset) -> None:
    shards = [BatchIterator(data, 500, seed=2, num_shards=3, shard_id=k, mode="real") for k in range(3)]
    assert len({len(s) for s in shards}) == 1
    seen = np.concatenate([np.concatenate(s.epoch_batches(1)) for s in shards])
    assert sorted(seen.tolist()) == list(range(len(data)))
    for s in shards:
        for b in s.epoch_batches(1):
            assert real_cost(data.src_sizes[b], data.tgt_sizes[b]) <= 500
