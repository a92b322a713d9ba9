import os
import subprocess
import sys

import pytest

CODE = "from aiayn.runtime import tune_allocator; print(tune_allocator(), tune_allocator())"


def _run(env_extra: dict[str, str]) -> str:
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env,
                          check=True).stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="platform: glibc mallopt")
def test_allocator_tuned_once_on_glibc_and_opt_out_respected():
    assert _run({}) == "True True"  # second call: already applied, same answer
    assert _run({"AIAYN_MALLOC": "system"}) == "False False"


@pytest.mark.parametrize("avx512_bf16, amx, expected", [(False, False, "fp32"), (True, False, "bf16"),
                                                         (False, True, "bf16")])
def test_dtype_auto_is_bf16_only_where_the_cpu_runs_it_natively(monkeypatch: pytest.MonkeyPatch,
                                                                 avx512_bf16: bool, amx: bool, expected: str):
    import torch

    from aiayn.runtime import resolve_train_dtype

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert resolve_train_dtype("auto", "cpu") == expected
    # An explicit choice is kept whatever the hardware.
    assert resolve_train_dtype("bf16", "cpu") == "bf16"
    assert resolve_train_dtype("fp32", "cpu") == "fp32"


def test_trainer_resolves_dtype_auto(monkeypatch: pytest.MonkeyPatch):
    import torch

    from aiayn.config import Config, ModelConfig, TrainConfig
    from aiayn.model import build_model
    from aiayn.training.trainer import Trainer

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    cfg = Config(model=ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1,
                                   src_vocab_size=16, tgt_vocab_size=16),
                 train=TrainConfig(dtype="auto"))
    cfg.validate()
    trainer = Trainer(cfg, build_model(cfg.model), device="cpu")
    assert (trainer.dtype, trainer.amp_dtype) == ("fp32", None)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    trainer = Trainer(cfg, build_model(cfg.model), device="cpu")
    assert (trainer.dtype, trainer.amp_dtype) == ("bf16", torch.bfloat16)


# The commands that run the model; each takes --threads, applied before it starts.
COMPUTE_COMMANDS = ("demo", "train", "translate", "evaluate", "parse", "serve", "plot attention")


@pytest.mark.parametrize("flag, env, expected", [(None, None, 0), (None, "3", 3), (2, "3", 2), (0, "3", 0),
                                                 (None, " 1 ", 1)])
def test_threads_from_the_flag_else_the_environment(monkeypatch: pytest.MonkeyPatch, flag, env, expected):
    from aiayn.runtime import THREADS_ENV, num_threads

    if env is None:
        monkeypatch.delenv(THREADS_ENV, raising=False)
    else:
        monkeypatch.setenv(THREADS_ENV, env)
    assert num_threads(flag) == expected


@pytest.mark.parametrize("flag, env, message", [(None, "two", "AIAYN_NUM_THREADS='two': not a whole number"),
                                                (None, "-1", "AIAYN_NUM_THREADS -1: the number of threads cannot"),
                                                (-2, None, "--threads -2: the number of threads cannot")])
def test_bad_thread_counts_name_their_origin(monkeypatch: pytest.MonkeyPatch, flag, env, message):
    from aiayn.errors import ConfigError
    from aiayn.runtime import THREADS_ENV, num_threads

    monkeypatch.setenv(THREADS_ENV, env) if env else monkeypatch.delenv(THREADS_ENV, raising=False)
    with pytest.raises(ConfigError, match=message):
        num_threads(flag)


@pytest.mark.parametrize("command", COMPUTE_COMMANDS)
def test_every_compute_command_applies_threads_before_it_runs(monkeypatch: pytest.MonkeyPatch, command: str):
    import torch

    from aiayn.cli import main as cli

    parser = cli.build_parser()
    seen = []
    real = parser.parse_args

    def parse_args(argv):
        args = real(argv)
        args.func = lambda a: seen.append((a.threads, torch.get_num_threads()))
        return args

    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(parser, "parse_args", parse_args)
    monkeypatch.setenv("AIAYN_NUM_THREADS", "2")
    checkpoint = ["--checkpoint", "x"]
    required = {"train": [], "translate": checkpoint, "evaluate": [], "parse": checkpoint, "serve": checkpoint,
                "plot attention": [*checkpoint, "--text", "a"], "demo": []}[command]
    before = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as exit_:
            cli.main([*command.split(), *required, "--threads", "1"])
        assert exit_.value.code == 0 and seen == [(1, 1)]
    finally:
        torch.set_num_threads(before)
