"""The `--dtype auto` quality guard that the slow recipe tests run on their trained models,
checked here on a tiny random model: it scores fp32 and every precision auto can choose."""

from __future__ import annotations

import random
from pathlib import Path

import torch

WORDS = "a man woman dog cat is riding walking on the street with red blue ball bike in park".split()


def _tiny_checkpoint(root: Path) -> Path:
    from aiayn.checkpoint.directory import save_checkpoint
    from aiayn.config import Config, DecodeConfig, model_preset
    from aiayn.model import build_model
    from aiayn.text.tokenizer import train_tokenizer

    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(200)]
    tok = train_tokenizer(lines, lines, root / "spm", vocab_size=80, joint=True, model_type="bpe")
    cfg = Config(model=model_preset("tiny", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                                    max_positions=64),
                 decode=DecodeConfig(beam=2, max_len_a=1.0, max_len_b=3))
    torch.manual_seed(0)
    return save_checkpoint(root / "ckpt", build_model(cfg.model).eval(), cfg, tokenizer=tok, state={"step": 1})


def test_the_guard_scores_fp32_and_each_auto_precision(dtype_guard, tmp_path: Path) -> None:
    from aiayn.inference.translator import Translator

    checkpoint = _tiny_checkpoint(tmp_path)
    sources = ["a man is riding a bike", "the dog in the park", "a red ball on the street"]
    (tmp_path / "src.txt").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    fp32 = Translator.from_checkpoint(checkpoint, dtype="fp32").translate(sources)
    (tmp_path / "ref.txt").write_text("".join(s + "\n" for s in fp32), encoding="utf-8")
    # A random model's near-ties may flip in another precision: the tolerance is wide here.
    scores = dtype_guard([checkpoint], tmp_path / "src.txt", tmp_path / "ref.txt", tolerance=100.0)
    assert list(scores) == ["fp32", "bf16", "int8"] and round(scores["fp32"], 6) == 100.0
