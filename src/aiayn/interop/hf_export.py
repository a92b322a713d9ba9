"""aiayn checkpoint -> Hugging Face MarianMT directory (``aiayn export hf``).

**Architecture.** HF Marian's layers are the paper's (:mod:`aiayn.interop.marian_format`).
An aiayn model with the paper's *interleaved* sinusoids is exported exactly by permuting
the model dimension through every weight (:func:`model_dim_permutation`): LayerNorm, dot
products and the residual sums do not care about the order of the d_model features, so the
permuted model computes the same logits. Pre-norm stacks, learned positions, d_k != d_model
/ h, or another LayerNorm eps have no HF Marian equivalent and are refused with the reason.

**Token ids.** aiayn's ids are kept as they are: ``vocab.json`` maps each
SentencePiece piece to its aiayn id, and ``source.spm`` / ``target.spm`` are the aiayn
SentencePiece models. So ``<pad>`` = 0 (HF ``pad_token_id``), ``<unk>`` = 1, ``<s>`` = 2
(HF ``decoder_start_token_id``: the decoder starts from aiayn's BOS embedding row, exactly
as aiayn's search does) and ``</s>`` = 3 (``eos_token_id``). OPUS-MT models use one id for
padding and decoder start, but nothing in ``transformers`` requires it: the encoder's
padding rows are masked by ``attention_mask`` and generation reads
``decoder_start_token_id``. ``<s>`` is declared the tokenizer's ``bos_token`` so that
``batch_decode(..., skip_special_tokens=True)`` drops it. ``generation_config.json``
suppresses ``<pad>`` and ``<s>`` (``bad_words_ids``) as aiayn's search does.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.checkpoint.directory import load_checkpoint, load_checkpoint_config, resolve_checkpoint
from aiayn.config import Config, ModelConfig
from aiayn.errors import InteropError
from aiayn.fileio import atomic_dir
from aiayn.interop.marian_format import HF_LAYER_NORM_EPS, require, tensor_map
from aiayn.model import Transformer
from aiayn.model.embeddings import sinusoid_table
from aiayn.text import spm_proto
from aiayn.text.tokenizer import Tokenizer
from aiayn.vocab import BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, UNK

log = logging.getLogger(__name__)


@contextmanager
def quiet_marian_tokenizer() -> Iterator[None]:
    """MarianTokenizer recommends sacremoses on every construction; it only uses it in an
    optional ``normalize`` method that nothing here calls."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Recommended: pip install sacremoses")
        yield


def unsupported_reasons(cfg: ModelConfig) -> list[str]:
    """Why HF Marian cannot represent ``cfg`` (empty when it can)."""
    reasons = []
    if cfg.norm != "post":
        reasons.append(f"model.norm={cfg.norm!r}: HF Marian layers are post-norm "
                       "(LayerNorm(x + sublayer(x))) with no final LayerNorm")
    if cfg.positions != "sinusoidal":
        reasons.append(f"model.positions={cfg.positions!r}: HF Marian has fixed sinusoidal "
                       "positions only")
    reasons += _head_size_reasons(cfg)
    if not math.isclose(cfg.layer_norm_eps, HF_LAYER_NORM_EPS, rel_tol=1e-9):
        reasons.append(f"model.layer_norm_eps={cfg.layer_norm_eps:g}: HF Marian's LayerNorms use "
                       f"{HF_LAYER_NORM_EPS:g}")
    return reasons


def _head_size_reasons(cfg: ModelConfig) -> list[str]:
    """HF Marian (and CTranslate2, which converts from it) derives d_k = d_v = d_model / n_heads;
    a model with other head sizes (Table 3 row B's d_k 16 or 32 at d_v 64) has no counterpart."""
    want = f"d_model / n_heads = {cfg.d_model / cfg.n_heads:g}"
    if cfg.d_k is None and cfg.d_v is None:
        if cfg.head_dim * cfg.n_heads == cfg.d_model:
            return []
        return [f"model.d_head={cfg.d_head}: HF Marian needs d_k = d_v = {want}"]
    reasons = []
    for name, dim in (("d_k", cfg.key_dim), ("d_v", cfg.value_dim)):
        if dim * cfg.n_heads != cfg.d_model:
            field = name if getattr(cfg, name) is not None else "d_head"
            reasons.append(f"model.{field}={getattr(cfg, field)}: HF Marian needs {name} = {want}")
    return reasons


def check_exportable(cfg: ModelConfig, target: str = "HF MarianMT") -> None:
    reasons = unsupported_reasons(cfg)
    if reasons:
        raise InteropError(f"this model cannot be exported to {target}: " + "; ".join(reasons))


def model_dim_permutation(d_model: int, layout: str) -> Tensor | None:
    """Index P with ``h_concat = h_interleaved[P]``; None for the concat layout.

    The interleaved table has sin_i at 2i and cos_i at 2i+1; the concat one has sin_i at i
    and cos_i at d_model/2 + i. So P = [0, 2, 4, ..., 1, 3, 5, ...].
    """
    if layout == "concat":
        return None
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])




def _permute(t: Tensor, kind: str, perm: Tensor | None) -> Tensor:
    if perm is None or kind == "none":
        return t
    if kind == "in":  # (out, d_model): the input features are model dimensions
        return t[:, perm]
    return t[perm]  # "out": (d_model, in) rows; "norm": (d_model,) vectors


def marian_state_dict(model: Transformer, cfg: ModelConfig) -> dict[str, Tensor]:
    """aiayn weights under HF MarianMTModel names, in the concat layout, float32."""
    check_exportable(cfg)
    perm = model_dim_permutation(cfg.d_model, cfg.sinusoid_layout)
    weights = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    out: dict[str, Tensor] = {}
    for hf_name, ai_name, kind in tensor_map(cfg):
        out[hf_name] = _permute(weights[ai_name], kind, perm).contiguous()
    src = _permute(weights["src_embed.weight"], "in", perm)
    tgt = _permute(weights["tgt_embed.weight"], "in", perm)
    if cfg.share_embeddings == "all":
        for name in ("model.shared.weight", "model.encoder.embed_tokens.weight",
                     "model.decoder.embed_tokens.weight", "lm_head.weight"):
            out[name] = tgt
    else:
        out["model.encoder.embed_tokens.weight"] = src
        out["model.decoder.embed_tokens.weight"] = tgt
        if cfg.share_embeddings == "decoder":
            out["lm_head.weight"] = tgt
        else:
            out["lm_head.weight"] = _permute(weights["output_projection.weight"], "in", perm)
    bias = weights.get("output_bias")
    out["final_logits_bias"] = (bias if bias is not None else torch.zeros(cfg.tgt_vocab_size))[None, :]
    return {k: v.contiguous() for k, v in out.items()}


def marian_config_kwargs(cfg: Config) -> dict[str, Any]:
    """``MarianConfig`` arguments equivalent to ``cfg.model`` (see the module docstring)."""
    model_cfg = cfg.model
    return dict(
        architectures=["MarianMTModel"],
        vocab_size=model_cfg.src_vocab_size,
        decoder_vocab_size=model_cfg.tgt_vocab_size,
        d_model=model_cfg.d_model,
        encoder_layers=model_cfg.n_encoder_layers,
        decoder_layers=model_cfg.n_decoder_layers,
        encoder_attention_heads=model_cfg.n_heads,
        decoder_attention_heads=model_cfg.n_heads,
        encoder_ffn_dim=model_cfg.d_ff,
        decoder_ffn_dim=model_cfg.d_ff,
        activation_function=model_cfg.activation,  # relu | gelu (erf) | swish: same names in HF
        dropout=model_cfg.dropout,
        attention_dropout=model_cfg.attention_dropout,
        activation_dropout=model_cfg.activation_dropout,
        max_position_embeddings=model_cfg.max_positions,
        scale_embedding=True,
        share_encoder_decoder_embeddings=model_cfg.share_embeddings == "all",
        tie_word_embeddings=model_cfg.share_embeddings != "none",
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        forced_eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
    )


def generation_kwargs(cfg: Config, warn: bool = True) -> dict[str, Any]:
    """``generation_config.json``: aiayn's decoding settings in HF terms.

    HF divides a hypothesis' log-probability by |Y|^length_penalty (|Y| counting EOS, not the
    decoder start): aiayn's ``lenpen_style: fairseq``. ``early_stopping=True`` is fairseq's
    (and aiayn's) rule: a sentence is done once ``num_beams`` hypotheses have ended. HF's
    ``max_length`` is absolute and counts the decoder start; aiayn's limit is relative to the
    source (max_len_a * |x| + max_len_b, plus EOS), so it is taken at the longest training
    source (``data.max_len``) and capped by the model's positions.
    """
    decode = cfg.decode
    if warn and decode.lenpen_style != "fairseq" and decode.beam > 1 and decode.lenpen != 0:
        log.warning("generation_config.json: transformers divides by |Y|^alpha (aiayn's lenpen_style "
                    "fairseq), this model's decode section uses %s; length_penalty=%g is written as is, "
                    "so HF beam search can pick other hypotheses than `aiayn translate` (which matches it "
                    "with --lenpen-style fairseq)", decode.lenpen_style, decode.lenpen)
    max_length = min(cfg.model.max_positions, decode.max_output_len(cfg.data.max_len) + 2)
    gen: dict[str, Any] = dict(
        num_beams=decode.beam,
        length_penalty=decode.lenpen,
        early_stopping=True,
        max_length=max_length,
        decoder_start_token_id=BOS_ID,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        forced_eos_token_id=EOS_ID,
        bad_words_ids=[[PAD_ID], [BOS_ID]],
    )
    if decode.min_len > 0:
        gen["min_new_tokens"] = decode.min_len
    if decode.no_repeat_ngram_size > 0:
        gen["no_repeat_ngram_size"] = decode.no_repeat_ngram_size
    return gen


def _spm_vocab(proto: bytes) -> dict[str, int]:
    return {p.piece: i for i, p in enumerate(spm_proto.read_pieces(proto))}


def write_tokenizer_files(tokenizer: Tokenizer, out: Path, cfg: Config) -> None:
    """vocab.json (+ target_vocab.json), source.spm, target.spm, tokenizer_config.json."""
    transformers = require("transformers")
    protos = tokenizer.model_bytes()
    src_proto, tgt_proto = (protos[0], protos[0]) if tokenizer.joint else (protos[0], protos[1])
    src_vocab, tgt_vocab = _spm_vocab(src_proto), _spm_vocab(tgt_proto)
    # One vocab.json serves both sides only when the two sides name every id the same way.
    separate = src_vocab != tgt_vocab
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        (tmp_dir / "source.spm").write_bytes(src_proto)
        (tmp_dir / "target.spm").write_bytes(tgt_proto)
        (tmp_dir / "vocab.json").write_text(json.dumps(src_vocab, ensure_ascii=False, indent=1), encoding="utf-8")
        extra: dict[str, Any] = {}
        if separate:
            (tmp_dir / "target_vocab.json").write_text(json.dumps(tgt_vocab, ensure_ascii=False, indent=1),
                                                 encoding="utf-8")
            extra = dict(target_vocab_file=str(tmp_dir / "target_vocab.json"), separate_vocabs=True)
        with quiet_marian_tokenizer():
            hf_tok = transformers.MarianTokenizer(
                source_spm=str(tmp_dir / "source.spm"), target_spm=str(tmp_dir / "target.spm"),
                vocab=str(tmp_dir / "vocab.json"),
                source_lang=cfg.data.src_lang, target_lang=cfg.data.tgt_lang, unk_token=UNK, eos_token=EOS,
                pad_token=PAD, bos_token=BOS, model_max_length=cfg.model.max_positions, **extra)
        hf_tok.save_pretrained(str(out))


def save_hf_dir(model: Transformer, cfg: Config, tokenizer: Tokenizer, out: Path,
                warn_generation: bool = True) -> None:
    """Write a MarianMTModel + MarianTokenizer directory for ``model`` into ``out``.

    ``warn_generation``: warn where generation_config.json cannot say what aiayn does (off
    for the CTranslate2 export, which does not read it).
    """
    transformers = require("transformers")
    check_exportable(cfg.model)
    for side, n_tok, n_model in (("source", tokenizer.src_vocab_size, cfg.model.src_vocab_size),
                                 ("target", tokenizer.tgt_vocab_size, cfg.model.tgt_vocab_size)):
        if n_tok != n_model:
            raise InteropError(f"the {side} tokenizer has {n_tok} pieces but the model "
                               f"{n_model} embedding rows: vocab.json cannot name every row")
    weights = marian_state_dict(model, cfg.model)
    hf_cfg = transformers.MarianConfig(**marian_config_kwargs(cfg))
    hf_model = transformers.MarianMTModel(hf_cfg).eval()
    target = hf_model.state_dict()
    missing = [k for k in target if k not in weights and "embed_positions" not in k]
    if missing:  # a transformers version with other parameter names
        raise InteropError(f"transformers {transformers.__version__}: unexpected MarianMTModel "
                           f"parameters {missing[:4]}")
    with torch.no_grad():
        for name, param in target.items():
            if name in weights:
                param.copy_(weights[name].view_as(param))
    _check_positions(hf_model, cfg.model)
    hf_model.generation_config = transformers.GenerationConfig(**generation_kwargs(cfg, warn_generation))
    hf_model.save_pretrained(str(out))
    write_tokenizer_files(tokenizer, out, cfg)


def _check_positions(hf_model: Any, cfg: ModelConfig) -> None:
    """HF builds its sinusoid table itself; it must be aiayn's concat table."""
    ours = sinusoid_table(cfg.max_positions, cfg.d_model, "concat")
    theirs = hf_model.model.encoder.embed_positions.weight.detach().float()
    if not torch.allclose(ours, theirs, atol=1e-6):
        raise InteropError("this transformers version's Marian position table differs from "
                           "aiayn's concat sinusoids; the export would not be exact")


def load_for_export(checkpoint: str | os.PathLike,
                    target: str = "HF MarianMT") -> tuple[Transformer, Config, Tokenizer]:
    """A checkpoint's model, config and tokenizer, once its architecture is known to export."""
    # Check the architecture before loading weights: the error should be about the model.
    check_exportable(load_checkpoint_config(resolve_checkpoint(checkpoint)).model, target)
    ckpt = load_checkpoint(checkpoint)
    if ckpt.tokenizer is None:
        raise InteropError(f"{ckpt.path}: the checkpoint has no tokenizer/ directory; the export "
                           "needs its SentencePiece model(s)")
    return ckpt.model, ckpt.config, ckpt.tokenizer


def export_hf(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, force: bool = False) -> Path:
    """``aiayn export hf``: write a directory ``MarianMTModel.from_pretrained`` loads."""
    require("transformers")
    model, cfg, tokenizer = load_for_export(checkpoint)
    with atomic_dir(out_dir, force, error=InteropError, inputs=[checkpoint]) as tmp:
        save_hf_dir(model, cfg, tokenizer, tmp)
    log.info("exported %s to %s (MarianMTModel, %s sinusoids%s)", checkpoint, out_dir,
             cfg.model.sinusoid_layout,
             ", model dimension permuted to the concat layout" if cfg.model.sinusoid_layout == "interleaved"
             else "")
    return Path(out_dir)

