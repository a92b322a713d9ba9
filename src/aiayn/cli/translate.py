"""`aiayn translate`: translate a file or stdin with a checkpoint, one output line per input line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from aiayn.config import INFERENCE_DTYPES
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


def add_decode_args(p: argparse.ArgumentParser) -> None:
    """Decoding options shared with `aiayn evaluate`; unset ones keep the checkpoint's."""
    g = p.add_argument_group("decoding (default: the checkpoint's decode section; paper: beam 4, "
                             "lenpen 0.6, max length = 1 * source + 50)")
    g.add_argument("--beam", type=int, default=None, help="beam size; 1 = greedy")
    g.add_argument("--lenpen", type=float, default=None, help="length-penalty alpha")
    g.add_argument("--lenpen-style", choices=("gnmt", "fairseq"), default=None,
                   help="gnmt: ((5+|Y|)/6)^alpha (the paper); fairseq: |Y|^alpha")
    g.add_argument("--max-len-a", type=float, default=None, help="max output tokens = a * source tokens + b")
    g.add_argument("--max-len-b", type=int, default=None, help="see --max-len-a")
    g.add_argument("--min-len", type=int, default=None, help="output tokens before EOS is allowed")
    g.add_argument("--nbest", type=int, default=1, help="hypotheses per sentence (<= beam; default 1)")
    g.add_argument("--no-repeat-ngram-size", type=int, default=None, help="forbid repeating n-grams of this size")
    g.add_argument("--batch-tokens", type=int, default=None, help="padded source tokens per batch")
    g.add_argument("--sampling", action="store_true", default=None,
                   help="sample instead of searching: --beam K independent samples, the --nbest best returned")
    g.add_argument("--temperature", type=float, default=None, help="sampling temperature")
    g.add_argument("--top-k", type=int, default=None, help="sample among the k most probable tokens (0 = all)")
    g.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold (1 = off)")
    g.add_argument("--seed", type=int, default=None, help="sampling seed")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto (default cpu)")
    p.add_argument("--dtype", default="fp32", choices=INFERENCE_DTYPES,
                   help="fp32, bf16 (CPU or GPU), fp16 (GPU only) or int8 (CPU only: int8 weights and "
                        "per-token int8 inputs for every linear layer); default fp32")


DECODE_FIELDS = ("beam", "lenpen", "lenpen_style", "max_len_a", "max_len_b", "min_len",
                 "no_repeat_ngram_size", "batch_tokens", "sampling", "temperature", "top_k", "top_p", "seed")


def decode_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in DECODE_FIELDS if getattr(args, name) is not None}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "translate", help="translate text with a checkpoint (beam search)",
        description="Translate a file or standard input with a trained checkpoint. Several "
                    "--checkpoint paths are averaged (element-wise mean of their weights).",
        epilog=FORMAT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, nargs="+", metavar="PATH",
                   help="checkpoint directory, run directory (its last checkpoint) or last/best pointer")
    p.add_argument("--input", "-i", default="-", help="input file (plain or .gz), or - for stdin (default)")
    p.add_argument("--output", "-o", default="-", help="output file, or - for stdout (default)")
    add_decode_args(p)
    p.add_argument("--format", choices=("text", "jsonl"), default="text", help="see 'output format' below")
    p.add_argument("--scores", action="store_true", help="text format: a score after each translation")
    p.add_argument("--buffer-size", type=int, default=None,
                   help="stdin: lines per buffer (default 1 from a terminal, 64 from a pipe)")
    p.add_argument("--on-invalid-utf8", choices=("error", "replace"), default="error",
                   help="invalid UTF-8 input: an error naming the line (default), or replace with U+FFFD")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary on stderr")
    p.set_defaults(func=run)


# --------------------------------------------------------------------------- input


def decode_line(raw: bytes, where: str, lineno: int, on_invalid_utf8: str) -> str:
    """One input line (bytes, without its newline) -> text; CR of CRLF files dropped."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if on_invalid_utf8 == "replace":
            return raw.decode("utf-8", errors="replace")
        raise DataError(f"{where}:{lineno}: invalid UTF-8 at byte {exc.start} of the line ({exc.reason}); "
                        "use --on-invalid-utf8 replace to translate it with U+FFFD in place of the bad bytes"
                        ) from None


def iter_raw_lines(stream: IO[bytes]) -> Iterator[bytes]:
    """Lines split at b'\\n' only (never at other Unicode line breaks, which would change the
    line count); the last line may lack its newline."""
    first = True
    while True:
        raw = stream.readline()
        if not raw:
            return
        if first and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        first = False
        yield raw[:-1] if raw.endswith(b"\n") else raw


def read_file_lines(path: Path, on_invalid_utf8: str) -> list[str]:
    import gzip

    if not path.is_file():
        raise DataError(f"{path}: file not found" if not path.exists() else f"{path}: not a file")
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            return [decode_line(raw, str(path), n, on_invalid_utf8)
                    for n, raw in enumerate(iter_raw_lines(f), 1)]  # type: ignore[arg-type]
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None


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
    def __init__(self, target: str) -> None:
        if target == "-":
            self.f: IO[bytes] = sys.stdout.buffer
            self.close_it = False
        else:
            path = Path(target)
            if path.parent and not path.parent.exists():
                raise AiaynError(f"--output {target}: directory {path.parent} does not exist")
            self.f = open(path, "wb")
            self.close_it = True

    def write(self, lines: list[str]) -> None:
        if lines:
            self.f.write(("\n".join(lines) + "\n").encode("utf-8"))
            self.f.flush()

    def close(self) -> None:
        if self.close_it:
            self.f.close()


# ----------------------------------------------------------------------------- run


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from aiayn.inference.translator import Translator

    if args.buffer_size is not None and args.buffer_size < 1:
        raise AiaynError(f"--buffer-size: must be at least 1, got {args.buffer_size}")
    overrides = decode_overrides(args)
    from_stdin = args.input == "-"
    lines = None if from_stdin else read_file_lines(Path(args.input), args.on_invalid_utf8)
    translator = Translator.from_checkpoint(args.checkpoint, device=args.device, dtype=args.dtype)
    cfg = translator.decode_config(**overrides, nbest=args.nbest)  # fail on bad options before any output
    writer = _Writer(args.output)
    start = time.perf_counter()
    done = 0

    def translate(chunk: list[str], first_lineno: int, bar: Any = None) -> None:
        nonlocal done
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
    finally:
        writer.close()
    if not args.quiet:
        elapsed = time.perf_counter() - start
        print(f"translated {done} lines in {elapsed:.1f}s ({done / max(elapsed, 1e-9):.1f} lines/s)",
              file=sys.stderr)
    return 0
