"""The Transformer behind the search's :class:`~aiayn.inference.search.DecoderModel` protocol.

:class:`IncrementalDecoder` is the fast one: encoder output and cross-attention
keys/values computed once, self-attention keys/values cached, one position per step.
:class:`RecomputingDecoder` reruns the whole teacher-forced decoder at every step; it is
slow and exists as the reference that the cache is tested against.
:class:`EnsembleDecoder` runs several of them as one model (an ensemble of checkpoints).

Both run a :class:`~aiayn.inference.optimize.OptimizedModel` (a plain Transformer given to
them is optimized as it is: same device and dtype) and end each step with its vocabulary
projection, so the two compute the same numbers in every precision, int8 included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from aiayn.errors import ConfigError
from aiayn.inference.optimize import OptimizedModel, optimize_for_inference
from aiayn.inference.search import StepVocabulary, step_log_probs
from aiayn.model import KVCache, Transformer


def _optimized(model: Transformer | OptimizedModel) -> OptimizedModel:
    return model if isinstance(model, OptimizedModel) else optimize_for_inference(model)


def _max_positions(model: Transformer) -> int | None:
    return getattr(model.tgt_positions, "max_positions", None)


class IncrementalDecoder:
    """Drives :meth:`Transformer.decode_step` with a :class:`KVCache`, in whatever dtype the
    inference copy's weights have."""

    normalized = False  # a step ends with the vocabulary projection: logits
    # Its projection runs over per-sentence lists (a SentenceVocabulary) itself.
    projects_sentence_lists = True

    def __init__(self, model: Transformer | OptimizedModel) -> None:
        optimized = _optimized(model)
        self.model = optimized.model
        self.project = optimized.step_projection
        self.max_steps = _max_positions(self.model)

    def init_state(self, src: Tensor, max_steps: int) -> KVCache:
        memory, src_mask = self.model.encode(src)
        return self.model.init_cache(memory, src_mask, max_steps)

    def step(self, tokens: Tensor, state: KVCache, need_attn: bool = False,
             vocabulary: StepVocabulary | None = None) -> tuple[Tensor, Tensor | None]:
        h, attn = self.model.decode_step(tokens, state, need_attn, project=False)  # (R, D), (R, L, H, S)
        if vocabulary is not None:
            return vocabulary.project(h, self), attn
        return self.project(h), attn  # (R, V)

    def reorder(self, state: KVCache, index: Tensor, same_sources: bool = False) -> KVCache:
        state.reorder(index, same_sources=same_sources)
        return state


@dataclass
class _FullState:
    memory: Tensor  # (R, S, D)
    src_mask: Tensor  # (R, 1, 1, S)
    tokens: Tensor  # (R, t+1): BOS and everything fed so far


class RecomputingDecoder:
    """Reruns :meth:`Transformer.decode` over the whole prefix each step (no cache)."""

    normalized = False
    projects_sentence_lists = False

    def __init__(self, model: Transformer | OptimizedModel) -> None:
        optimized = _optimized(model)
        self.model = optimized.model
        self.project = optimized.step_projection
        self.max_steps = _max_positions(self.model)

    def init_state(self, src: Tensor, max_steps: int) -> _FullState:
        memory, src_mask = self.model.encode(src)
        return _FullState(memory, src_mask, torch.empty(src.size(0), 0, dtype=torch.long,
                                                        device=src.device))

    def step(self, tokens: Tensor, state: _FullState, need_attn: bool = False,
             vocabulary: StepVocabulary | None = None) -> tuple[Tensor, Tensor | None]:
        state.tokens = torch.cat([state.tokens, tokens[:, None]], dim=1)
        h, attn = self.model.decode(state.tokens, state.memory, state.src_mask, need_attn, project=False)
        # h (R, T, D); attn (R, L, H, T, S): keep the last position.
        logits = self.project(h[:, -1])
        if vocabulary is not None:
            logits = vocabulary.restrict(logits, normalized=False)
        return logits, (attn[:, :, :, -1] if attn is not None else None)

    def reorder(self, state: _FullState, index: Tensor, same_sources: bool = False) -> _FullState:
        return _FullState(state.memory.index_select(0, index), state.src_mask.index_select(0, index),
                          state.tokens.index_select(0, index))


class EnsembleDecoder:
    """Several decoders (one per model) searched as one: each step's distribution is the mean
    of the members' probabilities, returned as its log (as fairseq's ensemble does); with
    ``need_attn``, the cross-attention is the mean of the members'.

    The members must share the target vocabulary (the caller checks the tokenizers); their
    architectures may differ, except that averaging attention needs the same layers and heads.
    """

    normalized = True  # the log of the mean probability: the search adds no log-softmax
    projects_sentence_lists = False

    def __init__(self, members: Sequence[Any]) -> None:
        if not members:
            raise ValueError("an ensemble needs at least one model")
        self.members = list(members)
        limits = [m.max_steps for m in self.members if m.max_steps is not None]
        self.max_steps = min(limits) if limits else None

    def init_state(self, src: Tensor, max_steps: int) -> list[Any]:
        return [m.init_state(src, max_steps) for m in self.members]

    def step(self, tokens: Tensor, state: list[Any], need_attn: bool = False,
             vocabulary: StepVocabulary | None = None) -> tuple[Tensor, Tensor | None]:
        outputs = [m.step(tokens, s, need_attn) for m, s in zip(self.members, state)]
        log_probs = torch.stack([step_log_probs(logits, m.normalized)
                                 for m, (logits, _) in zip(self.members, outputs)])
        mean = torch.logsumexp(log_probs, dim=0) - math.log(len(outputs))  # log of the mean probability
        if vocabulary is not None:
            mean = vocabulary.restrict(mean, normalized=True)
        return mean, (_mean_attention([a for _, a in outputs]) if need_attn else None)

    def reorder(self, state: list[Any], index: Tensor, same_sources: bool = False) -> list[Any]:
        return [m.reorder(s, index, same_sources) for m, s in zip(self.members, state)]


def _mean_attention(weights: list[Tensor | None]) -> Tensor | None:
    present = [w for w in weights if w is not None]
    if len(present) < len(weights):
        return None
    shapes = {tuple(w.shape) for w in present}
    if len(shapes) > 1:
        raise ConfigError("attention of an ensemble: its models have different numbers of layers or heads "
                          f"({', '.join(str(s[1:-1]) for s in sorted(shapes))}), so their weights cannot be "
                          "averaged; ask for attention from one model")
    return torch.stack([w.float() for w in present]).mean(dim=0)
