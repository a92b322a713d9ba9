"""Ensemble decoding: several models searched as one, each step the mean of their
probabilities. Checked against hand-computed scripted models, against a reference greedy
loop written here from the models' teacher-forced decoder, and through the CLI."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint.directory import load_checkpoint, save_checkpoint
from aiayn.config import DecodeConfig
from aiayn.errors import CheckpointError, ConfigError
from aiayn.inference.adapters import EnsembleDecoder
from aiayn.inference.search import SearchInputs, search
from aiayn.inference.translator import Translator
from aiayn.model import build_model
from aiayn.vocab import BOS_ID, EOS_ID, PAD_ID

A, B, C = 4, 5, 6  # ordinary ids of the scripted models; 0-3 are PAD, UNK, BOS, EOS
VOCAB = 8


class TableModel:
    """Next-token probabilities from a table keyed by the prefix (BOS excluded); every row
    of the batch follows the same table. Attention (R, 1, 1, S) holds ``attn_value``."""

    normalized = False

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], attn_value: float = 0.0,
                 max_steps: int | None = None) -> None:
        self.table = table
        self.attn_value = attn_value
        self.max_steps = max_steps

    def init_state(self, src: torch.Tensor, max_steps: int) -> list[tuple[int, ...]]:
        self.width = src.size(1)
        return [() for _ in range(src.size(0))]

    def step(self, tokens: torch.Tensor, state: list[tuple[int, ...]], need_attn: bool = False, vocabulary=None):
        out = torch.full((tokens.numel(), VOCAB), float("-inf"))
        for r, tok in enumerate(tokens.tolist()):
            if tok != BOS_ID:
                state[r] = state[r] + (tok,)
            for t, p in self.table.get(state[r], {EOS_ID: 1.0}).items():
                out[r, t] = math.log(p)
        attn = torch.full((tokens.numel(), 1, 1, self.width), self.attn_value) if need_attn else None
        return out, attn

    def reorder(self, state: list[tuple[int, ...]], index: torch.Tensor, same_sources: bool = False):
        return [state[i] for i in index.tolist()]


# Each member alone starts with its own favourite (A or C); the mean of the two prefers B,
# which neither ranks first: 0.45 against (0.5 + 0.05) / 2 = 0.275.
LEFT = {(): {A: 0.5, B: 0.45, C: 0.05}, (B,): {EOS_ID: 0.9, A: 0.1}, (A,): {EOS_ID: 1.0}}
RIGHT = {(): {C: 0.5, B: 0.45, A: 0.05}, (B,): {EOS_ID: 0.7, A: 0.3}, (C,): {EOS_ID: 1.0}}


def _src() -> torch.Tensor:
    return torch.tensor([[7, 7, EOS_ID]])


def _greedy(model) -> tuple[list[int], float]:
    hyp = search(model, _src(), DecodeConfig(beam=1, lenpen=0.0, max_len_a=0.0, max_len_b=5),
        SearchInputs(pad=PAD_ID, bos=BOS_ID, eos=EOS_ID))[0][0]
    return hyp.tokens, hyp.log_prob


def test_each_step_searches_the_mean_of_the_members_probabilities() -> None:
    assert _greedy(TableModel(LEFT))[0] == [A]
    assert _greedy(TableModel(RIGHT))[0] == [C]
    tokens, log_prob = _greedy(EnsembleDecoder([TableModel(LEFT), TableModel(RIGHT)]))
    assert tokens == [B]
    assert log_prob == pytest.approx(math.log(0.45) + math.log((0.9 + 0.7) / 2), abs=1e-6)
    # Beam search over the same ensemble finds the same best path and scores it alike.
    cfg = DecodeConfig(beam=3, lenpen=0.0, max_len_a=0.0, max_len_b=5, nbest=3)
    beam = search(EnsembleDecoder([TableModel(LEFT), TableModel(RIGHT)]), _src(), cfg,
                  SearchInputs(pad=PAD_ID, bos=BOS_ID, eos=EOS_ID))[0]
    assert beam[0].tokens == [B] and beam[0].log_prob == pytest.approx(log_prob, abs=1e-6)
    assert {tuple(h.tokens) for h in beam} == {(B,), (A,), (C,)}
    # [A]: (0.5 + 0.05) / 2, then EOS with probability 1 in both tables.
    by_tokens = {tuple(h.tokens): h.log_prob for h in beam}
    assert by_tokens[(A,)] == pytest.approx(math.log(0.275), abs=1e-6)


def test_the_ensemble_returns_log_probabilities_and_declares_it() -> None:
    # The search adds no log-softmax to a normalized model's output, so the ensemble's must
    # be one already: the log of the members' mean probability.
    ens = EnsembleDecoder([TableModel(LEFT), TableModel({(): {A: 2.0, C: 6.0}})])
    assert ens.normalized and not TableModel.normalized
    out, _ = ens.step(torch.tensor([BOS_ID, BOS_ID]), ens.init_state(torch.cat([_src(), _src()]), 5))
    assert torch.logsumexp(out, dim=-1).tolist() == pytest.approx([0.0, 0.0], abs=1e-6)
    # The second member's scores sum to 8: it is normalised before the mean (C: 6/8 = .75).
    assert out[0, C].exp().item() == pytest.approx((0.05 + 0.75) / 2)


def test_one_member_and_identical_members_change_nothing() -> None:
    tokens, log_prob = _greedy(TableModel(LEFT))
    for n in (1, 3):
        ens_tokens, ens_log_prob = _greedy(EnsembleDecoder([TableModel(LEFT) for _ in range(n)]))
        assert ens_tokens == tokens and ens_log_prob == pytest.approx(log_prob, abs=1e-6)


def test_attention_is_the_members_mean_and_needs_equal_shapes() -> None:
    ens = EnsembleDecoder([TableModel(LEFT, attn_value=1.0), TableModel(RIGHT, attn_value=3.0)])
    state = ens.init_state(_src(), 5)
    _, attn = ens.step(torch.tensor([BOS_ID]), state, need_attn=True)
    assert attn is not None and attn.shape == (1, 1, 1, 3)
    assert torch.equal(attn, torch.full((1, 1, 1, 3), 2.0))
    _, none = ens.step(torch.tensor([B]), state, need_attn=False)
    assert none is None

    class TwoHeads(TableModel):
        def step(self, tokens, state, need_attn=False, vocabulary=None):
            out, attn = super().step(tokens, state, need_attn)
            return out, (attn.expand(-1, -1, 2, -1) if attn is not None else None)

    mixed = EnsembleDecoder([TableModel(LEFT), TwoHeads(RIGHT)])
    with pytest.raises(ConfigError, match="different numbers of layers or heads"):
        mixed.step(torch.tensor([BOS_ID]), mixed.init_state(_src(), 5), need_attn=True)


def test_max_steps_is_the_smallest_members() -> None:
    assert EnsembleDecoder([TableModel(LEFT, max_steps=9), TableModel(RIGHT)]).max_steps == 9
    assert EnsembleDecoder([TableModel(LEFT, max_steps=9), TableModel(RIGHT, max_steps=4)]).max_steps == 4
    assert EnsembleDecoder([TableModel(LEFT)]).max_steps is None
    with pytest.raises(ValueError):
        EnsembleDecoder([])


# ------------------------------------------------------------------ real checkpoints


def _reference_greedy(paths: list[Path], src_ids: list[int], max_len: int) -> list[int]:
    """Greedy decoding of the ensemble written out plainly: at every step each model reruns
    its teacher-forced decoder over the whole prefix, the probabilities are averaged, and
    the most probable id is taken; EOS is forced after ``max_len`` ids."""
    models = [load_checkpoint(p).model.eval() for p in paths]
    src = torch.tensor([src_ids])
    out: list[int] = []
    with torch.no_grad():
        encoded = [m.encode(src) for m in models]
        while len(out) < max_len:
            tgt = torch.tensor([[BOS_ID, *out]])
            probs = sum(torch.softmax(m.decode(tgt, mem, mask)[0][0, -1].double(), dim=-1)
                        for m, (mem, mask) in zip(models, encoded))
            probs[BOS_ID] = probs[PAD_ID] = 0  # the search never emits these
            token = int(probs.argmax())
            if token == EOS_ID:
                break
            out.append(token)
    return out


def test_translator_ensemble_matches_a_reference_loop(tiny_checkpoint: Path, second_checkpoint: Path,
                                                      english: list[str]) -> None:
    paths = [tiny_checkpoint, second_checkpoint]
    ensemble = Translator.from_checkpoint(paths, ensemble=True)
    assert isinstance(ensemble.decoder, EnsembleDecoder) and len(ensemble.decoder.members) == 2
    single = Translator.from_checkpoint(tiny_checkpoint).parameters
    assert ensemble.parameters == {key: 2 * n for key, n in single.items()}
    greedy = dict(beam=1, lenpen=0.0, max_len_a=1.0, max_len_b=5)
    results = ensemble.translate_detailed(english[:6], **greedy)
    for r in results:
        expected = _reference_greedy(paths, r.src_tokens, max_len=len(r.src_tokens) + 5)
        assert r.best.tokens == expected, r.source
    # ... and it is neither of its models alone: each differs from it somewhere.
    for p in paths:
        alone = Translator.from_checkpoint(p).translate_detailed(english[:6], **greedy)
        assert any(a.best.tokens != r.best.tokens for a, r in zip(alone, results)), p


def test_ensemble_of_one_checkpoint_twice_is_that_checkpoint(tiny_checkpoint: Path, english: list[str]) -> None:
    one = Translator.from_checkpoint(tiny_checkpoint).translate_detailed(english[:4], nbest=2)
    twice = Translator.from_checkpoint([tiny_checkpoint, tiny_checkpoint], ensemble=True)
    for a, b in zip(one, twice.translate_detailed(english[:4], nbest=2)):
        assert [h.tokens for h in a.hypotheses] == [h.tokens for h in b.hypotheses]
        assert [h.score for h in a.hypotheses] == pytest.approx([h.score for h in b.hypotheses], abs=1e-4)


@pytest.fixture(scope="module")
def other_vocabulary(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint like the tiny one but with its own (smaller) SentencePiece vocabulary."""
    from aiayn.text.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("other_vocabulary")
    words = "a man woman dog cat is on the street with a ball in the park".split()
    text = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20
    tok = train_tokenizer(text, text, root / "spm", vocab_size=60, joint=True, model_type="bpe")
    cfg = load_checkpoint(tiny_checkpoint).config
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = tok.src_vocab_size
    return save_checkpoint(root / "ckpt", build_model(cfg.model).eval(), cfg, tokenizer=tok, state={"step": 1})


def test_ensemble_refuses_models_with_other_tokenizers(tiny_checkpoint: Path, other_vocabulary: Path) -> None:
    with pytest.raises(CheckpointError, match="different tokenizers"):
        Translator.from_checkpoint([tiny_checkpoint, other_vocabulary], ensemble=True)


def test_cli_ensemble_flag(run_cli, tiny_checkpoint: Path, second_checkpoint: Path, other_vocabulary: Path,
                           english: list[str], tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("\n".join(english[:5]) + "\n", encoding="utf-8")
    both = ["--checkpoint", str(tiny_checkpoint), str(second_checkpoint)]
    code, out, _ = run_cli(["translate", *both, "--ensemble", "--input", str(src)])
    assert code == 0
    expected = Translator.from_checkpoint([tiny_checkpoint, second_checkpoint], ensemble=True).translate(english[:5])
    assert out.decode("utf-8").splitlines() == expected
    # Without --ensemble the same paths are averaged, as before.
    code, out, _ = run_cli(["translate", *both, "--input", str(src)])
    assert code == 0
    assert out.decode("utf-8").splitlines() == Translator.from_checkpoint(
        [tiny_checkpoint, second_checkpoint]).translate(english[:5])
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), str(other_vocabulary),
                              "--ensemble", "--input", str(src)])
    assert code == 2 and out == b""
    assert "different tokenizers" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["translate", "evaluate", "tune-decoding", "parse"])
def test_every_command_taking_several_checkpoints_passes_ensemble_on(
        run_cli, monkeypatch: pytest.MonkeyPatch, tiny_checkpoint: Path, english: list[str], tmp_path: Path,
        command: str) -> None:
    src, ref = tmp_path / "in.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(english[:2]) + "\n", encoding="utf-8")
    ref.write_text("ein mann\nein hund\n", encoding="utf-8")
    extra = {"translate": [], "evaluate": ["--ref", str(ref)], "parse": [],
             "tune-decoding": ["--ref", str(ref), "--beams", "1", "--lenpens", "1.0"]}[command]
    seen: list[bool] = []
    load = Translator.from_checkpoint.__func__  # type: ignore[attr-defined]

    def spy(cls, path, *args, **kwargs):
        seen.append(kwargs.get("ensemble", False))
        return load(cls, path, *args, **kwargs)

    monkeypatch.setattr(Translator, "from_checkpoint", classmethod(spy))
    for flag in ([], ["--ensemble"]):
        run_cli([command, "--checkpoint", str(tiny_checkpoint), str(tiny_checkpoint), *flag,
                 "--input", str(src), "--max-len-b", "3", *extra])
    assert seen == [False, True]  # (parse then refuses the checkpoint: not a parser)


def test_evaluate_refuses_ensemble_with_a_hypothesis_file(run_cli, tmp_path: Path) -> None:
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("ein mann\n", encoding="utf-8")
    code, out, err = run_cli(["evaluate", "--hyp", str(hyp), "--ref", str(hyp), "--ensemble"])
    assert code == 2 and out == b""
    assert err.strip().splitlines() == [
        "aiayn evaluate: error: --ensemble decodes with several --checkpoint models; --hyp scores a file as it is"]
