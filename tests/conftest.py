"""Shared fixtures: tiny seeded configurations and the offline data mirror; and, under
``CI=true``, the rule that a missing prerequisite fails the run instead of skipping."""

from __future__ import annotations

import functools
import io
import os
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.config import Config, DataConfig, ModelConfig, TrainConfig, model_preset

REPO = Path(__file__).resolve().parents[1]
# The offline data mirror (real corpora): $AIAYN_DATA_MIRROR alone, which .ci/run sets. Unset, a
# path that exists nowhere and names the variable, so the tests that need data skip saying so.
MIRROR = Path(os.environ.get("AIAYN_DATA_MIRROR") or "/AIAYN_DATA_MIRROR-is-not-set")

pytest_plugins = ["pytester"]

# A skip CI accepts names a feature of the machine (a platform, a kernel, a daemon), never a
# missing install: its reason starts with this.
PLATFORM = "platform: "


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str | None:
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


# The cuda tests' skip where torch sees no CUDA device.
NO_CUDA = PLATFORM + "no CUDA device"


@functools.cache
def _unusable_gpu() -> str | None:
    """Where nvidia-smi sees a GPU that the installed torch cannot use (a CPU-only build):
    why and how to fix it, from scripts/torch_index.py; else None."""
    import torch_index

    return torch_index.unusable_gpu()


def _fail_missing_prerequisite(report: pytest.CollectReport | pytest.TestReport) -> None:
    """Locally a missing data mirror, browser or extra skips with its reason; under CI=true
    it is a failure, so that a green CI means every test ran. "No CUDA device" is a platform
    skip only where there is no GPU: a GPU with a torch that cannot use it fails under CI."""
    reason = _skip_reason(report)
    if reason is None or not _in_ci():
        return
    if reason.startswith(PLATFORM):
        gpu = _unusable_gpu() if reason == NO_CUDA else None
        if gpu is None:
            return
        reason = gpu
    report.outcome = "failed"
    report.longrepr = f"CI=true and a prerequisite is missing (locally this skips): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    _fail_missing_prerequisite(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    outcome = yield
    _fail_missing_prerequisite(outcome.get_result())


# Two cores on CI: keep torch from oversubscribing when pytest runs alongside builds.
torch.set_num_threads(int(os.environ.get("AIAYN_TEST_THREADS", "2")))

# Inference defaults to dtype auto, whose choice depends on the CPU: a test that does not ask
# for a precision runs fp32 on every machine, in-process and in the commands it starts
# (tests of auto itself clear it).
os.environ["AIAYN_DTYPE"] = "fp32"


@pytest.fixture
def tiny_config() -> ModelConfig:
    return model_preset("tiny")


@pytest.fixture
def mirror() -> Path:
    if not (MIRROR / "multi30k").is_dir():
        pytest.skip(f"data mirror not found at {MIRROR}")
    return MIRROR


# Every test starts from the same random state, whichever tests ran before it (or in which
# subset, as mutmut selects): torch, numpy's global generator and Python's random, seeded 0.
SEED = 0


def seed_everything(seed: int = SEED) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture of the test is set up: a module- or session-scoped fixture created
    # for this test (a trained checkpoint) starts from the seed too.
    seed_everything()


@pytest.fixture(autouse=True)
def _seeded() -> None:
    """The test itself starts from the seed, after its broader-scoped fixtures drew numbers."""
    seed_everything()


@pytest.fixture(autouse=True)
def _inductor_cache_variable() -> Iterator[None]:
    """Compiling points $TORCHINDUCTOR_CACHE_DIR at aiayn's cache (aiayn.runtime.use_compile_cache),
    in this process's environment: restored after each test, so that no later test, nor a
    process it starts, inherits it."""
    name = "TORCHINDUCTOR_CACHE_DIR"
    before = os.environ.get(name)
    yield
    if before is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = before


def tiny_cfg(vocab: int = 16, **train: object) -> Config:
    model = ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=32, n_heads=2,
                        d_ff=64, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0,
                        max_positions=64)
    t = dict(max_tokens=64, lr_schedule="constant", lr=3e-3, warmup_steps=0, log_every=0,
             valid_every=0, save_every=0, max_steps=10, label_smoothing=0.1, progress_bar=False)
    t.update(train)
    cfg = Config(model=model, data=DataConfig(), train=TrainConfig(**t))
    cfg.validate()
    return cfg


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread, and far faster than two threads on a busy
    shared machine (intra-op threads spin-wait for each other)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def make_cfg():
    """``make_cfg(**train_fields) -> Config`` of a tiny model (fixtures: importable helpers
    do not work under --import-mode=importlib)."""
    return tiny_cfg


class ListedPairs:
    """Given (source, target) id sequences in memory, as the batcher's SizedPairs."""

    def __init__(self, pairs: list[tuple[list[int] | np.ndarray, list[int] | np.ndarray]]) -> None:
        self.pairs = [(np.asarray(s), np.asarray(t)) for s, t in pairs]
        self.src_sizes = np.array([len(s) for s, _ in self.pairs])
        self.tgt_sizes = np.array([len(t) for _, t in self.pairs])

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.pairs[i]


@pytest.fixture
def listed_pairs():
    """``listed_pairs([(src_ids, tgt_ids), ...]) -> ListedPairs`` (a fixture: importable
    helpers do not work under --import-mode=importlib)."""
    return ListedPairs


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``tiny_checkpoints(corpus, **recipe) -> Path``: the checkpoint tests/tiny_world.py's
    ``tiny_checkpoint`` builds of that recipe, built once per test session in a folder of
    its own (a test that changes a checkpoint works on a copy)."""
    from tests.tiny_world import tiny_checkpoint

    built: dict[str, Path] = {}

    def get(*args: object, **recipe: object) -> Path:
        key = repr((args, sorted(recipe.items())))
        if key not in built:
            built[key] = tiny_checkpoint(tmp_path_factory.mktemp("tiny_ckpt"), *args, **recipe)
        return built[key]

    return get


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_checkpoints: Callable[..., Path]) -> Path:
    """The translator and CLI tests' checkpoint: a tiny random model with an English-German
    BPE tokenizer (tests/tiny_world.py, ``TRANSLATOR``)."""
    from tests.tiny_world import TRANSLATOR

    return tiny_checkpoints(**TRANSLATOR)


@pytest.fixture(scope="session")
def second_checkpoint(tiny_checkpoints: Callable[..., Path], tiny_checkpoint: Path) -> Path:
    """The same model configuration and tokenizer with other random weights."""
    from tests.tiny_world import TRANSLATOR

    return tiny_checkpoints(decode=TRANSLATOR["decode"], seed=1, step=2, name="ckpt2",
                            tokenizer=tiny_checkpoint / "tokenizer")


@pytest.fixture
def english() -> list[str]:
    """Twelve English sentences of the words the tiny checkpoint's tokenizer was trained on."""
    from tests.tiny_world import WORDS, sentences

    return sentences(12, 5, WORDS, longest=12)


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
