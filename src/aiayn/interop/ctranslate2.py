"""aiayn -> CTranslate2, through the HF Marian export and CTranslate2's own converter.

CTranslate2's stock Marian loader assumes an OPUS-MT model: the decoder starts from a zero
embedding (Marian C++'s convention), and the last vocabulary row, ``<pad>``, is dropped.
An aiayn model's decoder starts from its learned BOS row (``<s>``, id 2) and keeps all
rows, so :class:`AiaynMarianLoader` is that loader with those two assumptions removed:
the decoder starts from ``<s>``'s embedding, every row is kept, and the source and target
vocabularies are registered separately (they differ when the tokenizer is not joint).

aiayn's search never outputs ``<pad>`` or ``<s>``; CTranslate2 has no per-model list of
suppressed tokens, so the converted model gives those two tokens an output bias of
:data:`SUPPRESS_BIAS` (a finite value that fits float16): greedy results are unchanged,
and log-probabilities differ from aiayn's only by the probability those two tokens had.

Translate with the Marian source pieces plus ``</s>``::

    sp = sentencepiece.SentencePieceProcessor(model_file=f"{out}/source.spm")
    tr = ctranslate2.Translator(out)
    res = tr.translate_batch([sp.encode(text, out_type=str) + ["</s>"]], beam_size=4)
    text = sentencepiece.SentencePieceProcessor(model_file=f"{out}/target.spm").decode(
        res[0].hypotheses[0])
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from aiayn.config import Config, save_config
from aiayn.errors import InteropError
from aiayn.fileio import atomic_dir, check_empty_dir, write_atomic
from aiayn.interop.hf_export import load_for_export, quiet_marian_tokenizer, save_hf_dir
from aiayn.interop.marian_format import require
from aiayn.vocab import BOS

log = logging.getLogger(__name__)

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16",
                 "float32")
SUPPRESS_BIAS = -1e4
CONFIG_FILE = "aiayn_config.yaml"  # read by aiayn.interop.ct2_translator


def _loader_class() -> type:
    """Defined on first use: CTranslate2 and transformers are optional."""
    require("ctranslate2")
    require("transformers")
    from ctranslate2.converters.transformers import BartLoader, MarianMTLoader

    class AiaynMarianLoader(MarianMTLoader):
        def get_model_spec(self, model: Any) -> Any:
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            # BartLoader's spec, without MarianMTLoader's removal of the last (pad) row.
            spec = BartLoader.get_model_spec(self, model)
            vocab = model.final_logits_bias.shape[-1]
            bias = model.final_logits_bias.detach().reshape(-1).float().clone()
            for token_id in (model.config.pad_token_id, model.config.decoder_start_token_id):
                if token_id is not None and 0 <= token_id < vocab:
                    bias[token_id] = SUPPRESS_BIAS
            spec.decoder.projection.bias = bias
            return spec

        def set_decoder(self, spec: Any, decoder: Any) -> None:
            BartLoader.set_decoder(self, spec, decoder)
            spec.start_from_zero_embedding = False  # start from <s>'s own embedding

        def set_config(self, config: Any, model: Any, tokenizer: Any) -> None:
            config.bos_token = BOS
            config.eos_token = tokenizer.eos_token
            config.unk_token = tokenizer.unk_token
            config.decoder_start_token = BOS

        def __call__(self, model: Any, tokenizer: Any) -> Any:
            spec = self.get_model_spec(model)
            self.set_config(spec.config, model, tokenizer)
            src = _ordered(tokenizer.encoder)
            tgt = _ordered(tokenizer.target_encoder) if tokenizer.separate_vocabs else src
            spec.register_source_vocabulary(src)
            spec.register_target_vocabulary(tgt)
            return spec

    return AiaynMarianLoader


def _ordered(vocab: dict[str, int]) -> list[str]:
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda item: item[1])]
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise InteropError("vocab.json ids are not 0..V-1; CTranslate2 needs one token per row")
    return tokens


def _converter(hf_dir: Path) -> Any:
    require("ctranslate2")
    transformers = require("transformers")
    from ctranslate2.converters import TransformersConverter

    loader = _loader_class()()

    class Converter(TransformersConverter):
        def _load(self) -> Any:
            with torch.no_grad():
                model = transformers.MarianMTModel.from_pretrained(str(hf_dir)).float().eval()
                with quiet_marian_tokenizer():
                    tokenizer = transformers.MarianTokenizer.from_pretrained(str(hf_dir))
                spec = loader(model, tokenizer)
            for name in ("source.spm", "target.spm"):
                spec.register_file(str(hf_dir / name))
            return spec

    return Converter(str(hf_dir))


def convert_hf_dir(hf_dir: str | os.PathLike, out_dir: str | os.PathLike, quantization: str | None = None,
                   force: bool = False, config: Config | None = None) -> Path:
    """Convert an aiayn HF Marian export (see :func:`aiayn.interop.export_hf`) to CTranslate2.
    ``config``: the checkpoint's, saved beside the model as ``aiayn_config.yaml`` (decoding
    defaults and limits for ``aiayn serve --ctranslate2``)."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise InteropError(f"quantization {quantization!r}: choose from {', '.join(QUANTIZATIONS)}")
    hf_dir = Path(hf_dir)
    with atomic_dir(out_dir, force, error=InteropError) as tmp:
        _converter(hf_dir).convert(str(tmp), quantization=quantization, force=True)
        if config is not None:
            save_config(config, tmp / CONFIG_FILE)
    return Path(out_dir)


VMAP_FILE = "vmap.txt"  # CTranslate2's vocabulary map, read from the model directory (use_vmap)


def vmap_text(tokenizer: Any) -> str:
    """The tokenizer's shortlist as CTranslate2's vocabulary map: a line ``<TAB>`` + the
    frequent target pieces (always candidates), then per source piece with a list
    ``piece<TAB>target pieces`` (pieces separated by spaces)."""
    shortlist = tokenizer.shortlist
    lines = ["\t" + " ".join(tokenizer.tgt_pieces(shortlist.frequent.tolist()))]
    for src_id, row in enumerate(shortlist.table.tolist()):
        targets = [t for t in row if t >= 0]
        if targets:
            lines.append(tokenizer.src_pieces([src_id])[0] + "\t" + " ".join(tokenizer.tgt_pieces(targets)))
    return "\n".join(lines) + "\n"


def export_ctranslate2(checkpoint: str | os.PathLike, out_dir: str | os.PathLike,
                       quantization: str | None = None, force: bool = False) -> Path:
    """``aiayn export ctranslate2``: checkpoint -> HF Marian (temporary) -> CTranslate2."""
    require("ctranslate2")
    require("transformers")
    check_empty_dir(out_dir, force, InteropError, inputs=[checkpoint])
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise InteropError(f"quantization {quantization!r}: choose from {', '.join(QUANTIZATIONS)}")
    model, cfg, tokenizer = load_for_export(checkpoint, target="CTranslate2 (converted through HF MarianMT)")
    with tempfile.TemporaryDirectory(prefix="aiayn-hf-") as tmp:
        save_hf_dir(model, cfg, tokenizer, Path(tmp), warn_generation=False)
        convert_hf_dir(tmp, out_dir, quantization, force, config=cfg)
    if getattr(tokenizer, "shortlist", None) is not None:
        write_atomic(Path(out_dir) / VMAP_FILE, vmap_text(tokenizer).encode("utf-8"))
    log.info("exported %s to CTranslate2 model %s (%s)", checkpoint, out_dir, quantization or "float32")
    return Path(out_dir)


__all__ = ["QUANTIZATIONS", "VMAP_FILE", "convert_hf_dir", "export_ctranslate2", "vmap_text"]
