"""A CTranslate2 model behind aiayn's translator interface, so that ``aiayn serve`` (and
anything else that calls ``translate_detailed``) can run a model exported with
``aiayn export ctranslate2`` -- for example int8 weights on a CPU.

The export directory holds ``model.bin``, ``source.spm`` / ``target.spm`` and, when
aiayn wrote it, ``aiayn_config.yaml`` (the checkpoint's configuration: decoding defaults,
languages, the number of source positions). A CTranslate2 directory from elsewhere works
too, with :class:`~aiayn.config.DecodeConfig`'s defaults.

What maps exactly onto CTranslate2's ``translate_batch``: beam size, n-best, minimum
length, the max-length bound ``a * |x| + b`` (sentences are grouped by their bound),
``no_repeat_ngram_size``, and the length penalty in its ``fairseq`` form |Y|^alpha. The
paper's ``gnmt`` form ((5 + |Y|) / 6)^alpha has no CTranslate2 equivalent: it is
replaced by |Y|^alpha with the same alpha (a warning says so once), which can rank
hypotheses of different lengths differently. Attention is CTranslate2's: one layer, one
head (the converter's alignment head), returned as (1, 1, T, S).
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from aiayn.config import Config, DecodeConfig, load_config, to_dict
from aiayn.errors import ConfigError, InteropError
from aiayn.inference.request import TranslationRequest
from aiayn.inference.results import Hypothesis, TranslationResult
from aiayn.interop.ctranslate2 import CONFIG_FILE
from aiayn.interop.marian_format import require
from aiayn.text.tokenizer import lang_tag
from aiayn.vocab import EOS_PIECE

log = logging.getLogger(__name__)

REQUIRED = ("model.bin", "source.spm", "target.spm")


class _Pieces:
    """The source/target SentencePiece models and their vocabulary sizes."""

    def __init__(self, model_dir: Path) -> None:
        spm = require("sentencepiece")
        self.src = spm.SentencePieceProcessor(model_file=str(model_dir / "source.spm"))
        self.tgt = spm.SentencePieceProcessor(model_file=str(model_dir / "target.spm"))
        self.src_vocab_size = self.src.get_piece_size()
        self.tgt_vocab_size = self.tgt.get_piece_size()
        self.joint = (model_dir / "source.spm").read_bytes() == (model_dir / "target.spm").read_bytes()

    def src_pieces(self, text: str) -> list[str]:
        return list(self.src.encode(text, out_type=str)) + [EOS_PIECE]


class CTranslate2Translator:
    """``translate_detailed`` over a CTranslate2 model directory: an
    :class:`~aiayn.inference.protocol.TranslatorProtocol`, as :class:`Translator` is.

    ``compute_type``: CTranslate2's (``default`` keeps the saved one; ``int8``,
    ``int8_float32``, ``float32``, ...). ``threads``: intra-op threads (0: CTranslate2's
    default).
    """

    def __init__(self, model_dir: str | os.PathLike, device: str = "cpu", compute_type: str = "default",
                 threads: int = 0) -> None:
        ctranslate2 = require("ctranslate2")
        self.model_dir = Path(model_dir)
        if not self.model_dir.is_dir():
            raise InteropError(f"{self.model_dir}: no such directory")
        missing = [n for n in REQUIRED if not (self.model_dir / n).is_file()]
        if missing:
            raise InteropError(f"{self.model_dir}: not a CTranslate2 export of aiayn or Marian "
                               f"(missing {', '.join(missing)})")
        cfg_path = self.model_dir / CONFIG_FILE
        self.config: Config | None = load_config(cfg_path) if cfg_path.is_file() else None
        self.decode = self.config.decode if self.config is not None else DecodeConfig()
        self.tokenizer = _Pieces(self.model_dir)
        try:
            self.translator = ctranslate2.Translator(str(self.model_dir), device=device,
                                                     compute_type=compute_type, intra_threads=threads)
        except (RuntimeError, ValueError) as exc:
            raise InteropError(f"{self.model_dir}: CTranslate2 cannot load it: {exc}") from None
        self.device, self.compute_type = device, compute_type
        self.max_src_len: int | None = self.config.model.max_positions if self.config is not None else None
        self._warned_gnmt = False

    def encode_sources(self, texts: Sequence[str], cfg: DecodeConfig | None = None) -> list[list[str]]:
        """Each text's source pieces (a target-language tag and EOS included)."""
        tag = self._lang_tag(cfg or self.decode)
        return [tag + self.tokenizer.src_pieces(t) for t in texts]

    def source_lengths(self, texts: Sequence[str], cfg: DecodeConfig | None = None) -> list[int]:
        """Source pieces of each text (:meth:`encode_sources`)."""
        return [len(pieces) for pieces in self.encode_sources(texts, cfg)]

    def describe(self) -> dict[str, Any]:
        """The export's configuration and languages (when aiayn wrote it) and vocabulary."""
        info: dict[str, Any] = {}
        if self.config is not None:
            info["config"] = to_dict(self.config)
            info["languages"] = {"source": self.config.data.src_lang, "target": self.config.data.tgt_lang}
        tok = self.tokenizer
        info["vocabulary"] = {"source": tok.src_vocab_size, "target": tok.tgt_vocab_size, "joint": tok.joint}
        return info

    def decode_config(self, **overrides: Any) -> DecodeConfig:
        """The export's decoding options with ``overrides`` (None values are ignored), limited
        to what CTranslate2 runs."""
        cfg = self.decode.with_overrides(**overrides)
        if cfg.sampling:
            raise ConfigError("decode.sampling: the CTranslate2 backend serves beam search and greedy only")
        if cfg.nbest > cfg.beam:
            raise ConfigError(f"nbest: {cfg.nbest} is more than beam={cfg.beam}")
        if cfg.shortlist and not (self.model_dir / "vmap.txt").is_file():
            raise ConfigError("decode.shortlist: the CTranslate2 model has no vocabulary map (vmap.txt): export a "
                              "checkpoint whose data was prepared with data.shortlist_k")
        return cfg

    def _lang_tag(self, cfg: DecodeConfig) -> list[str]:
        """The target-language tag the sources start with (``decode.tgt_lang``, else the
        export's ``data.tgt_lang`` when it was trained with ``data.tgt_lang_tag``), or none."""
        data = self.config.data if self.config is not None else None
        lang = cfg.tgt_lang or (data.tgt_lang if data is not None and data.tgt_lang_tag else "")
        if not lang:
            return []
        tag = lang_tag(lang)
        src = self.tokenizer.src
        if src.piece_to_id(tag) == src.unk_id():
            raise ConfigError(f"decode.tgt_lang: the model's source vocabulary has no tag {tag}")
        return [tag]

    def translate(self, texts: Sequence[str], **overrides: Any) -> list[str]:
        return [r.hypotheses[0].text for r in self.translate_detailed(texts, **overrides)]

    def translate_detailed(self, texts: Sequence[str], nbest: int = 1, attention: bool = False,
                           **overrides: Any) -> list[TranslationResult]:
        return self.run(TranslationRequest(texts, self.decode_config(**{**overrides, "nbest": nbest}), attention))

    def run(self, request: TranslationRequest) -> list[TranslationResult]:
        """The request's results; prefixes and constraints are refused (a ConfigError)."""
        if request.prefixes is not None or request.constraints is not None or request.grammar is not None:
            raise ConfigError("the CTranslate2 backend translates without prefixes or constraints")
        cfg, texts, attention = request.decode, request.texts, request.attention
        if cfg.lenpen_style == "gnmt" and cfg.lenpen and not self._warned_gnmt:
            log.warning("CTranslate2 normalizes scores by |Y|^alpha: the 'gnmt' length penalty "
                        "((5+|Y|)/6)^alpha is served as |Y|^alpha with alpha %.2f", cfg.lenpen)
            self._warned_gnmt = True
        results = [TranslationResult(source=t) for t in texts]
        given = request.sources or self.encode_sources(texts, cfg)
        pieces = {i: list(given[i]) for i, t in enumerate(texts) if t.strip()}
        for i, text in enumerate(texts):
            if not text.strip():
                results[i].hypotheses = [Hypothesis.empty()]
        # aiayn's bound is per sentence (a * |x| + b tokens before EOS); CTranslate2's is per
        # call, so sentences with the same bound go together.
        by_bound: dict[int, list[int]] = defaultdict(list)
        for i, src in pieces.items():
            by_bound[cfg.max_output_len(len(src))].append(i)
        for bound, rows in by_bound.items():
            out = self.translator.translate_batch(
                [pieces[i] for i in rows], beam_size=cfg.beam, num_hypotheses=cfg.nbest,
                length_penalty=cfg.lenpen, min_decoding_length=cfg.min_len,
                # At most `bound` tokens (aiayn would then force EOS; CTranslate2 just stops).
                max_decoding_length=max(bound, 1), no_repeat_ngram_size=cfg.no_repeat_ngram_size,
                max_input_length=0, return_scores=True, return_attention=attention, use_vmap=cfg.shortlist)
            for i, res in zip(rows, out):
                results[i].hypotheses = [self._hypothesis(pieces[i], tokens, score, res, h, attention)
                                         for h, (tokens, score) in enumerate(zip(res.hypotheses, res.scores))]
        return results

    def _hypothesis(self, src: list[str], tokens: list[str], score: float, res: Any, h: int,
                    attention: bool) -> Hypothesis:
        tgt = list(tokens) + [EOS_PIECE]
        weights = None
        if attention and res.attention:
            a = torch.tensor(res.attention[h], dtype=torch.float32)  # (T', S)
            a = a[:len(tgt), :len(src)]
            if a.size(0) < len(tgt):  # no row for the EOS step: repeat the last one
                a = torch.cat([a, a[-1:].expand(len(tgt) - a.size(0), -1)])
            weights = a[None, None]  # (1, 1, T, S)
        ids = [self.tokenizer.tgt.piece_to_id(p) for p in tokens]
        return Hypothesis(text=self.tokenizer.tgt.decode(list(tokens)), tokens=ids, score=float(score),
                          src_pieces=src, tgt_pieces=tgt, attention=weights)


__all__ = ["CONFIG_FILE", "CTranslate2Translator"]
