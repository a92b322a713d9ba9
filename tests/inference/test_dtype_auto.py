"""`--dtype auto`, the default of the commands and of ``from_checkpoint``: the precision the
CPU's flags call for, said in one line on stderr; an explicit ``--dtype`` skips it."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.runtime.precision import DTYPE_ENV

# A CPU with bf16 units, under a torch without oneDNN's int8 kernel: auto -> bf16, which runs
# on every CPU (emulated where there are no bf16 units), so these tests run anywhere.
BF16_CPU = frozenset({"avx2", "avx512f", "avx512_bf16"})
LINE = "dtype auto -> bf16 (AVX-512 BF16)"


@pytest.fixture
def bf16_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Auto as it chooses on a machine with ``BF16_CPU``'s flags, no precision pinned."""
    from aiayn.runtime import cpu

    monkeypatch.delenv(DTYPE_ENV, raising=False)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: BF16_CPU)
    monkeypatch.setattr(cpu, "onednn_int8", lambda: False)


def test_from_checkpoint_defaults_to_auto(tiny_checkpoint: Path, english: list[str], bf16_cpu) -> None:
    from aiayn.inference.translator import Translator

    auto = Translator.from_checkpoint(tiny_checkpoint)
    assert (auto.dtype, auto.dtype_choice.reason) == ("bf16", "AVX-512 BF16")
    assert auto.translate(english) == Translator.from_checkpoint(tiny_checkpoint, dtype="bf16").translate(english)
    assert Translator.from_checkpoint(tiny_checkpoint, dtype="fp32").dtype == "fp32"


def test_translate_says_what_auto_chose(tiny_checkpoint: Path, english: list[str], run_cli, tmp_path: Path,
                                        bf16_cpu) -> None:
    from aiayn.inference.translator import Translator

    src = tmp_path / "in.txt"
    src.write_text("".join(line + "\n" for line in english), encoding="utf-8")
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "-i", str(src)])
    assert code == 0
    assert err.splitlines()[0] == LINE and err.count("dtype auto") == 1
    bf16 = Translator.from_checkpoint(tiny_checkpoint, dtype="bf16").translate(english)
    assert out.decode("utf-8").splitlines() == bf16
    # An explicit --dtype is taken as it is, without the line; --quiet keeps stderr empty.
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "-i", str(src), "--dtype", "fp32"])
    assert code == 0 and "dtype" not in err
    assert out.decode("utf-8").splitlines() == Translator.from_checkpoint(tiny_checkpoint, dtype="fp32").translate(
        english)
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "-i", str(src), "--quiet"])
    assert code == 0 and err == ""


@pytest.mark.parametrize("command", ["translate", "evaluate", "parse", "serve", "plot attention", "tune-decoding"])
def test_every_inference_command_defaults_to_auto(command: str) -> None:
    from aiayn.cli.main import build_parser

    subs = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    parser = subs[command.split()[0]]
    if " " in command:
        parser = parser._subparsers._group_actions[0].choices[command.split()[1]]  # type: ignore[union-attr]
    dtype = next(a for a in parser._actions if a.dest == "dtype")
    assert dtype.default == "auto" and list(dtype.choices) == ["auto", "fp32", "bf16", "fp16", "int8"]


def test_the_pinned_precision_is_said_too(tiny_checkpoint: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DTYPE_ENV, "int8")
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint)], stdin=b"a man\n")
    assert code == 0 and err.splitlines()[0] == "dtype auto -> int8 ($AIAYN_DTYPE)"
    monkeypatch.setenv(DTYPE_ENV, "fp64")
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint)], stdin=b"a man\n")
    assert code == 2 and "AIAYN_DTYPE='fp64': choose from auto, fp32, bf16, fp16, int8" in err


def test_an_error_stays_the_only_line(tiny_checkpoint: Path, run_cli, tmp_path: Path, bf16_cpu) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a man\n\xff\n")
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "-i", str(bad)])
    assert code == 2 and out == b"" and len(err.strip().splitlines()) == 1 and ":2:" in err
