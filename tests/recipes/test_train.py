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


class _Pieces:
    """A stand-in tokenizer: only its pieces matter to init_from's vocabulary map."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces, self.joint = pieces, True
        self.src_vocab_size = self.tgt_vocab_size = len(pieces)

    def src_pieces(self, ids):
        return [self.pieces[i] for i in ids]

    tgt_pieces = src_pieces


def test_init_from_with_a_changed_vocabulary(make_cfg, prepared, tmp_path):
    from aiayn.checkpoint.directory import save_checkpoint

    old_tok = load_tokenizer(prepared)
    n = old_tok.src_vocab_size
    old_cfg = make_cfg(vocab=n)
    old_model = build_model(old_cfg.model)
    ckpt = save_checkpoint(tmp_path / "ckpt", old_model, old_cfg, old_tok)
    old_pieces = old_tok.src_pieces(range(n))
    new_tok = _Pieces(old_pieces + ["▁new", "▁words"])
    cfg = make_cfg(vocab=n + 2, init_from=str(ckpt), init_vocab="extend")
    report: dict = {}
    model = recipe._build_model(cfg, None, DistInfo(), new_tok, report)
    assert report == {"mode": "extend", "joint": {"old": n, "new": n + 2, "kept": n, "added": 2}}
    old_w, new_w = old_model.src_embed.weight, model.src_embed.weight
    assert torch.equal(new_w[:n], old_w) and torch.equal(new_w[n], old_w[4:].mean(0))
    assert torch.equal(new_w[n + 1], new_w[n])
    cfg.train.init_vocab = "same"
    with pytest.raises(ConfigError, match="set train.init_vocab: extend"):
        recipe._build_model(cfg, None, DistInfo(), new_tok, {})
    # remap: any order of the same pieces and others.
    shuffled = old_pieces[:4] + old_pieces[4:][::-1] + ["▁new"]
    cfg = make_cfg(vocab=n + 1, init_from=str(ckpt), init_vocab="remap")
    model = recipe._build_model(cfg, None, DistInfo(), _Pieces(shuffled), report)
    assert report["joint"] == {"old": n, "new": n + 1, "kept": n, "added": 1}
    assert torch.equal(model.tgt_embed.weight[4:n], old_model.tgt_embed.weight[4:].flip(0))


def test_fine_tuning_with_an_extended_vocabulary_end_to_end(make_cfg, prepared, tmp_path):
    """prepare --extend-vocab on a checkpoint's tokenizer, then train.init_vocab: extend: the
    run starts from the checkpoint's rows and reports the kept and new pieces."""
    import json

    from aiayn.checkpoint.directory import save_checkpoint
    from aiayn.data.prepare import prepare_data

    pytest.importorskip("google.protobuf")
    old_tok = load_tokenizer(prepared)
    n = old_tok.src_vocab_size
    old_cfg = make_cfg(vocab=n)
    old_model = build_model(old_cfg.model)
    ckpt = save_checkpoint(tmp_path / "ckpt", old_model, old_cfg, old_tok)
    src, tgt = split_text(prepared, "valid")
    news = [(s + " zz yy", t + " yy zz") for s, t in zip(src, tgt)] * 4
    (tmp_path / "n.src").write_text("".join(s + "\n" for s, _ in news))
    (tmp_path / "n.tgt").write_text("".join(t + "\n" for _, t in news))
    data = DataConfig(train_src=str(tmp_path / "n.src"), train_tgt=str(tmp_path / "n.tgt"),
                      tokenizer_dir=str(ckpt / "tokenizer"), extend_vocab=2, spm_model_type="word")
    summary = prepare_data(data, tmp_path / "news", progress=False)
    assert summary["extended_vocab"]["joint"] == {"old": n, "new": n + 2, "added": 2}
    cfg = make_cfg(vocab=n, init_from=str(ckpt), init_vocab="extend", max_steps=1)
    cfg.data.prepared_dir = str(tmp_path / "news")
    out = recipe.run_training(cfg, tmp_path / "run")
    expected = {"mode": "extend", "joint": {"old": n, "new": n + 2, "kept": n, "added": 2}}
    assert out["init_vocab"] == expected
    assert json.loads((tmp_path / "run" / "train_summary.json").read_text())["init_vocab"] == expected
    assert f"init_vocab extend: joint vocabulary {n} -> {n + 2} pieces, {n} kept, 2 new" in (
        tmp_path / "run" / "train.log").read_text()
