"""The `aiayn` command. Each subcommand lives in its own module of this package and
exposes ``add_parser(subparsers)``, which registers its arguments and sets ``func``.
User errors (:class:`AiaynError`) print one message and exit non-zero, no traceback; so do
a full disk or quota and a read-only file system met anywhere (exit 1, naming the file).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
import typing

import aiayn
from aiayn import fileio
from aiayn.errors import AiaynError
from aiayn.runtime.process import exit_now, set_threads, tune_allocator

# Module names under aiayn.cli, in the order `aiayn --help` lists them.
SUBCOMMANDS = (
    "demo", "prepare", "choose_recipe", "train", "average", "translate", "evaluate", "tune_decoding", "parse",
    "serve", "plot", "export", "import_hf", "model_info",
)


# An error line echoes what the user gave, capped: a value (a run of non-space characters)
# at MAX_ECHO characters, the whole message at MAX_MESSAGE.
MAX_ECHO = 300
MAX_MESSAGE = 2000


def capped(message: str) -> str:
    """``message`` with every value longer than :data:`MAX_ECHO` cut (its length said), and
    the whole cut in the middle beyond :data:`MAX_MESSAGE`."""
    def cut(m: re.Match[str]) -> str:
        return f"{m.group(0)[:MAX_ECHO // 2]}...[{len(m.group(0)):,} characters]"

    message = re.sub(rf"\S{{{MAX_ECHO + 1},}}", cut, message)
    if len(message) > MAX_MESSAGE:
        head, tail = message[:MAX_MESSAGE // 2], message[-MAX_MESSAGE // 4:]
        message = f"{head} ...[{len(message) - len(head) - len(tail):,} characters]... {tail}"
    return message


class _Parser(argparse.ArgumentParser):
    """argparse's parser (and its subcommands'), its usage errors capped like every other."""

    def error(self, message: str) -> typing.NoReturn:
        super().error(capped(message))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="aiayn", description="The Transformer of 'Attention Is All You Need' for translation.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"aiayn {aiayn.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"aiayn.cli.{name}")
        except ModuleNotFoundError as exc:  # a subcommand whose module is not written yet
            if exc.name != f"aiayn.cli.{name}":
                raise
            continue
        module.add_parser(sub)
    return parser


# The exit code of a command whose standard output was closed by its reader: a shell's for a
# process that SIGPIPE ended (128 + 13).
PIPE_CLOSED = 141


def _quiet_stdout() -> None:
    """Point standard output at /dev/null, so that the interpreter's last flush of what the
    closed pipe did not take raises nothing more."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor behind it (a test's capture)
        pass


def main(argv: list[str] | None = None) -> None:
    tune_allocator()  # before the first large tensor; AIAYN_MALLOC=system opts out
    parser = build_parser()
    args = parser.parse_args(argv)
    fileio.set_command(" ".join(["aiayn", *(sys.argv[1:] if argv is None else argv)]))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        if "threads" in vars(args):  # the compute commands (options.add_threads)
            args.threads = set_threads(args.threads)
        code = args.func(args)
    except AiaynError as exc:
        print(f"aiayn {args.command}: error: {capped(str(exc))}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # whoever read standard output stopped (`aiayn evaluate ... | head -1`)
        _quiet_stdout()
        sys.exit(PIPE_CLOSED)
    except Exception as exc:
        if fileio.disk_errno(exc) is None:
            raise
        name = getattr(exc, "filename", None) or "a file"
        failure = fileio.environment_failure(
            exc, name, "outputs are renamed into place only once complete: the previous ones are unchanged")
        print(f"aiayn {args.command}: error: {capped(str(failure))}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"aiayn {args.command}: interrupted", file=sys.stderr)
        sys.exit(130)
    if argv is None and getattr(args, "exit_at_once", False):  # the process's own command line
        exit_now(code or 0)
    sys.exit(code or 0)


if __name__ == "__main__":
    main()
