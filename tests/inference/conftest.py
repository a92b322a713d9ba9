"""The translator and CLI tests run on one torch thread; their checkpoints (``tiny_checkpoint``,
``second_checkpoint``) and ``run_cli`` come from tests/conftest.py. The parsing tests share a
few gold trees and a random parsing checkpoint over their vocabularies."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn.config import Config, DecodeConfig, model_preset
from aiayn.data.trees import linearize, parse_tree


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models gain nothing from a second thread, and on a shared 2-core machine the
    threads' hand-offs cost more than the arithmetic; restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


GOLD = [
    "(S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) (. .))",
    "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))",
    "(S (NP (PRP He)) (VP (VBD said) (SBAR (S (NP (PRP it)) (VP (VBD rained))))) (. .))",
    "(NP (NP (DT a) (NN man)) (PP (IN with) (NP (DT a) (NN dog))))",
    "(S (NP (NNS Prices)) (VP (VBD rose) (NP (CD 5) (NN %))) (, ,) (NP (PRP they)) (VP (VBD said)) (. .))",
    "(FRAG (NP (-LRB- -LRB-) (NN note) (-RRB- -RRB-)) (. .))",
]


@pytest.fixture(scope="module")
def gold_trees() -> list:
    return [parse_tree(t) for t in GOLD]


@pytest.fixture(scope="module")
def parsing_checkpoint(tmp_path_factory: pytest.TempPathFactory, gold_trees: list) -> Path:
    """Random weights over real separate vocabularies: BPE over words, one piece per symbol."""
    from aiayn.checkpoint.directory import save_checkpoint
    from aiayn.model import build_model
    from aiayn.text.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("parsing")
    words = [" ".join(t.leaves()) for t in gold_trees] * 20
    symbols = [" ".join(linearize(t)) for t in gold_trees] * 20
    tok = train_tokenizer(words, symbols, root / "spm", vocab_size=60, joint=False, model_type="bpe",
                          tgt_model_type="word", num_threads=1)
    cfg = Config(model=model_preset("tiny", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                                    share_embeddings="decoder", max_positions=128),
                 decode=DecodeConfig(batch_tokens=64))
    torch.manual_seed(0)
    return save_checkpoint(root / "ckpt", build_model(cfg.model).eval(), cfg, tokenizer=tok, state={"step": 1})
