"""Translator: checkpoint loading (one or averaged), token-budget batches in input order,
n-best with scores and attention, overrides, bf16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn.errors import CheckpointError, ConfigError
from aiayn.inference import quantize as Q
from aiayn.inference.translator import Translator
from aiayn.vocab import BOS_ID, EOS_ID


@pytest.fixture(scope="module")
def translator(tiny_checkpoint: Path) -> Translator:
    return Translator.from_checkpoint(tiny_checkpoint)


def test_translate_keeps_input_order_and_matches_single_sentences(translator: Translator,
                                                                  english: list[str]) -> None:
    batch = translator.translate(english)
    assert len(batch) == len(english)
    assert all(isinstance(t, str) for t in batch)
    for text, out in list(zip(english, batch))[:4]:
        assert translator.translate([text]) == [out]
    # Tiny token budgets (many batches, one sentence each at worst) change nothing.
    assert translator.translate(english, batch_tokens=1) == batch
    assert translator.translate(english, batch_tokens=30) == batch


def test_empty_and_whitespace_texts(translator: Translator) -> None:
    out = translator.translate(["", "a man", "   ", "a dog"])
    assert out[0] == "" and out[2] == ""
    assert out[1] == translator.translate(["a man"])[0]
    assert translator.translate([]) == []


def test_detailed_nbest_scores_pieces_attention(translator: Translator, english: list[str]) -> None:
    results = translator.translate_detailed(english[:3], nbest=3, attention=True)
    for text, res in zip(english, results):
        assert res.source == text
        assert 1 <= len(res.hypotheses) <= 3
        scores = [h.score for h in res.hypotheses]
        assert scores == sorted(scores, reverse=True)
        assert res.best is res.hypotheses[0]
        for h in res.hypotheses:
            assert h.src_pieces[-1] == "</s>" and h.tgt_pieces[-1] == "</s>"
            assert len(h.src_pieces) == len(res.src_tokens)
            assert len(h.tgt_pieces) == len(h.tokens) + 1
            assert h.text == translator.tokenizer.decode_tgt(h.tokens)
            assert h.attention.shape == (2, 4, len(h.tgt_pieces), len(h.src_pieces))
            torch.testing.assert_close(h.attention.sum(-1), torch.ones(h.attention.shape[:-1]))
    assert results[0].best.text == translator.translate(english[:1])[0]
    assert translator.translate_detailed(english[:1])[0].best.attention is None


def test_overrides(translator: Translator, english: list[str]) -> None:
    greedy = translator.translate(english[:4], beam=1)
    assert greedy == [r.best.text for r in translator.translate_detailed(english[:4], beam=1)]
    short = translator.translate_detailed(english[:4], max_len_a=0.0, max_len_b=2, min_len=2)
    assert all(len(r.best.tokens) == 2 for r in short)
    with pytest.raises(ConfigError, match="bem"):
        translator.translate(english[:1], bem=3)
    with pytest.raises(ConfigError, match="nbest"):
        translator.translate_detailed(english[:1], nbest=5)  # more than beam 4
    assert translator.decode_config(beam=None).beam == 4  # None = the checkpoint's value
    sampled = translator.translate(english[:4], sampling=True, seed=3, top_k=5)
    assert sampled == translator.translate(english[:4], sampling=True, seed=3, top_k=5)


def test_prefix(translator: Translator) -> None:
    res = translator.translate_detailed(["a man is riding", "a dog"], prefixes=["ein mann", None],
                                        max_len_a=0.0, max_len_b=8)
    prefix_ids = translator.tokenizer.encode_tgt("ein mann")
    assert res[0].best.tokens[:len(prefix_ids)] == prefix_ids


def test_long_input_is_cut_with_a_warning_unless_the_request_refuses_it(translator: Translator, caplog) -> None:
    """The one rule (aiayn.inference.request.check_source_length): the Python API cuts, with a
    warning; a request with truncate=False (the command line, the server) is refused."""
    from aiayn.inference.request import SourceTooLong, TranslationRequest

    text = " ".join(["riding"] * 200)  # more pieces than the model's 64 positions
    with caplog.at_level("WARNING"):
        out = translator.translate_detailed([text, "a man"])
    assert len(out[0].src_tokens) == 64 and out[0].src_tokens[-1] == EOS_ID
    assert "sentence 1: " in caplog.text and "truncated to the model's 64 positions" in caplog.text
    with pytest.raises(SourceTooLong) as refused:
        translator.run(TranslationRequest([text, "a man"], translator.decode_config(), truncate=False))
    assert refused.value.index == 0 and refused.value.limit == 64 and refused.value.length > 64
    n = refused.value.length
    assert str(refused.value) == f"texts[0]: {n} source tokens (with EOS); the model has 64 positions"


def test_progress_callback(translator: Translator, english: list[str]) -> None:
    seen: list[int] = []
    translator.translate_detailed(english + [""], progress=seen.append, batch_tokens=40)
    assert sum(seen) == len(english) + 1


def test_average_of_checkpoints(tiny_checkpoint: Path, second_checkpoint: Path, english: list[str]) -> None:
    one = Translator.from_checkpoint(tiny_checkpoint)
    same = Translator.from_checkpoint([tiny_checkpoint, tiny_checkpoint])
    for a, b in zip(one.model.state_dict().values(), same.model.state_dict().values()):
        torch.testing.assert_close(a, b)
    assert same.translate(english[:3]) == one.translate(english[:3])
    two = Translator.from_checkpoint([tiny_checkpoint, second_checkpoint])
    other = Translator.from_checkpoint(second_checkpoint)
    for name, t in two.model.state_dict().items():
        expected = (one.model.state_dict()[name].double() + other.model.state_dict()[name].double()) / 2
        torch.testing.assert_close(t, expected.float())


def test_checkpoint_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError):
        Translator.from_checkpoint(tmp_path / "missing")
    with pytest.raises(CheckpointError):
        Translator.from_checkpoint([])


def _eager_log_probs(model: torch.nn.Module, src_tokens: list[int], tokens: list[int]) -> torch.Tensor:
    """(len(tokens) + 1, V) log-probabilities of the plain float32 model (not the inference
    copy), teacher-forced on BOS + ``tokens``: row i scores the token after i of them."""
    with torch.no_grad():
        memory, mask = model.encode(torch.tensor([src_tokens]))
        logits, _ = model.decode(torch.tensor([[BOS_ID, *tokens]]), memory, mask)
    return logits[0].double().log_softmax(-1).float()


def _step_log_probs(tr: Translator, src_tokens: list[int], tokens: list[int]) -> torch.Tensor:
    """The same rows from the translator's own decoder (its copy, in its dtype, with the
    cache), one step at a time, as the search runs it; log-softmax in float32."""
    with torch.no_grad():
        state = tr.decoder.init_state(torch.tensor([src_tokens]), len(tokens) + 1)
        rows = []
        for t in [BOS_ID, *tokens]:
            logits, _ = tr.decoder.step(torch.tensor([t]), state)
            rows.append(logits[0].float().log_softmax(-1))
    return torch.stack(rows)


# On the tiny_checkpoint fixture (12 sentences, 186 steps) the largest error of any
# log-probability of any step against eager float32 is 0.055 in bf16 and 0.073 in int8;
# 0.122 in int8 with a 7-bit side (fbgemm's inputs, oneDNN's weights without VNNI).
LOW_PRECISION_BOUND = {"bf16": 0.1, "int8": 0.12}
SEVEN_BIT_INT8_BOUND = 0.16


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_low_precision_against_eager_fp32(tiny_checkpoint: Path, english: list[str], dtype: str) -> None:
    """bf16 and int8 translators against the eager float32 model on the same checkpoint:
    (1) every log-probability of every step within the bound, teacher-forced on float32's
    greedy outputs; (2) greedy decoding gives float32's tokens up to the first step whose
    float32 margin (best minus second-best log-probability) is under twice the bound, where
    (1) guarantees the same argmax; (3) the reported log_prob is the float32 sum of the
    low-precision decoder's own log-softmaxed logits (log-probabilities are never bf16)."""
    from aiayn.checkpoint.directory import load_checkpoint

    bound = LOW_PRECISION_BOUND[dtype]
    if dtype == "int8" and (Q.KERNEL == "fbgemm" or Q.weight_qmax(Q.KERNEL) < 127):
        bound = SEVEN_BIT_INT8_BOUND
    eager = load_checkpoint(tiny_checkpoint).model.eval()
    ref = Translator.from_checkpoint(tiny_checkpoint).translate_detailed(english, beam=1)
    low = Translator.from_checkpoint(tiny_checkpoint, dtype=dtype)
    got = low.translate_detailed(english, beam=1, attention=True)
    compared = 0
    for r, g in zip(ref, got):
        assert g.src_tokens == r.src_tokens
        exact = _eager_log_probs(eager, r.src_tokens, r.best.tokens)
        # The fp32 translator's own score is the eager model's (same path but the dtype).
        expected = exact.gather(1, torch.tensor([*r.best.tokens, EOS_ID])[:, None]).sum()
        assert r.best.log_prob == pytest.approx(float(expected), abs=1e-4)
        err = (_step_log_probs(low, r.src_tokens, r.best.tokens) - exact).abs().max()
        assert err < bound, (dtype, float(err))
        top2 = exact.topk(2, dim=-1).values
        small = ((top2[:, 0] - top2[:, 1]) <= 2 * bound).nonzero()
        sure = int(small[0]) if len(small) else len(r.best.tokens) + 1
        assert [*g.best.tokens, EOS_ID][:sure] == [*r.best.tokens, EOS_ID][:sure]
        compared += sure
        # bf16 rounding depends on the batch's shapes: the sentence alone, as stepped here.
        alone = low.translate_detailed([g.source], beam=1)[0].best
        own = _step_log_probs(low, g.src_tokens, alone.tokens)
        own_sum = own.double().gather(1, torch.tensor([*alone.tokens, EOS_ID])[:, None]).sum()
        assert alone.log_prob == pytest.approx(float(own_sum), abs=1e-4)
        assert g.best.attention.dtype == torch.float32
    assert compared >= 150  # 158 of 186 steps; the rest follow a step where float32 hesitates


# int8 once reported 8,960 of 175,104: the int8 copy's weights are not nn.Parameters.
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
def test_describe_counts_the_checkpoints_parameters(tiny_checkpoint: Path, dtype: str) -> None:
    from aiayn.checkpoint.directory import load_checkpoint

    stored = load_checkpoint(tiny_checkpoint).model
    counts = Translator.from_checkpoint(tiny_checkpoint, dtype=dtype).describe()["parameters"]
    assert counts["parameters"] == sum(p.numel() for p in stored.parameters()) == 175_104


def test_bf16_dtype_errors(tiny_checkpoint: Path) -> None:
    with pytest.raises(ConfigError):
        Translator.from_checkpoint(tiny_checkpoint, dtype="fp8")


def test_int8(tiny_checkpoint: Path, english: list[str]) -> None:
    from aiayn.inference.engine import weight_dtype
    from aiayn.inference.quantize import Int8Linear

    tr = Translator.from_checkpoint(tiny_checkpoint, dtype="int8")
    assert isinstance(tr.model.decoder_layers[0].ffn.w_1, Int8Linear)
    out = tr.translate_detailed(english[:3], attention=True)
    assert all(r.best.text and r.best.attention.dtype == torch.float32 for r in out)
    # the same hypotheses as decoding the int8 model sentence by sentence
    assert [r.best.text for r in out] == [tr.translate([s])[0] for s in english[:3]]
    with pytest.raises(ConfigError, match="CPU"):
        weight_dtype("int8", torch.device("cuda"))


def test_weight_dtype_of_each_precision() -> None:
    from aiayn.inference.engine import weight_dtype

    cpu = torch.device("cpu")
    assert weight_dtype("fp32", cpu) is None
    assert weight_dtype("bf16", cpu) is torch.bfloat16
    assert weight_dtype("int8", cpu) is torch.int8
    with pytest.raises(ConfigError, match="CPU"):
        weight_dtype("int8", torch.device("cuda"))
    with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
        weight_dtype("fp16", cpu)


def test_trainer_style_construction(tiny_checkpoint: Path, english: list[str]) -> None:
    from aiayn.checkpoint.directory import load_checkpoint

    loaded = load_checkpoint(tiny_checkpoint)
    tr = Translator(loaded.model, loaded.tokenizer, loaded.config.decode)
    assert tr.translate(english[:2]) == Translator.from_checkpoint(tiny_checkpoint).translate(english[:2])
