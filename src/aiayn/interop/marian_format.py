"""What the HF MarianMT export and import share: the architecture and its parameter names.

HF Marian is the paper's post-norm Transformer with embeddings scaled by sqrt(d_model),
fixed sinusoids in the "concat" layout (all sines, then all cosines), LayerNorm eps 1e-5,
biases everywhere, a ``final_logits_bias``, positions starting at 0. :func:`tensor_map`
names each layer tensor on both sides; the export (:mod:`aiayn.interop.hf_export`) and the
import (:mod:`aiayn.interop.hf_import`) read it in opposite directions.

The ``interop`` extra's packages are optional: :func:`require` imports one or says how to
install it.
"""

from __future__ import annotations

from typing import Any

from aiayn.config import ModelConfig
from aiayn.errors import InteropError

HF_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which HF Marian does not configure


def require(module: str) -> Any:
    """Import an optional dependency (extra ``interop``) or say how to install it."""
    try:
        return __import__(module)
    except ImportError:
        raise InteropError(f"this needs the '{module}' package: pip install 'aiayn[interop]'") from None


def _layer_tensors(prefix_hf: str, prefix_aiayn: str, decoder: bool) -> list[tuple[str, str, str]]:
    """(hf name, aiayn name, kind) of one layer's tensors; kind says how the model
    dimension enters: 'in' (columns), 'out' (rows), 'norm' (a vector over it), 'none' (not
    at all: the bias of a projection out of it)."""
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
        names += _layer_tensors(f"model.encoder.layers.{i}", f"encoder_layers.{i}", decoder=False)
    for i in range(cfg.n_decoder_layers):
        names += _layer_tensors(f"model.decoder.layers.{i}", f"decoder_layers.{i}", decoder=True)
    return names

