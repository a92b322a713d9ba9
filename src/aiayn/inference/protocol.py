"""What a translator offers the server and the command lines, declared once.

Two backends implement it: :class:`aiayn.inference.translator.Translator` (a PyTorch
checkpoint) and :class:`aiayn.interop.ct2_translator.CTranslate2Translator` (a
CTranslate2 export). :mod:`aiayn.serving` is typed against :class:`TranslatorProtocol`
only, so anything that satisfies it can be served.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from aiayn.config import Config, DecodeConfig
from aiayn.inference.request import TranslationRequest
from aiayn.inference.results import TranslationResult


@runtime_checkable
class TranslatorProtocol(Protocol):
    """Text in, :class:`TranslationResult` out, with the checkpoint's decoding defaults."""

    @property
    def config(self) -> Config | None:
        """The experiment configuration the model was trained with (None: unknown, e.g. a
        CTranslate2 directory that aiayn did not write)."""

    @property
    def max_src_len(self) -> int | None:
        """Source positions of the model (EOS included); None: no limit known."""

    def decode_config(self, **overrides: Any) -> DecodeConfig:
        """The default decoding options with ``overrides`` applied and validated
        (:meth:`DecodeConfig.with_overrides`); a backend may refuse options it cannot run."""

    def translate(self, texts: Sequence[str], **overrides: Any) -> list[str]:
        """The best translation of each text, in input order."""

    def translate_detailed(self, texts: Sequence[str], nbest: int = 1, attention: bool = False,
                           **overrides: Any) -> list[TranslationResult]:
        """Up to ``nbest`` hypotheses per text, best first, with scores and pieces; with
        ``attention``, the cross-attention weights of each hypothesis."""

    def run(self, request: TranslationRequest) -> list[TranslationResult]:
        """The request's results, in input order (a backend may refuse what it cannot run,
        e.g. prefixes or constraints, with a ConfigError)."""

    def encode_sources(self, texts: Sequence[str], cfg: DecodeConfig | None = None) -> list[list[Any]]:
        """Each text's source tokens under ``cfg`` (None: the defaults), as the backend feeds
        them to its model (EOS and a target-language tag included), before any truncation;
        a request's ``sources``."""

    def source_lengths(self, texts: Sequence[str], cfg: DecodeConfig | None = None) -> list[int]:
        """Source tokens (EOS included, a target-language tag too) of each text under ``cfg``
        (None: the defaults), before any truncation."""

    def describe(self) -> dict[str, Any]:
        """What ``GET /v1/model`` reports about the model: ``config`` and ``languages`` when
        known, ``vocabulary`` (source, target, joint) and ``parameters`` when counted."""


__all__ = ["TranslatorProtocol"]
