"""Local Hugging Face MarianMT directory -> aiayn checkpoint (``aiayn import hf``).

Nothing is downloaded: the directory is read as it is (an OPUS-MT model saved with
``save_pretrained``, or an ``aiayn export hf`` directory). Its layers map onto aiayn's by
:func:`aiayn.interop.marian_format.tensor_map`; what aiayn cannot represent is refused
with the reason.

**Token ids.** aiayn needs pad 0, unk 1, bos 2, eos 3. Marian's decoder-start row
(its ``<pad>`` in OPUS-MT models) becomes aiayn's BOS (id 2), ``</s>`` becomes 3, ``<unk>``
1; the other rows follow in Marian's order. When Marian's pad and decoder start are the
same row (OPUS-MT), aiayn's PAD (id 0) is a new all-zero row whose output bias is
:data:`PAD_LOGIT_BIAS`, so that its probability is exactly 0 in float32 and the softmax
over the Marian rows is unchanged. The SentencePiece models are rewritten with pieces in
aiayn's id order (:mod:`aiayn.text.spm_proto`), so the imported checkpoint carries an
ordinary aiayn tokenizer.
"""

from __future__ import annotations

import json
import logging
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
from torch import Tensor

from aiayn.checkpoint.directory import save_checkpoint
from aiayn.config import Config, DataConfig, DecodeConfig, ModelConfig
from aiayn.config.coercion import short_repr
from aiayn.errors import InteropError
from aiayn.fileio import check_empty_dir
from aiayn.interop.marian_format import HF_LAYER_NORM_EPS, require, tensor_map
from aiayn.model import Transformer, build_model
from aiayn.text import spm_proto
from aiayn.text.spm_proto import CONTROL, NORMAL, UNKNOWN, UNUSED, Piece
from aiayn.text.tokenizer import Tokenizer
from aiayn.vocab import BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, UNK, UNK_ID

log = logging.getLogger(__name__)


# Output bias of the PAD row added on import. Its logit is then <= -100 + 0 (zero
# embedding), exp(-100 - max_logit) is far below float32 resolution next to the
# softmax's largest term (1), so log-softmax over the Marian rows is unchanged; and it is
# finite, so label smoothing stays finite when an imported model is fine-tuned.
PAD_LOGIT_BIAS = -100.0

MARIAN_FILES = ("config.json", "vocab.json", "source.spm", "target.spm")
_LANGUAGE_TOKEN = re.compile(r"^>>.+<<$")  # a multilingual model's target-language prefix, e.g. >>deu<<


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
    model_pieces = {p.piece: p for p in spm_proto.read_pieces(proto)}
    lowest = min((p.score for p in model_pieces.values()), default=0.0) - 1.0
    pieces = [Piece(PAD, 0.0, CONTROL), Piece(UNK, 0.0, UNKNOWN), Piece(BOS, 0.0, CONTROL),
              Piece(EOS, 0.0, CONTROL)]
    for name in mapping.pieces[4:]:
        p = model_pieces.get(name)
        if p is not None and p.type not in (UNKNOWN, CONTROL):
            pieces.append(Piece(p.piece, p.score, p.type))
        elif side == "target" and p is None and not _LANGUAGE_TOKEN.match(name) and not name.startswith("<marian:"):
            pieces.append(Piece(name, lowest, UNUSED))
        else:
            pieces.append(Piece(name, 0.0, CONTROL))
    dropped = [n for n, p in model_pieces.items() if p.type in (NORMAL, spm_proto.USER_DEFINED, spm_proto.BYTE)
               and n not in set(mapping.pieces)]
    if dropped:
        log.warning("%s SentencePiece model: %d pieces are not in the Marian vocabulary and are "
                    "dropped (e.g. %s)", side, len(dropped), dropped[:5])
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
    check_sizes(config, hf_dir)
    return config


# The sizes config.json may give, each bounded before anything is allocated: transformers
# builds the model from config.json before it reads a weight.
SIZE_LIMITS = {
    "d_model": 65536, "encoder_layers": 256, "decoder_layers": 256, "encoder_ffn_dim": 262144,
    "decoder_ffn_dim": 262144, "encoder_attention_heads": 1024, "decoder_attention_heads": 1024,
    "max_position_embeddings": 65536, "vocab_size": 4_000_000, "decoder_vocab_size": 4_000_000,
}
# transformers' MarianConfig defaults, for a config.json that leaves a size out.
MARIAN_DEFAULTS = {
    "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12, "encoder_ffn_dim": 4096,
    "decoder_ffn_dim": 4096, "encoder_attention_heads": 16, "decoder_attention_heads": 16,
    "max_position_embeddings": 1024, "vocab_size": 58101,
}
# The sinusoid table (max_position_embeddings x d_model) is computed, not stored: bounded apart.
POSITION_TABLE_LIMIT = 1 << 26
# Weights are stored in 2 bytes (fp16/bf16) or more: a config describing more parameters than
# the weight files could hold is refused before transformers allocates them.
_MIN_BYTES_PER_PARAMETER = 2


def check_sizes(config: dict[str, Any], hf_dir: Path) -> None:
    """Every size in ``config`` (config.json) within :data:`SIZE_LIMITS`, and the model it
    describes no larger than its weight files: an error naming the field otherwise."""
    where = hf_dir / "config.json"
    sizes: dict[str, int] = {}
    for name, limit in SIZE_LIMITS.items():
        value = config.get(name, MARIAN_DEFAULTS.get(name))
        if value is None and name == "decoder_vocab_size":  # null: the source vocabulary's size
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise InteropError(f"{where}: {name}: expected a positive integer, got {short_repr(value)}")
        if not 1 <= value <= limit:
            raise InteropError(f"{where}: {name}={value}: out of range (1 to {limit:,})")
        sizes[name] = value
    d = sizes["d_model"]
    if sizes["max_position_embeddings"] * d > POSITION_TABLE_LIMIT:
        raise InteropError(f"{where}: max_position_embeddings={sizes['max_position_embeddings']} x d_model={d}: "
                           f"a position table over {POSITION_TABLE_LIMIT:,} values")
    parameters = (sizes["vocab_size"] * d + sizes["encoder_layers"] * (4 * d * d + 2 * d * sizes["encoder_ffn_dim"])
                  + sizes["decoder_layers"] * (8 * d * d + 2 * d * sizes["decoder_ffn_dim"]))
    stored = sum(p.stat().st_size for p in hf_dir.iterdir()
                 if p.is_file() and p.suffix in (".safetensors", ".bin"))
    if parameters * _MIN_BYTES_PER_PARAMETER > stored:
        raise InteropError(f"{where}: its sizes (d_model={d}, encoder_layers={sizes['encoder_layers']}, "
                           f"decoder_layers={sizes['decoder_layers']}, vocab_size={sizes['vocab_size']}, ...) "
                           f"describe {parameters:,} parameters, but the weight files hold {stored:,} bytes")


def _import_checks(hf_config: Any, hf_dir: Path) -> str:
    """The aiayn activation name; errors for what aiayn cannot represent."""
    reasons = []
    activation = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}.get(
        hf_config.activation_function)
    if activation is None:
        reasons.append(f"activation_function={hf_config.activation_function!r} (aiayn has relu, gelu, swish)")
    if not hf_config.scale_embedding:
        reasons.append("scale_embedding=false (aiayn always scales embeddings by sqrt(d_model))")
    if hf_config.encoder_attention_heads != hf_config.decoder_attention_heads:
        reasons.append("different encoder and decoder head counts")
    if hf_config.encoder_ffn_dim != hf_config.decoder_ffn_dim:
        reasons.append("different encoder and decoder FFN sizes")
    if reasons:
        raise InteropError(f"{hf_dir}: cannot import: " + "; ".join(reasons))
    return activation  # type: ignore[return-value]


def load_marian(hf_dir: str | os.PathLike) -> tuple[Transformer, Config, Tokenizer]:
    """A local MarianMT directory as an aiayn model, config and tokenizer."""
    transformers = require("transformers")
    hf_dir = Path(hf_dir)
    raw_config = check_marian_dir(hf_dir)
    hf_model = _load_hf_model(transformers, hf_dir)
    hf_config = hf_model.config
    activation = _import_checks(hf_config, hf_dir)
    tok_cfg = _read_optional_json(hf_dir / "tokenizer_config.json")
    shared = bool(hf_config.share_encoder_decoder_embeddings)
    tie = bool(getattr(hf_config, "tie_word_embeddings", True))
    src_vocab, tgt_vocab = _marian_vocabs(hf_dir, tok_cfg, shared)
    hf_weights = {k: v.detach().float() for k, v in hf_model.state_dict().items()}
    src_map, tgt_map = _vocab_mappings(hf_dir, hf_config, tok_cfg, src_vocab, tgt_vocab, hf_weights, shared)
    share_mode = "all" if shared and tie else ("decoder" if tie else "none")
    if shared and not tie:
        log.warning("%s: shared source/target embeddings with a separate output projection; aiayn "
                    "keeps two equal embedding copies (they drift apart if fine-tuned)", hf_dir)
    model_cfg = _imported_model_config(hf_config, activation, share_mode, len(src_map), len(tgt_map))
    model = _imported_model(model_cfg, hf_weights, src_map, tgt_map)
    tokenizer = _imported_tokenizer(hf_dir, src_map, tgt_map, shared)
    # A multilingual model: its source vocabulary holds target-language tags (>>fra<<), kept as
    # control pieces; the source starts with one (data.tgt_lang_tag, chosen by --tgt-lang).
    langs = tokenizer.lang_tags()
    if langs:
        log.info("multilingual model: %d target-language tags (%s); translate with --tgt-lang", len(langs),
                 ", ".join(t[2:-2] for t in langs[:10]) + (" ..." if len(langs) > 10 else ""))
    data = DataConfig(src_lang=tok_cfg.get("source_lang") or "src", tgt_lang=tok_cfg.get("target_lang") or "tgt",
                      vocab_size=len(src_map), joint_vocab=tokenizer.joint, tgt_vocab_size=len(tgt_map),
                      tgt_lang_tag=bool(langs))
    cfg = Config(model=model_cfg, data=data, decode=_imported_decode_config(hf_dir, raw_config))
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


def _vocab_mappings(hf_dir: Path, hf_config: Any, tok_cfg: dict[str, Any], src_vocab: dict[str, int],
                    tgt_vocab: dict[str, int], hf_weights: dict[str, Tensor], shared: bool
                    ) -> tuple[VocabMapping, VocabMapping]:
    """Source and target id mappings (one shared mapping when the embeddings are shared)."""
    names = {k: _token_name(tok_cfg.get(f"{k}_token"), d) for k, d in (("pad", PAD), ("eos", EOS), ("unk", UNK))}
    n_src = hf_weights["model.encoder.embed_tokens.weight"].shape[0]
    n_tgt = hf_weights["model.decoder.embed_tokens.weight"].shape[0]
    start = hf_config.decoder_start_token_id
    if start is None:
        start = hf_config.pad_token_id
    eos = hf_config.eos_token_id
    if not isinstance(eos, int):
        eos = _piece_id(tgt_vocab, names["eos"], hf_dir)
    tgt_map = vocab_mapping(tgt_vocab, n_tgt, unk=_piece_id(tgt_vocab, names["unk"], hf_dir), eos=eos,
                            start=start, pad=hf_config.pad_token_id)
    if shared:
        return tgt_map, tgt_map
    src_map = vocab_mapping(src_vocab, n_src, unk=_piece_id(src_vocab, names["unk"], hf_dir),
                            eos=_piece_id(src_vocab, names["eos"], hf_dir), start=None,
                            pad=src_vocab.get(names["pad"]))
    return src_map, tgt_map


def _imported_model_config(hf_config: Any, activation: str, share_mode: str, src_vocab_size: int,
                           tgt_vocab_size: int) -> ModelConfig:
    return ModelConfig(
        src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, d_model=hf_config.d_model,
        n_heads=hf_config.encoder_attention_heads, d_ff=hf_config.encoder_ffn_dim,
        n_encoder_layers=hf_config.encoder_layers, n_decoder_layers=hf_config.decoder_layers,
        dropout=float(hf_config.dropout), attention_dropout=float(hf_config.attention_dropout),
        activation_dropout=float(hf_config.activation_dropout), activation=activation,
        positions="sinusoidal", sinusoid_layout="concat", norm="post", share_embeddings=share_mode,
        max_positions=hf_config.max_position_embeddings, pad_id=PAD_ID, layer_norm_eps=HF_LAYER_NORM_EPS,
        output_bias=True,
    )


def _imported_model(model_cfg: ModelConfig, hf_weights: dict[str, Tensor], src_map: VocabMapping,
                    tgt_map: VocabMapping) -> Transformer:
    """An aiayn model with Marian's weights, the vocabulary rows in aiayn's id order."""
    model = build_model(model_cfg).eval()
    weights: dict[str, Tensor] = {}
    for hf_name, ai_name, _ in tensor_map(model_cfg):
        weights[ai_name] = hf_weights[hf_name]
    weights["src_embed.weight"] = _gather_rows(hf_weights["model.encoder.embed_tokens.weight"], src_map)
    weights["tgt_embed.weight"] = _gather_rows(hf_weights["model.decoder.embed_tokens.weight"], tgt_map)
    if model_cfg.share_embeddings == "none":
        weights["output_projection.weight"] = _gather_rows(hf_weights["lm_head.weight"], tgt_map)
    weights["output_bias"] = _gather_rows(hf_weights["final_logits_bias"].reshape(-1), tgt_map, fill=PAD_LOGIT_BIAS)
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


def _piece_id(vocab: dict[str, int], name: str, hf_dir: Path) -> int:
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
