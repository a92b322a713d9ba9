"""docs/cli.md is the command-line reference generated from the `aiayn` parsers
(scripts/cli_reference.py): it must be what the script writes today."""

from __future__ import annotations

from pathlib import Path

import cli_reference

REPO = Path(__file__).resolve().parents[1]


def test_the_cli_reference_is_up_to_date() -> None:
    script = cli_reference
    page = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert page == script.render(), f"docs/cli.md is out of date: run `{script.REGENERATE}`"


def test_every_command_and_option_is_on_the_page() -> None:
    from aiayn.cli.main import build_parser

    page = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    assert set(commands.choices) >= {"demo", "prepare", "train", "translate", "serve", "export", "import"}
    for name, sub in commands.choices.items():
        assert f"## `aiayn {name}`" in page, name
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert option in page, f"aiayn {name} {option}"
