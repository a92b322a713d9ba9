"""The prefetching loader (aiayn.data.prefetch): the same batches in the same order with or
without the thread, errors raised where the batch would have come, early close, exact resume,
and the per-device choices of pinning, non-blocking copies and prefetch depth."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from aiayn.config import Config, DataConfig
from aiayn.data.batching import Batch, BatchIterator
from aiayn.data.prefetch import CPU_PREFETCH, CUDA_PREFETCH, Prefetcher, host_transfer
from aiayn.errors import ConfigError
from aiayn.vocab import EOS_ID


class ListDataset:
    """Random ids of random lengths in memory; ``fail_at``: an index whose read raises."""

    def __init__(self, n: int, seed: int = 0, max_len: int = 30, fail_at: int | None = None) -> None:
        rng = np.random.default_rng(seed)
        self.src = [np.append(rng.integers(4, 100, rng.integers(1, max_len)), EOS_ID) for _ in range(n)]
        self.tgt = [rng.integers(4, 100, rng.integers(1, max_len)) for _ in range(n)]
        self.src_sizes = np.array([len(s) for s in self.src])
        self.tgt_sizes = np.array([len(t) for t in self.tgt])
        self.fail_at = fail_at

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if i == self.fail_at:
            raise OSError(f"sentence {i}: read error")
        return self.src[i], self.tgt[i]


@pytest.fixture(scope="module")
def data() -> ListDataset:
    return ListDataset(600)


def _iterator(data: ListDataset, prefetch: int) -> BatchIterator:
    return BatchIterator(data, max_tokens=250, seed=7, transfer=host_transfer("cpu", prefetch))


def _fields(batch: Batch) -> tuple:
    return (batch.src, batch.tgt_in, batch.tgt_out, batch.ids, batch.n_src_tokens, batch.n_tgt_tokens)


def _assert_same(got: list[Batch], want: list[Batch]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        for x, y in zip(_fields(a), _fields(b)):
            assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y


def _no_prefetch_thread() -> bool:
    return not any(t.name == "aiayn-prefetch" and t.is_alive() for t in threading.enumerate())


@pytest.mark.parametrize("prefetch", [1, 4])
def test_prefetching_gives_the_same_batches_in_the_same_order(data: ListDataset, prefetch: int) -> None:
    plain, ahead = _iterator(data, 0), _iterator(data, prefetch)
    for _ in range(2):  # two epochs: the second in another order
        _assert_same(list(ahead), list(plain))
    assert ahead.state_dict() == plain.state_dict() == {"epoch": 3, "offset": 0}
    assert _no_prefetch_thread()


def test_the_position_counts_batches_received_not_prepared(data: ListDataset) -> None:
    reference = list(_iterator(data, 0))
    it = _iterator(data, 4)
    got = []
    for batch in it:
        got.append(batch)
        if len(got) == 5:
            state = json.loads(json.dumps(it.state_dict()))
            break
    assert state == {"epoch": 1, "offset": 5}  # not 5 + the 4 made ahead
    resumed = _iterator(data, 1)
    resumed.load_state_dict(state)
    _assert_same(got + list(resumed), reference)


def test_a_pass_broken_off_leaves_no_thread_and_the_next_one_continues(data: ListDataset) -> None:
    reference = list(_iterator(data, 0))
    it = _iterator(data, 2)
    passes = iter(it)
    first = [next(passes) for _ in range(3)]
    passes.close()  # what leaving a for loop early does
    assert _no_prefetch_thread()
    _assert_same(first + list(it), reference)


def test_closing_the_iterator_stops_its_thread_and_ends_the_pass_loudly(data: ListDataset) -> None:
    it = _iterator(data, 3)
    passes = iter(it)
    next(passes)
    it.close()
    assert _no_prefetch_thread()
    with pytest.raises(RuntimeError, match="prefetching iterator was closed"):
        next(passes)
    assert it.state_dict() == {"epoch": 1, "offset": 1}


def test_loading_a_position_stops_the_thread_of_the_old_one(data: ListDataset) -> None:
    it = _iterator(data, 3)
    passes = iter(it)
    next(passes)
    it.load_state_dict({"epoch": 2, "offset": 4})
    assert _no_prefetch_thread()
    passes.close()
    assert it.state_dict() == {"epoch": 2, "offset": 4}


def test_an_error_while_preparing_is_raised_where_its_batch_would_come() -> None:
    clean = ListDataset(300)
    order = [b.tolist() for b in BatchIterator(clean, 250, seed=7).epoch_batches(1)]
    bad_batch = 4
    broken = ListDataset(300, fail_at=order[bad_batch][0])
    it = BatchIterator(broken, 250, seed=7, transfer=host_transfer("cpu", 3))
    got = []
    with pytest.raises(OSError, match=rf"^sentence {order[bad_batch][0]}: read error$"):
        for batch in it:
            got.append(batch.ids.tolist())
    assert got == order[:bad_batch]
    assert it.state_dict() == {"epoch": 1, "offset": bad_batch}
    assert _no_prefetch_thread()


def test_prefetcher_hands_on_the_original_exception() -> None:
    error = ValueError("item 3 is malformed")

    def source() -> Iterator[int]:
        yield from range(3)
        raise error

    with Prefetcher(source(), depth=2) as items:
        assert [next(items) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(ValueError) as raised:
            next(items)
    assert raised.value is error and str(raised.value) == "item 3 is malformed"


def test_prefetcher_closed_early_stops_its_source() -> None:
    state = {"made": 0, "finished": False}

    def endless() -> Iterator[int]:
        try:
            while True:
                state["made"] += 1
                yield state["made"]
        finally:
            state["finished"] = True

    items = Prefetcher(endless(), depth=2)
    assert next(items) == 1 and next(items) == 2
    items.close()
    assert not items.alive and state["finished"]
    assert state["made"] <= 2 + 2 + 1  # at most the queue's depth (plus one in hand) beyond
    items.close()  # idempotent


def test_prefetcher_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="depth of at least 1"):
        Prefetcher(iter(()), depth=0)


def test_an_abandoned_prefetching_thread_does_not_hold_up_exit(tmp_path) -> None:
    script = textwrap.dedent("""
        import itertools
        from aiayn.data.prefetch import Prefetcher
        items = Prefetcher(itertools.count(), depth=2)  # never closed, always blocked
        print(next(items), next(items))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "1"]


def test_transfer_choices_by_device() -> None:
    cpu = host_transfer("cpu")
    assert (cpu.pin_memory, cpu.non_blocking, cpu.prefetch) == (False, False, CPU_PREFETCH)
    cuda = host_transfer(torch.device("cuda", 1))  # a choice by name: no GPU needed to make it
    assert (cuda.pin_memory, cuda.non_blocking, cuda.prefetch) == (True, True, CUDA_PREFETCH)
    assert cuda.device == torch.device("cuda", 1)
    assert host_transfer("cpu", 3).prefetch == 3 and host_transfer("cuda", 0).prefetch == 0
    with pytest.raises(ValueError, match="must not be negative"):
        host_transfer("cpu", -1)


def test_on_a_cpu_batches_are_neither_pinned_nor_moved(data: ListDataset) -> None:
    transfer = host_transfer("cpu", 2)
    batch = next(iter(BatchIterator(data, 250, seed=7, transfer=transfer)))
    moved = transfer.to_device(batch)
    assert moved.src.data_ptr() == batch.src.data_ptr()  # the very tensors: no copy


def test_prefetch_batches_field() -> None:
    assert DataConfig().prefetch_batches is None  # by device
    DataConfig(prefetch_batches=0).validate()
    with pytest.raises(ConfigError, match=r"^data\.prefetch_batches: must be 0"):
        Config(data=DataConfig(prefetch_batches=-2)).validate()


@pytest.mark.parametrize("prefetch", [0, 2])
def test_with_pinning_every_batch_is_pinned_before_the_loop_gets_it(data: ListDataset, monkeypatch,
                                                                    prefetch: int) -> None:
    pinned_by: dict[int, str] = {}

    def fake_pin(batch: Batch, device: torch.device) -> Batch:  # page-locking needs CUDA
        assert device == torch.device("cuda", 0)
        pinned_by[id(batch.ids)] = threading.current_thread().name
        return batch

    monkeypatch.setattr("aiayn.data.batching.pinned", fake_pin)
    cuda = host_transfer("cuda:0", prefetch)
    got = list(BatchIterator(data, 250, seed=7, transfer=cuda))
    _assert_same(got, list(_iterator(data, 0)))
    threads = {pinned_by[id(b.ids)] for b in got}
    assert threads == {"aiayn-prefetch" if prefetch else "MainThread"}
