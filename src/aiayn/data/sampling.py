"""Subword regularization: every training sentence segmented afresh in every epoch.

With ``data.subword_alpha_src`` / ``data.subword_alpha_tgt`` above 0, the batches of each
epoch hold a new segmentation of each training sentence, drawn by the rules of its
SentencePiece model: for a BPE model, BPE-dropout (Provilkov et al., 2020: each merge is
skipped with probability alpha); for a unigram model, subword sampling (Kudo, 2018: one of
the ``nbest`` most likely segmentations, with probability proportional to its likelihood to
the power alpha).
Validation and test never are: they keep the segmentation ``aiayn prepare`` wrote.

How. A prepared training split holds ids, not text, and SentencePiece's own sampling
cannot be seeded reproducibly across processes; the draw is made by
:class:`aiayn.text.tokenizer.SegmentationSampler` from the sentence's pieces, by the model's
rules, with a generator seeded from ``(seed, epoch, sentence, side)`` alone
(:func:`example_seed`). A run resumed mid-epoch, or every process of a torchrun job, builds
exactly the batches an uninterrupted run builds. A side holding an unknown piece is never
resampled: its characters are lost.

Batching. The batches are formed once, as without sampling, so that every epoch has the same
batches of the same sentences (the batch iterator's resume and its per-epoch counts rely on
it); only the pieces inside change. Since sampled segmentations are longer than the
deterministic one, and vary in length, each sentence is batched by its deterministic length
scaled by a *growth factor* per side, estimated once from GROWTH_SAMPLE sentences segmented
with the seeds of epoch 0 (training epochs count from 1). A batch then holds fewer sentences
than without sampling, and stays within ``max_tokens`` as follows:

* ``max_tokens_mode: padded`` (sentences x longest side): the factor is a high quantile
  (GROWTH_QUANTILE) of the sentences' own growth, because a batch's width is its longest
  sample; a sampled side longer than its batch has room for (``max_tokens // sentences``)
  is replaced by the sentence's deterministic ids.
* ``max_tokens_mode: real`` (each side's real tokens): the factor is the mean growth, since a
  batch's sums average out; if a side's sampled tokens still exceed ``max_tokens``, the
  sentences that grew most take their deterministic ids until it fits.

A sampled side longer than ``max_len`` pieces (the length filter, or what the model's
positions hold) is replaced by the deterministic ids as well. Every replacement is counted
in :attr:`SampledPairs.fallbacks`.
"""

from __future__ import annotations

import hashlib
import logging
import random
from typing import Any

import numpy as np

from aiayn.config import Config
from aiayn.data.batching import BATCH_MODES, SizedPairs
from aiayn.errors import ConfigError, DataError
from aiayn.vocab import EOS_ID

log = logging.getLogger(__name__)

# Sentences segmented to estimate the growth factors: enough for a stable quantile, few
# enough to cost nothing next to an epoch.
GROWTH_SAMPLE = 2000
# Padded batches: room for the growth of 95 sentences in 100. A higher quantile leaves more
# of every batch to padding; a lower one sends more samples back to their deterministic ids.
GROWTH_QUANTILE = 0.95
# The estimate's sentences and seeds: epoch 0 is never trained on.
GROWTH_EPOCH = 0
SIDES = ("src", "tgt")

Sample = tuple[int, np.ndarray, np.ndarray]  # (index, source ids with EOS, target ids), as collate takes


def example_seed(seed: int, epoch: int, index: int, side: int) -> int:
    """The seed of one side (0: source, 1: target) of sentence ``index`` in ``epoch``: a
    hash, so that neighbouring arguments give unrelated draws."""
    key = f"{seed}:{epoch}:{index}:{side}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


class SampledPairs:
    """A training split whose pairs are segmented afresh in each epoch (see the module text).

    For :class:`~aiayn.data.batching.BatchIterator`: ``src_sizes`` / ``tgt_sizes`` are the
    lengths to batch by (deterministic lengths scaled by :attr:`growth`), ``self[i]`` the
    deterministic pair, and :meth:`epoch_pairs` the sampled pairs of a batch in an epoch.
    ``alpha_src`` / ``alpha_tgt`` / ``nbest`` are ``data.subword_alpha_src`` / ``_tgt`` /
    ``data.subword_nbest`` (a bad tokenizer for them is a ConfigError naming the field);
    ``max_tokens`` and ``mode`` the batch iterator's.
    """

    def __init__(self, dataset: SizedPairs, tokenizer: Any, *, alpha_src: float, alpha_tgt: float,
                 nbest: int = 64, seed: int = 1, max_tokens: int, mode: str = "padded",
                 max_len: int | None = None) -> None:
        if mode not in BATCH_MODES:
            raise DataError(f"batch mode must be one of {', '.join(BATCH_MODES)}, got {mode!r}")
        self.dataset = dataset
        self.alpha = (float(alpha_src), float(alpha_tgt))
        self.nbest = int(nbest)
        self.seed = int(seed)
        self.max_tokens = int(max_tokens)
        self.mode = mode
        self.max_len = max_len
        self.fallbacks = 0
        self._samplers = tuple(tokenizer.segmentation_sampler(name) if self.alpha[side] > 0 else None
                               for side, name in enumerate(SIDES))
        self.base_src = np.asarray(dataset.src_sizes, dtype=np.int64)
        self.base_tgt = np.asarray(dataset.tgt_sizes, dtype=np.int64)
        self.growth = self._estimate_growth()
        # Source lengths count their EOS, which sampling leaves alone.
        self.src_sizes: np.ndarray = _scaled(self.base_src - 1, self.growth[0]) + 1
        self.tgt_sizes: np.ndarray = _scaled(self.base_tgt, self.growth[1])

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.dataset[i]

    # ------------------------------------------------------------------ sampling

    def sample_side(self, ids: np.ndarray, side: int, index: int, epoch: int) -> np.ndarray:
        """One side's ids (source: with EOS) in ``epoch``: a sampled segmentation, or ``ids``
        themselves where this side is not sampled, holds an unknown piece, or the sample is
        longer than ``max_len``."""
        sampler = self._samplers[side]
        pieces = ids[:-1] if side == 0 else ids
        if sampler is None or len(pieces) == 0:
            return ids
        rng = random.Random(example_seed(self.seed, epoch, index, side))
        out = sampler.sample(pieces, self.alpha[side], self.nbest, rng)
        if out is None:
            return ids
        if self.max_len is not None and len(out) > max(self.max_len, len(pieces)):
            self.fallbacks += 1
            return ids
        return np.asarray(out + [EOS_ID] if side == 0 else out, dtype=np.int64)

    def epoch_pairs(self, indices: np.ndarray, epoch: int) -> list[Sample]:
        """The sentences ``indices`` (one batch) as segmented in ``epoch``, within ``max_tokens``."""
        rows = [int(i) for i in indices]
        base = [self.dataset[i] for i in rows]
        sampled = [[self.sample_side(pair[side], side, i, epoch) for i, pair in zip(rows, base)]
                   for side in (0, 1)]
        for side in (0, 1):
            given = [pair[side] for pair in base]
            if self.mode == "padded":
                self._fit_width(sampled[side], given, side)
            else:
                self._fit_sum(sampled[side], given, side)
        return [(i, s, t) for i, s, t in zip(rows, sampled[0], sampled[1])]

    # ------------------------------------------------------------------ the token budget

    def _fit_width(self, sampled: list[np.ndarray], given: list[np.ndarray], side: int) -> None:
        """Padded batches: no side longer than ``max_tokens // sentences`` (tokens as the
        model sees them: the target gets BOS or EOS added), unless its deterministic ids are."""
        extra = 0 if side == 0 else 1
        width = self.max_tokens // len(sampled)
        for k, (ids, det) in enumerate(zip(sampled, given)):
            if len(ids) + extra > max(width, len(det) + extra):
                sampled[k] = det
                self.fallbacks += 1

    def _fit_sum(self, sampled: list[np.ndarray], given: list[np.ndarray], side: int) -> None:
        """Real-token batches: a side's tokens within ``max_tokens`` (or the deterministic
        total, if that is larger), the sentences that grew most falling back first."""
        extra = 0 if side == 0 else 1
        budget = max(self.max_tokens, sum(len(d) + extra for d in given))
        total = sum(len(s) + extra for s in sampled)
        if total <= budget:
            return
        # Largest growth first; ties in batch order (a stable sort), so the choice is deterministic.
        growth = [len(s) - len(d) for s, d in zip(sampled, given)]
        for k in sorted(range(len(sampled)), key=lambda j: -growth[j]):
            if total <= budget or growth[k] <= 0:
                break
            total -= growth[k]
            sampled[k] = given[k]
            self.fallbacks += 1

    def _estimate_growth(self) -> tuple[float, float]:
        """Per side: how much longer sampled segmentations are (1.0 for a side not sampled),
        from a seeded sample of sentences: the mean (``real``) or GROWTH_QUANTILE (``padded``).
        The same sentences check that the tokenizer's segmentation is replayed exactly."""
        n = len(self.dataset)
        rng = np.random.default_rng([self.seed, GROWTH_SAMPLE])
        chosen = np.sort(rng.choice(n, size=min(n, GROWTH_SAMPLE), replace=False))
        lengths: list[list[tuple[int, int]]] = [[], []]
        for i in chosen.tolist():
            pair = self.dataset[i]
            for side, sampler in enumerate(self._samplers):
                pieces = pair[side][:-1] if side == 0 else pair[side]
                if sampler is None or len(pieces) == 0:
                    continue
                replayed = sampler.replay(pieces)
                if replayed is not None and replayed != pieces.tolist():
                    raise ConfigError(
                        f"data.subword_alpha_{SIDES[side]}: the {('source', 'target')[side]} tokenizer's "
                        f"segmentation cannot be replayed from its pieces (sentence {i} differs), so it "
                        "cannot be sampled; subword sampling needs a BPE or unigram model: set it to 0")
                after = self.sample_side(pair[side], side, i, GROWTH_EPOCH)
                lengths[side].append((len(pieces), len(after) - (1 - side)))
        self.fallbacks = 0
        return _growth(lengths[0], self.mode), _growth(lengths[1], self.mode)


def _growth(lengths: list[tuple[int, int]], mode: str) -> float:
    """(deterministic, sampled) lengths -> the factor to batch by, at least 1."""
    if not lengths:
        return 1.0
    arr = np.asarray(lengths, dtype=np.float64)
    if mode == "real":
        factor = float(arr[:, 1].sum() / arr[:, 0].sum())
    else:
        factor = float(np.quantile(arr[:, 1] / arr[:, 0], GROWTH_QUANTILE))
    return max(1.0, factor)


def _scaled(lengths: np.ndarray, factor: float) -> np.ndarray:
    if factor == 1.0:
        return lengths.copy()
    return np.ceil(lengths * factor).astype(np.int64)


def training_pairs(dataset: SizedPairs, tokenizer: Any, cfg: Config) -> SizedPairs:
    """The training split as ``cfg`` has it batched: ``dataset`` itself, or, with subword
    sampling on (``data.subword_alpha_*`` above 0), a :class:`SampledPairs` over it."""
    data = cfg.data
    if not data.subword_sampling:
        return dataset
    # Pieces a sentence may have: the length filter's, and what the model's positions hold
    # (BOS or EOS takes one).
    max_len = min(data.max_len, cfg.model.max_positions - 1)
    pairs = SampledPairs(dataset, tokenizer, alpha_src=data.subword_alpha_src, alpha_tgt=data.subword_alpha_tgt,
                         nbest=data.subword_nbest, seed=cfg.train.seed, max_tokens=cfg.train.max_tokens,
                         mode=cfg.train.max_tokens_mode, max_len=max_len)
    log.info("subword sampling (alpha source %g, target %g): batched by lengths x %.3f (source), x %.3f (target)",
             data.subword_alpha_src, data.subword_alpha_tgt, *pairs.growth)
    return pairs

