"""A tiny checkpoint with a real SentencePiece model (random weights) for translator and
CLI tests; built once per test session."""

from __future__ import annotations

import io
import random
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from aiayn.config import Config, DecodeConfig, model_preset

WORDS_EN = "a man woman dog cat is riding walking on the street with red blue ball bike in park".split()
WORDS_DE = "ein mann frau hund katze fährt geht auf der straße mit rot blau ball fahrrad im park".split()


def _sentences(words: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(n)]


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models gain nothing from a second thread, and on a shared 2-core machine the
    threads' hand-offs cost more than the arithmetic; restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from aiayn.checkpoint.directory import save_checkpoint
    from aiayn.model import build_model
    from aiayn.text.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("translator")
    tok = train_tokenizer(_sentences(WORDS_EN, 300, 1), _sentences(WORDS_DE, 300, 2), root / "spm",
                          vocab_size=120, joint=True, model_type="bpe")
    cfg = Config(model=model_preset("tiny", src_vocab_size=tok.src_vocab_size,
                                    tgt_vocab_size=tok.tgt_vocab_size, max_positions=64),
                 decode=DecodeConfig(beam=4, lenpen=0.6, max_len_a=1.0, max_len_b=5))
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    return save_checkpoint(root / "ckpt", model, cfg, tokenizer=tok, state={"step": 1})


@pytest.fixture(scope="session")
def second_checkpoint(tiny_checkpoint: Path) -> Path:
    """The same model configuration and tokenizer with other random weights."""
    from aiayn.checkpoint.directory import load_checkpoint, save_checkpoint
    from aiayn.model import build_model

    loaded = load_checkpoint(tiny_checkpoint)
    torch.manual_seed(1)
    model = build_model(loaded.config.model).eval()
    return save_checkpoint(tiny_checkpoint.parent / "ckpt2", model, loaded.config,
                           tokenizer=tiny_checkpoint / "tokenizer", state={"step": 2})


@pytest.fixture
def english() -> list[str]:
    return _sentences(WORDS_EN, 12, 5)


@pytest.fixture
def run_cli(capsysbinary: pytest.CaptureFixture[bytes],
            monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, bytes, str]]:
    """``run_cli(argv, stdin=None) -> (exit code, stdout bytes, stderr text)``: ``aiayn`` run
    in this process, ``stdin`` (bytes) given as a non-terminal standard input."""
    from aiayn.cli.main import main

    def run(argv: list[str], stdin: bytes | None = None) -> tuple[int, bytes, str]:
        if stdin is not None:
            class FakeStdin:
                buffer = io.BytesIO(stdin)

                def isatty(self) -> bool:
                    return False

            monkeypatch.setattr(sys, "stdin", FakeStdin())
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsysbinary.readouterr()
        return code, out, err.decode("utf-8", "replace")

    return run
