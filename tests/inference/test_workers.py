"""Batches searched in worker processes (aiayn.inference.workers through the engine's
``use_workers``): the same hypotheses as in this process, errors raised as here, a map left
early leaving nothing behind, the cases kept in-process, and workers that end with their
parent or report their own end."""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path

import pytest
import torch

from aiayn.errors import ConstraintError
from aiayn.inference import workers as W
from aiayn.inference.request import TranslationRequest
from aiayn.inference.translator import Translator


@pytest.fixture
def translators(tiny_checkpoint: Path):
    """(in this process, with 2 workers): the same checkpoint twice."""
    here = Translator.from_checkpoint(tiny_checkpoint, dtype="fp32")
    pooled = Translator.from_checkpoint(tiny_checkpoint, dtype="fp32")
    pooled.engine.use_workers(2, threads=1)
    yield here, pooled
    pooled.engine.use_workers(1)


def _detailed(translator: Translator, texts: list[str], **options):
    results = translator.translate_detailed(texts, nbest=2, attention=True, batch_tokens=24, **options)
    return [[(h.text, h.score, h.tokens, h.attention) for h in r.hypotheses] for r in results]


def test_workers_give_the_hypotheses_of_this_process(translators, english: list[str]) -> None:
    here, pooled = translators
    texts = [*english, "", english[0]]
    expected = _detailed(here, texts)
    got = _detailed(pooled, texts)
    assert len(got) == len(texts)
    for mine, theirs in zip(got, expected, strict=True):
        assert [(t, s, k) for t, s, k, _ in mine] == [(t, s, k) for t, s, k, _ in theirs]
        for (*_, a), (*_, b) in zip(mine, theirs, strict=True):
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    processes = pooled.engine._pool[1]._processes
    assert len(processes) == 2 and all(p.is_alive() for p in processes)
    # A second request reuses them.
    assert pooled.translate(english[:3]) == here.translate(english[:3])
    assert pooled.engine._pool[1]._processes == processes


def test_progress_comes_batch_by_batch_in_order(translators, english: list[str]) -> None:
    _, pooled = translators
    seen: list[int] = []
    pooled.run(TranslationRequest(english, pooled.decode_config(batch_tokens=24), progress=seen.append))
    assert sum(seen) == len(english) and len(seen) > 2


def test_an_error_in_a_batch_is_raised_here_and_the_next_request_is_whole(translators, english: list[str]) -> None:
    here, pooled = translators
    # Two pieces of room, both required, both orders excluded: the search itself finds nothing
    # (the request's own checks pass), in a worker as in this process.
    constraints: list = [None] * len(english)
    constraints[5] = {"include": ["red", "ball"], "exclude": ["red ball", "ball red"]}
    raised = []
    for translator in (here, pooled):
        with pytest.raises(ConstraintError) as info:
            translator.translate(english, constraints=constraints, batch_tokens=24, max_len_b=2, max_len_a=0.0)
        raised.append((type(info.value), info.value.index, str(info.value)))
    assert raised[0] == raised[1] == (
        ConstraintError, 5, "texts[5]: no translation within the length bound meets its constraints")
    assert pooled.translate(english) == here.translate(english)


def test_a_map_left_early_does_not_reach_the_next(translators, english: list[str]) -> None:
    here, pooled = translators
    request = TranslationRequest(english, pooled.decode_config(batch_tokens=24))
    from aiayn.inference.request import batches, encode_request

    sentences = encode_request(request, pooled.tokenizer, pooled.tokenizer, pooled.engine.limits)
    found = pooled.engine.search_batches(batches(sentences, 24), request)
    next(found)
    found.close()  # the consumer stops after one batch
    assert pooled.translate(english) == here.translate(english)


def test_compiled_steps_and_grammars_search_here(translators, english: list[str], monkeypatch) -> None:
    _, pooled = translators

    def refuse(*args, **kwargs):
        raise AssertionError("sent to the workers")

    monkeypatch.setattr(W.SearchWorkers, "map", refuse)
    request = TranslationRequest(english[:4], pooled.decode_config(), grammar=lambda rows: None)
    assert len(pooled.run(request)) == 4
    pooled.run(TranslationRequest(english[:4], pooled.decode_config()), decoder=pooled.engine.decoder)
    assert pooled.engine.searches_in_workers
    monkeypatch.setattr(type(pooled.engine), "compiled", property(lambda self: True))
    assert not pooled.engine.searches_in_workers
    pooled.translate(english[:4])


def test_a_worker_ends_when_its_parent_is_gone(monkeypatch) -> None:
    monkeypatch.setattr(W, "PARENT_CHECK_S", 0.01)
    ended = threading.Event()

    def serve() -> None:  # a parent id that is not this thread's process's parent
        W._serve(lambda b, r: [], queue.Queue(), queue.Queue(), type("V", (), {"value": 0})(), 1, os.getppid() + 10**6)
        ended.set()

    before = torch.get_num_threads()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    thread.join(timeout=10)
    torch.set_num_threads(before)
    assert ended.is_set()


def test_a_task_of_an_abandoned_map_is_skipped_and_a_failure_travels(monkeypatch) -> None:
    tasks, results = queue.Queue(), queue.Queue()
    for item in [(0, ["old"], None), (1, ["new"], None), (2, ["bad"], None), None]:
        tasks.put(item)

    def search(batch, request):
        if batch == ["bad"]:
            raise ConstraintError(3, "cannot be met")
        return [batch]

    before = torch.get_num_threads()
    W._serve(search, tasks, results, type("V", (), {"value": 1})(), 1, os.getppid())
    torch.set_num_threads(before)
    assert results.get_nowait() == (1, True, [["new"]])
    task_id, ok, error = results.get_nowait()
    assert (task_id, ok, type(error), error.index) == (2, False, ConstraintError, 3)
    assert results.empty()


def test_an_exception_that_cannot_travel_becomes_its_text() -> None:
    class Local(Exception):
        def __reduce__(self):
            raise TypeError("not picklable")

    portable = W._portable(Local("boom"))
    assert type(portable) is RuntimeError and str(portable) == "Local: boom"
    error = ValueError("fine")
    assert W._portable(error) is error


def test_a_worker_that_dies_is_one_error(translators, english: list[str], monkeypatch) -> None:
    _, pooled = translators
    pooled.translate(english[:2])  # the workers started
    monkeypatch.setattr(W, "PARENT_CHECK_S", 0.05)
    for process in pooled.engine._pool[1]._processes:
        process.kill()
        process.join()
    with pytest.raises(RuntimeError, match=r"^decoding worker aiayn-search-0 ended before its batch was done "
                                           r"\(out of memory\?\)$"):
        pooled.translate(english)


def test_fewer_than_two_workers_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match=r"^SearchWorkers needs 2 or more workers$"):
        W.SearchWorkers(lambda b, r: [], 1)


def test_a_pool_starts_nothing_until_used_and_one_thread_each_by_default() -> None:
    pool = W.SearchWorkers(lambda b, r: [], 2)
    assert (pool.workers, pool.threads) == (2, 1)
    pool.close()  # never started: nothing to stop
    assert pool._processes == []


def test_workers_are_daemons_named_in_order_and_logged(translators, english: list[str], caplog) -> None:
    """Daemons: an interpreter that exits never waits for them."""
    import logging

    _, pooled = translators
    with caplog.at_level(logging.INFO, logger=W.__name__):
        pooled.translate(english[:2])
    processes = pooled.engine._pool[1]._processes
    assert [(p.name, p.daemon) for p in processes] == [("aiayn-search-0", True), ("aiayn-search-1", True)]
    assert "decoding in 2 worker processes of 1 thread(s) each" in caplog.messages


def test_closing_kills_a_worker_stuck_in_a_search(monkeypatch) -> None:
    """A worker that does not end within STOP_S of being told to (a search that never
    returns) is killed: closing never waits on it for ever."""
    monkeypatch.setattr(W, "STOP_S", 0.2)
    pool = W.SearchWorkers(lambda b, r: threading.Event().wait(), 2)
    pool._start()
    processes = list(pool._processes)
    for k in range(2):
        pool._tasks.put((k, ["stuck"], None))
    closed = threading.Event()

    def close() -> None:
        pool.close()
        closed.set()

    threading.Thread(target=close, daemon=True).start()
    assert closed.wait(timeout=30)
    assert not any(p.is_alive() for p in processes) and pool._processes == []


def test_a_request_travels_as_its_options_alone() -> None:
    """What a worker receives: the texts, prefixes, constraints, callables and encoded sources
    stay with the parent; every option is kept."""
    import dataclasses
    import pickle

    from aiayn.config import DecodeConfig

    request = TranslationRequest(["a b", "c"], DecodeConfig(beam=3, nbest=2), attention=True,
                                 prefixes=["x", None], constraints=[None, None], best_effort=True, truncate=False,
                                 first_number=7, attention_summary=lambda a: a, progress=print, sources=[[5], [6]])
    portable = W._portable_request(request)
    dropped = {"texts": (), "prefixes": None, "constraints": None, "progress": None, "sources": None,
               "attention_summary": None}
    for f in dataclasses.fields(request):
        assert getattr(portable, f.name) == dropped.get(f.name, getattr(request, f.name)), f.name
    assert pickle.loads(pickle.dumps(portable)).decode == request.decode


def test_an_idle_worker_waits_for_its_task_and_passes_the_request(monkeypatch) -> None:
    """A worker idles in slices of PARENT_CHECK_S, looking whether its parent is there (an
    orphan stops), and hands the search each task's own request."""
    monkeypatch.setattr(W, "PARENT_CHECK_S", 0.01)
    tasks, results = queue.Queue(), queue.Queue()
    seen: list = []
    request = object()
    parent = os.getppid()
    calls = {"n": 0}

    def getppid() -> int:  # the parent is gone after 50 looks: a blocking wait would never look again
        calls["n"] += 1
        return parent if calls["n"] <= 50 else parent + 10**6

    def feed() -> None:
        threading.Event().wait(0.1)
        tasks.put((0, ["batch"], request))

    monkeypatch.setattr(W.os, "getppid", getppid)
    ended = threading.Event()

    def serve() -> None:
        W._serve(lambda b, r: seen.append(r) or [b], tasks, results, type("V", (), {"value": 0})(), 1, parent)
        ended.set()

    before = torch.get_num_threads()
    threading.Thread(target=feed, daemon=True).start()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    thread.join(timeout=10)
    torch.set_num_threads(before)
    assert ended.is_set() and calls["n"] > 50
    assert results.get_nowait() == (0, True, [["batch"]]) and seen == [request]


ORPHAN = """
import os, sys
from aiayn.inference.translator import Translator
translator = Translator.from_checkpoint(sys.argv[1], dtype="fp32")
translator.engine.use_workers(2)
translator.translate(["a man is riding a red bike", "two dogs"] * 4, batch_tokens=16)
print(" ".join(str(p.pid) for p in translator.engine._pool[1]._processes), flush=True)
os._exit(0)  # no clean-up: as a killed parent
"""


def test_workers_end_with_a_parent_that_exits_without_clean_up(tiny_checkpoint: Path, monkeypatch) -> None:
    import subprocess
    import sys
    import time

    proc = subprocess.run([sys.executable, "-c", ORPHAN, str(tiny_checkpoint)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2
    def running(pid: int) -> bool:  # an ended process not yet reaped (a zombie) has ended
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False

    deadline = time.monotonic() + 30  # each notices within PARENT_CHECK_S; the margin is for a busy machine
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(running(pid) for pid in pids)
