"""CUDA-graph decoding (aiayn.inference.cuda_graphs) without a GPU: the buckets, which graph a
step replays and when one is recorded, padding rows and source positions, the static cache
bound to reused buffers, and the eager fallback when recording fails.

On a CPU the recording is replaced by one that re-runs the step on the same static buffers
(:func:`eager_capture`): everything but the recording itself is exercised, and the outputs
must equal the eager decoder's. tests/inference/test_cuda_graph_decoding.py compares the
real graphs with eager decoding on a GPU."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from aiayn.config import DecodeConfig, ModelConfig
from aiayn.inference import cuda_graphs
from aiayn.inference.adapters import IncrementalDecoder
from aiayn.inference.cuda_graphs import (
    CudaGraphDecoder,
    GraphKey,
    StaticKVCache,
    bucket_positions,
    bucket_rows,
    bucket_source,
    graphs_pay,
    uses_cuda_graphs,
)
from aiayn.inference.optimize import optimize_for_inference
from aiayn.inference.search import search
from aiayn.model import build_model

VOCAB = 40


class EagerCapture:
    """Stands for CUDA graph recording: recording leaves the output tensor unwritten (NaN here:
    a CUDA graph's recording launches nothing), the replay re-runs the step on the static inputs
    (as a graph would) and writes that tensor in place; counts both."""

    def __init__(self) -> None:
        self.recorded = 0
        self.replayed = 0

    def __call__(self, record: Callable[[], Tensor]) -> tuple[Tensor, Callable[[], None]]:
        self.recorded += 1
        out = record().fill_(float("nan"))

        def replay() -> None:
            self.replayed += 1
            out.copy_(record())
        return out, replay


def _decoders(capture: Callable | None = None) -> tuple[IncrementalDecoder, CudaGraphDecoder]:
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32, d_ff=64, n_heads=4,
                      n_encoder_layers=2, n_decoder_layers=2, max_positions=64)
    optimized = optimize_for_inference(build_model(cfg).eval())
    return IncrementalDecoder(optimized), CudaGraphDecoder(optimized, capture=capture or EagerCapture())


def _sources(n: int, length: int, seed: int) -> Tensor:
    """``n`` sources of different lengths up to ``length`` (padded with 0), ending in EOS (3)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (n, length), generator=g)
    for i in range(n):
        end = length - (i % 3)
        src[i, end:] = 0
        src[i, end - 1] = 3
    return src


def _same_search(eager: IncrementalDecoder, graphs: CudaGraphDecoder, src: Tensor, cfg: DecodeConfig) -> None:
    with torch.inference_mode():
        want, got = search(eager, src, cfg), search(graphs, src, cfg)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
    for s_got, s_want in zip(got, want):
        assert [h.score for h in s_got] == pytest.approx([h.score for h in s_want], abs=1e-4)


def test_buckets() -> None:
    assert [bucket_rows(n) for n in (1, 2, 3, 5, 64, 65, 128, 129, 512)] == [1, 2, 4, 8, 64, 128, 128, 192, 512]
    assert [bucket_source(n) for n in (1, 16, 17, 24, 33)] == [16, 16, 32, 32, 48]
    assert [bucket_positions(n) for n in (1, 16, 17, 41, 64, 65)] == [16, 16, 32, 64, 64, 128]
    with pytest.raises(ValueError):
        bucket_rows(0)


def test_the_device_decides_and_graphs_pay_beyond_a_handful_of_lines() -> None:
    assert uses_cuda_graphs("cuda") and uses_cuda_graphs(torch.device("cuda", 1))
    assert not uses_cuda_graphs("cpu") and not uses_cuda_graphs("meta")
    assert graphs_pay(cuda_graphs.MIN_GRAPH_LINES) and not graphs_pay(1) and not graphs_pay(None)


def test_beam_search_through_graphs_equals_the_eager_search() -> None:
    """Three sentences of a beam of 4 pad to a bucket of 4 groups (16 rows, 4 of them padding);
    the sources (9 tokens) pad to 16 positions. As sentences finish the rows shrink into
    smaller buckets, each a graph of its own, each replayed after it is recorded."""
    capture = EagerCapture()
    eager, graphs = _decoders(capture)
    cfg = DecodeConfig(beam=4, lenpen=0.6, max_len_a=1.0, max_len_b=4, nbest=4)
    _same_search(eager, graphs, _sources(3, 9, seed=1), cfg)
    steps = graphs.graphs
    assert graphs.compiled is steps and graphs.compiled_ran
    first = steps.captured[0]
    assert first == GraphKey(groups=4, per_source=4, buffer_rows=16, positions=16, source=16, dtype=torch.float32)
    assert len(set(steps.captured)) == len(steps.captured) == capture.recorded  # each key recorded once
    assert capture.replayed > capture.recorded and steps.replays == capture.replayed
    assert {k.groups for k in steps.captured} <= {1, 2, 4}


def test_steps_of_more_rows_than_the_graphs_take_run_eagerly() -> None:
    """Three sentences of a beam of 4 are 16 rows once bucketed: over a limit of 8 the steps
    run eagerly until sentences finish and the rows fit (2 groups of 4), then from graphs."""
    capture = EagerCapture()
    eager, graphs = _decoders(capture)
    graphs.graphs.max_rows = 8
    cfg = DecodeConfig(beam=4, lenpen=0.6, max_len_a=1.0, max_len_b=4, nbest=4)
    _same_search(eager, graphs, _sources(3, 9, seed=1), cfg)
    steps = graphs.graphs
    assert steps.captured and max(k.rows for k in steps.captured) <= 8
    assert {k.groups for k in steps.captured} <= {1, 2}
    # No limit: the first steps run from a graph of all 16 rows.
    unlimited = _decoders(EagerCapture())[1]
    _same_search(eager, unlimited, _sources(3, 9, seed=1), cfg)
    assert unlimited.graphs.captured[0].rows == 16 and unlimited.graphs.replays > steps.replays


def test_a_second_search_reuses_the_graphs_and_buffers_of_its_bucket() -> None:
    capture = EagerCapture()
    eager, graphs = _decoders(capture)
    cfg = DecodeConfig(beam=2, lenpen=0.6, min_len=6, max_len_a=0.0, max_len_b=6)
    _same_search(eager, graphs, _sources(3, 7, seed=2), cfg)
    recorded, pools, replays = capture.recorded, dict(graphs.graphs.pools), capture.replayed
    # Other sentences, another source length within the bucket, the same number of sentences:
    # every step after the first replays (the first search's cache has let go of the buffers).
    _same_search(eager, graphs, _sources(3, 11, seed=3), cfg)
    assert capture.recorded == recorded and graphs.graphs.pools == pools
    assert capture.replayed == replays + 6  # 7 steps (6 tokens, then EOS), the first one eager
    # Five sentences: a bucket of 8 groups, recorded anew.
    _same_search(eager, graphs, _sources(5, 11, seed=4), cfg)
    assert capture.recorded == recorded + 1 and graphs.graphs.captured[-1].groups == 8


def test_greedy_search_and_one_sentence() -> None:
    eager, graphs = _decoders()
    _same_search(eager, graphs, _sources(1, 6, seed=5), DecodeConfig(beam=1, max_len_a=0.0, max_len_b=8))
    _same_search(eager, graphs, _sources(6, 6, seed=6), DecodeConfig(beam=1, max_len_a=0.0, max_len_b=8))
    assert {(k.groups, k.per_source) for k in graphs.graphs.captured} >= {(1, 1), (8, 1)}


def test_steps_with_attention_run_eagerly_between_graph_steps() -> None:
    eager, graphs = _decoders()
    src = _sources(2, 8, seed=7)
    states = [d.init_state(src, 10) for d in (eager, graphs)]
    assert isinstance(states[1], StaticKVCache) and states[1].positions == 16
    tokens = torch.full((2,), 2)
    with torch.inference_mode():
        for step in range(6):
            need_attn = step % 2 == 1
            (want, want_attn), (got, got_attn) = (d.step(tokens, s, need_attn) for d, s in zip((eager, graphs), states))
            torch.testing.assert_close(got, torch.log_softmax(want, dim=-1), atol=1e-5, rtol=1e-5)
            assert (got_attn is None) is (not need_attn)
            index = torch.tensor([1, 0]) if step % 2 else torch.tensor([0, 1])
            states = [d.reorder(s, index, same_sources=False) for d, s in zip((eager, graphs), states)]
            tokens = want.argmax(-1).index_select(0, index)
    assert graphs.graphs.replays >= 2


def test_a_second_search_at_once_decodes_eagerly_instead_of_sharing_the_buffers() -> None:
    eager, graphs = _decoders()
    src = _sources(2, 8, seed=8)
    with torch.inference_mode():
        a, b = graphs.init_state(src, 10), graphs.init_state(src, 10)
        tokens = torch.full((2,), 2)
        for state in (a, b):
            graphs.step(tokens, state)  # the first step is eager
        graphs.step(tokens, a)
        assert a.pool is not None and not graphs.graphs.fits(b, 2)
        reference = eager.init_state(src, 10)
        eager.step(tokens, reference)
        want, _ = eager.step(tokens, reference)
        got, _ = graphs.step(tokens, b)  # eager: a holds the buffers
        torch.testing.assert_close(got, torch.log_softmax(want, dim=-1), atol=1e-5, rtol=1e-5)
        assert b.pool is None
        del a
        assert graphs.graphs.fits(b, 2)  # freed with the first search


def test_a_failed_recording_warns_once_and_decodes_eagerly(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def broken(record: Callable[[], Tensor]) -> tuple[Tensor, Callable[[], None]]:
        calls.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    eager, graphs = _decoders(broken)
    cfg = DecodeConfig(beam=3, lenpen=0.6, max_len_a=1.0, max_len_b=4, nbest=3)
    with caplog.at_level(logging.WARNING, logger="aiayn.inference.cuda_graphs"):
        _same_search(eager, graphs, _sources(3, 9, seed=1), cfg)
        _same_search(eager, graphs, _sources(2, 9, seed=2), cfg)
    assert graphs.compiled is None and not graphs.compiled_ran and calls == [1]
    warnings = [r.getMessage() for r in caplog.records if "CUDA graph decoding is unavailable" in r.getMessage()]
    assert warnings == ["CUDA graph decoding is unavailable (RuntimeError: operation not permitted when stream "
                        "is capturing); decoding eagerly"]


def test_bf16_steps_equal_the_eager_bf16_steps() -> None:
    """bf16 weights (the translator's bf16 mode) through the graphs."""
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32, d_ff=64, n_heads=4,
                      n_encoder_layers=1, n_decoder_layers=2, max_positions=64)
    optimized = optimize_for_inference(build_model(cfg).eval(), dtype=torch.bfloat16)
    eager = IncrementalDecoder(optimized)
    graphs = CudaGraphDecoder(optimized, capture=EagerCapture())
    src = _sources(2, 6, seed=9)
    states = [d.init_state(src, 8) for d in (eager, graphs)]
    tokens = torch.full((2,), 2)
    with torch.inference_mode():
        for _ in range(4):
            (want, _), (got, _) = (d.step(tokens, s) for d, s in zip((eager, graphs), states))
            torch.testing.assert_close(got, torch.log_softmax(want.float(), dim=-1), atol=0.05, rtol=0.05)
            tokens = want.argmax(-1)
    assert graphs.graphs.replays == 3


def test_compiled_decoding_on_a_gpu_selects_graphs_and_auto_uses_them(tiny_checkpoint, monkeypatch) -> None:
    """The translator decides from its device (the device is stubbed: the decoder is only built)."""
    from aiayn.inference.compiled import CompiledDecoder
    from aiayn.inference.translator import Translator

    translator = Translator.from_checkpoint(tiny_checkpoint, device="cpu", dtype="fp32")
    engine = translator.engine
    assert type(engine.compiled_decoder()) is CompiledDecoder
    assert not translator.compile_pays(cuda_graphs.MIN_GRAPH_LINES)  # the CPU's estimate: a tiny model, no
    monkeypatch.setattr(engine, "device", torch.device("cuda", 0))
    monkeypatch.setattr(engine, "_compiled", None)
    assert type(engine.compiled_decoder()) is CudaGraphDecoder
    assert type(engine.decoder) is IncrementalDecoder
    assert translator.compile_pays(cuda_graphs.MIN_GRAPH_LINES)
    assert not translator.compile_pays(1) and not translator.compile_pays(None)  # a stream
