"""The decoding engine's loading and worker pools (aiayn.inference.engine): which member's
tokenizer and configuration an ensemble or an average keeps, what it logs, and when a pool of
worker processes is replaced; checked with stand-ins for the checkpoints and the processes."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from aiayn.errors import CheckpointError
from aiayn.inference import engine as E


class _Tokenizer:
    def __init__(self, name: str) -> None:
        self.name = name

    def model_bytes(self) -> bytes:
        return b"one vocabulary"

    def __repr__(self) -> str:
        return f"Tokenizer({self.name})"


def _members(monkeypatch: pytest.MonkeyPatch, names: list[str]) -> dict[str, SimpleNamespace]:
    """Loading path ``p`` gives a stand-in checkpoint whose model, tokenizer and config name it."""
    members = {p: SimpleNamespace(path=Path(p), model=f"model {p}", tokenizer=_Tokenizer(p), config=f"config {p}")
               for p in names}
    monkeypatch.setattr(E, "_load_with_tokenizer", lambda p: members[str(p)])
    return members


def test_no_checkpoint_is_one_error() -> None:
    with pytest.raises(CheckpointError, match=r"^no checkpoint given$"):
        E.load_models([])


def test_an_ensemble_keeps_every_model_and_the_last_tokenizer_and_config(monkeypatch, caplog) -> None:
    _members(monkeypatch, ["a", "b", "c"])
    with caplog.at_level(logging.INFO, logger=E.__name__):
        loaded = E.load_models(["a", "b", "c"], ensemble=True)
    assert loaded.models == ["model a", "model b", "model c"]
    assert (repr(loaded.tokenizer), loaded.config) == ("Tokenizer(c)", "config c")
    assert caplog.messages == ["loaded an ensemble of a, b, c (Tokenizer(c))"]


def test_an_ensemble_checks_its_tokenizers(monkeypatch) -> None:
    members = _members(monkeypatch, ["a", "b"])
    members["a"].tokenizer.model_bytes = lambda: b"another vocabulary"
    with pytest.raises(CheckpointError, match=r"^a and b: different tokenizers; "):
        E.load_models(["a", "b"], ensemble=True)


def test_one_checkpoint_is_loaded_without_averaging(monkeypatch, caplog) -> None:
    _members(monkeypatch, ["a"])
    monkeypatch.setattr(E, "average_weights", lambda paths: pytest.fail("one checkpoint averaged"))
    with caplog.at_level(logging.INFO, logger=E.__name__):
        loaded = E.load_models(["a"])
    assert (loaded.models, repr(loaded.tokenizer), loaded.config) == (["model a"], "Tokenizer(a)", "config a")
    assert caplog.messages == ["loaded a (Tokenizer(a))"]


def test_several_checkpoints_are_averaged_into_the_last(monkeypatch, caplog) -> None:
    """Their element-wise mean, loaded strictly (every key) into the last one's model."""
    members = _members(monkeypatch, ["a", "b"])
    loads: list = []
    members["b"].model = SimpleNamespace(load_state_dict=lambda state, strict: loads.append((state, strict)))
    monkeypatch.setattr(E, "average_weights", lambda paths: ({"w": list(paths)}, None, [Path(p) for p in paths]))
    with caplog.at_level(logging.INFO, logger=E.__name__):
        loaded = E.load_models(["a", "b"])
    assert loads == [({"w": ["a", "b"]}, True)] and loaded.models == [members["b"].model]
    assert (repr(loaded.tokenizer), loaded.config) == ("Tokenizer(b)", "config b")
    assert caplog.messages == ["averaged the weights of 2 checkpoints", "loaded a, b (Tokenizer(b))"]


class _Pool:
    """A stand-in for SearchWorkers: what it was given, and whether it was closed."""

    made: list[_Pool] = []

    def __init__(self, search, workers: int, threads: int) -> None:
        self.search, self.workers, self.threads, self.closed = search, workers, threads, False
        _Pool.made.append(self)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch):
    """An engine (only its pool bookkeeping is used) whose worker pools are stand-ins."""
    monkeypatch.setattr(E, "SearchWorkers", _Pool)
    _Pool.made = []
    engine = object.__new__(E.DecodingEngine)
    engine._workers, engine._pool = (1, 0), None
    return engine


def test_use_workers_takes_one_thread_each_by_default(engine) -> None:
    engine.use_workers(3)
    assert engine._workers == (3, 1)
    engine.use_workers(2, threads=2)
    assert engine._workers == (2, 2)


def test_a_pool_is_kept_while_its_workers_and_shortlist_stay(engine) -> None:
    shortlist = object()
    engine.use_workers(2)
    pool = engine._worker_pool(shortlist)
    assert (pool.workers, pool.threads) == (2, 1)
    engine.use_workers(2)  # the same again: kept
    assert engine._worker_pool(shortlist) is pool and not pool.closed
    engine.use_workers(3)  # another count: closed, the next request forks anew
    assert pool.closed and engine._pool is None
    again = engine._worker_pool(shortlist)
    assert again is not pool and (again.workers, again.threads) == (3, 1)
    other = engine._worker_pool(object())  # another shortlist: the workers must hold it
    assert again.closed and other is not again and engine._pool[1] is other


def test_a_worker_searches_with_the_pool_s_shortlist(engine, monkeypatch) -> None:
    shortlist = object()
    seen: list = []
    monkeypatch.setattr(engine, "search", lambda batch, request, shortlist=None, decoder=None:
                        seen.append((batch, request, shortlist)) or ["hypotheses"], raising=False)
    engine.use_workers(2)
    pool = engine._worker_pool(shortlist)
    assert pool.search(["batch"], "request") == ["hypotheses"]
    assert seen == [(["batch"], "request", shortlist)]


@pytest.mark.parametrize(("flags", "exact"), [({"avx2", "avx512_vnni"}, False), ({"avx2"}, True)])
def test_int8_steps_stay_eager_where_int_mm_is_slow_or_inexact(tiny_checkpoint: Path, monkeypatch, caplog,
                                                                flags: set[str], exact: bool) -> None:
    """Compiled int8 steps run torch._int_mm: a reference loop without int8 dot products, and
    inexact where it saturates. There the engine keeps the eager steps, says so once, and
    `--compile auto` never estimates that compiling pays."""
    from aiayn.inference import quantize as Q
    from aiayn.inference.translator import Translator
    from aiayn.runtime import cpu

    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(Q, "int_mm_exact", lambda input_qmax, weight_qmax: exact)
    with caplog.at_level(logging.WARNING, logger=E.__name__):
        translator = Translator.from_checkpoint(tiny_checkpoint, dtype="int8", compile=True)
    assert not translator.engine.steps_compile_well and not translator.compiled
    assert caplog.messages == ["int8 decoding steps are not compiled on a CPU without VNNI or AMX (torch._int_mm, "
                               "which they would run, is slow or inexact there); decoding with the eager steps"]
    assert translator.engine.compile_pays(10**6, per_source=4) is False
    fp32 = Translator.from_checkpoint(tiny_checkpoint, dtype="fp32")
    assert fp32.engine.steps_compile_well  # no int8 layer: nothing to run slowly


def test_int8_steps_compile_with_int8_dot_products_and_exact_ranges(tiny_checkpoint: Path, monkeypatch) -> None:
    from aiayn.inference import quantize as Q
    from aiayn.inference.translator import Translator
    from aiayn.runtime import cpu

    ranges: list[tuple[float, float]] = []
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "avx512_vnni"}))
    monkeypatch.setattr(Q, "int_mm_exact", lambda input_qmax, weight_qmax: ranges.append(
        (input_qmax, weight_qmax)) is None)
    translator = Translator.from_checkpoint(tiny_checkpoint, dtype="int8")
    assert translator.engine.steps_compile_well
    layer = next(m for m in translator.engine.model.modules() if isinstance(m, Q.Int8Linear))
    assert (layer.input_qmax, Q.weight_qmax(layer.kernel)) in ranges


def _hypotheses(hyps):
    return [[(h.tokens, round(h.score, 5), None if h.attention is None else h.attention.tolist()) for h in sentence]
            for sentence in hyps]


@pytest.mark.parametrize("attention", [False, True])
def test_constraints_no_translation_meets_are_dropped_with_best_effort(tiny_checkpoint: Path, caplog,
                                                                       attention: bool) -> None:
    """A sentence whose required phrase cannot fit the length bound: the search finds nothing;
    with ``best_effort`` that sentence alone is searched again, with its prefix and without
    its constraints, and a warning names its number; without, ConstraintError."""
    from aiayn.config import DecodeConfig
    from aiayn.errors import ConstraintError
    from aiayn.inference.request import EncodedSentence, TranslationRequest
    from aiayn.inference.translator import Translator
    from aiayn.vocab import EOS_ID

    engine = Translator.from_checkpoint(tiny_checkpoint, dtype="fp32").engine
    cfg = DecodeConfig(beam=2, max_len_a=0.0, max_len_b=3)
    free = EncodedSentence(0, [5, 6, 7, EOS_ID])
    stuck = EncodedSentence(1, [8, 9, 10, 11, EOS_ID], prefix=[12], include=[[13, 14, 15, 16, 17, 18]])
    request = TranslationRequest(["a", "b"], cfg, attention=attention, best_effort=True, first_number=5)
    with caplog.at_level(logging.WARNING, logger=E.__name__):
        got = engine.search([free, stuck], request)
    assert caplog.messages == ["sentence 6: no translation within the length bound meets its constraints; "
                               "translated without them"]
    alone = engine.search([EncodedSentence(1, stuck.source, prefix=[12])], request)
    first = engine.search([free], request)
    assert _hypotheses(got[1:]) == _hypotheses(alone)  # attention included: searched on its own
    assert [[row[:2] for row in r] for r in _hypotheses(got[:1])] == [[row[:2] for row in r]
                                                                      for r in _hypotheses(first)]
    assert got[1] and got[1][0].tokens[:1] == [12]
    with pytest.raises(ConstraintError) as refused:
        engine.search([free, stuck], TranslationRequest(["a", "b"], cfg, attention=attention))
    assert (refused.value.index, str(refused.value).endswith(
        "no translation within the length bound meets its constraints")) == (1, True)
