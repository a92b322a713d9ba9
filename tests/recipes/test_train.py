"""The training recipe's own pieces: data for a process, vocabulary sizes, the validation
BLEU it injects into the trainer. (Whole runs: tests/training/test_train_cli.py,
test_resume.py, test_distributed.py.)"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from aiayn.config import DataConfig, DecodeConfig
from aiayn.data.prepare import ensure_prepared, load_tokenizer, split_text
from aiayn.errors import ConfigError
from aiayn.evaluation.bleu import corpus_bleu
from aiayn.inference.translator import Translator
from aiayn.model import build_model
from aiayn.recipes import train as recipe
from aiayn.training.distributed import DistInfo


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    cfg = DataConfig(synthetic="reverse", synthetic_train_size=60, synthetic_valid_size=6,
                     synthetic_min_len=2, synthetic_max_len=5, synthetic_vocab=8, spm_model_type="word")
    return ensure_prepared(cfg, tmp_path_factory.mktemp("recipe") / "prepared")


def test_default_run_dir():
    assert recipe.default_run_dir("configs/wmt14_en_de_base.yaml") == Path("runs/wmt14_en_de_base")
    assert recipe.default_run_dir(None) == Path("runs/run")


def test_build_data_for_the_main_process_and_the_others(make_cfg, prepared, tmp_path):
    cfg = make_cfg(valid_bleu=True)
    cfg.data.prepared_dir = str(prepared)
    main = recipe.build_data(cfg, tmp_path, DistInfo())
    assert main.prepared == prepared and main.tokenizer.src_vocab_size > 0
    assert main.valid and sum(b.src.size(0) for b in main.valid) == 6
    assert main.valid_text == split_text(prepared, "valid")
    other = recipe.build_data(cfg, tmp_path, DistInfo(rank=1, world_size=2, local_rank=1))
    assert other.valid is None and other.valid_text is None  # validation is the main process's
    assert (main.train.num_shards, main.train.shard_id) == (1, 0)
    assert (other.train.num_shards, other.train.shard_id) == (2, 1)


def test_match_vocab(make_cfg):
    tok = SimpleNamespace(src_vocab_size=20, tgt_vocab_size=20)
    cfg = recipe.match_vocab(make_cfg(), tok)
    assert (cfg.model.src_vocab_size, cfg.model.tgt_vocab_size) == (20, 20)
    cfg.model.share_embeddings = "all"
    with pytest.raises(ConfigError, match="'all' needs one shared vocabulary"):
        recipe.match_vocab(cfg, SimpleNamespace(src_vocab_size=20, tgt_vocab_size=24))


def test_validation_bleu_decodes_the_live_model_with_a_new_translator(prepared, monkeypatch):
    tok = load_tokenizer(prepared)
    src, ref = split_text(prepared, "valid")
    decode = DecodeConfig(beam=2, max_len_b=8)
    built = []

    class Scripted:
        """A translator that says what its model is scripted to say when it is built."""

        def __init__(self, model, *args, **kwargs) -> None:
            built.append(((model, *args), kwargs))
            self.says = list(model.says)

        def translate(self, texts: list[str]) -> list[str]:
            assert texts == src
            return self.says

    monkeypatch.setattr(recipe, "Translator", Scripted)
    bleu = recipe.validation_bleu((src, ref), tok, decode, torch.device("cpu"))
    model = torch.nn.Linear(1, 1)
    model.says = ref  # translates perfectly
    assert bleu(model) == float(corpus_bleu(ref, ref)) == pytest.approx(100.0)
    model.says = [ref[0]] * len(ref)  # then, after an update, one sentence for every source
    worse = corpus_bleu(model.says, ref)
    assert 0.0 < worse < 99.0 and bleu(model) == float(worse)
    # A new translator each time (its weights would go stale), built on the live model.
    assert built == [((model, tok, decode), {"device": torch.device("cpu")})] * 2


def test_validation_bleu_is_the_translators_bleu(prepared, tiny_config):
    tok = load_tokenizer(prepared)
    tiny_config.src_vocab_size = tiny_config.tgt_vocab_size = tok.src_vocab_size
    model = build_model(tiny_config).eval()
    text = split_text(prepared, "valid")
    decode = DecodeConfig(beam=2, max_len_b=8)
    bleu = recipe.validation_bleu(text, tok, decode, torch.device("cpu"))
    assert bleu(model) == float(corpus_bleu(Translator(model, tok, decode).translate(text[0]), text[1]))


def test_validation_bleu_without_text_is_skipped(caplog):
    bleu = recipe.validation_bleu(None, object(), DecodeConfig(), torch.device("cpu"))
    with caplog.at_level(logging.INFO, logger="aiayn"):
        assert bleu(torch.nn.Linear(1, 1)) is None
    assert "no validation text or tokenizer; BLEU skipped" in caplog.text
