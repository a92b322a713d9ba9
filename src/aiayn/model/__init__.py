"""The Transformer model: embeddings, attention, layers, KV cache, builder, parameter counts."""

from aiayn.model.builder import build_model
from aiayn.model.cache import KVCache
from aiayn.model.parameter_count import count_parameters
from aiayn.model.transformer import Transformer

__all__ = ["KVCache", "Transformer", "build_model", "count_parameters"]
