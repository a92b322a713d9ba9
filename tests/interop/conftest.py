"""Shared fixtures of the interop tests: a toy translation task, its tokenizer, and a tiny
Transformer trained on it for a few hundred steps (seconds on a CPU).

The task maps each word of a sentence through a fixed dictionary and keeps the order
(a monotone "translation"), so a tiny model learns it quickly and its next-token
distributions are peaked: greedy and beam comparisons between toolkits are then about
the numbers, not about breaking near-ties.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from aiayn.checkpoint.directory import save_checkpoint
from aiayn.config import Config, DecodeConfig, model_preset
from aiayn.model import Transformer, build_model
from aiayn.text.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, train_tokenizer
from aiayn.training.loss import label_smoothed_nll_loss

# No downloads: everything these tests load is written by the tests themselves.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# CTranslate2 picks Intel MKL for its matmuls only on Intel CPUs; elsewhere its int8 goes
# through oneDNN, which on CPUs without VNNI (AVX2 only) agreed with aiayn's float32 greedy
# output on 11 of 20 test sentences instead of >= 15 (with MKL: >= 15). The tests check the
# export, not that backend, so they ask for MKL everywhere (read once, at CT2's first use).
os.environ.setdefault("CT2_USE_MKL", "1")

SRC_WORDS = ("the a cat dog bird house garden tree river red green blue small big old new runs "
             "sleeps sees eats quickly slowly under over near with and").split()
TGT_WORDS = ("der ein katze hund vogel haus garten baum fluss rot gruen blau klein gross alt neu "
             "rennt schlaeft sieht isst schnell langsam unter ueber nahe mit und").split()
LEXICON = dict(zip(SRC_WORDS, TGT_WORDS))


def toy_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    src = [" ".join(rng.choice(SRC_WORDS) for _ in range(rng.randint(3, 10))) for _ in range(n)]
    return src, [" ".join(LEXICON[w] for w in s.split()) for s in src]


def pad_batch(seqs: list[list[int]], pad: int = PAD_ID) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [pad] * (width - len(s)) for s in seqs], dtype=torch.long)


def train_tiny(model: Transformer, tok: Tokenizer, src: list[str], tgt: list[str], steps: int,
               seed: int = 0) -> float:
    """A plain training loop (Adam, label smoothing 0.1); returns the last loss per token."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    # One thread: for a model this small, thread hand-offs cost more than they save,
    # and several test processes may share the machine's cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    xs = [tok.encode_src(s) for s in src]
    ys = [tok.encode_tgt(t) for t in tgt]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    model.train()
    loss_value = float("nan")
    for _ in range(steps):
        idx = rng.sample(range(len(xs)), 64)
        s = pad_batch([xs[i] for i in idx])
        t_in = pad_batch([[BOS_ID] + ys[i] for i in idx])
        t_out = pad_batch([ys[i] + [EOS_ID] for i in idx])
        loss, _ = label_smoothed_nll_loss(model(s, t_in), t_out, 0.1, PAD_ID, reduction="mean")
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_value = float(loss.detach())
    model.eval()
    torch.set_num_threads(threads)
    return loss_value


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Tiny models decode faster on one thread than on two contended ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass
class Trained:
    checkpoint: Path
    model: Transformer
    tokenizer: Tokenizer
    config: Config
    test_src: list[str]
    test_tgt: list[str]


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """A tiny post-norm model with the paper's interleaved sinusoids, trained on the toy task."""
    root = tmp_path_factory.mktemp("interop_trained")
    src, tgt = toy_pairs(4000, seed=1)
    test_src, test_tgt = toy_pairs(200, seed=2)
    tok = train_tokenizer(src, tgt, root / "tok", vocab_size=160, joint=True)
    cfg = Config(model=model_preset("tiny", src_vocab_size=tok.src_vocab_size,
                                    tgt_vocab_size=tok.tgt_vocab_size, sinusoid_layout="interleaved"),
                 decode=DecodeConfig(beam=4, lenpen=1.0, lenpen_style="fairseq"))
    torch.manual_seed(0)
    model = build_model(cfg.model)
    t0 = time.time()
    loss = train_tiny(model, tok, src, tgt, steps=400)
    print(f"trained tiny model: loss {loss:.3f} in {time.time() - t0:.1f}s")
    ckpt = save_checkpoint(root / "ckpt", model, cfg, tokenizer=tok, state={"step": 400})
    return Trained(ckpt, model, tok, cfg, test_src, test_tgt)


def aiayn_search(model: Transformer, tok: Tokenizer, texts: list[str], cfg: DecodeConfig,
                 batch: int = 50) -> list[list[int]]:
    """aiayn's own search (greedy for beam 1) over ``texts``: the best hypothesis' ids."""
    from aiayn.inference.adapters import IncrementalDecoder
    from aiayn.inference.search import search

    out: list[list[int]] = []
    for i in range(0, len(texts), batch):
        src = pad_batch([tok.encode_src(t) for t in texts[i:i + batch]])
        out += [hyps[0].tokens for hyps in search(IncrementalDecoder(model), src, cfg)]
    return out


def hf_generated(sequences: torch.Tensor, eos: int) -> list[list[int]]:
    """HF ``generate`` output -> ids without the decoder start, up to (not incl.) EOS."""
    out = []
    for row in sequences[:, 1:].tolist():
        out.append(row[:row.index(eos)] if eos in row else row)
    return out


@pytest.fixture(scope="session")
def helpers() -> SimpleNamespace:
    """This module's helper functions, for the test modules (which cannot import a conftest)."""
    return SimpleNamespace(toy_pairs=toy_pairs, pad_batch=pad_batch, train_tiny=train_tiny,
                           aiayn_search=aiayn_search, hf_generated=hf_generated)
