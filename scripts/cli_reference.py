"""Write docs/cli.md, the reference of every `aiayn` command, from the argparse parsers.

    python scripts/cli_reference.py            # rewrite docs/cli.md
    python scripts/cli_reference.py --check    # exit 1 if docs/cli.md differs from the parsers

The page is built from the parsers' own fields (descriptions, option strings, metavars,
choices, help and epilog texts), not from argparse's formatted help, whose layout changes
with the terminal width and the Python version.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from aiayn.cli.main import build_parser  # noqa: E402

OUTPUT = REPO / "docs" / "cli.md"
REGENERATE = "python scripts/cli_reference.py"

HEADER = f"""# Command-line reference

Every `aiayn` command with its options, as `aiayn COMMAND --help` prints them. This page is
generated from the command's parsers (`{REGENERATE}`); `tests/test_cli_reference.py` fails when
it is out of date. Every command answers a mistake with one line and exit code 2
([what bad input gets](bad-input.md), [FAQ](faq.md)). Commands that run the model take
`--threads N` (else `$AIAYN_NUM_THREADS`, else one per core). Which extras a command needs:
`serve` needs `pip install "aiayn[serve]"`, `export` and `import` need `aiayn[interop]`.
"""


def _escape(text: str) -> str:
    """Markdown-safe text: characters that would start emphasis, HTML or a table cell are
    escaped outside `code spans`, which stay as they are."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = re.sub(r"([\\*_<>\[\]|])", r"\\\1", parts[i])
    return "`".join(parts)


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {**vars(action), "prog": "", "default": action.default}
    text = " ".join(text.split())
    shown_default = action.default not in (None, False, True, argparse.SUPPRESS, [], "")
    if shown_default and "default" not in text and action.option_strings:
        text = f"{text} (default: {action.default})" if text else f"default: {action.default}"
    return text


def _metavar(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        name = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        name = "{" + ",".join(str(c) for c in action.choices) + "}"
    elif action.option_strings:
        name = action.dest.upper()
    else:
        name = action.dest
    if action.nargs in ("*",):
        return f"[{name} ...]"
    if action.nargs == "+":
        return f"{name} [{name} ...]"
    if action.nargs == "?":
        return f"[{name}]"
    if isinstance(action.nargs, int) and action.nargs > 1:
        return " ".join([name] * action.nargs)
    return name


def _signature(action: argparse.Action) -> str:
    metavar = _metavar(action)
    if not action.option_strings:
        return metavar
    names = ", ".join(action.option_strings)
    return f"{names} {metavar}" if metavar else names


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _options(parser: argparse.ArgumentParser) -> list[str]:
    lines: list[str] = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)
                   and not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        title = group.title or "options"
        title = "options" if title == "optional arguments" else title  # Python < 3.10's name
        lines.append(f"*{_escape(title)}*")
        lines.append("")
        for action in actions:
            help_text = _escape(_help(action))
            lines.append(f"- `{_signature(action)}`" + (f": {help_text}" if help_text else ""))
        lines.append("")
    return lines


def _section(parser: argparse.ArgumentParser, name: str, level: int, summary: str | None) -> list[str]:
    lines = [f"{'#' * level} `{name}`", ""]
    description = parser.description or summary or ""
    if description:
        lines += [_escape(" ".join(description.split())), ""]
    lines += _options(parser)
    if parser.epilog:
        if isinstance(parser.formatter_class, type) and issubclass(
                parser.formatter_class, argparse.RawDescriptionHelpFormatter):
            lines += ["```text", parser.epilog.strip("\n"), "```", ""]
        else:
            lines += [_escape(" ".join(parser.epilog.split())), ""]
    sub = _subparsers(parser)
    if sub is not None:
        summaries = {a.dest: a.help for a in sub._choices_actions}
        for child_name, child in sub.choices.items():
            lines += _section(child, f"{name} {child_name}", level + 1, summaries.get(child_name))
    return lines


def render() -> str:
    parser = build_parser()
    parser.prog = "aiayn"
    sub = _subparsers(parser)
    assert sub is not None
    summaries = {a.dest: a.help for a in sub._choices_actions}
    lines = [HEADER, "## Commands", ""]
    lines += [f"- [`aiayn {name}`](#aiayn-{name}): {_escape(summaries.get(name) or '')}" for name in sub.choices]
    lines += ["", "## `aiayn`", ""]
    lines += _options(parser)
    for name, child in sub.choices.items():
        lines += _section(child, f"aiayn {name}", 2, summaries.get(name))
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/cli.md from the aiayn parsers.")
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.is_file() or OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{OUTPUT.relative_to(REPO)} is out of date: run `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
