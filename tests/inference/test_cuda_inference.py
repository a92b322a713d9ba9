"""Decoding on a CUDA device against the CPU: the same translations where float32 margins
allow, reduced precisions, ensembles, compiled steps and parsing. Runs where a GPU is
present (``pytest -m cuda``); skips elsewhere."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from aiayn.data.trees import tree_to_string
from aiayn.inference.parser import Parser
from aiayn.inference.translator import Translator
from aiayn.runtime.devices import cuda_native_bf16

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="platform: no CUDA device")]

# Two hypotheses whose scores differ by less than this may swap places between devices: the
# GPU's float32 sums run in another order than the CPU's.
SCORE_MARGIN = 1e-3


# Reduced precisions round the logits (bf16 keeps 8 bits of mantissa, fp16 11): their scores
# differ from the CPU's float32 ones by about this much, and hypotheses closer than it may swap.
REDUCED_MARGIN = {"bf16": 0.15, "fp16": 0.03}


def _assert_same_where_margins_allow(cpu: Translator, gpu: Translator, texts: list[str],
                                     margin: float = SCORE_MARGIN, agree: float = 0.75, beam: int = 4) -> None:
    """Identical best translations with the same scores (to ``margin``), except where the
    CPU's best scores are too close to order: then the GPU's best must be one of the CPU's
    n-best (``beam`` of them) with a score within ``margin`` of the CPU's best. At least
    ``agree`` of the texts have the CPU's best exactly."""
    expected = cpu.translate_detailed(texts, nbest=beam, beam=beam)
    got = gpu.translate_detailed(texts, nbest=beam, beam=beam)
    same = 0
    for text, e, g in zip(texts, expected, got):
        best, gpu_best = e.hypotheses[0], g.hypotheses[0]
        if gpu_best.tokens == best.tokens:
            same += 1
            assert gpu_best.score == pytest.approx(best.score, abs=margin)
            continue
        rivals = [h for h in e.hypotheses if h.tokens == gpu_best.tokens]
        assert rivals and abs(rivals[0].score - best.score) < margin, f"{text!r}: {gpu_best.text!r}"
    assert same >= len(texts) * agree


def test_cuda_decoding_matches_the_cpu(tiny_checkpoint: Path, english: list[str]) -> None:
    cpu = Translator.from_checkpoint(tiny_checkpoint)
    gpu = Translator.from_checkpoint(tiny_checkpoint, device="cuda")
    assert gpu.device.type == "cuda"
    _assert_same_where_margins_allow(cpu, gpu, english[:24])


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_reduced_precision_decodes_as_the_cpu_in_float32(tiny_checkpoint: Path, english: list[str],
                                                         dtype: str) -> None:
    """bf16 / fp16 on the GPU against float32 on the CPU: the same best translations and
    scores within the precision's margin, except between hypotheses closer than it."""
    if dtype == "bf16" and not cuda_native_bf16():
        pytest.skip("platform: no bf16 on this GPU")
    cpu = Translator.from_checkpoint(tiny_checkpoint, dtype="fp32")
    gpu = Translator.from_checkpoint(tiny_checkpoint, device="cuda", dtype=dtype)
    assert gpu.dtype == dtype
    _assert_same_where_margins_allow(cpu, gpu, english[:16], margin=REDUCED_MARGIN[dtype], agree=0.5, beam=8)


def test_a_cuda_ensemble_matches_the_cpus(tiny_checkpoint: Path, second_checkpoint: Path,
                                          english: list[str]) -> None:
    paths = [tiny_checkpoint, second_checkpoint]
    cpu = Translator.from_checkpoint(paths, ensemble=True)
    gpu = Translator.from_checkpoint(paths, device="cuda", ensemble=True)
    _assert_same_where_margins_allow(cpu, gpu, english[:16])


def test_aoti_packages_refuse_cuda_and_decode_eagerly_with_a_warning(tiny_checkpoint: Path, english: list[str],
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Loading an AOTInductor package of the step crashed the process on CUDA: a
    ``CompiledDecoder`` there builds nothing, warns once and gives the eager outputs (a GPU
    translator compiles with CUDA graphs instead: test_cuda_graph_decoding.py)."""
    from aiayn.inference.compiled import CompiledDecoder

    eager = Translator.from_checkpoint(tiny_checkpoint, device="cuda")
    packaged = Translator.from_checkpoint(tiny_checkpoint, device="cuda")
    packaged.engine.decoder = decoder = CompiledDecoder(packaged.engine.optimized[0])
    texts = english[:8]
    with caplog.at_level(logging.WARNING, logger="aiayn.inference.compiled"):
        assert packaged.translate(texts) == eager.translate(texts)
    assert decoder.compiled is None and decoder.packages.built == []
    assert sum("built for the CPU only" in r.getMessage() for r in caplog.records) == 1


def test_parsing_on_cuda_gives_the_cpus_trees(parsing_checkpoint: Path) -> None:
    sentences = ["The cat sat on the mat .", "a man with a dog"]
    cpu = Parser.from_checkpoint(parsing_checkpoint).parse(sentences, beam=4)
    gpu = Parser.from_checkpoint(parsing_checkpoint, device="cuda").parse(sentences, beam=4)
    for c, g in zip(cpu, gpu):
        assert g.tree is not None and g.tree.leaves() == g.words == c.words
        # The same linearization and tree as the CPU's (float32 both: random logits leave no
        # two hypotheses within the devices' rounding of each other).
        assert (g.tokens, tree_to_string(g.tree), g.repaired) == (c.tokens, tree_to_string(c.tree), c.repaired)
