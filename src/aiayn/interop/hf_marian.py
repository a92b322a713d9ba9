"""Hugging Face MarianMT <-> aiayn: export a checkpoint, import a local Marian directory.

**Architecture.** HF Marian is the paper's post-norm Transformer with embeddings scaled by
sqrt(d_model), fixed sinusoids in the "concat" layout (all sines, then all cosines),
LayerNorm eps 1e-5, biases everywhere, a ``final_logits_bias``, positions starting at 0.
An aiayn model with the paper's *interleaved* sinusoids is exported exactly by permuting
the model dimension through every weight (:func:`model_dim_permutation`): LayerNorm, dot
products and the residual sums do not care about the order of the d_model features, so the
permuted model computes the same logits. Pre-norm stacks, learned positions, d_k != d_model
/ h, or another LayerNorm eps have no HF Marian equivalent and are refused with the reason.

**Token ids (export).** aiayn's ids are kept as they are: ``vocab.json`` maps each
SentencePiece piece to its aiayn id, and ``source.spm`` / ``target.spm`` are the aiayn
SentencePiece models. So ``<pad>`` = 0 (HF ``pad_token_id``), ``<unk>`` = 1, ``<s>`` = 2
(HF ``decoder_start_token_id``: the decoder starts from aiayn's BOS embedding row, exactly
as aiayn's search does) and ``</s>`` = 3 (``eos_token_id``). OPUS-MT models use one id for
padding and decoder start, but nothing in ``transformers`` requires it: the encoder's
padding rows are masked by ``attention_mask`` and generation reads
``decoder_start_token_id``. ``<s>`` is declared the tokenizer's ``bos_token`` so that
``batch_decode(..., skip_special_tokens=True)`` drops it. ``generation_config.json``
suppresses ``<pad>`` and ``<s>`` (``bad_words_ids``) as aiayn's search does.

**Token ids (import).** aiayn needs pad 0, unk 1, bos 2, eos 3. Marian's decoder-start row
(its ``<pad>`` in OPUS-MT models) becomes aiayn's BOS (id 2), ``</s>`` becomes 3, ``<unk>``
1; the other rows follow in Marian's order. When Marian's pad and decoder start are the
same row (OPUS-MT), aiayn's PAD (id 0) is a new all-zero row whose output bias is
:data:`PAD_LOGIT_BIAS`, so that its probability is exactly 0 in float32 and the softmax
over the Marian rows is unchanged. The SentencePiece models are rewritten with pieces in
aiayn's id order (:mod:`aiayn.interop.spm_proto`), so the imported checkpoint carries an
ordinary aiayn tokenizer.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
from torch import Tensor

from aiayn.checkpoint.directory import load_checkpoint, load_checkpoint_config, resolve_checkpoint, save_checkpoint
from aiayn.config import Config, DataConfig, DecodeConfig, ModelConfig
from aiayn.errors import InteropError
from aiayn.fileio import atomic_dir, check_empty_dir
from aiayn.interop import spm_proto
from aiayn.interop.spm_proto import CONTROL, NORMAL, UNKNOWN, UNUSED, Piece
from aiayn.model import Transformer, build_model
from aiayn.model.embeddings import sinusoid_table
from aiayn.text.tokenizer import Tokenizer
from aiayn.vocab import BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, UNK, UNK_ID

log = logging.getLogger(__name__)


# Output bias of the PAD row added on import. Its logit is then <= -100 + 0 (zero
# embedding), exp(-100 - max_logit) is far below float32 resolution next to the
# softmax's largest term (1), so log-softmax over the Marian rows is unchanged; and it is
# finite, so label smoothing stays finite when an imported model is fine-tuned.
PAD_LOGIT_BIAS = -100.0

HF_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which HF Marian does not configure
MARIAN_FILES = ("config.json", "vocab.json", "source.spm", "target.spm")
_LANG_CODE = re.compile(r"^>>.+<<$")


def require(module: str) -> Any:
    """Import an optional dependency (extra ``interop``) or say how to install it."""
    try:
        return __import__(module)
    except ImportError:
        raise InteropError(f"this needs the '{module}' package: pip install 'aiayn[interop]'") from None


@contextmanager
def quiet_marian_tokenizer() -> Iterator[None]:
    """MarianTokenizer recommends sacremoses on every construction; it only uses it in an
    optional ``normalize`` method that nothing here calls."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Recommended: pip install sacremoses")
        yield


# ========================================================================== export


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


def _layer_map(prefix_hf: str, prefix_aiayn: str, decoder: bool) -> list[tuple[str, str, str]]:
    """(hf name, aiayn name, kind) of one layer's tensors; kind says how the model
    dimension enters: 'in' (columns), 'out' (rows and bias), 'norm' (vector)."""
    out: list[tuple[str, str, str]] = []
    blocks = [("self_attn", "self_attn", "self_attn_layer_norm", "self_attn_norm")]
    if decoder:
        blocks.append(("encoder_attn", "cross_attn", "encoder_attn_layer_norm", "cross_attn_norm"))
    for hf_attn, ai_attn, hf_norm, ai_norm in blocks:
        for hf_proj, ai_proj in (("q_proj", "w_q"), ("k_proj", "w_k"), ("v_proj", "w_v")):
            out.append((f"{prefix_hf}.{hf_attn}.{hf_proj}.weight", f"{prefix_aiayn}.{ai_attn}.{ai_proj}.weight", "in"))
            out.append((f"{prefix_hf}.{hf_attn}.{hf_proj}.bias", f"{prefix_aiayn}.{ai_attn}.{ai_proj}.bias", "none"))
        out.append((f"{prefix_hf}.{hf_attn}.out_proj.weight", f"{prefix_aiayn}.{ai_attn}.w_o.weight", "out"))
        out.append((f"{prefix_hf}.{hf_attn}.out_proj.bias", f"{prefix_aiayn}.{ai_attn}.w_o.bias", "norm"))
        out.append((f"{prefix_hf}.{hf_norm}.weight", f"{prefix_aiayn}.{ai_norm}.weight", "norm"))
        out.append((f"{prefix_hf}.{hf_norm}.bias", f"{prefix_aiayn}.{ai_norm}.bias", "norm"))
    out += [
        (f"{prefix_hf}.fc1.weight", f"{prefix_aiayn}.ffn.w_1.weight", "in"),
        (f"{prefix_hf}.fc1.bias", f"{prefix_aiayn}.ffn.w_1.bias", "none"),
        (f"{prefix_hf}.fc2.weight", f"{prefix_aiayn}.ffn.w_2.weight", "out"),
        (f"{prefix_hf}.fc2.bias", f"{prefix_aiayn}.ffn.w_2.bias", "norm"),
        (f"{prefix_hf}.final_layer_norm.weight", f"{prefix_aiayn}.ffn_norm.weight", "norm"),
        (f"{prefix_hf}.final_layer_norm.bias", f"{prefix_aiayn}.ffn_norm.bias", "norm"),
    ]
    return out


def tensor_map(cfg: ModelConfig) -> list[tuple[str, str, str]]:
    """Every layer tensor as (hf name, aiayn name, kind); embeddings are handled apart."""
    names: list[tuple[str, str, str]] = []
    for i in range(cfg.n_encoder_layers):
        names += _layer_map(f"model.encoder.layers.{i}", f"encoder_layers.{i}", decoder=False)
    for i in range(cfg.n_decoder_layers):
        names += _layer_map(f"model.decoder.layers.{i}", f"decoder_layers.{i}", decoder=True)
    return names


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
    sd = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    out: dict[str, Tensor] = {}
    for hf_name, ai_name, kind in tensor_map(cfg):
        out[hf_name] = _permute(sd[ai_name], kind, perm).contiguous()
    src = _permute(sd["src_embed.weight"], "in", perm)
    tgt = _permute(sd["tgt_embed.weight"], "in", perm)
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
            out["lm_head.weight"] = _permute(sd["output_projection.weight"], "in", perm)
    bias = sd.get("output_bias")
    out["final_logits_bias"] = (bias if bias is not None else torch.zeros(cfg.tgt_vocab_size))[None, :]
    return {k: v.contiguous() for k, v in out.items()}


def marian_config_kwargs(cfg: Config) -> dict[str, Any]:
    """``MarianConfig`` arguments equivalent to ``cfg.model`` (see the module docstring)."""
    m = cfg.model
    return dict(
        architectures=["MarianMTModel"],
        vocab_size=m.src_vocab_size,
        decoder_vocab_size=m.tgt_vocab_size,
        d_model=m.d_model,
        encoder_layers=m.n_encoder_layers,
        decoder_layers=m.n_decoder_layers,
        encoder_attention_heads=m.n_heads,
        decoder_attention_heads=m.n_heads,
        encoder_ffn_dim=m.d_ff,
        decoder_ffn_dim=m.d_ff,
        activation_function=m.activation,  # relu | gelu (erf) | swish: same names in HF
        dropout=m.dropout,
        attention_dropout=m.attention_dropout,
        activation_dropout=m.activation_dropout,
        max_position_embeddings=m.max_positions,
        scale_embedding=True,
        share_encoder_decoder_embeddings=m.share_embeddings == "all",
        tie_word_embeddings=m.share_embeddings != "none",
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
    d = cfg.decode
    if warn and d.lenpen_style != "fairseq" and d.beam > 1 and d.lenpen != 0:
        log.warning("generation_config.json: transformers divides by |Y|^alpha (aiayn's lenpen_style "
                    "fairseq), this model's decode section uses %s; length_penalty=%g is written as is, "
                    "so HF beam search can pick other hypotheses than `aiayn translate` (which matches it "
                    "with --lenpen-style fairseq)", d.lenpen_style, d.lenpen)
    max_length = min(cfg.model.max_positions, int(d.max_len_a * cfg.data.max_len + d.max_len_b) + 2)
    gen: dict[str, Any] = dict(
        num_beams=d.beam,
        length_penalty=d.lenpen,
        early_stopping=True,
        max_length=max_length,
        decoder_start_token_id=BOS_ID,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        forced_eos_token_id=EOS_ID,
        bad_words_ids=[[PAD_ID], [BOS_ID]],
    )
    if d.min_len > 0:
        gen["min_new_tokens"] = d.min_len
    if d.no_repeat_ngram_size > 0:
        gen["no_repeat_ngram_size"] = d.no_repeat_ngram_size
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
        t = Path(tmp)
        (t / "source.spm").write_bytes(src_proto)
        (t / "target.spm").write_bytes(tgt_proto)
        (t / "vocab.json").write_text(json.dumps(src_vocab, ensure_ascii=False, indent=1), encoding="utf-8")
        extra: dict[str, Any] = {}
        if separate:
            (t / "target_vocab.json").write_text(json.dumps(tgt_vocab, ensure_ascii=False, indent=1),
                                                 encoding="utf-8")
            extra = dict(target_vocab_file=str(t / "target_vocab.json"), separate_vocabs=True)
        with quiet_marian_tokenizer():
            hf_tok = transformers.MarianTokenizer(
                source_spm=str(t / "source.spm"), target_spm=str(t / "target.spm"), vocab=str(t / "vocab.json"),
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
        for name, t in target.items():
            if name in weights:
                t.copy_(weights[name].view_as(t))
    _check_positions(hf_model, cfg.model)
    hf_model.generation_config = transformers.GenerationConfig(**generation_kwargs(cfg, warn_generation))
    hf_model.save_pretrained(str(out))
    write_tokenizer_files(tokenizer, out, cfg)


def _check_positions(hf_model: Any, cfg: ModelConfig) -> None:
    # HF builds its sinusoid table itself; it must be aiayn's concat table.

    ours = sinusoid_table(cfg.max_positions, cfg.d_model, "concat")
    theirs = hf_model.model.encoder.embed_positions.weight.detach().float()
    if not torch.allclose(ours, theirs, atol=1e-6):
        raise InteropError("this transformers version's Marian position table differs from "
                           "aiayn's concat sinusoids; the export would not be exact")


def load_for_export(checkpoint: str | os.PathLike,
                    target: str = "HF MarianMT") -> tuple[Transformer, Config, Tokenizer]:

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


# ========================================================================== import


@dataclass
class VocabMapping:
    """How one side's aiayn ids map to Marian rows.

    ``rows[i]``: the Marian embedding row of aiayn id i (None: a new zero row);
    ``pieces[i]``: the piece string of aiayn id i.
    """

    rows: list[int | None]
    pieces: list[str]

    def __len__(self) -> int:
        return len(self.rows)

    def marian_to_aiayn(self) -> dict[int, int]:
        return {r: i for i, r in enumerate(self.rows) if r is not None}


def vocab_mapping(vocab: dict[str, int], n_rows: int, *, unk: int, eos: int, start: int | None,
                  pad: int | None) -> VocabMapping:
    """aiayn order: PAD, UNK, BOS (Marian's decoder start), EOS, then Marian's rows.

    ``start`` None (a source side) gives BOS a new zero row; ``pad`` None or equal to
    ``start`` gives PAD one.
    """
    names: dict[int, str] = {}
    for piece, i in vocab.items():
        if 0 <= i < n_rows:
            names.setdefault(i, piece)
    pad_row = pad if pad is not None and pad != start else None
    head: list[int | None] = [pad_row, unk, start, eos]
    taken = {r for r in head if r is not None}
    marian_rows = [r for r in range(n_rows) if r not in taken]
    rows = head + marian_rows
    specials = (PAD, UNK, BOS, EOS)
    pieces = list(specials)
    for r in marian_rows:
        name = names.get(r, f"<marian:{r}>")  # a row vocab.json does not name
        if name in specials:  # e.g. a Marian vocabulary with its own "<s>" entry
            name = f"<marian:{name}>"
        pieces.append(name)
    return VocabMapping(rows, pieces)


def _gather_rows(weight: Tensor, mapping: VocabMapping, fill: float = 0.0) -> Tensor:
    """Marian rows (V, ...) -> aiayn order (V', ...); new rows are ``fill``."""
    out = weight.new_full((len(mapping),) + tuple(weight.shape[1:]), fill)
    idx = [i for i, r in enumerate(mapping.rows) if r is not None]
    src = [r for r in mapping.rows if r is not None]
    out[idx] = weight[src]
    return out


def rebuild_spm(proto: bytes, mapping: VocabMapping, side: str) -> bytes:
    """The Marian SentencePiece model with its pieces re-numbered to aiayn's ids.

    A vocabulary entry the model does not have is a CONTROL piece on the source side
    (never produced by encoding, so segmentation is exactly the original) and an UNUSED one
    on the target side (never produced either, but decoded as its text, as HF does); its
    score is below every real piece so that BPE would try it last. Pieces of the model that
    the vocabulary lacks are dropped (HF maps them to <unk>; aiayn segments around them).
    """
    own = {p.piece: p for p in spm_proto.read_pieces(proto)}
    lowest = min((p.score for p in own.values()), default=0.0) - 1.0
    pieces = [Piece(PAD, 0.0, CONTROL), Piece(UNK, 0.0, UNKNOWN), Piece(BOS, 0.0, CONTROL),
              Piece(EOS, 0.0, CONTROL)]
    for name in mapping.pieces[4:]:
        p = own.get(name)
        if p is not None and p.type not in (UNKNOWN, CONTROL):
            pieces.append(Piece(p.piece, p.score, p.type))
        elif side == "target" and p is None and not _LANG_CODE.match(name) and not name.startswith("<marian:"):
            pieces.append(Piece(name, lowest, UNUSED))
        else:
            pieces.append(Piece(name, 0.0, CONTROL))
    dropped = [n for n, p in own.items() if p.type in (NORMAL, spm_proto.USER_DEFINED, spm_proto.BYTE)
               and n not in set(mapping.pieces)]
    if dropped:
        log.warning("%s SentencePiece model: %d pieces are not in the Marian vocabulary and are "
                    "dropped (e.g. %s)", side, len(dropped), dropped[:5])
    langs = [n for n in mapping.pieces if _LANG_CODE.match(n)]
    if langs and side == "source":
        log.warning("the vocabulary has %d target-language tokens (e.g. %s); aiayn's tokenizer does "
                    "not insert them: multilingual prefixes are not supported", len(langs), langs[:3])
    return spm_proto.rebuild_model(proto, pieces, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InteropError(f"{path}: cannot read JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InteropError(f"{path}: expected a JSON object")
    return data


def check_marian_dir(hf_dir: Path) -> dict[str, Any]:
    """The config.json of a local Marian directory, or an error naming what is wrong."""
    if not hf_dir.is_dir():
        raise InteropError(f"{hf_dir}: no such directory (import needs a local MarianMT directory; "
                           "nothing is downloaded)")
    if not (hf_dir / "config.json").is_file():
        raise InteropError(f"{hf_dir}: not a Hugging Face model directory (no config.json)")
    config = _read_json(hf_dir / "config.json")
    model_type = config.get("model_type")
    if model_type != "marian":
        raise InteropError(f"{hf_dir}: not a Marian model (config.json has model_type={model_type!r}, "
                           "expected 'marian')")
    missing = [f for f in MARIAN_FILES[1:] if not (hf_dir / f).is_file()]
    if missing:
        raise InteropError(f"{hf_dir}: Marian tokenizer files missing: {', '.join(missing)}")
    if not any((hf_dir / f).is_file() for f in ("model.safetensors", "pytorch_model.bin",
                                                "model.safetensors.index.json")):
        raise InteropError(f"{hf_dir}: no weights (model.safetensors or pytorch_model.bin)")
    return config


def _import_checks(c: Any, hf_dir: Path) -> str:
    """The aiayn activation name; errors for what aiayn cannot represent."""
    reasons = []
    act = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}.get(c.activation_function)
    if act is None:
        reasons.append(f"activation_function={c.activation_function!r} (aiayn has relu, gelu, swish)")
    if not c.scale_embedding:
        reasons.append("scale_embedding=false (aiayn always scales embeddings by sqrt(d_model))")
    if c.encoder_attention_heads != c.decoder_attention_heads:
        reasons.append("different encoder and decoder head counts")
    if c.encoder_ffn_dim != c.decoder_ffn_dim:
        reasons.append("different encoder and decoder FFN sizes")
    if reasons:
        raise InteropError(f"{hf_dir}: cannot import: " + "; ".join(reasons))
    return act  # type: ignore[return-value]


def load_marian(hf_dir: str | os.PathLike) -> tuple[Transformer, Config, Tokenizer]:
    """A local MarianMT directory as an aiayn model, config and tokenizer."""
    transformers = require("transformers")
    hf_dir = Path(hf_dir)
    raw_config = check_marian_dir(hf_dir)
    hf_model = _load_hf_model(transformers, hf_dir)
    c = hf_model.config
    activation = _import_checks(c, hf_dir)
    tok_cfg = _read_optional_json(hf_dir / "tokenizer_config.json")
    shared = bool(c.share_encoder_decoder_embeddings)
    tie = bool(getattr(c, "tie_word_embeddings", True))
    src_vocab, tgt_vocab = _marian_vocabs(hf_dir, tok_cfg, shared)
    sd = {k: v.detach().float() for k, v in hf_model.state_dict().items()}
    src_map, tgt_map = _vocab_mappings(hf_dir, c, tok_cfg, src_vocab, tgt_vocab, sd, shared)
    share_mode = "all" if shared and tie else ("decoder" if tie else "none")
    if shared and not tie:
        log.warning("%s: shared source/target embeddings with a separate output projection; aiayn "
                    "keeps two equal embedding copies (they drift apart if fine-tuned)", hf_dir)
    mcfg = _imported_model_config(c, activation, share_mode, len(src_map), len(tgt_map))
    model = _imported_model(mcfg, sd, src_map, tgt_map)
    tokenizer = _imported_tokenizer(hf_dir, src_map, tgt_map, shared)
    data = DataConfig(src_lang=tok_cfg.get("source_lang") or "src", tgt_lang=tok_cfg.get("target_lang") or "tgt",
                      vocab_size=len(src_map), joint_vocab=tokenizer.joint, tgt_vocab_size=len(tgt_map))
    cfg = Config(model=mcfg, data=data, decode=_imported_decode_config(hf_dir, raw_config))
    cfg.validate()
    return model, cfg, tokenizer


def _load_hf_model(transformers: Any, hf_dir: Path) -> Any:
    try:
        with warnings.catch_warnings():  # torch's unpickler warns about protocols: noise here
            warnings.simplefilter("ignore")
            return transformers.MarianMTModel.from_pretrained(str(hf_dir)).float().eval()
    except Exception as exc:  # untrusted files: a truncated safetensors, a refused pickle, ...
        if type(exc).__name__ == "UnpicklingError":
            raise InteropError(f"{hf_dir}: pytorch_model.bin holds pickled objects other than tensors; refused "
                               "(loading it could run code); convert it to model.safetensors where it is trusted"
                               ) from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise InteropError(f"{hf_dir}: transformers cannot load the model ({type(exc).__name__}: {first})") from None


def _read_optional_json(path: Path) -> dict[str, Any]:
    return _read_json(path) if path.is_file() else {}


def _marian_vocabs(hf_dir: Path, tok_cfg: dict[str, Any], shared: bool) -> tuple[dict[str, int], dict[str, int]]:
    """vocab.json, and target_vocab.json where the tokenizer has separate vocabularies."""
    separate = bool(tok_cfg.get("separate_vocabs", False))
    if shared and separate:
        raise InteropError(f"{hf_dir}: shared embeddings but separate vocabularies (separate_vocabs)")
    src_vocab = {str(k): int(v) for k, v in _read_json(hf_dir / "vocab.json").items()}
    if not separate:
        return src_vocab, src_vocab
    if not (hf_dir / "target_vocab.json").is_file():
        raise InteropError(f"{hf_dir}: separate_vocabs is set but target_vocab.json is missing")
    return src_vocab, {str(k): int(v) for k, v in _read_json(hf_dir / "target_vocab.json").items()}


def _vocab_mappings(hf_dir: Path, c: Any, tok_cfg: dict[str, Any], src_vocab: dict[str, int],
                    tgt_vocab: dict[str, int], sd: dict[str, Tensor], shared: bool
                    ) -> tuple[VocabMapping, VocabMapping]:
    """Source and target id mappings (one shared mapping when the embeddings are shared)."""
    names = {k: _token_name(tok_cfg.get(f"{k}_token"), d) for k, d in (("pad", PAD), ("eos", EOS), ("unk", UNK))}
    n_src = sd["model.encoder.embed_tokens.weight"].shape[0]
    n_tgt = sd["model.decoder.embed_tokens.weight"].shape[0]
    start = c.decoder_start_token_id if c.decoder_start_token_id is not None else c.pad_token_id
    eos = c.eos_token_id if isinstance(c.eos_token_id, int) else _id(tgt_vocab, names["eos"], hf_dir)
    tgt_map = vocab_mapping(tgt_vocab, n_tgt, unk=_id(tgt_vocab, names["unk"], hf_dir), eos=eos,
                            start=start, pad=c.pad_token_id)
    if shared:
        return tgt_map, tgt_map
    src_map = vocab_mapping(src_vocab, n_src, unk=_id(src_vocab, names["unk"], hf_dir),
                            eos=_id(src_vocab, names["eos"], hf_dir), start=None,
                            pad=src_vocab.get(names["pad"]))
    return src_map, tgt_map


def _imported_model_config(c: Any, activation: str, share_mode: str, src_vocab_size: int,
                           tgt_vocab_size: int) -> ModelConfig:
    return ModelConfig(
        src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, d_model=c.d_model,
        n_heads=c.encoder_attention_heads, d_ff=c.encoder_ffn_dim,
        n_encoder_layers=c.encoder_layers, n_decoder_layers=c.decoder_layers,
        dropout=float(c.dropout), attention_dropout=float(c.attention_dropout),
        activation_dropout=float(c.activation_dropout), activation=activation,
        positions="sinusoidal", sinusoid_layout="concat", norm="post", share_embeddings=share_mode,
        max_positions=c.max_position_embeddings, pad_id=PAD_ID, layer_norm_eps=HF_LAYER_NORM_EPS,
        output_bias=True,
    )


def _imported_model(mcfg: ModelConfig, sd: dict[str, Tensor], src_map: VocabMapping,
                    tgt_map: VocabMapping) -> Transformer:
    """An aiayn model with Marian's weights, the vocabulary rows in aiayn's id order."""
    model = build_model(mcfg).eval()
    weights: dict[str, Tensor] = {}
    for hf_name, ai_name, _ in tensor_map(mcfg):
        weights[ai_name] = sd[hf_name]
    weights["src_embed.weight"] = _gather_rows(sd["model.encoder.embed_tokens.weight"], src_map)
    weights["tgt_embed.weight"] = _gather_rows(sd["model.decoder.embed_tokens.weight"], tgt_map)
    if mcfg.share_embeddings == "none":
        weights["output_projection.weight"] = _gather_rows(sd["lm_head.weight"], tgt_map)
    weights["output_bias"] = _gather_rows(sd["final_logits_bias"].reshape(-1), tgt_map, fill=PAD_LOGIT_BIAS)
    state = model.state_dict()
    with torch.no_grad():
        for name, t in state.items():
            t.copy_(weights[name])
    return model


def _imported_tokenizer(hf_dir: Path, src_map: VocabMapping, tgt_map: VocabMapping, shared: bool) -> Tokenizer:
    """Marian's SentencePiece models, their pieces renumbered to aiayn's ids."""
    src_bytes = (hf_dir / "source.spm").read_bytes()
    tgt_bytes = (hf_dir / "target.spm").read_bytes()
    try:
        src_proto = rebuild_spm(src_bytes, src_map, "source")
        tgt_proto = rebuild_spm(tgt_bytes, tgt_map, "target")
    except spm_proto.ProtoError as exc:
        raise InteropError(f"{hf_dir}: source.spm/target.spm are not SentencePiece models: {exc}") from None
    if shared and src_bytes == tgt_bytes:
        return Tokenizer(_processor(src_proto), src_proto=src_proto)
    return Tokenizer(_processor(src_proto), _processor(tgt_proto), src_proto=src_proto, tgt_proto=tgt_proto)


def _processor(proto: bytes) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(proto)
    return sp


def _imported_decode_config(hf_dir: Path, raw_config: dict[str, Any]) -> DecodeConfig:
    """Decoding settings: generation_config.json, else (older exports) config.json, else HF's defaults."""
    gen = _read_optional_json(hf_dir / "generation_config.json")

    def setting(name: str, default: Any) -> Any:
        value = gen.get(name, raw_config.get(name))
        return default if value is None else value

    return DecodeConfig(
        beam=int(setting("num_beams", 1)),
        lenpen=float(setting("length_penalty", 1.0)),
        lenpen_style="fairseq",
        no_repeat_ngram_size=int(setting("no_repeat_ngram_size", 0)),
    )


def _token_name(value: Any, default: str) -> str:
    # tokenizer_config.json stores special tokens as strings or as AddedToken dicts.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else default


def _id(vocab: dict[str, int], name: str, hf_dir: Path) -> int:
    if name not in vocab:
        raise InteropError(f"{hf_dir}: vocab.json has no {name!r} entry")
    return vocab[name]


def import_hf(hf_dir: str | os.PathLike, out_checkpoint: str | os.PathLike, force: bool = False) -> Path:
    """``aiayn import hf``: convert a local MarianMT directory into an aiayn checkpoint."""

    out = check_empty_dir(out_checkpoint, force, InteropError, inputs=[hf_dir])
    model, cfg, tokenizer = load_marian(hf_dir)
    state = {"step": 0, "imported_from": str(Path(hf_dir).resolve()), "source_format": "hf-marian"}
    path = save_checkpoint(out, model, cfg, tokenizer=tokenizer, state=state)
    log.info("imported %s into %s (%d/%d source/target ids, %s embeddings)", hf_dir, path,
             cfg.model.src_vocab_size, cfg.model.tgt_vocab_size, cfg.model.share_embeddings)
    return path
