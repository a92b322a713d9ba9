"""Token-budget batching, collation and sharding: from a :class:`TokenDataset` to ``Batch``es.

The paper batches "by approximate sequence length", about 25,000 source and 25,000 target
tokens per step (section 5.1). As in fairseq, a batch is bounded by ``max_tokens``: its
sentence count times its longest sequence on either side, i.e. the padded size of the
larger of the two tensors the model sees (``src`` or ``tgt_in``/``tgt_out``). With
``mode="real"`` the bound is on real (non-pad) tokens instead, on each side: the source
tokens (with EOS) and the target tokens (with EOS) of a batch are each at most
``max_tokens``, which is how the paper states its batch size (padding comes on top).

How an epoch's batches are made (all from ``(seed, epoch)``, so every rank and every
resumed run computes the same list):

1. sentences are sorted by source length, then target length; with ``shuffle`` the order
   among sentences of equal lengths is random per epoch (the batch *boundaries* depend only
   on the sorted length sequence, so they are computed once and the batch count is constant);
2. consecutive sentences fill a batch while it stays within ``max_tokens``;
3. with several shards, the largest batches are split in two until the count divides evenly;
4. with ``shuffle`` the batch order is permuted; shard ``k`` takes batches ``k, k+n, k+2n, ...``.

A sentence longer than ``max_tokens`` on its own still forms a batch of one (logged):
evaluation sets are never filtered, and dropping a test sentence would change the score.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from aiayn.data.prefetch import HostTransfer, Prefetcher, pinned
from aiayn.errors import DataError
from aiayn.vocab import BOS_ID, EOS_ID, PAD_ID

log = logging.getLogger(__name__)


class SizedPairs(Protocol):
    """What the batcher needs from a dataset (``TokenDataset`` and in-memory lists fit).

    A dataset may also have ``padded(indices, side)`` (vectorized collation, as
    ``TokenDataset``), or ``epoch_pairs(indices, epoch)``: its pairs differ by epoch
    (``aiayn.data.sampling``), and ``src_sizes`` / ``tgt_sizes`` are what to batch by.
    """

    @property
    def src_sizes(self) -> np.ndarray: ...

    @property
    def tgt_sizes(self) -> np.ndarray: ...

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass
class Batch:
    """One training/evaluation batch; right-padded with ``PAD_ID``."""

    src: torch.Tensor  # (B, S) long: source pieces + EOS
    tgt_in: torch.Tensor  # (B, T) long: BOS + y (teacher forcing input)
    tgt_out: torch.Tensor  # (B, T) long: y + EOS (what the decoder must predict)
    ids: torch.Tensor  # (B,) long: dataset indices, e.g. to put translations back in order
    n_src_tokens: int  # non-pad tokens in src
    n_tgt_tokens: int  # non-pad tokens in tgt_out: the loss is normalized by this

    @property
    def size(self) -> int:
        return int(self.src.shape[0])

    @property
    def src_pad_mask(self) -> torch.Tensor:
        """(B, S) bool, True on padding (the model builds its attention masks from pad ids)."""
        return self.src.eq(PAD_ID)

    @property
    def tgt_pad_mask(self) -> torch.Tensor:
        """(B, T) bool, True on padding of tgt_in / tgt_out (the same positions)."""
        return self.tgt_out.eq(PAD_ID)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            src=self.src.to(device, non_blocking=non_blocking),
            tgt_in=self.tgt_in.to(device, non_blocking=non_blocking),
            tgt_out=self.tgt_out.to(device, non_blocking=non_blocking),
            ids=self.ids.to(device, non_blocking=non_blocking),
            n_src_tokens=self.n_src_tokens, n_tgt_tokens=self.n_tgt_tokens)

    def pin_memory(self) -> Batch:
        return Batch(self.src.pin_memory(), self.tgt_in.pin_memory(), self.tgt_out.pin_memory(),
                     self.ids.pin_memory(), self.n_src_tokens, self.n_tgt_tokens)


def collate(samples: Sequence[tuple[int, np.ndarray, np.ndarray]]) -> Batch:
    """``(index, src ids incl. EOS, tgt ids without BOS/EOS)`` triples -> a padded :class:`Batch`."""
    if not samples:
        raise ValueError("collate: empty batch")
    b = len(samples)
    s = max(len(src) for _, src, _ in samples)
    t = max(len(tgt) for _, _, tgt in samples) + 1  # + BOS (in) / + EOS (out)
    src = np.full((b, s), PAD_ID, dtype=np.int64)
    tgt_in = np.full((b, t), PAD_ID, dtype=np.int64)
    tgt_out = np.full((b, t), PAD_ID, dtype=np.int64)
    ids = np.empty(b, dtype=np.int64)
    n_src = n_tgt = 0
    for row, (idx, x, y) in enumerate(samples):
        n, m = len(x), len(y)
        src[row, :n] = x
        tgt_in[row, 0] = BOS_ID
        tgt_in[row, 1:m + 1] = y
        tgt_out[row, :m] = y
        tgt_out[row, m] = EOS_ID
        ids[row] = idx
        n_src += n
        n_tgt += m + 1
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out),
                 torch.from_numpy(ids), n_src, n_tgt)


def collate_padded(ids: np.ndarray, src: np.ndarray, src_lens: np.ndarray, tgt: np.ndarray,
                   tgt_lens: np.ndarray) -> Batch:
    """:func:`collate` from already padded matrices: ``src`` (B, S) with EOS, ``tgt`` (B, T-1)."""
    b, w = tgt.shape
    tgt_in = np.full((b, w + 1), PAD_ID, dtype=np.int64)
    tgt_in[:, 0] = BOS_ID
    tgt_in[:, 1:] = tgt
    tgt_out = np.full((b, w + 1), PAD_ID, dtype=np.int64)
    tgt_out[:, :w] = tgt
    tgt_out[np.arange(b), tgt_lens] = EOS_ID
    return Batch(torch.from_numpy(np.ascontiguousarray(src, dtype=np.int64)), torch.from_numpy(tgt_in),
                 torch.from_numpy(tgt_out), torch.from_numpy(np.asarray(ids, dtype=np.int64)),
                 int(src_lens.sum()), int(tgt_lens.sum()) + b)


def padded_cost(src_sizes: np.ndarray, tgt_sizes: np.ndarray) -> int:
    """Tokens a batch of these sentences occupies: count x longest side (tgt counts BOS/EOS)."""
    if len(src_sizes) == 0:
        return 0
    return int(len(src_sizes) * max(int(src_sizes.max()), int(tgt_sizes.max()) + 1))


def real_cost(src_sizes: np.ndarray, tgt_sizes: np.ndarray) -> int:
    """Real tokens of a batch on its larger side: source (with EOS) or target (with EOS)."""
    if len(src_sizes) == 0:
        return 0
    return int(max(int(src_sizes.sum()), int(tgt_sizes.sum()) + len(tgt_sizes)))


BATCH_MODES = ("padded", "real")


# Sentences whose sort keys are computed per step: bounds the temporaries at large scale.
_KEY_CHUNK = 1 << 20


# Length-pair keys up to this many are counted in a table (one pass); beyond, sorted.
_KEY_TABLE = 1 << 24


def _sort_keys(src_sizes: np.ndarray, tgt_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each sentence's rank among the distinct (source, target) lengths, and the distinct
    lengths and how many sentences have each, in sorted order (source, then target).

    Sorting by rank is sorting by length pair. Ranks take two bytes a sentence while there
    are at most 65,536 distinct length pairs (WMT-size corpora have about 20,000), else four;
    they are computed in chunks, so no length-sized int64 temporary is ever whole.
    """
    n = len(src_sizes)
    width = int(np.max(tgt_sizes)) + 1 if n else 1
    span = (int(np.max(src_sizes)) + 1) * width if n else 1

    def keys(a: int) -> np.ndarray:
        return np.asarray(src_sizes[a:a + _KEY_CHUNK], dtype=np.int64) * width + tgt_sizes[a:a + _KEY_CHUNK]

    lookup: np.ndarray | None = None  # key -> rank, when the keys are counted in a table
    if span <= _KEY_TABLE:
        table = np.zeros(span, dtype=np.int64)
        for a in range(0, n, _KEY_CHUNK):
            table += np.bincount(keys(a), minlength=span)
        merged = np.flatnonzero(table)
        counts = table[merged]
        lookup = np.zeros(span, dtype=np.int64)
        lookup[merged] = np.arange(len(merged))
    else:
        keys_seen: list[np.ndarray] = []
        counts_seen: list[np.ndarray] = []
        for a in range(0, n, _KEY_CHUNK):
            k, c = np.unique(keys(a), return_counts=True)
            keys_seen.append(k)
            counts_seen.append(c)
        merged, where = np.unique(np.concatenate(keys_seen), return_inverse=True)
        counts = np.bincount(where, weights=np.concatenate(counts_seen), minlength=len(merged)).astype(np.int64)
    rank = np.empty(n, dtype=np.uint16 if len(merged) <= 1 << 16 else np.int32)
    for a in range(0, n, _KEY_CHUNK):
        rank[a:a + _KEY_CHUNK] = lookup[keys(a)] if lookup is not None else np.searchsorted(merged, keys(a))
    return rank, np.stack([merged // width, merged % width], axis=1), counts


def _boundaries(lengths: np.ndarray, counts: np.ndarray, max_tokens: int, mode: str = "padded") -> list[int]:
    """Greedy batch boundaries over length-sorted sentences: ``[0, b1, b2, ..., n]``.

    ``lengths`` holds the distinct (source, target) length pairs in sorted order and
    ``counts`` how many sentences have each. Batches fill sentence by sentence as if the
    sorted sentences came one at a time; a run of equal lengths is taken in whole steps, so
    the work grows with the distinct lengths and the batches, not with the sentences.
    """
    src = lengths[:, 0].tolist()
    tgt_out = (lengths[:, 1] + 1).tolist()  # target with EOS (or BOS)
    need = [max(s, t) for s, t in zip(src, tgt_out)]  # longest side of each sentence
    oversize = sum(c for v, c in zip(need, counts.tolist()) if v > max_tokens)
    if oversize:
        log.warning("%d sentence(s) longer than max_tokens=%d form batches of their own", oversize, max_tokens)
    if mode == "real":
        return _real_boundaries(src, tgt_out, counts.tolist(), max_tokens)
    bounds = [0]
    pos = size = longest = 0  # sentences placed; sentences in the open batch; its longest side
    for v, m in zip(need, counts.tolist()):
        while m:
            if size:
                grown = v if v > longest else longest
                fit = max_tokens // grown - size  # more sentences the open batch takes
                if fit <= 0:
                    bounds.append(pos)
                    size = longest = 0
                    continue
                take = min(fit, m)
            else:  # a new batch: its first sentence always, then while size x longest fits
                grown = v
                take = min(max(1, max_tokens // v), m)
            size += take
            longest = grown
            pos += take
            m -= take
    if size:
        bounds.append(pos)
    return bounds


def _real_boundaries(src: list[int], tgt_out: list[int], counts: list[int], max_tokens: int) -> list[int]:
    """Greedy boundaries such that each side's real tokens stay within ``max_tokens``."""
    bounds = [0]
    pos = size = src_sum = tgt_sum = 0
    for a, b, m in zip(src, tgt_out, counts):
        while m:
            if size:
                fit = min((max_tokens - src_sum) // a if a else m, (max_tokens - tgt_sum) // b)
                if fit <= 0:
                    bounds.append(pos)
                    size = src_sum = tgt_sum = 0
                    continue
                take = min(fit, m)
            else:  # a new batch: its first sentence always, then while both sides fit
                more = min((max_tokens - a) // a if a else m, (max_tokens - b) // b)
                take = min(1 + max(0, more), m)
            size += take
            src_sum += take * a
            tgt_sum += take * b
            pos += take
            m -= take
    if size:
        bounds.append(pos)
    return bounds


def _stable_sort_by_rank(items: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """``items`` ordered by ``rank[items]``, equal ranks in their order in ``items``: what
    ``items[np.argsort(rank[items], kind="stable")]`` gives, with temporaries of one chunk
    (each chunk sorted, then its runs written after the earlier chunks' items of equal rank)."""
    n_ranks = int(rank.max()) + 1 if len(rank) else 1
    counts = np.bincount(rank, minlength=n_ranks)
    fill = np.zeros(n_ranks, dtype=np.int64)  # where each rank's next item goes
    np.cumsum(counts[:-1], out=fill[1:])
    out = np.empty_like(items)
    for a in range(0, len(items), _KEY_CHUNK):
        chunk = items[a:a + _KEY_CHUNK]
        keys = rank[chunk]
        by_rank = np.argsort(keys, kind="stable")
        sorted_keys = keys[by_rank]
        run_starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
        within = np.arange(len(chunk)) - np.repeat(run_starts, np.diff(np.r_[run_starts, len(chunk)]))
        out[fill[sorted_keys] + within] = chunk[by_rank]
        fill += np.bincount(keys, minlength=n_ranks)
    return out


class BatchIterator:
    """Epochs of token-budget batches, deterministic in ``(seed, epoch)``, resumable mid-epoch.

    ``for batch in it`` yields the rest of the current epoch (from ``offset``); once the
    epoch is exhausted, ``epoch`` is incremented and ``offset`` reset, so the next ``for``
    starts the next epoch. :meth:`state_dict` after receiving *k* batches gives
    ``offset = k``; a fresh iterator given that state yields exactly the batches that would
    have come next.

    ``transfer`` (:func:`~aiayn.data.prefetch.host_transfer`; None: neither) has the batches
    pinned for a CUDA device and prepared ahead by a background thread: the same batches in
    the same order, and ``offset`` still counts the batches received, not those prepared.
    :meth:`close` stops that thread (so do :meth:`load_state_dict` and closing the ``for``
    loop's generator).
    """

    def __init__(self, dataset: SizedPairs, max_tokens: int, seed: int = 1, shuffle: bool = True,
                 num_shards: int = 1, shard_id: int = 0, mode: str = "padded",
                 transfer: HostTransfer | None = None) -> None:
        if max_tokens < 1:
            raise DataError(f"max_tokens must be at least 1, got {max_tokens}")
        if mode not in BATCH_MODES:
            raise DataError(f"batch mode must be one of {', '.join(BATCH_MODES)}, got {mode!r}")
        if num_shards < 1 or not 0 <= shard_id < num_shards:
            raise ValueError(f"shard_id {shard_id} is not in range for num_shards={num_shards}")
        self.dataset = dataset
        self.max_tokens = int(max_tokens)
        self.mode = mode  # what max_tokens bounds: "padded" (the larger tensor) or "real" tokens per side
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.num_shards = int(num_shards)
        self.shard_id = int(shard_id)
        self.epoch: int = 1
        self.offset: int = 0
        self._size = len(dataset)
        if self._size == 0:
            raise DataError("cannot batch an empty dataset")
        # A dataset whose lengths change from epoch to epoch (subword sampling) is batched
        # by each epoch's lengths; any other once, by its own.
        self._epoch_sizes: Callable[[int], tuple[np.ndarray, np.ndarray]] | None = getattr(dataset, "epoch_sizes", None)
        self._layout = self._lay_out(dataset.src_sizes, dataset.tgt_sizes) if self._epoch_sizes is None else None
        self._cache: tuple[int, list[np.ndarray]] | None = None
        self.transfer = transfer
        self._prefetcher: Prefetcher[Batch] | None = None  # the latest pass's, while it runs

    def _lay_out(self, src_sizes: np.ndarray, tgt_sizes: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """The sort key (a length rank per sentence) and this shard's batch boundaries over
        the sorted sentences."""
        rank, lengths, counts = _sort_keys(np.asarray(src_sizes), np.asarray(tgt_sizes))
        # The sorted length sequence is the same for every tie-break permutation, so the
        # boundaries (and the split schedule for sharding) are computed once per layout.
        return rank, self._shard_bounds(_boundaries(lengths, counts, self.max_tokens, self.mode))

    # ------------------------------------------------------------------ batches

    def _epoch_layout(self, epoch: int) -> tuple[np.ndarray, list[int]]:
        if self._epoch_sizes is not None:
            return self._lay_out(*self._epoch_sizes(epoch))
        assert self._layout is not None
        return self._layout

    @staticmethod
    def _sorted_order(key: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
        n = len(key)
        # Sentence indices take four bytes while they can. Shuffling them in place draws what
        # rng.permutation(n) draws, whatever their type.
        base = np.arange(n, dtype=np.int32 if n < 1 << 31 else np.int64)
        if rng is not None:
            rng.shuffle(base)
        # By source length, then target length (the key is the rank of the length pair); a
        # stable sort keeps `base`'s order among equal lengths.
        return _stable_sort_by_rank(base, key)

    def _shard_bounds(self, bounds: list[int]) -> list[int]:
        """Split the largest batches in two until the batch count divides by num_shards."""
        if self.num_shards == 1:
            return bounds
        spans = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
        while len(spans) % self.num_shards:
            # Largest first: most sentences (cost is at most the budget anyway); ties by position.
            j = max(range(len(spans)), key=lambda k: (spans[k][1] - spans[k][0], -k))
            a, b = spans[j]
            if b - a < 2:
                raise DataError(
                    f"cannot give {self.num_shards} shards the same number of batches: "
                    f"{len(spans)} batches of one sentence each (dataset of {self._size} "
                    f"sentences); use a larger dataset or fewer shards")
            mid = (a + b) // 2
            spans[j:j + 1] = [(a, mid), (mid, b)]
        return [spans[0][0]] + [end for _, end in spans]

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch])

    def epoch_batches(self, epoch: int | None = None) -> list[np.ndarray]:
        """This shard's batches of ``epoch`` (default: the current one), as index arrays."""
        epoch = self.epoch if epoch is None else int(epoch)
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        key, bounds = self._epoch_layout(epoch)
        rng = self._rng(epoch) if self.shuffle else None
        order = self._sorted_order(key, rng)
        batches = [order[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        mine = batches[self.shard_id::self.num_shards]
        self._cache = (epoch, mine)
        return mine

    def __len__(self) -> int:
        """This shard's batches in the current epoch."""
        if self._layout is not None:
            return (len(self._layout[1]) - 1) // self.num_shards
        return len(self.epoch_batches())

    def __iter__(self) -> Iterator[Batch]:
        epoch, start = self.epoch, self.offset
        batches = self.epoch_batches(epoch)
        made = (self._host_batch(idx, epoch) for idx in batches[start:])
        depth = self.transfer.prefetch if self.transfer is not None else 0
        prefetcher = Prefetcher(made, depth) if depth and start < len(batches) else None
        self._prefetcher = prefetcher
        try:
            for batch in prefetcher if prefetcher is not None else made:
                # Count before yielding: a state_dict() taken while this batch is in use says
                # it has been consumed, so a resume continues with the next one. Batches the
                # prefetching thread has made beyond it are not counted.
                self.offset += 1
                yield batch
        finally:
            if prefetcher is not None:
                prefetcher.close()
                if self._prefetcher is prefetcher:
                    self._prefetcher = None
            else:
                made.close()
        self.epoch += 1
        self.offset = 0

    def _host_batch(self, indices: np.ndarray, epoch: int) -> Batch:
        """The batch of ``indices`` in ``epoch`` as the loop receives it (pinned, for CUDA)."""
        batch = self.make_batch(indices, epoch)
        if self.transfer is not None and self.transfer.pin_memory:
            batch = pinned(batch, self.transfer.device)
        return batch

    def close(self) -> None:
        """Stop the prefetching thread of the pass in progress, if any; its batches made
        ahead are dropped (the position is unchanged). Continuing that pass is an error:
        start a new one."""
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def make_batch(self, indices: np.ndarray, epoch: int | None = None) -> Batch:
        """The batch of sentences ``indices`` as in ``epoch`` (default: the current one)."""
        ds = self.dataset
        per_epoch = getattr(ds, "epoch_pairs", None)
        if per_epoch is not None:  # subword sampling (aiayn.data.sampling): new pieces in each epoch
            return collate(per_epoch(indices, self.epoch if epoch is None else int(epoch)))
        padded = getattr(ds, "padded", None)
        if padded is not None:  # TokenDataset: vectorized gather from the memory map
            src, src_lens = padded(indices, "src")
            tgt, tgt_lens = padded(indices, "tgt")
            return collate_padded(np.asarray(indices), src, src_lens, tgt, tgt_lens)
        return collate([(int(i), *ds[int(i)]) for i in indices])

    # ------------------------------------------------------------------ resume

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": int(self.epoch), "offset": int(self.offset)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()  # batches made ahead belong to the old position
        epoch, offset = int(state["epoch"]), int(state["offset"])
        n = len(self.epoch_batches(epoch)) if epoch >= 1 else 0
        if epoch < 1 or not 0 <= offset <= n:
            raise DataError(f"invalid data position epoch={epoch} offset={offset} "
                            f"(this shard has {n} batches in that epoch)")
        self.epoch, self.offset = epoch, offset
