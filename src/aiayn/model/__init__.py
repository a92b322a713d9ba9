"""The Transformer model: embeddings, attention, layers, KV cache, builder."""

from aiayn.model.builder import build_model, count_parameters
from aiayn.model.cache import KVCache
from aiayn.model.transformer import Transformer

__all__ = ["KVCache", "Transformer", "build_model", "count_parameters"]
