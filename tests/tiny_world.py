"""What the bad-input and fault matrices run against: sentences of a small vocabulary, two
tiny checkpoints (different seeds) with a word tokenizer trained on them, and snapshots of
the files a row must leave untouched."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

WORDS = "a man woman dog cat is riding walking on the street with red blue ball bike in park".split()


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]


def two_checkpoints(root: Path) -> tuple[Path, Path]:
    """``root/ck`` and ``root/ck2``: tiny models of seeds 0 and 1, beam 2, at most 3 tokens
    past the source length, sharing one word tokenizer."""
    import torch

    from aiayn.checkpoint.directory import save_checkpoint
    from aiayn.config import Config, DecodeConfig, model_preset
    from aiayn.model import build_model
    from aiayn.text.tokenizer import train_tokenizer

    tok = train_tokenizer(sentences(200, 1), sentences(200, 2), root / "spm", vocab_size=60, joint=True,
                          model_type="word")
    cfg = Config(model=model_preset("tiny", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                                    max_positions=64),
                 decode=DecodeConfig(beam=2, max_len_a=1.0, max_len_b=3))
    paths = []
    for seed, name in ((0, "ck"), (1, "ck2")):
        torch.manual_seed(seed)
        paths.append(save_checkpoint(root / name, build_model(cfg.model).eval(), cfg, tokenizer=tok,
                                     state={"step": seed + 1}))
    return paths[0], paths[1]


def snapshot(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root``: equal snapshots mean nothing
    under it was added, removed or changed."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out
