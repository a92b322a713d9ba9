"""The compiled decoding step (aiayn.inference.compiled) against the eager one.

Building a package runs inductor and the C++ compiler, even for a tiny model, so the module
shares one compiled decoder and its one package (``built``): every test that decodes with it
keeps two rows per source. Only claims about another package build their own (int8, which is
also the greedy package). The eager :class:`IncrementalDecoder` of the same optimized model is
the reference.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch

from aiayn.config import DecodeConfig, ModelConfig
from aiayn.inference.adapters import IncrementalDecoder
from aiayn.inference.compiled import CompiledDecoder, IndexedKVCache
from aiayn.inference.optimize import optimize_for_inference
from aiayn.inference.search import search
from aiayn.inference.step_packages import StepPackages, record_path
from aiayn.model import KVCache, Transformer, build_model
from aiayn.model import cache as cache_module

VOCAB = 40
CXX = ("g++", "c++", "clang++")
NO_COMPILER = "no C++ compiler (g++, c++ or clang++) for inductor: compiled decoding fell back to eager"


# torch.compile builds C++ kernels with g++: minutes on a busy 2-core machine.
pytestmark = pytest.mark.timeout(600)


def _model() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32, d_ff=64, n_heads=4,
                      n_encoder_layers=2, n_decoder_layers=2, max_positions=64)
    return build_model(cfg).eval()


Built = tuple[IncrementalDecoder, CompiledDecoder, list[Path]]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The eager decoder, a compiled decoder of the same optimized model over an empty folder,
    and the packages its first search built: one sentence (a server's first request often
    is), beam 2, 20 tokens. The tests that share it decode with two rows per source, so that
    one package serves them all."""
    optimized = optimize_for_inference(_model())
    eager = IncrementalDecoder(optimized)
    compiled = CompiledDecoder(optimized, folder=tmp_path_factory.mktemp("packages"))
    _one_sentence_search(eager, compiled)
    return eager, compiled, list(compiled.packages.built)


@pytest.fixture
def decoders(built: Built) -> tuple[IncrementalDecoder, CompiledDecoder]:
    eager, compiled, _ = built
    return eager, compiled


def _sources() -> torch.Tensor:
    """Three sources of different lengths (padded with 0), ending in EOS (3)."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (3, 9), generator=g)
    src[0, 5:], src[1, 8:] = 0, 0
    src[0, 4], src[1, 7], src[2, 8] = 3, 3, 3
    return src


def test_steps_match_the_eager_decoder_through_reorders(decoders):
    """Log-probabilities at every step equal the eager step's, while the rows are regrouped (beam
    expansion), shuffled within their sentences and dropped (a sentence finishing)."""
    eager, compiled = decoders
    src = _sources()
    states = [d.init_state(src, 12) for d in decoders]
    tokens = torch.full((3,), 2)  # BOS
    reorders = [torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([1, 0, 3, 3, 4, 5]),
                torch.tensor([2, 3, 4, 5]), torch.tensor([1, 1, 2, 3]), torch.tensor([0, 1])]
    with torch.inference_mode():
        for step, index in enumerate([*reorders, None]):
            (want, _), (got, _) = (d.step(tokens, s) for d, s in zip(decoders, states))
            torch.testing.assert_close(got, torch.log_softmax(want, dim=-1), atol=1e-5, rtol=1e-5, msg=f"step {step}")
            if index is not None:
                states = [d.reorder(s, index) for d, s in zip(decoders, states)]
                tokens = want.argmax(-1).index_select(0, index)
    assert states[1].length == len(reorders) + 1
    _assert_compiled(compiled)
    assert list(compiled.packages.runners) == [2]  # one package for 3 sentences, then 2, then 1


def _assert_compiled(decoder: CompiledDecoder) -> None:
    """The compiled graph ran: no silent fallback to the eager step (which would make the
    comparisons above compare eager with eager), wherever inductor has a C++ compiler. A
    missing compiler is a missing install, not a feature of the platform: it skips locally and
    fails under CI=true (tests/conftest.py)."""
    if decoder.compiled is None:
        if not any(shutil.which(cxx) for cxx in CXX):
            pytest.skip(NO_COMPILER)
        pytest.fail("compiled decoding fell back to the eager step on a machine with a C++ compiler")


def test_a_missing_compiler_skips_as_a_missing_install(monkeypatch):
    """Not as a platform skip, which CI accepts: under CI=true the fallback fails."""
    monkeypatch.setattr(shutil, "which", lambda name: None)
    fell_back = CompiledDecoder.__new__(CompiledDecoder)
    fell_back.compiled = None
    with pytest.raises(pytest.skip.Exception, match="no C\\+\\+ compiler") as skipped:
        _assert_compiled(fell_back)
    assert not str(skipped.value).startswith("platform: ")


def test_beam_search_outputs_equal_the_eager_ones(decoders):
    eager, compiled = decoders
    cfg = DecodeConfig(beam=2, lenpen=0.6, max_len_a=1.0, max_len_b=4, nbest=2)
    with torch.inference_mode():
        want, got = search(eager, _sources(), cfg), search(compiled, _sources(), cfg)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
    for s_got, s_want in zip(got, want):
        assert [h.score for h in s_got] == pytest.approx([h.score for h in s_want], abs=1e-4)
    _assert_compiled(compiled)


def _search_twice(eager: IncrementalDecoder, compiled: CompiledDecoder, beam: int = 2) -> None:
    """Two searches whose rows, groups, source length and cache length differ (every
    sentence runs to the same length, so no batch is left with one sentence, which runs the
    eager step); the compiled decoder's outputs equal the eager one's."""
    g = torch.Generator().manual_seed(2)
    first, second = torch.randint(4, VOCAB, (3, 7), generator=g), torch.randint(4, VOCAB, (5, 11), generator=g)
    first[:, -1], second[:, -1] = 3, 3
    with torch.inference_mode():
        for src, steps in ((first, 5), (second, 8)):
            cfg = DecodeConfig(beam=beam, lenpen=0.6, min_len=steps, max_len_a=0.0, max_len_b=steps)
            want, got = search(eager, src, cfg), search(compiled, src, cfg)
            assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
    _assert_compiled(compiled)


def test_one_package_serves_batches_of_other_sizes_and_a_second_decoder_loads_it(built):
    """A size that export fixed instead of leaving symbolic would fail a search of other sizes
    (or build a second package); a decoder over the same weights compiles nothing."""
    eager, compiled, first = built
    _search_twice(eager, compiled)
    (package,) = first
    assert compiled.packages.built == first and compiled.packages.loaded == []
    folder = compiled.packages.folder
    assert folder is not None
    # the package and its record (weights' key, SHA-256), no partial file left
    assert sorted(folder.iterdir()) == sorted([package, record_path(package)])
    again = CompiledDecoder(eager.model, folder=folder)
    _search_twice(eager, again)
    assert again.packages.built == [] and again.packages.loaded == [package]


def test_buffers_that_grow_mid_search_give_the_eager_outputs(decoders, monkeypatch):
    """Buffers of 2 positions double at positions 2, 4 and 8 while the searches run: the
    package reads the grown buffers (positions are a symbolic size) through the rows table."""
    monkeypatch.setattr(cache_module, "INITIAL_POSITIONS", 2)
    eager, compiled = decoders
    _search_twice(eager, compiled)


def test_make_room_doubles_the_buffers_and_keeps_the_lineage():
    g = torch.Generator().manual_seed(0)
    cross = [(torch.randn(2, 2, 5, 4, generator=g), torch.randn(2, 2, 5, 4, generator=g))]
    plain = KVCache.allocate(cross, torch.ones(2, 1, 1, 5, dtype=torch.bool), 6)
    plain.reserve(2)
    indexed = IndexedKVCache(plain)
    indexed.layers[0].self_k = indexed.layers[0].self_k[:, :, :2].clone()  # 2 positions
    indexed.layers[0].self_v = indexed.layers[0].self_v[:, :, :2].clone()
    indexed.rows = indexed.rows[:2]
    keys = torch.randn(2, 2, 2, 4, generator=g)
    indexed.layers[0].self_k[:] = keys
    indexed.length = 2
    indexed.reorder(torch.tensor([1, 0]), same_sources=True)
    before = indexed.rows.clone()
    junk = torch.full((2, 2, 4, 4), float("nan"))  # memory the allocator may hand back to the grown buffer
    del junk
    indexed.make_room()
    assert indexed.positions == 4 and indexed.rows.shape == (4, 2)
    assert torch.equal(indexed.rows[:2], before) and torch.equal(indexed.rows[2:], torch.tensor([[0, 1], [0, 1]]))
    grown = indexed.layers[0].self_k
    assert torch.equal(grown[:, :, :2], keys) and bool((grown[:, :, 2:] == 0).all())
    indexed.length = 4
    indexed.make_room()
    assert indexed.positions == 6  # at most max_len
    indexed.length = 6
    with pytest.raises(RuntimeError, match="KV cache full: max_len=6"):
        indexed.make_room()


def test_a_package_is_keyed_by_the_weights_values_and_the_beam():
    """The same weights in another copy give the same file; one changed value, another
    precision or another number of rows per source give another."""
    model = _model()
    cpu = torch.device("cpu")

    def path(m: Transformer, per_source: int = 2, dtype: torch.dtype | None = None):
        return CompiledDecoder(optimize_for_inference(m, dtype=dtype)).packages.path(per_source, cpu)

    same = [path(m) for m in (model, copy.deepcopy(model))]
    assert same[0] == same[1]
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.decoder_layers[1].ffn.w_2.bias[3] += 1e-3
    others = [path(changed), path(model, dtype=torch.int8), path(model, per_source=4)]
    assert len({same[0], *others}) == 4


def test_int8_steps_compile_with_the_same_integer_products(tmp_path):
    """oneDNN's packed int8 weights cannot be exported: the package computes with
    torch._int_mm over the same int8 weights, and the search's outputs are the same. Greedy:
    the package of one row per source (the rows are the source groups) is built here."""
    from aiayn.inference.quantize import Int8Linear

    optimized = optimize_for_inference(_model(), dtype=torch.int8)
    if not all(m.compiles_well() for m in optimized.model.modules() if isinstance(m, Int8Linear)):
        pytest.skip("platform: no VNNI or AMX: torch._int_mm is slow or inexact, int8 steps are not compiled here")
    compiled = CompiledDecoder(optimized, folder=tmp_path)
    _search_twice(IncrementalDecoder(optimized), compiled, beam=1)
    assert list(compiled.packages.runners) == [1]


def test_steps_that_return_attention_run_the_eager_step_between_compiled_ones(decoders, monkeypatch):
    """Steps alternate between asking for attention (the eager step) and not (the package):
    the package runs on exactly the steps without attention, each path reads the cache
    positions the other wrote, and every step's log-probabilities and attention equal those of
    the eager decoder that runs them all."""
    eager, compiled = decoders
    calls: list[int] = []
    package = compiled.compiled
    if package is not None:
        def counted(*args):
            calls.append(int(args[1]))  # the position the package writes
            return package(*args)

        monkeypatch.setattr(compiled, "compiled", counted)
    states = [d.init_state(_sources(), 8) for d in decoders]
    tokens = torch.full((3,), 2)
    beams = torch.tensor([0, 0, 1, 1, 2, 2])  # after the first step: two rows per source
    with torch.inference_mode():
        for position in range(6):
            need_attn = position % 2 == 1
            (want, w_attn), (got, g_attn) = (d.step(tokens, s, need_attn=need_attn) for d, s in zip(decoders, states))
            torch.testing.assert_close(got, torch.log_softmax(want, dim=-1), atol=1e-5, rtol=1e-5,
                                       msg=f"position {position}")
            if need_attn:
                assert g_attn is not None
                torch.testing.assert_close(g_attn, w_attn)
            else:
                assert g_attn is None
            tokens = want.argmax(-1)
            if position == 0:
                states = [d.reorder(s, beams) for d, s in zip(decoders, states)]
                tokens = tokens.index_select(0, beams)
    _assert_compiled(compiled)
    assert calls == [2, 4]  # position 0 has no cache to read: the eager step


def test_a_full_cache_is_an_error_not_a_silent_overwrite(decoders):
    _, compiled = decoders
    state = compiled.init_state(_sources(), 2)
    tokens = torch.full((3,), 2)
    with torch.inference_mode():
        compiled.step(tokens, state)
        state = compiled.reorder(state, torch.tensor([0, 0, 1, 1, 2, 2]))  # two rows per source
        tokens = torch.full((6,), 2)
        compiled.step(tokens, state)
        with pytest.raises(RuntimeError, match="KV cache full: max_len=2"):
            compiled.step(tokens, state)


def test_a_model_in_training_mode_is_refused():
    torch.manual_seed(0)
    model = build_model(ModelConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16, d_ff=32,
                                    n_heads=2, n_encoder_layers=1, n_decoder_layers=1))
    with pytest.raises(ValueError, match="eval mode"):
        CompiledDecoder(model)


def test_a_grown_cache_buffer_is_zero_past_the_copied_prefix():
    """The compiled step attends over every position, masking the unfilled ones; their
    values must be finite (0 x NaN is NaN), so buffers made by a reorder start as zeros
    even where the allocator hands back memory full of NaN."""
    junk = torch.full((6, 2, 8, 4), float("nan"))
    del junk
    buf = torch.randn(3, 2, 8, 4)
    new, _ = KVCache._gather(buf, None, torch.tensor([0, 0, 1, 1, 2, 2]), 3)
    torch.testing.assert_close(new[:, :, :3], buf.index_select(0, torch.tensor([0, 0, 1, 1, 2, 2]))[:, :, :3])
    assert bool((new[:, :, 3:] == 0).all())


def test_an_indexed_cache_reads_what_a_reordered_cache_holds():
    """Through beam expansion, moves within sentences and dropped sentences, reading the
    buffers through ``rows`` (as the compiled step does) and materializing them both give
    the prefix that :class:`KVCache`'s copying reorder holds."""
    g = torch.Generator().manual_seed(0)
    cross = [(torch.randn(3, 2, 5, 4, generator=g), torch.randn(3, 2, 5, 4, generator=g))]
    mask = torch.ones(3, 1, 1, 5, dtype=torch.bool)
    plain = KVCache.allocate(cross, mask, 8)
    indexed = IndexedKVCache(KVCache.allocate(cross, mask, 8))
    reorders = [([0, 0, 1, 1, 2, 2], False), ([1, 0, 3, 3, 4, 5], True), ([1, 1, 2, 3, 5, 5], True),
                ([2, 3, 4, 5], False), ([1, 1, 2, 3], True), ([0, 1], False)]  # (index, same sources)
    for rows, same in reorders:
        index = torch.tensor(rows)
        k, v = torch.randn(2, plain.batch_size, 2, 1, 4, generator=g)
        plain.append(0, k, v)
        c = indexed.layers[0]
        c.self_k[:k.size(0), :, indexed.length], c.self_v[:k.size(0), :, indexed.length] = k[:, :, 0], v[:, :, 0]
        plain.advance(), indexed.advance()
        plain.reorder(index, same_sources=same)
        indexed.reorder(index, same_sources=same)
        n, t = plain.length, torch.arange(plain.length)
        for got, want in ((c.self_k, plain.layers[0].self_k), (c.self_v, plain.layers[0].self_v)):
            torch.testing.assert_close(got[indexed.rows[:n].t(), :, t].transpose(1, 2), want[:, :, :n])
        assert (indexed.batch_size, indexed.group_size) == (plain.batch_size, plain.group_size)
    assert indexed.moved
    first = indexed.layers[0].self_k
    indexed.materialize()
    c = indexed.layers[0]
    torch.testing.assert_close(c.self_k[:, :, :n], plain.layers[0].self_k[:, :, :n])
    torch.testing.assert_close(c.self_v[:, :, :n], plain.layers[0].self_v[:, :, :n])
    assert c.self_k.size(0) == 2 and not indexed.moved and bool((c.self_k[:, :, n:] == 0).all())
    # Moved again: materialized into the buffer before (the spare), as KVCache's reorder reuses its own.
    k, v = torch.randn(2, 2, 2, 1, 4, generator=g)
    plain.append(0, k, v)
    c.self_k[:, :, indexed.length], c.self_v[:, :, indexed.length] = k[:, :, 0], v[:, :, 0]
    plain.advance(), indexed.advance()
    plain.reorder(torch.tensor([1, 1]), same_sources=True)
    indexed.reorder(torch.tensor([1, 1]), same_sources=True)
    indexed.materialize()
    n = plain.length
    torch.testing.assert_close(c.self_k[:, :, :n], plain.layers[0].self_k[:, :, :n])
    torch.testing.assert_close(c.self_v[:, :, :n], plain.layers[0].self_v[:, :, :n])
    assert c.self_k.data_ptr() == first.data_ptr() and bool(c.self_k.isfinite().all())


def test_a_failed_compile_falls_back_to_eager_decoding(caplog: pytest.LogCaptureFixture):
    """A machine where inductor cannot compile (no C++ compiler, say): a warning, the same
    outputs as the eager decoder, and no second attempt."""
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16, d_ff=32, n_heads=2,
                      n_encoder_layers=1, n_decoder_layers=1)
    optimized = optimize_for_inference(build_model(cfg).eval())
    failing = CompiledDecoder(optimized)
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("InductorError: no C++ compiler found\nmore detail")

    failing.compiled = broken
    decode = DecodeConfig(beam=2, max_len_a=1.0, max_len_b=3)
    with torch.inference_mode():
        got = search(failing, _sources(), decode)
        want = search(IncrementalDecoder(optimized), _sources(), decode)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
    assert calls == [1] and failing.compiled is None
    assert "compiled decoding is unavailable (RuntimeError: InductorError: no C++ compiler found)" in caplog.text


def test_a_package_off_the_cpu_is_refused_before_anything_is_built(tmp_path):
    """Loading a CUDA package of the step crashed the process: other devices get a clear
    error instead (CompiledDecoder then decodes eagerly), and no package is built."""
    packages = StepPackages(lambda *args: args[0], [], folder=tmp_path)

    def meta(*shape: int) -> torch.Tensor:
        return torch.empty(shape, device="meta")

    args = (meta(4), meta(), meta(3, 4), [meta(5, 2, 3, 8)], [meta(5, 2, 3, 8)], [meta(2, 2, 6, 8)],
            [meta(2, 2, 6, 8)], meta(2, 1, 1, 6))
    with pytest.raises(RuntimeError, match="built for the CPU only, not meta"):
        packages(*args)
    assert packages.built == [] and list(tmp_path.iterdir()) == []


ONE_SENTENCE = torch.tensor([[5, 9, 14, 7, 3]])


def _one_sentence_search(eager: IncrementalDecoder, compiled: CompiledDecoder,
                         src: torch.Tensor = ONE_SENTENCE) -> None:
    """Beam 2, 20 forced tokens (the buffers grow past their first 16 positions), by default
    over one sentence; the outputs equal the eager ones."""
    cfg = DecodeConfig(beam=2, lenpen=0.6, min_len=20, max_len_a=0.0, max_len_b=20)
    with torch.inference_mode():
        want, got = search(eager, src, cfg), search(compiled, src, cfg)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]


def test_a_package_built_from_one_sentence_serves_batches_of_several(built):
    """A server's first request is often one sentence: export must not fix the one source
    group as a constant (the example doubles it), or every later batch would decode eagerly.
    The shared decoder's first search, one sentence, built its package."""
    eager, compiled, first = built
    assert len(first) == 1
    _one_sentence_search(eager, compiled, _sources())  # three sentences, the same package
    assert compiled.compiled is not None and compiled.packages.built == first


def test_eager_steps_that_grow_the_buffers_keep_the_lineage_table(decoders):
    """After a fallback to eager steps (compiled None), an eager step that grows full buffers
    must grow the rows table with them, or the next beam reorder fails."""
    eager, _ = decoders
    fallen_back = CompiledDecoder(eager.model)
    fallen_back.compiled = None
    _one_sentence_search(eager, fallen_back)
