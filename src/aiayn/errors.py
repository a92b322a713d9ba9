"""User-facing errors.

Anything a user can cause (a bad file, a bad config value, a bad request) raises a
subclass of :class:`AiaynError`. The CLI prints its message and exits non-zero, without
a traceback; programming errors stay ordinary exceptions with tracebacks.
"""

from __future__ import annotations


class AiaynError(Exception):
    """An error caused by user input; its message names the file, line or field."""

    exit_code: int = 2


class EnvironmentFailure(AiaynError):
    """The machine, not the input, stopped the command: a full disk or quota, a read-only
    file system. The message names the path and what was kept; the exit code is 1."""

    exit_code = 1


class ConfigError(AiaynError):
    """An invalid configuration value or an unknown configuration key."""


class DataError(AiaynError):
    """Bad input data: missing file, misaligned lines, invalid UTF-8, corrupt gzip..."""


class ConstraintError(DataError):
    """A sentence whose constraints cannot be met: ``index`` is its position among the texts
    translated, ``reason`` says why. The message names it as ``texts[index]``; a command
    line re-words it as ``FILE:LINE``."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"texts[{index}]: {reason}")
        self.index = index
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[int, str]]:  # pickled whole: it crosses from a decoding worker
        return type(self), (self.index, self.reason)


class CheckpointError(AiaynError):
    """A missing, incomplete or corrupted checkpoint."""


class InteropError(AiaynError):
    """A model or directory that cannot be converted (HF MarianMT, CTranslate2), with the reason."""
