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


@pytest.mark.parametrize(("odd", "named"), [("a", "a and c"), ("b", "b and c"), ("c", "a and c")])
def test_an_ensemble_checks_every_tokenizer_against_the_last(monkeypatch, odd: str, named: str) -> None:
    members = _members(monkeypatch, ["a", "b", "c"])
    members[odd].tokenizer.model_bytes = lambda: b"another vocabulary"
    with pytest.raises(CheckpointError, match=rf"^{named}: different tokenizers; the models of an ensemble must "
                                              r"share one SentencePiece vocabulary$"):
        E.load_models(["a", "b", "c"], ensemble=True)


def test_a_checkpoint_without_a_tokenizer_is_one_error(monkeypatch) -> None:
    monkeypatch.setattr(E, "load_checkpoint", lambda path, device: SimpleNamespace(path=Path(path), tokenizer=None))
    with pytest.raises(CheckpointError, match=r"^ck: the checkpoint has no tokenizer/ directory, so text cannot be "
                                              r"encoded; save it with its tokenizer$"):
        E.load_models(["ck"])


def test_an_unknown_precision_names_the_known_ones() -> None:
    import torch

    from aiayn.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--dtype fp8: choose from fp32, bf16, fp16, int8$"):
        E.weight_dtype("fp8", torch.device("cpu"))


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

    def map(self, batches, request):
        return ((batch, ["searched", request]) for batch in batches)


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


@pytest.mark.parametrize(("attention", "prefix"), [(False, [12]), (True, [12]), (True, [])])
def test_constraints_no_translation_meets_are_dropped_with_best_effort(tiny_checkpoint: Path, caplog,
                                                                       attention: bool, prefix: list[int]) -> None:
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
    stuck = EncodedSentence(0, [8, 9, 10, 11, EOS_ID], prefix=prefix, include=[[13, 14, 15, 16, 17, 18]])
    free = EncodedSentence(1, [5, 6, 7, EOS_ID])
    request = TranslationRequest(["a", "b"], cfg, attention=attention, best_effort=True, first_number=5)
    with caplog.at_level(logging.WARNING, logger=E.__name__):
        got = engine.search([stuck, free], request)
    assert caplog.messages == ["sentence 5: no translation within the length bound meets its constraints; "
                               "translated without them"]
    alone = engine.search([EncodedSentence(0, stuck.source, prefix=prefix)], request)
    second = engine.search([free], request)
    assert _hypotheses(got[:1]) == _hypotheses(alone)  # attention included: searched on its own
    assert [[row[:2] for row in r] for r in _hypotheses(got[1:])] == [[row[:2] for row in r]
                                                                      for r in _hypotheses(second)]
    assert got[0] and got[0][0].tokens[:len(prefix)] == prefix
    with pytest.raises(ConstraintError) as refused:
        engine.search([stuck, free], TranslationRequest(["a", "b"], cfg, attention=attention))
    assert (refused.value.index, str(refused.value).endswith(
        "no translation within the length bound meets its constraints")) == (0, True)


def test_batches_go_to_workers_holding_the_request_s_shortlist(engine, monkeypatch) -> None:
    from aiayn.inference.request import TranslationRequest

    monkeypatch.setattr(E.DecodingEngine, "compiled", property(lambda self: False))
    shortlist, request = object(), TranslationRequest(["a"])
    engine.use_workers(2)
    out = list(engine.search_batches([["b1"], ["b2"]], request, shortlist=shortlist))
    assert out == [(["b1"], ["searched", request]), (["b2"], ["searched", request])]
    assert engine._pool[0] is shortlist


def _model(max_positions: int = 64, seed: int = 0):
    import torch

    from aiayn.config import ModelConfig
    from aiayn.model import build_model

    torch.manual_seed(seed)
    return build_model(ModelConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=16, d_ff=32, n_heads=2,
                                   n_encoder_layers=1, n_decoder_layers=1, max_positions=max_positions))


def test_an_engine_decodes_in_float32_eagerly_on_the_cpu_unless_told() -> None:
    import torch

    from aiayn.inference.request import SourceLimits
    from aiayn.runtime.precision import resolve_inference_dtype

    engine = E.DecodingEngine(_model())
    assert engine.device == torch.device("cpu") and engine.precision.dtype == "fp32"
    assert not engine.compiled and engine._compiled is None
    assert engine.limits == SourceLimits(positions=64, steps=64)
    auto = E.DecodingEngine(_model(), dtype="auto")
    assert auto.precision == resolve_inference_dtype("auto", torch.device("cpu"))


def test_an_ensemble_reads_and_writes_what_its_shortest_member_can() -> None:
    from aiayn.inference.request import SourceLimits
    from aiayn.model.parameter_count import count_parameters

    members = [_model(64), _model(48, seed=1)]
    counts = [count_parameters(m)["parameters"] for m in members]
    engine = E.DecodingEngine(members)
    assert engine.limits == SourceLimits(positions=48, steps=48)
    assert engine.parameters["parameters"] == sum(counts)


def test_no_model_is_one_error() -> None:
    from aiayn.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^no model given$"):
        E.DecodingEngine([])


def test_weight_dtypes_per_precision_and_device() -> None:
    import torch

    from aiayn.errors import ConfigError

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [E.weight_dtype(p, cpu) for p in ("fp32", "bf16", "int8")] == [None, torch.bfloat16, torch.int8]
    assert E.weight_dtype("fp16", cuda) is torch.float16
    with pytest.raises(ConfigError, match=r"^--dtype fp16 needs a CUDA device; use bf16 on the CPU$"):
        E.weight_dtype("fp16", cpu)
    with pytest.raises(ConfigError, match=r"^--dtype int8 is a CPU path \(oneDNN int8 matmuls\); on cuda use fp16 "
                                          r"or bf16$"):
        E.weight_dtype("int8", cuda)


def test_a_constrained_sentence_searched_again_keeps_the_shortlist(tiny_checkpoint: Path) -> None:
    """The best-effort retry of a sentence whose constraints nothing met scores its batch's
    shortlist (the listed pieces and the constraints' own), not the whole vocabulary."""
    import torch

    from aiayn.config import DecodeConfig
    from aiayn.inference.request import EncodedSentence, TranslationRequest
    from aiayn.inference.translator import Translator
    from aiayn.vocab import EOS_ID

    engine = Translator.from_checkpoint(tiny_checkpoint, dtype="fp32").engine
    allowed = [EOS_ID, 20, 21, 22]
    shortlist = SimpleNamespace(rows=lambda ids, extra: torch.tensor(sorted({*allowed, *extra})))
    cfg = DecodeConfig(beam=2, max_len_a=0.0, max_len_b=3, shortlist=True)
    stuck = EncodedSentence(0, [8, 9, 10, 11, EOS_ID], include=[[13, 14, 15, 16, 17, 18]])
    request = TranslationRequest(["a"], cfg, best_effort=True)
    got = engine.search([stuck], request, shortlist)
    assert got[0] and all(set(h.tokens) <= {*allowed, *stuck.include[0]} for h in got[0])
    # Searched over the whole vocabulary, the same sentence alone finds other hypotheses.
    whole = engine.search([EncodedSentence(0, stuck.source)], TranslationRequest(["a"], DecodeConfig(
        beam=2, max_len_a=0.0, max_len_b=3)))
    assert _hypotheses(whole) != _hypotheses(got)
