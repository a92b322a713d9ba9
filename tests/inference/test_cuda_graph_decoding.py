"""CUDA-graph decoding (aiayn.inference.cuda_graphs) on a GPU against eager decoding on the same
GPU, in float32, bf16 and fp16: graphs are recorded (no silent fallback), replayed by later
searches, and give the eager step's log-probabilities and translations. Runs where a GPU is
present (``pytest -m cuda``); skips elsewhere. The logic around the recording is tested on a
CPU in test_cuda_graphs.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn.inference.cuda_graphs import CudaGraphDecoder, StaticKVCache
from aiayn.inference.translator import Translator
from aiayn.runtime.devices import cuda_native_bf16

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="platform: no CUDA device")]

# Per precision: the largest difference between a graph step's log-probabilities and the eager
# step's (the graph's step attends with an explicit float32 softmax, the eager one with torch's
# kernel), and between the scores of a translation both give.
TOLERANCE = {"fp32": 1e-4, "bf16": 0.1, "fp16": 0.02}
DTYPES = ["fp32", "bf16", "fp16"]


def _skip_without(dtype: str) -> None:
    if dtype == "bf16" and not cuda_native_bf16():
        pytest.skip("platform: no bf16 on this GPU")


def _pair(checkpoint: Path, dtype: str) -> tuple[Translator, Translator]:
    eager = Translator.from_checkpoint(checkpoint, device="cuda", dtype=dtype)
    graphs = Translator.from_checkpoint(checkpoint, device="cuda", dtype=dtype, compile=True)
    assert isinstance(graphs.decoder, CudaGraphDecoder) and eager.dtype == graphs.dtype == dtype
    return eager, graphs


@pytest.mark.parametrize("dtype", DTYPES)
def test_graph_steps_give_the_eager_log_probabilities(tiny_checkpoint: Path, english: list[str], dtype: str) -> None:
    _skip_without(dtype)
    eager, graphs = _pair(tiny_checkpoint, dtype)
    src = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(eager.tokenizer.encode_src(t)) for t in english[:3]], batch_first=True).cuda()
    decoders = (eager.decoder, graphs.decoder)
    states = [d.init_state(src, 12) for d in decoders]
    assert isinstance(states[1], StaticKVCache)
    tokens = torch.full((3,), 2, device="cuda")
    reorders = [torch.tensor(i, device="cuda") for i in ([0, 0, 1, 1, 2, 2], [1, 0, 3, 3, 4, 5], [2, 3, 4, 5])]
    with torch.inference_mode():
        for step, index in enumerate([*reorders, None]):
            (want, _), (got, _) = (d.step(tokens, s) for d, s in zip(decoders, states))
            want = torch.log_softmax(want.float(), dim=-1)
            torch.testing.assert_close(got, want, atol=TOLERANCE[dtype], rtol=0, msg=f"{dtype} step {step}")
            if index is not None:
                states = [d.reorder(s, index) for d, s in zip(decoders, states)]
                tokens = want.argmax(-1).index_select(0, index)
    steps = graphs.decoder.graphs
    assert graphs.decoder.compiled is steps and len(steps.captured) >= 2  # 3 sentences x 2, then 2 x 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_graph_decoding_translates_as_eager_decoding(tiny_checkpoint: Path, english: list[str], dtype: str) -> None:
    """A batch, then the same batch again (replays only, nothing recorded), then another size."""
    _skip_without(dtype)
    eager, graphs = _pair(tiny_checkpoint, dtype)
    texts = english[:24]
    steps = graphs.decoder.graphs
    for batch in (texts, texts, texts[:5]):
        recorded, replays = len(steps.captured), steps.replays
        want, got = eager.translate_detailed(batch, nbest=2), graphs.translate_detailed(batch, nbest=2)
        same = [g.best.tokens == w.best.tokens for g, w in zip(got, want)]
        assert sum(same) >= len(batch) * 3 // 4, f"{dtype}: {sum(same)} of {len(batch)} the same"
        for g, w, s in zip(got, want, same):
            if s:
                assert g.best.score == pytest.approx(w.best.score, abs=TOLERANCE[dtype])
        assert steps.replays > replays  # every batch decodes through graphs, none falls back to eager steps
        if batch is texts and recorded:
            assert len(steps.captured) == recorded  # the second time: replays only
    assert graphs.decoder.compiled is steps and steps.captured and steps.replays > len(steps.captured)
    assert graphs.decoder.compiled_ran
