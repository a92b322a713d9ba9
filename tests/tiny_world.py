"""Tiny checkpoints and the sentences around them: the one builder of the tests' random-weight
checkpoints (``tiny_checkpoint``, which the session-scoped ``tiny_checkpoints`` fixture of
tests/conftest.py caches), the two checkpoints the bad-input and fault matrices run against,
and snapshots of the files a row must leave untouched."""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiayn.config import DataConfig

WORDS = "a man woman dog cat is riding walking on the street with red blue ball bike in park".split()
WORDS_DE = "ein mann frau hund katze fährt geht auf der straße mit rot blau ball fahrrad im park".split()

# The checkpoints several test folders share (``tiny_checkpoint``'s arguments after ``root``).
# The translator and CLI tests': an English-German BPE tokenizer, the search short.
TRANSLATOR: dict[str, Any] = {"corpus": "en-de", "vocab_size": 120, "model_type": "bpe", "name": "ckpt",
                              "decode": {"beam": 4, "lenpen": 0.6, "max_len_a": 1.0, "max_len_b": 5}}
# The serving and plotting tests': the toy task's word tokenizer, as the serving benchmarks
# build theirs (benchmarks/serve_load.py), the preset's positions.
SERVING: dict[str, Any] = {"corpus": "toy", "vocab_size": 200, "max_positions": None, "step": 0,
                           "name": "checkpoint", "decode": {"beam": 4, "max_len_a": 1.0, "max_len_b": 8}}


def sentences(n: int, seed: int, words: list[str] = WORDS, longest: int = 9) -> list[str]:
    """``n`` sentences of 3 to ``longest`` random ``words``, the same for the same seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, longest))) for _ in range(n)]


def _corpus(name: str) -> tuple[list[str], list[str], DataConfig]:
    """The (source, target) sentences a tokenizer of ``name`` is trained on, and the data
    section its checkpoint records."""
    from aiayn.config import DataConfig

    if name == "words":  # one word list on both sides
        return sentences(200, 1), sentences(200, 2), DataConfig()
    if name == "same-words":  # the same sentences on both sides
        return sentences(200, 0), sentences(200, 0), DataConfig()
    if name == "en-de":  # English and German word lists, longer sentences
        return sentences(300, 1, WORDS, 12), sentences(300, 2, WORDS_DE, 12), DataConfig()
    if name == "toy":  # the synthetic toy task, as the serving benchmarks' checkpoint
        from aiayn.data.synthetic import generate

        pairs = generate("toy", 400, seed=0, min_len=3, max_len=10)
        return ([s for s, _ in pairs], [t for _, t in pairs],
                DataConfig(src_lang="en", tgt_lang="xx", synthetic="toy", spm_model_type="word"))
    raise ValueError(f"unknown corpus {name!r}")


def tiny_checkpoint(root: Path, corpus: str | None = "words", *, vocab_size: int = 60, model_type: str = "word",
                    decode: Mapping[str, Any] | None = None, max_positions: int | None = 64, seed: int = 0,
                    step: int = 1, name: str = "ck", tokenizer: Path | None = None) -> Path:
    """``root/name``: a checkpoint of the ``tiny`` preset with the random weights of ``seed``
    and ``state={"step": step}``.

    Its tokenizer is trained in ``root/spm`` on ``corpus`` (``vocab_size`` pieces of
    ``model_type``, one joint vocabulary) and its source sentences are written to
    ``root/sentences.txt``; or it is the directory ``tokenizer`` (another checkpoint's, for
    a second model of the same vocabulary); with ``corpus=None`` there is none and the model
    has ``vocab_size`` ids. ``decode``: DecodeConfig fields (the rest their defaults);
    ``max_positions=None`` keeps the preset's.
    """
    import torch

    from aiayn.checkpoint.directory import save_checkpoint
    from aiayn.config import Config, DataConfig, DecodeConfig, model_preset
    from aiayn.model import build_model
    from aiayn.text.tokenizer import Tokenizer, train_tokenizer

    data = DataConfig()
    tok: Tokenizer | Path | None = tokenizer
    if tokenizer is not None:
        loaded = Tokenizer.load(tokenizer)
        src_vocab, tgt_vocab = loaded.src_vocab_size, loaded.tgt_vocab_size
    elif corpus is None:
        src_vocab = tgt_vocab = vocab_size
    else:
        sources, targets, data = _corpus(corpus)
        trained = train_tokenizer(sources, targets, root / "spm", vocab_size=vocab_size, joint=True,
                                  model_type=model_type)
        (root / "sentences.txt").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
        src_vocab, tgt_vocab, tok = trained.src_vocab_size, trained.tgt_vocab_size, trained
    positions = {} if max_positions is None else {"max_positions": max_positions}
    cfg = Config(model=model_preset("tiny", src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab, **positions),
                 data=data, decode=DecodeConfig(**(decode or {})))
    torch.manual_seed(seed)
    return save_checkpoint(root / name, build_model(cfg.model).eval(), cfg, tokenizer=tok, state={"step": step})


def two_checkpoints(root: Path) -> tuple[Path, Path]:
    """``root/ck`` and ``root/ck2``: tiny models of seeds 0 and 1, beam 2, at most 3 tokens
    past the source length, sharing one word tokenizer."""
    decode = {"beam": 2, "max_len_a": 1.0, "max_len_b": 3}
    first = tiny_checkpoint(root, "words", decode=decode)
    return first, tiny_checkpoint(root, decode=decode, seed=1, step=2, name="ck2", tokenizer=first / "tokenizer")


def snapshot(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root``: equal snapshots mean nothing
    under it was added, removed or changed."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out
