"""`aiayn translate`: translate a file or stdin with a checkpoint, one output line per input line."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from aiayn import fileio
from aiayn.cli import options
from aiayn.errors import AiaynError, DataError

FORMAT_HELP = """\
output format
  Exactly one output line per input line, in input order; an empty input line gives an
  empty output line.
  --format text (default)
      --nbest 1: the translation.
      --nbest N: the N best translations on the line, best first, separated by TABs (always
      N fields; a sentence with fewer hypotheses gets empty fields).
      --scores: each translation is followed by a TAB and its score
      (log-probability / length penalty), e.g. "hyp1<TAB>score1<TAB>hyp2<TAB>score2".
  --format jsonl
      one JSON object per line: {"line": 1, "hypotheses": [{"text": ..., "score": ...,
      "tokens": [...]}, ...]} (best first; an empty input line has one empty hypothesis).

input
  A file (plain or .gz) is read whole first, so invalid UTF-8 anywhere is reported before
  any work; a progress bar goes to stderr. Standard input ("-") is streamed: lines are
  collected into buffers of --buffer-size lines (default: 1 from a terminal, 64 from a
  pipe), each buffer is translated as batches and written at once (like
  fairseq-interactive). Use --buffer-size 1 to drive it line by line from another program.
  Invalid UTF-8 is an error naming the line, unless --on-invalid-utf8 replace (U+FFFD).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "translate", help="translate text with a checkpoint (beam search)",
        description="Translate a file or standard input with a trained checkpoint. Several "
                    "--checkpoint paths are averaged (element-wise mean of their weights).",
        epilog=FORMAT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_checkpoint(p)
    p.add_argument("--input", "-i", default="-", help="input file (plain or .gz), or - for stdin (default)")
    p.add_argument("--output", "-o", default="-", help="output file, or - for stdout (default)")
    options.add_decode_flags(p)
    options.add_device_flags(p)
    p.add_argument("--format", choices=("text", "jsonl"), default="text", help="see 'output format' below")
    p.add_argument("--scores", action="store_true", help="text format: a score after each translation")
    p.add_argument("--truncate", action="store_true",
                   help="cut a line longer than the model's source positions (with a warning naming it); "
                        "by default such a line is an error")
    p.add_argument("--buffer-size", type=int, default=None,
                   help="stdin: lines per buffer (default 1 from a terminal, 64 from a pipe)")
    options.add_on_invalid_utf8(p)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary on stderr")
    p.set_defaults(func=run)


# --------------------------------------------------------------------------- input


def decode_line(raw: bytes, where: str, lineno: int, on_invalid_utf8: str) -> str:
    """One input line (bytes, without its newline) -> text; CR of CRLF files dropped."""
    text = fileio.decode_line(raw[:-1] if raw.endswith(b"\r") else raw, where, lineno,
                              _utf8_mode(on_invalid_utf8), hint=_UTF8_HINT)
    assert text is not None  # None only under "skip"
    return text


_UTF8_HINT = "use --on-invalid-utf8 replace to translate it with U+FFFD in place of the bad bytes"


def _utf8_mode(on_invalid_utf8: str) -> str:
    return "replace" if on_invalid_utf8 == "replace" else "error"


def iter_raw_lines(stream: IO[bytes]) -> Iterator[bytes]:
    """Lines split at b'\\n' only (never at other Unicode line breaks, which would change the
    line count); the last line may lack its newline."""
    return fileio.iter_raw_lines(stream, "<stdin>")


def read_file_lines(path: Path, on_invalid_utf8: str) -> list[str]:
    """Every line of a file (plain or gzip), read before any work, so that invalid UTF-8
    anywhere is reported first."""
    lines = fileio.read_text_lines(path, _utf8_mode(on_invalid_utf8), strip="eol", hint=_UTF8_HINT)
    return [line for line in lines if line is not None]  # None only under "skip"


def check_lengths(translator: Any, chunk: list[str], first_lineno: int, where: str) -> None:
    """Refuse a line the model cannot read whole: cutting it would be a silent loss."""
    limit = translator.max_src_len
    if limit is None:
        return
    for k, n in enumerate(translator.source_lengths(chunk)):
        if n > limit:
            raise DataError(f"{where}:{first_lineno + k}: {n} source tokens (with EOS); the model has {limit} "
                            "positions: split the line, or use --truncate to cut it")


# -------------------------------------------------------------------------- output


def _clean(text: str, tabs: bool) -> str:
    # A translation must stay on its line (and in its TSV field).
    text = text.replace("\r", " ").replace("\n", " ")
    return text.replace("\t", " ") if tabs else text


def format_result(result: Any, lineno: int, nbest: int, fmt: str, scores: bool) -> str:
    hyps = list(result.hypotheses)
    if fmt == "jsonl":
        return json.dumps({"line": lineno, "hypotheses": [
            {"text": _clean(h.text, False), "score": h.score, "tokens": h.tokens} for h in hyps]},
            ensure_ascii=False)
    fields = []
    for k in range(nbest):
        h = hyps[k] if k < len(hyps) else None
        fields.append(_clean(h.text, True) if h is not None else "")
        if scores:
            fields.append(f"{h.score:.4f}" if h is not None else "")
    return "\t".join(fields)


class _Writer:
    """Standard output, streamed line by line; or a file, written under a temporary name and
    renamed into place only when every line is translated (a failed or interrupted run
    leaves the file as it was)."""

    def __init__(self, target: str, inputs: list[str]) -> None:
        self._stack = contextlib.ExitStack()
        if target == "-":
            self.f: IO[bytes] = sys.stdout.buffer
        else:
            path = fileio.check_output_file(target, [i for i in inputs if i != "-"], "--output")
            self.f = self._stack.enter_context(fileio.atomic_file(path, "wb", durable=False))

    def write(self, lines: list[str]) -> None:
        if lines:
            self.f.write(("\n".join(lines) + "\n").encode("utf-8"))
            self.f.flush()

    def close(self, ok: bool) -> None:
        """Put the file in place (``ok``) or drop it."""
        if ok:
            self._stack.close()
        else:
            self._stack.__exit__(RuntimeError, RuntimeError("translation failed"), None)


# ----------------------------------------------------------------------------- run


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from aiayn.inference.translator import Translator

    if args.buffer_size is not None and args.buffer_size < 1:
        raise AiaynError(f"--buffer-size: must be at least 1, got {args.buffer_size}")
    overrides = options.decode_overrides(args)
    device = options.device(args)
    from_stdin = args.input == "-"
    lines = None if from_stdin else read_file_lines(Path(args.input), args.on_invalid_utf8)
    translator = Translator.from_checkpoint(args.checkpoint, device=device, dtype=args.dtype)
    cfg = translator.decode_config(**overrides, nbest=args.nbest)  # fail on bad options before any output
    writer = _Writer(args.output, [args.input])
    start = time.perf_counter()
    done = 0

    def translate(chunk: list[str], first_lineno: int, bar: Any = None) -> None:
        nonlocal done
        if not args.truncate:
            check_lengths(translator, chunk, first_lineno, "<stdin>" if from_stdin else args.input)
        results = translator.translate_detailed(chunk, nbest=args.nbest, progress=bar.update if bar else None,
                                                **overrides)
        writer.write([format_result(r, first_lineno + k, cfg.nbest, args.format, args.scores)
                      for k, r in enumerate(results)])
        done += len(chunk)

    try:
        if lines is not None:
            with tqdm(total=len(lines), unit="sent", file=sys.stderr, disable=args.quiet,
                      desc="translate", dynamic_ncols=True) as bar:
                translate(lines, 1, bar)
        else:
            size = args.buffer_size or (1 if sys.stdin.isatty() else 64)
            buffer: list[str] = []
            first = 1
            try:
                for n, raw in enumerate(iter_raw_lines(sys.stdin.buffer), 1):
                    buffer.append(decode_line(raw, "<stdin>", n, args.on_invalid_utf8))
                    if len(buffer) >= size:
                        translate(buffer, first)
                        first, buffer = n + 1, []
            except DataError:
                translate(buffer, first)  # everything before the bad line is still delivered
                raise
            if buffer:
                translate(buffer, first)
    except BaseException:
        writer.close(ok=False)
        raise
    writer.close(ok=True)
    if not args.quiet:
        elapsed = time.perf_counter() - start
        print(f"translated {done} lines in {elapsed:.1f}s ({done / max(elapsed, 1e-9):.1f} lines/s)",
              file=sys.stderr)
    return 0
