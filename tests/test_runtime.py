import os
import subprocess
import sys

import pytest

CODE = "from aiayn.runtime.process import tune_allocator; print(tune_allocator(), tune_allocator())"


def _run(env_extra: dict[str, str]) -> str:
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env,
                          check=True).stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="platform: glibc mallopt")
def test_allocator_tuned_once_on_glibc_and_opt_out_respected():
    assert _run({}) == "True True"  # second call: already applied, same answer
    assert _run({"AIAYN_MALLOC": "system"}) == "False False"


def _flags(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """The CPU seen by every precision choice: these flags."""
    from aiayn.runtime import cpu

    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset(names))


@pytest.mark.parametrize("avx512_bf16, amx, expected", [(False, False, "fp32"), (True, False, "bf16"),
                                                         (False, True, "bf16")])
def test_dtype_auto_is_bf16_only_where_the_cpu_runs_it_natively(monkeypatch: pytest.MonkeyPatch,
                                                                 avx512_bf16: bool, amx: bool, expected: str):
    from aiayn.runtime.precision import resolve_train_dtype

    _flags(monkeypatch, "avx2", *(["avx512_bf16"] if avx512_bf16 else []), *(["amx_tile"] if amx else []))
    assert resolve_train_dtype("auto", "cpu") == expected
    # An explicit choice is kept whatever the hardware.
    assert resolve_train_dtype("bf16", "cpu") == "bf16"
    assert resolve_train_dtype("fp32", "cpu") == "fp32"


def test_trainer_resolves_dtype_auto(monkeypatch: pytest.MonkeyPatch):
    import torch

    from aiayn.config import Config, ModelConfig, TrainConfig
    from aiayn.model import build_model
    from aiayn.training.trainer import Trainer

    _flags(monkeypatch, "avx2", "avx512_vnni")
    cfg = Config(model=ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1,
                                   src_vocab_size=16, tgt_vocab_size=16),
                 train=TrainConfig(dtype="auto"))
    cfg.validate()
    trainer = Trainer(cfg, build_model(cfg.model), device="cpu")
    assert (trainer.dtype, trainer.amp_dtype) == ("fp32", None)
    _flags(monkeypatch, "avx2", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
    trainer = Trainer(cfg, build_model(cfg.model), device="cpu")
    assert (trainer.dtype, trainer.amp_dtype) == ("bf16", torch.bfloat16)


# The commands that run the model; each takes --threads, applied before it starts.
COMPUTE_COMMANDS = ("demo", "train", "translate", "evaluate", "parse", "serve", "plot attention")


@pytest.mark.parametrize("flag, env, expected", [(None, None, 0), (None, "3", 3), (2, "3", 2), (0, "3", 0),
                                                 (None, " 1 ", 1)])
def test_threads_from_the_flag_else_the_environment(monkeypatch: pytest.MonkeyPatch, flag, env, expected):
    from aiayn.runtime.process import THREADS_ENV, num_threads

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
    from aiayn.runtime.process import THREADS_ENV, num_threads

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


# CPU flag sets of the kinds the project runs on -> what `--dtype auto` picks and prints.
DTYPE_AUTO_CASES = [
    (("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"), "int8", "AMX"),
    (("avx2", "avx512f", "avx512_vnni", "avx512_bf16"), "int8", "AVX-512 VNNI"),
    (("avx2", "avx512f", "avx512_vnni"), "int8", "AVX-512 VNNI"),
    (("avx2", "avx_vnni"), "int8", "AVX-VNNI"),
    (("avx2", "avx512f", "avx512_bf16"), "bf16", "AVX-512 BF16"),
    (("avx2", "avx512f"), "int8", "fbgemm's int8 kernel"),
    (("avx2",), "int8", "fbgemm's int8 kernel"),
    (("sse4_2",), "fp32", "no VNNI or bf16 units"),
    ((), "fp32", "no VNNI or bf16 units"),
]
# The same without oneDNN's int8 kernel (a torch built without it, or not x86), with and
# without fbgemm's.
DTYPE_AUTO_WITHOUT_ONEDNN = [
    (("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"), True, "bf16",
     "AVX-512 BF16"),
    (("amx_bf16",), True, "bf16", "AMX"),
    (("avx2", "avx512f", "avx512_vnni"), True, "int8", "fbgemm's int8 kernel"),
    (("avx2",), True, "int8", "fbgemm's int8 kernel"),
    (("avx2", "avx512f", "avx512_vnni"), False, "fp32", "no VNNI or bf16 units"),
    (("avx2",), False, "fp32", "no VNNI or bf16 units"),
]


@pytest.mark.parametrize("flags, fbgemm, dtype, reason", DTYPE_AUTO_WITHOUT_ONEDNN)
def test_dtype_auto_without_an_int8_kernel(monkeypatch: pytest.MonkeyPatch, flags, fbgemm, dtype, reason):
    from aiayn.runtime import cpu
    from aiayn.runtime.precision import auto_inference_dtype

    monkeypatch.setattr(cpu, "onednn_int8", lambda: False)
    monkeypatch.setattr(cpu, "fbgemm_int8", lambda: fbgemm)
    choice = auto_inference_dtype("cpu", frozenset(flags))
    assert (choice.dtype, choice.reason) == (dtype, reason)


@pytest.mark.parametrize("flags, onednn, fbgemm, dtype, caveat", [
    (("avx2",), True, True, "bf16",
     "dtype bf16: bf16 is emulated on this CPU (no AVX-512 BF16 or AMX), slower than fp32"),
    (("avx512_bf16",), True, True, "bf16", "dtype bf16"),
    (("avx2", "avx512_vnni"), True, True, "int8", "dtype int8"),
    (("avx2", "avx512_vnni"), True, False, "int8", "dtype int8"),
    (("avx2",), True, True, "int8", "dtype int8"),  # fbgemm's kernel
    (("avx2",), False, True, "int8", "dtype int8"),
    (("avx2",), True, False, "int8", "dtype int8: this CPU has no VNNI or AMX: int8 runs with oneDNN's 7-bit "
                                     "weights, faster than fp32 in batches, slower one sentence at a time"),
    (("avx2",), False, False, "int8", "dtype int8: this torch has no oneDNN or fbgemm int8 kernel; int8 runs on a "
                                      "reference loop, slower than fp32"),
    (("avx2",), False, False, "fp32", "dtype fp32"),
])
def test_an_explicit_dtype_that_is_slow_here_says_so(monkeypatch: pytest.MonkeyPatch, flags, onednn, fbgemm, dtype,
                                                     caveat):
    from aiayn.runtime import cpu
    from aiayn.runtime.precision import resolve_inference_dtype

    _flags(monkeypatch, *flags)
    monkeypatch.setattr(cpu, "onednn_int8", lambda: onednn)
    monkeypatch.setattr(cpu, "fbgemm_int8", lambda: fbgemm)
    assert resolve_inference_dtype(dtype, "cpu").describe() == caveat
    assert resolve_inference_dtype(dtype, "meta").describe() == f"dtype {dtype}"  # not a CPU: no caveat


@pytest.mark.parametrize("flags, dtype, reason", DTYPE_AUTO_CASES)
def test_dtype_auto_on_the_cpu_follows_its_flags(monkeypatch: pytest.MonkeyPatch, flags, dtype, reason):
    from aiayn.runtime import cpu
    from aiayn.runtime.precision import DTYPE_ENV, auto_inference_dtype, resolve_inference_dtype

    monkeypatch.setattr(cpu, "onednn_int8", lambda: True)  # a torch with both int8 kernels
    monkeypatch.setattr(cpu, "fbgemm_int8", lambda: True)
    assert auto_inference_dtype("cpu", frozenset(flags)).dtype == dtype
    monkeypatch.delenv(DTYPE_ENV, raising=False)
    _flags(monkeypatch, *flags)
    choice = resolve_inference_dtype("auto", "cpu")
    assert (choice.dtype, choice.reason, choice.auto) == (dtype, reason, True)
    assert choice.describe() == f"dtype auto -> {dtype} ({reason})"


@pytest.mark.parametrize("major, expected", [(9, "bf16"), (8, "bf16"), (7, "fp16"), (6, "fp16")])
def test_dtype_auto_on_a_gpu_is_bf16_where_native_else_fp16(monkeypatch: pytest.MonkeyPatch, major, expected):
    """Compute capability 8.0 and later compute bf16 natively; a V100 (7.0) or T4 (7.5) gets
    fp16 even though ``torch.cuda.is_bf16_supported()`` answers True there (emulated bf16)."""
    import types

    import torch

    from aiayn.runtime.precision import auto_inference_dtype

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(major=major))
    assert auto_inference_dtype("cuda:0").dtype == expected


def test_an_explicit_dtype_skips_auto_and_the_environment_pins_auto(monkeypatch: pytest.MonkeyPatch):
    from aiayn.errors import ConfigError
    from aiayn.runtime.precision import DTYPE_ENV, resolve_inference_dtype

    _flags(monkeypatch, "avx512_vnni", "avx512_bf16")
    monkeypatch.setenv(DTYPE_ENV, "bf16")
    for name in ("fp32", "bf16", "fp16", "int8"):
        assert resolve_inference_dtype(name, "cpu") == resolve_inference_dtype(name, "cuda")
        assert resolve_inference_dtype(name, "cpu").describe() == f"dtype {name}"
    assert resolve_inference_dtype("auto", "cpu").describe() == "dtype auto -> bf16 ($AIAYN_DTYPE)"
    monkeypatch.setenv(DTYPE_ENV, "auto")
    assert resolve_inference_dtype("auto", "cpu").dtype == "int8"
    monkeypatch.setenv(DTYPE_ENV, "float8")
    with pytest.raises(ConfigError, match="AIAYN_DTYPE='float8': choose from auto, fp32"):
        resolve_inference_dtype("auto", "cpu")
    with pytest.raises(ConfigError, match="--dtype fp64: choose from auto, fp32"):
        resolve_inference_dtype("fp64", "cpu")


def test_cpu_flags_read_cpuinfo_once(monkeypatch: pytest.MonkeyPatch, tmp_path):
    from aiayn.runtime import cpu

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx_vnni\nbugs\t: none\n"
                       "processor\t: 1\nflags\t\t: fpu amx_int8\n")
    monkeypatch.setattr(cpu, "CPUINFO", cpuinfo)
    cpu.cpu_flags.cache_clear()
    try:
        flags = cpu.cpu_flags()
        assert {"fpu", "sse2", "avx2", "avx_vnni"} <= flags and "amx_int8" not in flags  # the first CPU's line
        cpuinfo.write_text("flags\t\t: amx_int8\n")
        assert cpu.cpu_flags() is flags  # read once per process
        monkeypatch.setattr(cpu, "CPUINFO", tmp_path / "missing")
        cpu.cpu_flags.cache_clear()
        assert cpu.cpu_flags() <= set(cpu._TORCH_CPU_PROBES)  # elsewhere: torch's probes alone
    finally:
        cpu.cpu_flags.cache_clear()


def test_on_a_passing_thread_returns_the_result_from_a_thread_that_has_ended():
    import threading

    from aiayn.runtime.process import on_a_passing_thread

    seen = []
    assert on_a_passing_thread(lambda: seen.append(threading.current_thread()) or 42) == 42
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()


def test_on_a_passing_thread_raises_the_work_s_exception_here():
    from aiayn.errors import CheckpointError
    from aiayn.runtime.process import on_a_passing_thread

    error = CheckpointError("ck: not a checkpoint")

    def fail():
        raise error

    with pytest.raises(CheckpointError) as caught:
        on_a_passing_thread(fail)
    assert caught.value is error


EXIT_NOW = """
import atexit, logging, sys
from aiayn.runtime.process import exit_now
logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
atexit.register(lambda: print("teardown ran"))
print("the output", end="")
logging.getLogger("x").info("a log line")
exit_now(3)
"""


def test_exit_now_flushes_the_outputs_and_skips_the_teardown():
    proc = subprocess.run([sys.executable, "-c", EXIT_NOW], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "the output", "a log line\n")


@pytest.mark.parametrize("argv, exits_at_once", [(None, True), (["translate", "--checkpoint", "x"], False)])
def test_one_shot_commands_exit_at_once_only_from_the_process_command_line(monkeypatch: pytest.MonkeyPatch,
                                                                          argv, exits_at_once):
    from aiayn.cli import main as cli

    ended = []
    monkeypatch.setattr(sys, "argv", ["aiayn", "translate", "--checkpoint", "x"])
    monkeypatch.setattr(cli, "set_threads", lambda n: n)
    monkeypatch.setattr(cli, "exit_now", lambda code: (ended.append(code), sys.exit(code)))
    parser = cli.build_parser()
    real = parser.parse_args

    def parse_args(args):
        parsed = real(args)
        parsed.func = lambda a: 0
        return parsed

    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(parser, "parse_args", parse_args)
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 0 and ended == ([0] if exits_at_once else [])


# This machine kind's flags (an AMX CPU) narrowed by $ONEDNN_MAX_CPU_ISA to each kind it emulates.
AMX_CPU = frozenset({"fma", "avx", "f16c", "avx2", "avx512f", "avx512bw", "avx512vl", "avx_vnni", "avx512_vnni",
                     "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"})
NARROWED_CASES = [
    ("", AMX_CPU),
    ("AVX512_CORE_AMX", AMX_CPU),
    ("avx512_core_bf16", AMX_CPU - {"avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"}),
    ("AVX512_CORE_VNNI", {"fma", "avx", "f16c", "avx2", "avx512f", "avx512bw", "avx512vl", "avx_vnni",
                          "avx512_vnni"}),
    ("AVX512_CORE", {"fma", "avx", "f16c", "avx2", "avx512f", "avx512bw", "avx512vl"}),
    ("AVX2_VNNI", {"fma", "avx", "f16c", "avx2", "avx_vnni"}),
    ("AVX2", {"fma", "avx", "f16c", "avx2"}),
    ("AVX", {"avx", "f16c"}),
    ("SSE41", {"sse4_1"} & AMX_CPU),
    ("NOT_AN_ISA", AMX_CPU),
]


@pytest.mark.parametrize("isa, expected", NARROWED_CASES)
def test_onednn_isa_narrows_the_flags_the_precision_choices_read(isa: str, expected: set[str]):
    from aiayn.runtime.cpu import narrowed_flags

    assert narrowed_flags(AMX_CPU, isa) == frozenset(expected)


@pytest.mark.parametrize("isa, dtype, reason", [
    ("", "int8", "AMX"), ("AVX512_CORE_BF16", "int8", "AVX-512 VNNI"), ("AVX512_CORE_VNNI", "int8", "AVX-512 VNNI"),
    ("AVX2_VNNI", "int8", "AVX-VNNI"), ("AVX2", "int8", "fbgemm's int8 kernel"),
    ("AVX", "fp32", "no VNNI or bf16 units")])
def test_an_emulated_cpu_kind_gets_that_kind_s_dtype(monkeypatch: pytest.MonkeyPatch, tmp_path, isa, dtype, reason):
    """cpu_flags() applies $ONEDNN_MAX_CPU_ISA as it reads the CPU: the choice is the kind's."""
    from aiayn.runtime import cpu
    from aiayn.runtime.precision import DTYPE_ENV, resolve_inference_dtype

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: " + " ".join(sorted(AMX_CPU)) + "\n")
    monkeypatch.setattr(cpu, "CPUINFO", cpuinfo)
    monkeypatch.setattr(cpu, "_TORCH_CPU_PROBES", {})
    monkeypatch.setenv(cpu.ONEDNN_ISA_ENV, isa)
    monkeypatch.delenv(DTYPE_ENV, raising=False)
    cpu.cpu_flags.cache_clear()
    try:
        choice = resolve_inference_dtype("auto", "cpu")
    finally:
        cpu.cpu_flags.cache_clear()
    assert (choice.dtype, choice.reason) == (dtype, reason)


@pytest.mark.parametrize("flags, kind", [
    (AMX_CPU, "AMX"), (AMX_CPU - {"amx_tile", "amx_int8", "amx_bf16"}, "AVX-512 BF16"),
    ({"avx2", "avx512f", "avx512_vnni"}, "AVX-512 VNNI"), ({"avx2", "avx_vnni"}, "AVX-VNNI"),
    ({"avx2", "avx512f"}, "AVX-512"), ({"avx2", "fma"}, "AVX2"), ({"sse4_2"}, "other")])
def test_cpu_kind_names_the_results_page_s_tables(monkeypatch: pytest.MonkeyPatch, flags, kind):
    from aiayn.runtime.cpu import ISA_NARROWING_ENV, cpu_kind

    for name in ISA_NARROWING_ENV:
        monkeypatch.delenv(name, raising=False)
    assert cpu_kind(frozenset(flags)) == kind
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("CT2_FORCE_CPU_ISA", "AVX2")
    assert cpu_kind(frozenset(flags)) == f"{kind} (emulated: ONEDNN_MAX_CPU_ISA=AVX2 CT2_FORCE_CPU_ISA=AVX2)"
