"""`aiayn translate`: one output line per input line, whatever the input holds."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

TRICKY = (
    b"a man is riding a bike\n"
    b"\n"
    + b" ".join([b"riding"] * 400) + b"\n"  # longer than the model's 64 positions
    + b"a dog \xff\xfe on the street\n"  # invalid UTF-8
    + b"windows line\r\n"
    + b"   \n"
    + "a cat\u2028with odd line breaks\x0c\x1c\x85 inside".encode() + b"\n"
    + b"no final newline"
)
N_TRICKY = 8
# TRICKY's lines as `aiayn translate` reads them (--on-invalid-utf8 replace): the CR of a
# CRLF dropped, each invalid byte a U+FFFD, Unicode line separators kept inside the line.
TRICKY_TEXTS = [
    "a man is riding a bike",
    "",
    " ".join(["riding"] * 400),
    "a dog \ufffd\ufffd on the street",
    "windows line",
    "   ",
    "a cat\u2028with odd line breaks\x0c\x1c\x85 inside",
    "no final newline",
]


def api_translations(checkpoint: Path, texts: list[str], dtype: str = "fp32", **overrides) -> list[str]:
    """What the Python API gives for ``texts`` (the reference the CLI's lines must equal)."""
    from aiayn.inference.translator import Translator

    return Translator.from_checkpoint(checkpoint, dtype=dtype).translate(texts, **overrides)


def _lines(out: bytes) -> list[str]:
    text = out.decode("utf-8")
    assert text == "" or text.endswith("\n")
    return text.split("\n")[:-1]


@pytest.fixture
def tricky_file(tmp_path: Path) -> Path:
    path = tmp_path / "in.txt"
    path.write_bytes(TRICKY)
    return path


def test_line_count_preserved_with_empty_long_and_invalid_lines(tiny_checkpoint, tricky_file, run_cli) -> None:
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(tricky_file),
                              "--on-invalid-utf8", "replace", "--truncate", "--max-len-b", "3"])
    assert code == 0, err
    lines = _lines(out)
    assert lines == api_translations(tiny_checkpoint, TRICKY_TEXTS, max_len_b=3)
    assert lines[1] == "" and lines[5] == ""
    assert all(line for i, line in enumerate(lines) if i not in (1, 5))
    assert "translated 8 lines" in err


def test_a_line_over_the_positions_is_an_error_without_truncate(tiny_checkpoint, tricky_file, run_cli) -> None:
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(tricky_file),
                              "--on-invalid-utf8", "replace"])
    assert code == 2 and out == b""
    assert f"{tricky_file}:3: 401 source tokens (with EOS); the model has 64 positions" in err


def test_invalid_utf8_is_an_error_naming_the_line(tiny_checkpoint, tricky_file, run_cli) -> None:
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(tricky_file)])
    assert code == 2
    assert f"{tricky_file}:4: invalid UTF-8" in err
    assert out == b""  # a file is checked whole before anything is translated
    assert "Traceback" not in err


def test_stdin_streaming_equals_file(tiny_checkpoint, tricky_file, run_cli) -> None:
    args = ["translate", "--checkpoint", str(tiny_checkpoint), "--on-invalid-utf8", "replace", "--truncate",
            "--max-len-b", "3", "--quiet"]
    _, from_file, _ = run_cli(args + ["--input", str(tricky_file)])
    for size in ("1", "3", "100"):
        code, from_stdin, err = run_cli(args + ["--buffer-size", size], stdin=TRICKY)
        assert code == 0, err
        assert from_stdin == from_file


def test_stdin_invalid_utf8_delivers_earlier_lines_then_fails(tiny_checkpoint, run_cli) -> None:
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "--buffer-size", "10",
                              "--max-len-b", "2", "--truncate"], stdin=TRICKY)
    assert code == 2
    assert "<stdin>:4: invalid UTF-8" in err
    assert _lines(out) == api_translations(tiny_checkpoint, TRICKY_TEXTS[:3], max_len_b=2)


def test_nbest_formats(tiny_checkpoint, tricky_file, run_cli, tmp_path: Path) -> None:
    base = ["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(tricky_file), "--quiet",
            "--on-invalid-utf8", "replace", "--truncate", "--max-len-b", "3", "--nbest", "3"]
    from aiayn.inference.translator import Translator

    expected = Translator.from_checkpoint(tiny_checkpoint).translate_detailed(TRICKY_TEXTS, nbest=3, max_len_b=3)
    code, out, err = run_cli(base + ["--scores"])
    assert code == 0, err
    lines = _lines(out)
    assert len(lines) == N_TRICKY
    for line, result in zip(lines, expected):
        # TEXT<TAB>SCORE three times, the scores to 4 decimals; "" for a missing hypothesis.
        hyps = result.hypotheses
        fields = [x for h in hyps for x in (h.text, f"{h.score:.4f}")] + ["", ""] * (3 - len(hyps))
        assert line.split("\t") == fields
    assert [len(r.hypotheses) for r in expected] == [3, 1, 3, 3, 3, 1, 3, 3]  # empty lines: one ""
    out_file = tmp_path / "out.jsonl"
    code, out, err = run_cli(base + ["--format", "jsonl", "--output", str(out_file)])
    assert code == 0 and out == b""
    records = [json.loads(line) for line in out_file.read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in records] == list(range(1, N_TRICKY + 1))
    for record, result in zip(records, expected):
        hyps = result.hypotheses
        assert [(h["text"], h["tokens"]) for h in record["hypotheses"]] == [(h.text, h.tokens) for h in hyps]
        assert [h["score"] for h in record["hypotheses"]] == pytest.approx([h.score for h in hyps], abs=1e-5)


def test_bad_options_fail_before_output(tiny_checkpoint, tricky_file, run_cli) -> None:
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(tricky_file),
                              "--on-invalid-utf8", "replace", "--truncate", "--nbest", "5"])
    assert code == 2 and out == b"" and "nbest" in err
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "--input", "/nonexistent"])
    assert code == 2 and "/nonexistent" in err
    code, out, err = run_cli(["translate", "--checkpoint", "/nonexistent/ckpt", "--input", str(tricky_file)])
    assert code == 2 and "Traceback" not in err


def test_empty_input(tiny_checkpoint, tmp_path: Path, run_cli) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    code, out, _ = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(empty)])
    assert code == 0 and out == b""
    code, out, _ = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "--quiet"], stdin=b"\n\n")
    assert code == 0 and out == b"\n\n"


def test_real_process_streams_stdin(tiny_checkpoint) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "aiayn", "translate", "--checkpoint", str(tiny_checkpoint), "--max-len-b", "2",
         "--buffer-size", "2", "--on-invalid-utf8", "replace", "--truncate"],
        input=TRICKY, capture_output=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    assert _lines(proc.stdout) == api_translations(tiny_checkpoint, TRICKY_TEXTS, max_len_b=2)


def test_int8_translation(tiny_checkpoint, tricky_file, run_cli) -> None:
    args = ["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(tricky_file),
            "--on-invalid-utf8", "replace", "--truncate"]
    code, out, err = run_cli([*args, "--dtype", "int8"])
    assert code == 0, err
    assert _lines(out) == api_translations(tiny_checkpoint, TRICKY_TEXTS, dtype="int8")
    code, out, err = run_cli([*args, "--dtype", "int8", "--device", "cuda"])
    assert code == 2 and out == b"" and "Traceback" not in err


@pytest.mark.timeout(600)  # torch.compile builds C++ kernels with g++
def test_compiled_translation_equals_the_eager_one(tiny_checkpoint, tricky_file, run_cli) -> None:
    args = ["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(tricky_file),
            "--on-invalid-utf8", "replace", "--truncate"]
    code, out, err = run_cli([*args, "--compile"])
    assert code == 0, err
    assert _lines(out) == api_translations(tiny_checkpoint, TRICKY_TEXTS)


def _subcommand(parser: argparse.ArgumentParser, *names: str) -> argparse.ArgumentParser:
    for name in names:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def test_decoding_flags_are_generated_from_decode_config() -> None:
    """Every DecodeConfig field is a flag of translate and evaluate unless it is marked
    config-only, typed as the field; a flag left out is None (the checkpoint's value), a
    per-call argument (--nbest) has the field's default."""
    from aiayn.cli.main import build_parser
    from aiayn.cli.options import decode_overrides
    from aiayn.config import DecodeConfig, decode_options

    hints = typing.get_type_hints(DecodeConfig)
    parser = build_parser()
    for command in ("translate", "evaluate"):
        actions = {a.dest: a for a in _subcommand(parser, command)._actions}
        for f, opt in decode_options():
            assert (f.name in actions) == opt.cli, f"{command}: decode.{f.name}"
        base = [command, "--checkpoint", "ckpt"]
        unset = parser.parse_args(base)
        assert {f.name: getattr(unset, f.name) for f, _ in decode_options()} == {
            f.name: f.default if opt.argument else None for f, opt in decode_options()}
        assert decode_overrides(unset) == {}
        argv, given = list(base), {}
        for f, opt in decode_options():
            flag = "--" + f.name.replace("_", "-")
            if hints[f.name] is bool:
                argv.append(flag)
                given[f.name] = True
                continue
            value = opt.choices[-1] if opt.choices else ("fr" if hints[f.name] is str else f.default + 3)
            argv += [flag, str(value)]
            given[f.name] = value
        args = parser.parse_args(argv)
        assert {n: getattr(args, n) for n in given} == given
        assert all(type(getattr(args, n)) is hints[n] for n in given)
        assert decode_overrides(args) == {n: v for n, v in given.items() if n != "nbest"}


def test_subcommands_with_some_decoding_flags() -> None:
    from aiayn.cli.main import build_parser
    from aiayn.cli.options import decode_overrides

    parser = build_parser()
    args = parser.parse_args(["parse", "--checkpoint", "c", "--input", "x", "--beam", "3", "--max-len-b", "9"])
    assert decode_overrides(args) == {"beam": 3, "max_len_b": 9}
    assert args.device == "cpu" and args.dtype == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["parse", "--checkpoint", "c", "--top-k", "3"])  # not a parsing option
    args = parser.parse_args(["plot", "attention", "--checkpoint", "c", "--text", "t", "--beam", "2"])
    assert decode_overrides(args) == {"beam": 2}
    args = parser.parse_args(["serve", "--checkpoint", "c", "--device", "auto"])
    assert args.checkpoint == "c" and args.ctranslate2 is None and not hasattr(args, "beam")


def test_bad_device_is_one_clear_line(tiny_checkpoint, tricky_file, run_cli) -> None:
    code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "-i", str(tricky_file),
                              "--device", "gpu7"])
    assert code != 0 and out == b""
    assert "--device gpu7: not a device" in err and "Traceback" not in err
