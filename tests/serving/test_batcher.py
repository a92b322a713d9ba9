"""The dynamic batcher on its own, driven by a scripted translate function (no model)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("prometheus_client", reason="the 'serve' extra is not installed")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from aiayn.serving.batcher import BatchLimits, DecodeOptions, DynamicBatcher, QueueFullError, ShuttingDownError  # noqa: E402
from aiayn.serving.metrics import ServerMetrics  # noqa: E402


class Scripted:
    """Records every call; translates "x" to "T(x)"; raises on a text containing "bad".
    With ``gate``, the first call blocks until the test sets it: requests submitted
    meanwhile must queue behind that call (event-driven, no sleeps)."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.calls: list[tuple[list[str], DecodeOptions]] = []
        self.gate = gate
        self.entered = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, texts: list[str], nbest: int, attention: bool, overrides: dict[str, Any]) -> list[str]:
        with self.lock:
            self.calls.append((list(texts), DecodeOptions.make(nbest, attention, overrides)))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(timeout=60), "the test never opened the gate"
        if any("bad" in t for t in texts):
            raise ValueError("scripted failure")
        return [f"T({t})" for t in texts]


OPTS = DecodeOptions.make()


def submit(b: DynamicBatcher, texts: list[str], options: DecodeOptions = OPTS):
    return b.submit(texts, [len(t.split()) + 1 for t in texts], options)


def test_concurrent_requests_share_model_calls_and_get_their_own_results() -> None:
    gate = threading.Event()
    fn = Scripted(gate)
    b = DynamicBatcher(fn, limits=BatchLimits(window_ms=0))
    b.start()
    futures = [submit(b, ["s0 a", "s0 b"])]
    assert fn.entered.wait(timeout=60)  # the model is busy with the first request ...
    futures += [submit(b, [f"s{i} a", f"s{i} b"]) for i in range(1, 10)]
    gate.set()  # ... so the nine others, queued meanwhile, share the next call
    results = [f.result(timeout=60) for f in futures]
    b.close()
    for i, r in enumerate(results):
        assert r == [f"T(s{i} a)", f"T(s{i} b)"]
    assert [texts for texts, _ in fn.calls] == [["s0 a", "s0 b"], [f"s{i} {x}" for i in range(1, 10) for x in "ab"]]


def test_the_window_lets_a_later_request_join() -> None:
    # A window far longer than the test: the first request can only leave with the second,
    # which fills the batch (2 sentences), so the batch goes at once, without waiting out the window.
    fn = Scripted()
    b = DynamicBatcher(fn, limits=BatchLimits(window_ms=600_000, max_batch_sentences=2))
    in_window = threading.Event()
    idle_or_window_wait = b._cond.wait

    def wait(timeout: float | None = None) -> bool:
        if timeout is not None:  # only the window's wait has a timeout
            in_window.set()
        return idle_or_window_wait(timeout)

    b._cond.wait = wait  # type: ignore[method-assign]
    b.start()
    first = submit(b, ["one"])
    assert in_window.wait(timeout=60), "the worker never held the first request in its window"
    second = submit(b, ["two"])
    assert first.result(timeout=60) == ["T(one)"] and second.result(timeout=60) == ["T(two)"]
    b.close()
    assert [texts for texts, _ in fn.calls] == [["one", "two"]]


def test_token_budget_and_sentence_limit_cut_batches() -> None:
    fn = Scripted()
    b = DynamicBatcher(fn, limits=BatchLimits(max_batch_tokens=10, max_batch_sentences=64, window_ms=0))
    futures = [submit(b, ["a b c"]) for _ in range(5)]  # 4 tokens each (EOS included)
    b.start()  # everything is queued before the worker looks
    for f in futures:
        f.result(timeout=10)
    b.close()
    assert [len(texts) for texts, _ in fn.calls] == [2, 2, 1]  # 2 x 4 <= 10 < 3 x 4

    fn2 = Scripted()
    b2 = DynamicBatcher(fn2, limits=BatchLimits(max_batch_sentences=3, window_ms=0))
    futures = [submit(b2, ["a"]) for _ in range(7)]
    b2.start()
    for f in futures:
        f.result(timeout=10)
    b2.close()
    assert [len(texts) for texts, _ in fn2.calls] == [3, 3, 1]


def test_requests_with_different_options_never_share_a_call() -> None:
    fn = Scripted()
    b = DynamicBatcher(fn, limits=BatchLimits(window_ms=0))
    beam2 = DecodeOptions.make(overrides={"beam": 2})
    futures = [submit(b, [f"t{i}"], beam2 if i % 2 else OPTS) for i in range(6)]
    b.start()
    for f in futures:
        f.result(timeout=10)
    b.close()
    for texts, opts in fn.calls:
        expected = beam2 if int(texts[0][1:]) % 2 else OPTS
        assert all((int(t[1:]) % 2 == 1) == (expected == beam2) for t in texts)
        assert opts == expected
    assert len(fn.calls) == 2


def test_a_failing_request_fails_alone() -> None:
    fn = Scripted()
    metrics = ServerMetrics()
    b = DynamicBatcher(fn, metrics=metrics, limits=BatchLimits(window_ms=0))
    good1, bad, good2 = submit(b, ["fine"]), submit(b, ["bad one"]), submit(b, ["also fine"])
    b.start()
    assert good1.result(timeout=10) == ["T(fine)"]
    assert good2.result(timeout=10) == ["T(also fine)"]
    with pytest.raises(ValueError, match="scripted failure"):
        bad.result(timeout=10)
    b.close()
    assert metrics.value("aiayn_batch_failures_total") == 1
    assert [texts for texts, _ in fn.calls][0] == ["fine", "bad one", "also fine"]  # tried together first


def test_a_full_queue_refuses_and_counts() -> None:
    metrics = ServerMetrics()
    b = DynamicBatcher(Scripted(), metrics=metrics, limits=BatchLimits(queue_size=2))
    submit(b, ["a"])
    submit(b, ["b"])
    with pytest.raises(QueueFullError):
        submit(b, ["c"])
    assert metrics.value("aiayn_queue_rejected_total") == 1
    b.start()
    b.close()


def test_close_finishes_queued_work_then_refuses() -> None:
    fn = Scripted()
    b = DynamicBatcher(fn, enabled=False)
    futures = [submit(b, [f"q{i}"]) for i in range(4)]
    b.start()
    b.close()
    assert [f.result(timeout=1) for f in futures] == [[f"T(q{i})"] for i in range(4)]
    with pytest.raises(ShuttingDownError):
        submit(b, ["late"])


def test_without_batching_every_request_runs_alone() -> None:
    fn = Scripted()
    b = DynamicBatcher(fn, enabled=False)
    futures = [submit(b, ["a", "b"]) for _ in range(5)]
    b.start()
    for f in futures:
        f.result(timeout=10)
    b.close()
    assert [len(texts) for texts, _ in fn.calls] == [2] * 5


def test_metrics_render_in_prometheus_text_format() -> None:
    metrics = ServerMetrics()
    b = DynamicBatcher(Scripted(), metrics=metrics, limits=BatchLimits(window_ms=0))
    b.start()
    submit(b, ["a b", "c"]).result(timeout=10)
    b.close()
    text = metrics.render().decode("utf-8")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["aiayn_batch_sentences"].type == "histogram"
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    # Cumulative buckets: one batch of two sentences.
    assert samples[("aiayn_batch_sentences_bucket", (("le", "1.0"),))] == 0
    assert samples[("aiayn_batch_sentences_bucket", (("le", "2.0"),))] == 1
    assert samples[("aiayn_batch_sentences_bucket", (("le", "+Inf"),))] == 1
    assert samples[("aiayn_batch_sentences_count", ())] == 1
    assert samples[("aiayn_batch_sentences_sum", ())] == 2
    assert samples[("aiayn_batch_requests_count", ())] == 1
    assert samples[("aiayn_batches_total", ())] == 1
    assert samples[("aiayn_sentences_total", ())] == 2
    assert samples[("aiayn_source_tokens_total", ())] == 5
    assert text.endswith("\n")


def test_a_withdrawn_request_is_never_translated() -> None:
    """A request whose client disconnected leaves the queue untranslated; the others go on."""
    gate = threading.Event()
    fn = Scripted(gate)
    metrics = ServerMetrics()
    b = DynamicBatcher(fn, metrics=metrics, limits=BatchLimits(window_ms=0))
    b.start()
    first = submit(b, ["s0"])
    assert fn.entered.wait(timeout=60)  # the model is busy with the first request
    gone, kept = submit(b, ["gone"]), submit(b, ["kept"])
    assert b.withdraw(gone) and gone.cancelled() and b.depth == 1
    assert not b.withdraw(first)  # being translated: it finishes
    gate.set()
    assert first.result(timeout=60) == ["T(s0)"] and kept.result(timeout=60) == ["T(kept)"]
    b.close()
    assert [texts for texts, _ in fn.calls] == [["s0"], ["kept"]]
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    assert families["aiayn_queue_abandoned"].samples[0].value == 1.0
