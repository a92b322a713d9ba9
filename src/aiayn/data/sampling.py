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

Batching. An epoch's sentences are all segmented when the epoch starts (:meth:`SampledPairs.
epoch_sizes`), and its batches are formed from those lengths, as without sampling: sorted by
length, cut within ``max_tokens``, shuffled, all by ``(seed, epoch)``. So a batch is as full
as without sampling, and an epoch has as many batches as its segmentations need (sampled
ones are longer: more batches). Segmenting the whole epoch up front costs what segmenting it
batch by batch would; it holds one epoch's ids in memory.

A sampled side longer than ``max_len`` pieces (the length filter, or what the model's
positions hold) is replaced by the deterministic ids. Every replacement is counted in
:attr:`SampledPairs.fallbacks`.
"""

from __future__ import annotations

import hashlib
import logging
import random
from typing import Any

import numpy as np

from aiayn.config import Config
from aiayn.data.batching import SizedPairs
from aiayn.errors import ConfigError
from aiayn.vocab import EOS_ID

log = logging.getLogger(__name__)

# Sentences whose segmentation is replayed when sampling is set up, to check that the
# tokenizer's can be: enough to meet most pieces, few enough to cost nothing next to an epoch.
REPLAY_CHECK = 500
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
    deterministic lengths, ``self[i]`` the deterministic pair, :meth:`epoch_sizes` the lengths
    an epoch is batched by, and :meth:`epoch_pairs` the sampled pairs of a batch.
    ``alpha_src`` / ``alpha_tgt`` / ``nbest`` are ``data.subword_alpha_src`` / ``_tgt`` /
    ``data.subword_nbest`` (a bad tokenizer for them is a ConfigError naming the field).
    """

    def __init__(self, dataset: SizedPairs, tokenizer: Any, *, alpha_src: float, alpha_tgt: float,
                 nbest: int = 64, seed: int = 1, max_len: int | None = None) -> None:
        self.dataset = dataset
        self.alpha = (float(alpha_src), float(alpha_tgt))
        self.nbest = int(nbest)
        self.seed = int(seed)
        self.max_len = max_len
        self.fallbacks = 0
        self._samplers = tuple(tokenizer.segmentation_sampler(name) if self.alpha[side] > 0 else None
                               for side, name in enumerate(SIDES))
        self.src_sizes: np.ndarray = np.asarray(dataset.src_sizes, dtype=np.int64)
        self.tgt_sizes: np.ndarray = np.asarray(dataset.tgt_sizes, dtype=np.int64)
        self._epoch: tuple[int, list[tuple[np.ndarray, np.ndarray]]] | None = None
        self._check_replay()

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

    def _samples(self, epoch: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every sentence of ``epoch`` as segmented in it (the last epoch asked for is kept)."""
        if self._epoch is None or self._epoch[0] != epoch:
            pairs = (self.dataset[i] for i in range(len(self.dataset)))
            self._epoch = (epoch, [(self.sample_side(s, 0, i, epoch), self.sample_side(t, 1, i, epoch))
                                   for i, (s, t) in enumerate(pairs)])
        return self._epoch[1]

    def epoch_sizes(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The lengths of ``epoch``'s segmentations (source with EOS, target without), to batch by."""
        samples = self._samples(epoch)
        return (np.fromiter((len(s) for s, _ in samples), dtype=np.int64, count=len(samples)),
                np.fromiter((len(t) for _, t in samples), dtype=np.int64, count=len(samples)))

    def epoch_pairs(self, indices: np.ndarray, epoch: int) -> list[Sample]:
        """The sentences ``indices`` (one batch) as segmented in ``epoch``."""
        samples = self._samples(epoch)
        return [(int(i), *samples[int(i)]) for i in indices]

    def _check_replay(self) -> None:
        """Sampling at alpha 0 must give back the prepared ids (REPLAY_CHECK sentences, seeded),
        or the tokenizer's segmentation is not the one this module draws from."""
        n = len(self.dataset)
        rng = np.random.default_rng([self.seed, REPLAY_CHECK])
        for i in np.sort(rng.choice(n, size=min(n, REPLAY_CHECK), replace=False)).tolist():
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
                         nbest=data.subword_nbest, seed=cfg.train.seed, max_len=max_len)
    log.info("subword sampling (alpha source %g, target %g): each epoch segmented afresh and batched by its lengths",
             data.subword_alpha_src, data.subword_alpha_tgt)
    return pairs

