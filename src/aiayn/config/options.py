"""What the command lines and the HTTP API know of a decoding option.

:class:`~aiayn.config.sections.DecodeConfig` declares each of its fields with
:func:`decode_option`; the field's metadata generates the CLI flags (:mod:`aiayn.cli.options`)
and the fields of the HTTP request body (:mod:`aiayn.serving.schemas`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class HttpField:
    """How a decoding option appears in ``POST /v1/translate`` (:mod:`aiayn.serving.schemas`).

    ``position`` orders the request's fields as the API first published them (its OpenAPI
    schema and the "known fields" of an ``unknown_field`` error); the request-only fields
    ``texts`` (0) and ``attention`` (3) sit among them.
    """

    ge: int | float | None
    le: int | float | None
    position: int
    description: str | None = None


@dataclass(frozen=True)
class DecodeOption:
    """What the command lines and the HTTP API need to know about one
    :class:`~aiayn.config.sections.DecodeConfig` field; the field's own type and default are the rest.

    ``cli=False`` marks an option as config-only (YAML ``decode:`` section and ``decode.x=``
    overrides, no flag). ``argument=True``: the value is an argument of every call
    (``translate_detailed(nbest=...)``), defaulting to the field's default, not to the
    checkpoint's, so it is never one of the "overrides".
    """

    help: str
    flag: str | None = None  # None: --field-name
    choices: tuple[str, ...] | None = None
    cli: bool = True
    http: HttpField | None = None
    argument: bool = False


def decode_option(default: Any, help: str, **meta: Any) -> Any:
    """A dataclass field with ``default`` whose metadata is its :class:`DecodeOption`."""
    return field(default=default, metadata={"option": DecodeOption(help, **meta)})
