"""Text in, text out: a checkpoint's decoding engine, its tokenizer and its decoding defaults.

    translator = Translator.from_checkpoint("runs/base")         # device cpu, dtype "auto"
    translator.run(TranslationRequest(texts, translator.decode_config(beam=5), prefixes=...))

A request is encoded once (:mod:`aiayn.inference.request`), its sentences sorted by length
into batches of at most ``decode.batch_tokens`` padded source tokens, each searched by the
engine (:mod:`aiayn.inference.engine`); results come back in input order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from aiayn.config import Config, DecodeConfig, to_dict
from aiayn.errors import ConfigError, DataError
from aiayn.inference.engine import DecodingEngine, load_models
from aiayn.inference.request import TranslationRequest, batches, encode_request
from aiayn.inference.results import Hypothesis, TranslationResult
from aiayn.model import Transformer
from aiayn.runtime.precision import DtypeChoice


class Translator:
    """A model (or an ensemble) + tokenizer + decoding defaults (``config``: a checkpoint's
    [Config][aiayn.config.Config] or a ``DecodeConfig``); ``device``, ``dtype`` (fp32 here, ``auto``
    in ``from_checkpoint``) and ``compile`` are the :class:`~aiayn.inference.engine.DecodingEngine`'s."""

    def __init__(self, model: Transformer | Sequence[Transformer], tokenizer: Any,
                 config: Config | DecodeConfig | None = None, device: str | torch.device = "cpu",
                 dtype: str | DtypeChoice = "fp32", compile: bool = False) -> None:
        self.config = Config(decode=config) if isinstance(config, DecodeConfig) else config or Config()
        self.tokenizer = tokenizer
        self.engine = engine = DecodingEngine(model, device=device, dtype=dtype, compile=compile)
        self.device, self.dtype_choice, self.dtype = engine.device, engine.precision, engine.precision.dtype
        self.parameters, self.model, self.max_src_len = engine.parameters, engine.model, engine.limits.positions

    @classmethod
    def from_checkpoint(cls, path: str | Path | Sequence[str | Path], device: str | torch.device = "cpu",
                        dtype: str | DtypeChoice = "auto", compile: bool = False, ensemble: bool = False) -> Translator:
        """Load a checkpoint (a directory, a run directory or a ``last``/``best`` pointer): its
        model, tokenizer and decoding defaults. Several paths: their weights averaged, or with
        ``ensemble`` decoded as an ensemble. Raises CheckpointError (a missing, incomplete or
        corrupted checkpoint, or one without its tokenizer) and ConfigError (a device or dtype
        this machine does not have).

        Example:
            ```python
            translator = Translator.from_checkpoint("runs/mine/averaged", dtype="bf16")
            ```
        """
        loaded = load_models([path] if isinstance(path, (str, Path)) else list(path), ensemble=ensemble)
        return cls(loaded.models, loaded.tokenizer, loaded.config, device=device, dtype=dtype, compile=compile)

    compiled = property(lambda self: self.engine.compiled, doc="Whether the decoding steps run compiled.")
    decoder = property(lambda self: self.engine.decoder, doc="The engine's step function (eager or compiled).")
    def use_compiled(self, warm_up: Sequence[Sequence[str]] = ()) -> None:
        """Decode with compiled steps from now on, after translating the batches of texts
        ``warm_up`` with them (calls meanwhile, e.g. a server's, keep the eager steps)."""
        def warm(decoder: Any) -> None:
            for texts in warm_up:
                self.run(TranslationRequest(list(texts), self.decode_config()), decoder)
        self.engine.use_compiled(warm if warm_up else None)

    def compile_pays(self, lines: int | None, cfg: DecodeConfig | None = None) -> bool:
        """Whether compiling the steps wins back its warm-up over ``lines`` more lines at ``cfg``'s beam."""
        return self.engine.compile_pays(lines, per_source=(cfg or self.config.decode).beam)

    def decode_config(self, **overrides: Any) -> DecodeConfig:  # None values are ignored
        return self.config.decode.with_overrides(**overrides)

    def source_tokenizer(self, cfg: DecodeConfig) -> Any:
        """The tokenizer of the sources under ``cfg``: tagged with ``cfg.tgt_lang``, else with the
        checkpoint's ``data.tgt_lang`` when it was trained with ``data.tgt_lang_tag``, else as given."""
        data = self.config.data
        lang = cfg.tgt_lang or (data.tgt_lang if data.tgt_lang_tag else "")
        if not lang:
            return self.tokenizer
        try:
            return self.tokenizer.tagged(lang)
        except DataError as exc:
            raise ConfigError(f"decode.tgt_lang: {exc}") from None

    def encode_sources(self, texts: Sequence[str], cfg: DecodeConfig | None = None) -> list[list[int]]:
        """Each text's source ids under ``cfg`` (EOS included, the target-language tag too), uncut."""
        # num_threads=1: the server calls this on its event loop; short texts need no thread pool.
        return self.source_tokenizer(cfg or self.config.decode).encode_src_batch(list(texts), num_threads=1)

    def source_lengths(self, texts: Sequence[str], cfg: DecodeConfig | None = None) -> list[int]:
        """Source tokens of each text (:meth:`encode_sources`)."""
        return [len(ids) for ids in self.encode_sources(texts, cfg)]

    def describe(self) -> dict[str, Any]:
        """The model's configuration, languages, vocabulary and parameter counts (``GET /v1/model``)."""
        cfg, tok = self.config, self.tokenizer
        return {"config": to_dict(cfg), "languages": {"source": cfg.data.src_lang, "target": cfg.data.tgt_lang},
                "vocabulary": {"source": tok.src_vocab_size, "target": tok.tgt_vocab_size,
                               "joint": bool(getattr(tok, "joint", False))},
                "parameters": self.parameters}

    def translate(self, texts: Sequence[str], constraints: Sequence[Any] | None = None,
                  constraints_best_effort: bool = False, **decode_overrides: Any) -> list[str]:
        """The best translation of each text, in input order. ``constraints``: terminology, one
        entry per text (None, a list of phrases to include, or ``{"include": [...], "exclude":
        [...]}``); ``constraints_best_effort``: translate a text whose constraints cannot be met
        without them (a warning) instead of raising ConstraintError. ``decode_overrides``: any
        ``DecodeConfig`` field (``beam``, ``lenpen``, ``max_len_b``, ``sampling``, ...).

        Example:
            ```python
            translator.translate(["A dog chases a red ball."], constraints=[["Hund", "roten Ball"]], beam=5)
            ```
        """
        results = self.translate_detailed(texts, constraints=constraints,
                                          constraints_best_effort=constraints_best_effort, **decode_overrides)
        return [r.hypotheses[0].text if r.hypotheses else "" for r in results]

    def translate_detailed(self, texts: Sequence[str], nbest: int = 1, attention: bool = False,
                           prefixes: Sequence[str | None] | None = None, constraints: Sequence[Any] | None = None,
                           constraints_best_effort: bool = False, progress: Callable[[int], None] | None = None,
                           **decode_overrides: Any) -> list[TranslationResult]:
        """Up to ``nbest`` hypotheses per text with scores, pieces and (with ``attention``) the
        cross-attention of each; the other arguments as :class:`TranslationRequest`'s fields."""
        return self.run(TranslationRequest(texts, self.decode_config(**{**decode_overrides, "nbest": nbest}),
                                           attention, prefixes, constraints, constraints_best_effort,
                                           progress=progress))

    def run(self, request: TranslationRequest, decoder: Any = None) -> list[TranslationResult]:
        """The request's results in input order (``decoder``: another of the engine's, e.g. while
        warming compiled steps up). A source longer than the model's positions is cut, or with
        ``truncate=False`` raises :class:`~aiayn.inference.request.SourceTooLong`."""
        results = [TranslationResult(source=t) for t in request.texts]
        sentences = encode_request(request, self.tokenizer, self.source_tokenizer(request.decode), self.engine.limits)
        for i in set(range(len(results))) - {s.index for s in sentences}:
            results[i].hypotheses = [Hypothesis.empty()]
        if request.progress is not None and len(sentences) < len(results):
            request.progress(len(results) - len(sentences))
        todo, shortlist = batches(sentences, request.decode.batch_tokens), getattr(self.tokenizer, "shortlist", None)
        for batch, found in self.engine.search_batches(todo, request, shortlist, decoder):
            for sentence, hyps in zip(batch, found):
                results[sentence.index].src_tokens = sentence.source
                results[sentence.index].hypotheses = [
                    Hypothesis.from_search(self.tokenizer, sentence.source, h, request.attention_summary) for h in hyps]
            if request.progress is not None:
                request.progress(len(batch))
        return results
