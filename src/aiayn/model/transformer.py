"""The Transformer (paper figure 1): encoder, decoder, tied pre-softmax projection.

The model returns logits; the loss and the search live elsewhere. Search drives it
through :meth:`Transformer.encode`, :meth:`Transformer.init_cache` and
:meth:`Transformer.decode_step`, reordering the cache with :meth:`KVCache.reorder`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.model.cache import KVCache
from aiayn.model.embeddings import PositionalEncoding, TokenEmbedding
from aiayn.model.layers import DecoderLayer, EncoderLayer


class Transformer(nn.Module):
    def __init__(
        self,
        src_embed: TokenEmbedding,
        tgt_embed: TokenEmbedding,
        src_positions: PositionalEncoding,
        tgt_positions: PositionalEncoding,
        encoder_layers: list[EncoderLayer],
        decoder_layers: list[DecoderLayer],
        encoder_norm: nn.LayerNorm | None,
        decoder_norm: nn.LayerNorm | None,
        output_projection: nn.Linear | None,
        output_bias: bool = False,
    ) -> None:
        """``output_projection`` None ties the pre-softmax projection to ``tgt_embed``."""
        super().__init__()
        self.src_embed = src_embed  # may be the same module as tgt_embed (shared vocab)
        self.tgt_embed = tgt_embed
        self.src_positions = src_positions
        self.tgt_positions = tgt_positions
        self.encoder_layers = nn.ModuleList(encoder_layers)
        self.decoder_layers = nn.ModuleList(decoder_layers)
        self.encoder_norm = encoder_norm  # final LayerNorm of a pre-norm stack, else None
        self.decoder_norm = decoder_norm
        self.output_projection = output_projection
        vocab = tgt_embed.weight.size(0)
        if output_bias:
            self.output_bias = nn.Parameter(torch.zeros(vocab))
        else:
            self.register_parameter("output_bias", None)
        self.pad_id = src_embed.pad_id

    # ------------------------------------------------------------------ pieces

    def src_mask(self, src: Tensor) -> Tensor:
        """(B, S) ids -> (B, 1, 1, S) bool, True on real (non-pad) tokens."""
        return (src != self.pad_id)[:, None, None, :]

    @property
    def output_weight(self) -> Tensor:
        """The pre-softmax projection (V, D): the target embedding when tied."""
        return self.tgt_embed.weight if self.output_projection is None else self.output_projection.weight

    def project(self, h: Tensor) -> Tensor:
        """Decoder states (..., D) -> logits (..., V)."""
        return F.linear(h, self.output_weight, self.output_bias)

    # --------------------------------------------------------------- full pass

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, D), src_mask (B, 1, 1, S)."""
        mask = self.src_mask(src)
        x = self.src_positions(self.src_embed(src))
        for layer in self.encoder_layers:
            x = layer(x, mask)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x, mask

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor,
               need_attn: bool = False, project: bool = True) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced decoder. tgt_in (B, T) -> logits (B, T, V).

        With ``need_attn``, also the cross-attention weights (B, L, H, T, S). With
        ``project=False``, the final decoder states (B, T, D) instead of logits (the trainer
        fuses the projection with the loss: training.loss.projected_label_smoothed_loss).
        """
        y = self.tgt_positions(self.tgt_embed(tgt_in))
        attn = []
        for layer in self.decoder_layers:
            y, w = layer(y, memory, src_mask, need_weights=need_attn)
            attn.append(w)
        if self.decoder_norm is not None:
            y = self.decoder_norm(y)
        out = self.project(y) if project else y
        return out, (torch.stack(attn, dim=1) if need_attn else None)

    def forward(self, src: Tensor, tgt_in: Tensor, project: bool = True) -> Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V), or states (B, T, D) without ``project``."""
        memory, mask = self.encode(src)
        return self.decode(tgt_in, memory, mask, project=project)[0]

    # -------------------------------------------------------- incremental pass

    def _decoders(self) -> Iterable[DecoderLayer]:
        # To a type checker nn.ModuleList holds plain nn.Modules; this one holds DecoderLayers.
        return cast("Iterable[DecoderLayer]", self.decoder_layers)

    def init_cache(self, memory: Tensor, src_mask: Tensor, max_len: int) -> KVCache:
        """Allocate the cache; cross-attention keys/values are computed here, once."""
        cross = [layer.cross_attn.project_kv(memory) for layer in self._decoders()]
        return KVCache.allocate(cross, src_mask, max_len)

    def decode_step(self, tokens: Tensor, cache: KVCache, need_attn: bool = False,
                    project: bool = True) -> tuple[Tensor, Tensor | None]:
        """The next position for each row. tokens (B,) are the previous outputs
        (BOS at the first step) -> logits (B, V); with ``need_attn`` also (B, L, H, S).
        With ``project=False``, the final decoder states (B, D) instead of logits (for a
        caller with its own vocabulary projection).
        """
        y = self.tgt_embed(tokens[:, None])  # (B, 1, D)
        y = self.tgt_positions(y, start=cache.length)
        attn = []
        for i, layer in enumerate(self._decoders()):
            y, w = layer.step(y, cache, i, need_weights=need_attn)
            attn.append(w)
        cache.advance()
        if self.decoder_norm is not None:
            y = self.decoder_norm(y)
        out = self.project(y[:, 0]) if project else y[:, 0]
        # Under need_attn every layer has returned its weights: no None in attn.
        return out, (torch.stack(cast("list[Tensor]", attn), dim=1)[:, :, :, 0] if need_attn else None)
