"""`aiayn translate`: translate a file or stdin with a checkpoint, one output line per input line."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiayn import fileio
from aiayn.cli import options, translate_constraints, translate_io
from aiayn.errors import AiaynError, DataError, EnvironmentFailure

DEFAULT_CHUNK_SIZE = 10_000

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
      --alignment: each translation (and its score) is followed by a TAB and its word
      alignment, e.g. "hyp1<TAB>0-0 1-2 2-1" (see 'alignment').
  --format jsonl
      one JSON object per line: {"line": 1, "hypotheses": [{"text": ..., "score": ...,
      "tokens": [...]}, ...]} (best first; an empty input line has one empty hypothesis);
      with --alignment each hypothesis also has "alignment": [[src, tgt], ...].

alignment (--alignment)
  Hard word alignments as fast_align, Moses and Marian write them: "i-j" pairs, source word
  i aligned to target word j, 0-based, sorted by i then j, separated by spaces. From the
  cross-attention of the last decoder layer averaged over its heads (fairseq's
  --print-alignment): each target piece (EOS excluded) is aligned to the source piece it
  attends to most (EOS excluded); both are mapped to the whitespace-separated words that
  contain them (the target words of the output line; the source words of the input line,
  as SentencePiece splits it); duplicate pairs are written once. An empty line or
  translation has an empty alignment. Slower than without, and it computes attention with
  the explicit softmax formula, so in a rare near-tie a translation can differ from one made
  without --alignment.

input and output
  The input is read --chunk-size lines at a time; each chunk is translated as batches
  (sentences sorted by length within the chunk) and its lines are written, in input order,
  before the next chunk is read: memory holds one chunk whatever the file size. A regular
  input file (plain or .gz) is first read through once (a chunk at a time too), so that
  invalid UTF-8 and lines longer than the model's positions (without --truncate) are
  reported before any work, and the progress bar on stderr knows the number of lines and
  shows an ETA. Standard input ("-") and pipes are read once, with no total: a chunk also
  ends when no further line has arrived, so a program that writes one line and waits gets
  its translation at once (like fairseq-interactive), while a fast pipe fills whole chunks.
  Invalid UTF-8 is an error naming the line, unless --on-invalid-utf8 replace (U+FFFD).
  The chunk size does not change the translations, but a score can move in its last digits
  (a sentence's floating-point sums depend on the batch it shares; in a rare near-tie, so
  can a translation).
  On standard output each chunk appears when it is done. A file given with --output is
  written as OUTPUT.partial (flushed after each chunk) and renamed to OUTPUT once complete:
  OUTPUT itself is never partly written. If a run from an input file stops early (an error,
  Ctrl-C, a crash), OUTPUT.partial keeps the finished chunks and OUTPUT.partial.json what
  produced them (the input's text, the checkpoint's checksums, the options): the same
  command with --resume goes on from there, and refuses, naming what differs, if anything
  does. Without --resume a new run replaces them. A run from standard input cannot be
  resumed: when it fails, it removes OUTPUT.partial.

prefixes (--prefix-file)
  One target prefix per input line (an empty line for none): the translation is forced to
  start with it (encoded with the checkpoint's tokenizer, as the Python API's prefixes=).
  The line counts must match; an empty input line still gives an empty output line.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "translate", help="translate text with a checkpoint (beam search)",
        description="Translate a file or standard input with a trained checkpoint. Several "
                    "--checkpoint paths are averaged (element-wise mean of their weights), or with --ensemble "
                    "decoded as an ensemble (the mean of their probabilities at each step).",
        epilog=FORMAT_HELP + "\n" + translate_constraints.HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_checkpoint(p)
    p.add_argument("--input", "-i", default="-", help="input file (plain or .gz), or - for stdin (default)")
    p.add_argument("--output", "-o", default="-", help="output file, or - for stdout (default)")
    options.add_decode_flags(p)
    options.add_device_flags(p)
    options.add_compile(p, "where the input file's line count is estimated to win the warm-up back "
                           "(never for standard input or a few lines)")
    options.add_workers(p)
    p.add_argument("--format", choices=("text", "jsonl"), default="text", help="see 'output format' below")
    p.add_argument("--scores", action="store_true", help="text format: a score after each translation")
    p.add_argument("--alignment", action="store_true",
                   help="word alignments from the last layer's cross-attention (see 'alignment' below)")
    p.add_argument("--prefix-file", metavar="FILE",
                   help="one target prefix per input line, forced at the start of its translation")
    translate_constraints.add_flags(p)
    p.add_argument("--truncate", action="store_true",
                   help="cut a line longer than the model's source positions (with a warning naming it); "
                        "by default such a line is an error")
    p.add_argument("--chunk-size", "--buffer-size", dest="chunk_size", type=int, default=DEFAULT_CHUNK_SIZE,
                   metavar="N", help=f"lines read, translated and written at a time (default {DEFAULT_CHUNK_SIZE}; "
                                     "--buffer-size is another name for it)")
    p.add_argument("--resume", action="store_true",
                   help="continue the OUTPUT.partial an interrupted run of the same command left")
    options.add_on_invalid_utf8(p)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary on stderr")
    p.set_defaults(func=run, exit_at_once=True)  # main: no interpreter teardown after the outputs are closed


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


def read_file_lines(path: Path, on_invalid_utf8: str) -> list[str]:
    """Every line of a file (plain or gzip), read before any work, so that invalid UTF-8
    anywhere is reported first."""
    return list(translate_io.text_lines(path, _utf8_mode(on_invalid_utf8), hint=_UTF8_HINT))


def check_lengths(translator: Any, chunk: list[str], first_lineno: int, where: str, cfg: Any) -> None:
    """Refuse a line the model cannot read whole, before any output: cutting it would be a
    silent loss. (A stream is checked as it is translated: :func:`too_long`.)"""
    limit = translator.max_src_len
    if limit is None:
        return
    for k, n in enumerate(translator.source_lengths(chunk, cfg)):
        if n > limit:
            raise too_long(where, first_lineno + k, n, limit)


def too_long(where: str, line: int, length: int, limit: int) -> DataError:
    """The one message for a source line longer than the model's positions."""
    return DataError(f"{where}:{line}: {length} source tokens (with EOS); the model has {limit} positions: "
                     "split the line, or use --truncate to cut it")


def _is_stream(path: str) -> bool:
    """Standard input, or a path that can be read only once (a named pipe, /dev/stdin)."""
    return path == "-" or (os.path.exists(path) and not os.path.isfile(path))


# -------------------------------------------------------------------------- output


def _clean(text: str, tabs: bool) -> str:
    # A translation must stay on its line (and in its TSV field).
    text = text.replace("\r", " ").replace("\n", " ")
    return text.replace("\t", " ") if tabs else text


def _alignment(h: Any) -> list[tuple[int, int]]:
    from aiayn.inference.alignment import hard_alignment

    return hard_alignment(h.attention, h.src_pieces, h.tgt_pieces)


def _alignment_text(h: Any) -> str:
    from aiayn.inference.alignment import format_alignment

    return format_alignment(_alignment(h))


def format_result(result: Any, lineno: int, nbest: int, fmt: str, scores: bool, alignment: bool = False) -> str:
    """One output line (without its newline) for one input line; ``alignment``: the
    hypotheses' attention is :func:`aiayn.inference.alignment.last_layer_mean` of theirs."""
    hyps = list(result.hypotheses)
    if fmt == "jsonl":
        records = [{"text": _clean(h.text, False), "score": h.score, "tokens": h.tokens} for h in hyps]
        if alignment:
            for record, h in zip(records, hyps):
                record["alignment"] = [list(pair) for pair in _alignment(h)]
        return json.dumps({"line": lineno, "hypotheses": records}, ensure_ascii=False)
    fields = []
    for k in range(nbest):
        h = hyps[k] if k < len(hyps) else None
        fields.append(_clean(h.text, True) if h is not None else "")
        if scores:
            fields.append(f"{h.score:.4f}" if h is not None else "")
        if alignment:
            fields.append(_alignment_text(h) if h is not None else "")
    return "\t".join(fields)


class _Stdout:
    """Standard output: each chunk written and flushed as it is done."""

    lines = 0

    def write(self, data: bytes, lines: int) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    def finish(self) -> None:
        pass

    def abort(self) -> bool:
        return False


# ----------------------------------------------------------------------------- run


class _Prefixes:
    """The --prefix-file lines, taken chunk by chunk beside the input."""

    def __init__(self, path: str | None, on_invalid_utf8: str, skip: int) -> None:
        self.path = path
        self.used = skip
        self._lines: Iterator[str] | None = None
        if path is not None:
            lines = translate_io.text_lines(path, _utf8_mode(on_invalid_utf8), hint=_UTF8_HINT)
            self._lines = itertools.islice(lines, skip, None)

    def take(self, n: int) -> list[str | None] | None:
        if self._lines is None:
            return None
        got: list[str | None] = list(itertools.islice(self._lines, n))
        self.used += len(got)
        if len(got) < n:
            raise DataError(f"--prefix-file {self.path}: {self.used} lines, but the input has more; give one "
                            "prefix per input line (an empty line for none)")
        return got

    def finish(self, input_lines: int) -> None:
        if self._lines is not None and next(self._lines, None) is not None:
            raise DataError(f"--prefix-file {self.path}: more lines than the {input_lines} of the input; give one "
                            "prefix per input line (an empty line for none)")


class _Job:
    """One `aiayn translate` run: the checks, the pass over the input, the output."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from aiayn.checkpoint.directory import resolve_checkpoint
        from aiayn.inference.translator import Translator
        from aiayn.runtime.process import decode_workers

        self.args = args
        self.overrides = options.decode_overrides(args)
        device = options.device(args)
        self.output = _check_output(args)
        # Resolved once: a `last` pointer moving on meanwhile cannot change what is loaded.
        self.checkpoints = [resolve_checkpoint(p) for p in args.checkpoint]
        self.dtype = options.dtype(args, device)
        self.translator = Translator.from_checkpoint(self.checkpoints, device=device, dtype=self.dtype,
                                                     compile=args.compile == "on", ensemble=args.ensemble)
        self.cfg = self.translator.decode_config(**self.overrides, nbest=args.nbest)  # bad options: before output
        self.where = "<stdin>" if args.input == "-" else args.input
        self.stream = _is_stream(args.input)
        self.total: int | None = None
        self.identity: dict[str, Any] | None = None
        if not self.stream:
            self._scan()
        self.terms = translate_constraints.check_files(args.constraints, args.terms, _utf8_mode(args.on_invalid_utf8),
                                                       self.total, args.input)
        self.compiling = args.compile == "auto" and self.translator.compile_pays(self.total, self.cfg)
        self.workers = decode_workers(args.workers, device.type, torch.get_num_threads(),
                                      None if self.stream else self.total)

    def start(self) -> None:
        """Say what auto chose (after every check: an error stays the only line on stderr)."""
        options.say_dtype(self.dtype, self.args.quiet)
        if self.compiling:
            if not self.args.quiet:
                print(f"compile auto -> on ({self.total} lines win its warm-up back)", file=sys.stderr)
            self.translator.use_compiled()
        elif self.workers[0] > 1:
            self.translator.engine.use_workers(*self.workers)
            if self.translator.engine.searches_in_workers and not self.args.quiet and self.args.workers == "auto":
                print(f"workers auto -> {self.workers[0]} processes of {self.workers[1]} thread(s) "
                      f"({self.total} lines)", file=sys.stderr)

    def _scan(self) -> None:
        """One pass over a regular input file (and prefix file) before any translation."""
        args = self.args

        def check(chunk: list[str], first: int) -> None:
            if not args.truncate:
                check_lengths(self.translator, chunk, first, args.input, self.cfg)

        scan = translate_io.scan_text_file(args.input, _utf8_mode(args.on_invalid_utf8), hint=_UTF8_HINT,
                                        size=args.chunk_size, check=check)
        self.total = scan.lines
        prefix_scan = None
        if args.prefix_file is not None and not _is_stream(args.prefix_file):
            prefix_scan = translate_io.scan_text_file(args.prefix_file, _utf8_mode(args.on_invalid_utf8),
                                                   hint=_UTF8_HINT, size=args.chunk_size)
            if prefix_scan.lines != scan.lines:
                raise DataError(f"--prefix-file {args.prefix_file}: {prefix_scan.lines} lines, but {args.input} "
                                f"has {scan.lines}; give one prefix per input line (an empty line for none)")
        streams = [p for p in (args.constraints, args.terms) if p is not None and _is_stream(p)]
        if (args.prefix_file is None or prefix_scan is not None) and not streams:
            self.identity = self._identity(scan, prefix_scan)

    def _identity(self, scan: translate_io.TextScan, prefix: translate_io.TextScan | None) -> dict[str, Any]:
        """Everything the output bytes depend on, for --resume to compare."""
        from aiayn.config import to_dict

        args = self.args
        flags = {"--format": args.format, "--scores": args.scores, "--alignment": args.alignment,
                 "--truncate": args.truncate, "--on-invalid-utf8": args.on_invalid_utf8,
                 "--chunk-size": args.chunk_size, "--dtype": self.translator.dtype, "--compile": args.compile,
                 "--ensemble": args.ensemble, "--device": self.translator.device.type,
                 "--constraints": translate_constraints.file_sha256(args.constraints),
                 "--terms": translate_constraints.file_sha256(args.terms),
                 "--constraints-best-effort": args.constraints_best_effort}
        return {"input": scan.sha256, "--prefix-file": prefix.sha256 if prefix else None,
                "--checkpoint": translate_io.checkpoint_identity(self.checkpoints),
                **{f"decode.{k}": v for k, v in to_dict(self.cfg).items()}, **flags}

    def open_output(self) -> translate_io.PartialOutput | _Stdout:
        if self.output is None:
            return _Stdout()
        if self.args.resume and self.identity is None:
            raise AiaynError("--resume: needs a regular --input file (and --prefix-file, --constraints, --terms): "
                             "a stream cannot be read again from where the run stopped")
        out = translate_io.PartialOutput(self.output, self.identity, resume=self.args.resume)
        if not self.args.quiet and out.lines:
            print(f"resuming {out.partial}: {out.lines} of {self.total} lines done", file=sys.stderr)
        elif not self.args.quiet and out.replaced:
            print(f"replacing {out.partial} left by an earlier run (--resume continues one)", file=sys.stderr)
        return out

    def chunks(self, skip: int) -> Iterator[list[str]]:
        args = self.args
        if not self.stream:
            lines = translate_io.text_lines(args.input, _utf8_mode(args.on_invalid_utf8), hint=_UTF8_HINT)
            return translate_io.chunked(itertools.islice(lines, skip, None), args.chunk_size)
        return self._stream_chunks()

    def _stream_chunks(self) -> Iterator[list[str]]:
        args = self.args

        def decode(raw: bytes, lineno: int) -> str:
            return decode_line(raw, self.where, lineno, args.on_invalid_utf8)

        if args.input == "-":
            yield from translate_io.stream_chunks(sys.stdin.buffer, args.chunk_size, decode, name=self.where)
            return
        with fileio.open_text_input(args.input) as (f, compressed):
            yield from translate_io.stream_chunks(f, args.chunk_size, decode, name=self.where, wait=False)

    def translate(self, chunk: list[str], prefixes: list[str | None] | None, first: int, bar: Any,
                  constraints: list[Any] | None = None) -> bytes:
        """One chunk's output lines, in input order, as bytes."""
        from aiayn.errors import ConstraintError
        from aiayn.inference.alignment import last_layer_mean
        from aiayn.inference.request import SourceTooLong, TranslationRequest

        args = self.args
        request = TranslationRequest(chunk, self.cfg, args.alignment, prefixes, constraints,
                                     args.constraints_best_effort, truncate=args.truncate, first_number=first,
                                     attention_summary=last_layer_mean if args.alignment else None,
                                     progress=bar.update)
        try:
            results = self.translator.run(request)
        except SourceTooLong as exc:
            raise too_long(self.where, first + exc.index, exc.length, exc.limit) from None
        except ConstraintError as exc:
            raise DataError(f"{self.where}:{first + exc.index}: {exc.reason} (--constraints-best-effort translates "
                            "it without them)") from None
        lines = [format_result(r, first + k, self.cfg.nbest, args.format, args.scores, args.alignment)
                 for k, r in enumerate(results)]
        return "".join(line + "\n" for line in lines).encode("utf-8")

    def run(self, out: translate_io.PartialOutput | _Stdout) -> int:
        """Translate every chunk after the ``out.lines`` already done; the lines translated."""
        from tqdm import tqdm

        args = self.args
        skip = out.lines
        prefixes = _Prefixes(args.prefix_file, args.on_invalid_utf8, skip)
        terms = translate_constraints.ConstraintsFile(args.constraints, self.terms, args.on_invalid_utf8, skip)
        n = skip
        with tqdm(total=self.total, initial=skip, unit="line", file=sys.stderr, disable=args.quiet,
                  desc="translate", dynamic_ncols=True) as bar:
            for chunk in self.chunks(skip):
                out.write(self.translate(chunk, prefixes.take(len(chunk)), n + 1, bar, terms.take(chunk)),
                          len(chunk))
                n += len(chunk)
        prefixes.finish(n)
        terms.finish(n)
        return n - skip


def _check_output(args: argparse.Namespace) -> Path | None:
    """The output file (None: stdout), checked before any work; never one of the inputs."""
    if args.chunk_size < 1:
        raise AiaynError(f"--chunk-size: must be at least 1, got {args.chunk_size}")
    if args.resume and args.output == "-":
        raise AiaynError("--resume: needs an --output file (it continues OUTPUT.partial)")
    translate_constraints.check_paths(args.constraints, args.terms)
    if args.output == "-":
        return None
    inputs = [args.input, args.prefix_file, args.constraints, args.terms, *args.checkpoint]
    path = fileio.check_output_file(args.output, inputs, "--output")
    partial = path.with_name(path.name + translate_io.PARTIAL_SUFFIX)
    for written in (partial, partial.with_name(partial.name + translate_io.STATE_SUFFIX)):
        fileio.check_output_file(written, inputs, "--output")
    return path


def run(args: argparse.Namespace) -> int:
    job = _Job(args)
    out = job.open_output()
    job.start()
    start = time.perf_counter()
    try:
        done = job.run(out)
        out.finish()
    except BaseException as exc:
        kept = out.abort()
        note = (f"{out.partial} keeps the first {out.lines} lines"
                if kept and isinstance(out, translate_io.PartialOutput) else "")
        if isinstance(exc, AiaynError) and not isinstance(exc, EnvironmentFailure):
            # The input caused it: --resume would meet it again, so it is not advised.
            if note:
                exc.args = (f"{exc}; {note}",)
            raise
        note += "; the same command with --resume continues it" if note else ""
        if isinstance(out, translate_io.PartialOutput):  # a full disk: one line, with what was kept
            failure = fileio.environment_failure(exc, out.partial, f"{out.path} is unchanged")
            if failure is not None:
                raise EnvironmentFailure(f"{failure}" + (f"; {note}" if note else "")) from None
        if note:
            print(f"aiayn translate: {note}", file=sys.stderr)
        raise
    finally:
        job.translator.engine.use_workers(1)  # the worker processes, if any, stop
    if not args.quiet:
        elapsed = time.perf_counter() - start
        print(f"translated {done} lines in {elapsed:.1f}s ({done / max(elapsed, 1e-9):.1f} lines/s)",
              file=sys.stderr)
    return 0
