"""Search over a step function: greedy, batched beam search, sampling.

The search knows nothing about the Transformer. It drives any object that follows the
:class:`DecoderModel` protocol (``init_state`` / ``step`` / ``reorder``); the Transformer is
adapted to it in :mod:`aiayn.inference.adapters`, and the tests drive the very same code
with a scripted model whose probabilities are fixed, so expected hypotheses are known
exactly (the fairseq approach).

Conventions (shared by the three searches):

* ``src`` is a right-padded (B, S) id tensor; a sentence's source length ``|x|`` is its
  number of non-pad ids (the EOS included, as fairseq counts it).
* Lengths count output tokens *without* the final EOS: ``min_len`` tokens must come before
  EOS may, and after ``max_len = int(max_len_a * |x| + max_len_b)`` tokens only EOS may
  (section 6.1: "maximum output length = input length + 50"), so a model that never emits
  EOS still stops. Every hypothesis therefore ends with EOS; ``tokens`` omit it and the
  attention has one row more (the EOS step).
* The length ``|Y|`` in the length penalty counts the EOS (fairseq, tensor2tensor):
  ``gnmt``: lp = ((5 + |Y|) / 6)^alpha (the paper's setting, alpha = 0.6);
  ``fairseq``: lp = |Y|^alpha. A hypothesis' score is its summed log-probability / lp.
* Every search runs the same step on its live rows (:class:`_OngoingSearch`): one model step ->
  log-probabilities -> the constraints' masks (min/max length, prefix, n-gram repeats) ->
  its own selection (beam top-k, argmax, a draw) -> the rows that chose EOS finish ->
  the model state and the rows are reordered to the survivors and extended.
* The hot path is vectorised over (sentences x beams): one model step per time step for
  the whole batch, one top-k over beam*vocab per sentence, and one ``reorder`` that both
  follows the beam parents and drops the rows of sentences that are done. Python loops
  run only over hypotheses that have just finished.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.config import DecodeConfig
from aiayn.inference.constraints import NEG_INF, AllocatingState, Constraint, ConstraintState
from aiayn.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

logger = logging.getLogger(__name__)



# The log-probability given to a forced token (EOS at the maximum length, a prefix token)
# that the model assigns probability 0.
FORCED_FLOOR = -1e4


class DecoderModel(Protocol):
    """What a search needs from a model: an encoder state, one step, a reorder.

    ``max_steps`` is the most decoder steps the model supports (its number of target
    positions), or None for no limit. ``normalized``: True when ``step`` returns
    log-probabilities already (an ensemble's log of the mean), which the search then uses as
    they are; False when it returns logits, which the search normalises with a log-softmax.
    """

    max_steps: int | None
    normalized: bool
    projects_sentence_lists: bool  # its step projects onto a narrowing vocabulary itself

    def init_state(self, src: Tensor, max_steps: int) -> Any:
        """Encode ``src`` (B, S) and allocate whatever a step needs for ``max_steps`` steps."""
        ...

    def step(self, tokens: Tensor, state: Any, need_attn: bool = False,
             vocabulary: StepVocabulary | None = None) -> tuple[Tensor, Tensor | None]:
        """Feed the previous tokens (R,) (BOS first) -> logits, or log-probs when
        ``normalized``, (R, V) and, with ``need_attn``, cross-attention weights (R, L, H, S)
        (any leading layout is fine as long as the first dimension is R and the last is S).
        With ``vocabulary``, only its ids are scored (:class:`StepVocabulary`)."""
        ...

    def reorder(self, state: Any, index: Tensor, same_sources: bool = False) -> Any:
        """Keep rows ``index`` (R',) of the state in that order; R' may differ from R.

        ``same_sources`` is a hint: every row keeps the sentence it had (beams reshuffled
        within their sentence, none dropped), so per-sentence state -- the encoder output,
        cross-attention keys/values -- need not move. Ignoring it is always correct.
        """
        ...


class StepVocabulary(Protocol):
    """The ids a step scores: a vocabulary shortlist, an argument of the model's ``step``.

    One that does not ``narrow`` gives every id of the vocabulary a score, -inf outside its
    ids. One that narrows returns fewer columns than the vocabulary, row by row (each
    sentence its own list); it then says which id each column stands for (:meth:`ids`,
    :meth:`columns`) and follows the search's rows (:meth:`start`, :meth:`select`). Its first
    columns are the special ids themselves (PAD, UNK, BOS, EOS: column = id), so the masks of
    those ids need no translation.
    """

    narrows: bool

    def start(self, sentences: int) -> None:
        """A search begins with one row per sentence."""
        ...

    def select(self, index: Tensor, same_sources: bool = False) -> None:
        """Keep rows ``index`` in that order (as ``DecoderModel.reorder``)."""
        ...

    def project(self, h: Tensor, decoder: Any) -> Tensor:
        """Scores of the decoder states ``h`` (R, D) under ``decoder``'s vocabulary projection
        (``decoder.project``, over ``decoder.model``'s output weight), for this vocabulary."""
        ...

    def restrict(self, scores: Tensor, normalized: bool) -> Tensor:
        """Whole-vocabulary scores (R, V) restricted to this vocabulary; log-probabilities
        (``normalized``) are normalized again over it."""
        ...


class NarrowedVocabulary(StepVocabulary, Protocol):
    """A :class:`StepVocabulary` that ``narrows``: which id each column stands for."""

    def ids(self, rows: Tensor, cols: Tensor) -> Tensor:
        """The vocabulary ids of columns ``cols`` of rows ``rows`` (broadcast together)."""
        ...

    def columns(self, rows: Tensor, ids: Tensor) -> Tensor:
        """The columns of ``ids`` in rows ``rows`` (broadcast together); an id the row does not
        score gets PAD's column, which every step masks anyway."""
        ...


@dataclass(frozen=True)
class SearchInputs:
    """What a search is given besides the model, the sources and the decoding options.

    Attributes:
        prefix: Per sentence, target ids its outputs must start with (None: no prefixes).
        need_attn: Keep every step's cross-attention for the hypotheses.
        constraint: What the next token of each row may be (constrained decoding).
        vocabulary: The ids the model's steps score (a vocabulary shortlist), given to
            every ``step``; None: the whole vocabulary.
        pad, bos, eos: The special ids (``aiayn.vocab``'s unless a model has others).
    """

    prefix: list[list[int]] | None = None
    need_attn: bool = False
    constraint: Constraint | None = None
    vocabulary: StepVocabulary | None = None
    pad: int = PAD_ID
    bos: int = BOS_ID
    eos: int = EOS_ID


@dataclass
class SearchHypothesis:
    """One finished output of a search."""

    tokens: list[int]  # output ids, without the final EOS
    score: float  # log_prob / length penalty; what hypotheses are ranked by
    log_prob: float  # summed log-probabilities of tokens and EOS
    # Cross-attention (L, H, T, S_i): T = len(tokens) + 1 (the EOS step), S_i the
    # sentence's own source length. None unless attention was asked for.
    attention: Tensor | None = None


# ------------------------------------------------------------------------ helpers


@overload
def length_penalty(length: Tensor, alpha: float, style: str = ...) -> Tensor: ...
@overload
def length_penalty(length: float, alpha: float, style: str = ...) -> float: ...


def length_penalty(length: Tensor | float, alpha: float, style: str = "gnmt") -> Tensor | float:
    """The divisor of a summed log-probability for a hypothesis of ``length`` tokens
    (EOS included). ``gnmt``: ((5 + |Y|) / 6)^alpha (Wu et al. 2016; the paper's alpha 0.6);
    ``fairseq``: |Y|^alpha."""
    if style == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if style == "fairseq":
        return length ** alpha
    raise ValueError(f"unknown length penalty style {style!r}")


def source_lengths(src: Tensor, pad: int = PAD_ID) -> Tensor:
    """(B, S) right-padded ids -> (B,) number of real ids."""
    return (src != pad).sum(dim=1)


def max_output_lengths(src_len: Tensor, cfg: DecodeConfig, model_max_steps: int | None,
                       prefix_len: Tensor | None = None) -> Tensor:
    """Per sentence, the most output tokens before EOS is forced: a*|x| + b, at least the
    forced prefix, and at most what the model's positions allow (one step stays for EOS)."""
    max_len = torch.tensor([cfg.max_output_len(n) for n in src_len.tolist()], dtype=torch.long,
                           device=src_len.device)
    if prefix_len is not None:
        max_len = torch.maximum(max_len, prefix_len)
    if model_max_steps is not None:
        max_len = max_len.clamp(max=model_max_steps - 1)
    return max_len.clamp(min=0)


def _prefix_tensor(prefix: list[list[int]] | None, n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Forced target prefixes -> (n, P) ids padded with -1, and their lengths (n,)."""
    if prefix is None:
        return torch.full((n, 0), -1, dtype=torch.long, device=device), torch.zeros(n, dtype=torch.long)
    if len(prefix) != n:
        raise ValueError(f"got {len(prefix)} prefixes for {n} sentences")
    width = max((len(p) for p in prefix), default=0)
    out = torch.full((n, width), -1, dtype=torch.long)
    for i, p in enumerate(prefix):
        if p:
            out[i, :len(p)] = torch.tensor(p, dtype=torch.long)
    return out.to(device), torch.tensor([len(p) for p in prefix], dtype=torch.long)


@dataclass
class _StepMasks:
    """Everything that masks the next-token distribution at step t."""

    min_len: int
    no_repeat_ngram_size: int
    pad: int
    bos: int
    eos: int

    def apply(self, lprobs: Tensor, t: int, hist: Tensor, max_len_rows: Tensor,
              prefix_rows: Tensor, floor: Tensor | float = FORCED_FLOOR) -> Tensor:
        """Mask ``lprobs`` (R, V) in place for step ``t`` (``t`` tokens generated so far).

        hist (R, t): the tokens so far; max_len_rows (R,); prefix_rows (R, P), -1 = free.
        ``lprobs`` may also be logits (log-probabilities up to a per-row constant c); then
        ``floor`` must be FORCED_FLOOR + c, per row (R,).
        """
        floor_col = floor[:, None] if isinstance(floor, Tensor) else floor
        at_max = t >= max_len_rows  # (R,) bool
        forced = prefix_rows[:, t] if t < prefix_rows.size(1) else None
        if forced is not None and not bool((forced >= 0).any()):
            forced = None  # no row is forced at this step
        # Values that forcing must keep even where the masks below remove them. A forced
        # token the model gives probability 0 still gets a finite (very bad) score, so that a
        # forced path is never mistaken for a dead beam (whose score is -inf).
        eos_orig = torch.maximum(lprobs[:, self.eos], torch.as_tensor(floor, device=lprobs.device))
        if forced is not None:
            forced_orig = torch.maximum(lprobs.gather(1, forced.clamp(min=0)[:, None]),
                                        torch.as_tensor(floor_col, device=lprobs.device))
        # PAD and BOS are never outputs.
        lprobs[:, self.pad] = NEG_INF
        lprobs[:, self.bos] = NEG_INF
        if t < self.min_len:
            lprobs[:, self.eos] = NEG_INF
        _ban_repeated_ngrams(lprobs, t, hist, self.no_repeat_ngram_size)
        if bool(at_max.any()):
            # Only EOS from here: the max-length bound of section 6.1.
            lprobs[at_max] = NEG_INF
            lprobs[at_max, self.eos] = eos_orig[at_max]
        if forced is not None:
            rows = (forced >= 0).nonzero(as_tuple=True)[0]
            lprobs[rows] = NEG_INF
            lprobs[rows, forced[rows]] = forced_orig[rows, 0]
        return lprobs


def _ban_repeated_ngrams(lprobs: Tensor, t: int, hist: Tensor, n: int) -> None:
    """Mask, in place, every token that would repeat an n-gram of ``hist`` (R, t); n = 0: none."""
    if n <= 0 or t < n - 1:
        return
    if n == 1:
        if t > 0:
            lprobs.scatter_(1, hist, NEG_INF)
    elif t >= n:
        # All n-grams so far (R, t-n+1, n); ban the last token of those whose first
        # n-1 tokens equal the current suffix.
        windows = hist.unfold(1, n, 1)
        suffix = hist[:, t - n + 1:]  # (R, n-1)
        match = (windows[:, :, :-1] == suffix[:, None, :]).all(dim=-1)  # (R, W)
        rows, which = match.nonzero(as_tuple=True)
        if rows.numel():
            lprobs[rows, windows[rows, which, -1]] = NEG_INF


def topk_block(v: int, k: int) -> int:
    """Columns per vocabulary block in :func:`row_topk`: the power of two nearest 2 sqrt(v / k),
    which balances the top-k over the v / block block maxima against the one over the k * block
    candidate columns (64 for 8,000 pieces and k = 8, 128 for 32,000)."""
    return 2 ** max(0, round(math.log2(2 * math.sqrt(v / k))))


def row_topk(x: Tensor, k: int, block: int | None = None) -> tuple[Tensor, Tensor]:
    """``x.topk(k, dim=1)`` for (R, V) rows with a large V, computed over a few blocks of columns.

    The k largest values of a row lie in the k blocks (of ``block`` columns, default
    :func:`topk_block`) with the largest maxima: a block outside those has a maximum below k
    others, each a distinct larger value. So: block maxima (one vectorised reduction), the k
    best blocks, top-k among their k*block columns, merged with the top-k of the last, partial
    block. torch.topk's CPU kernel selects over all V with a scalar partial sort, slower on a
    CPU than this vectorised reduction over the rows. Values equal torch.topk's; among exactly
    equal values either may pick a different index. Rows of fewer than 4k blocks go to
    torch.topk.
    """
    rows, v = x.shape
    block = topk_block(v, k) if block is None else block
    n_blocks = v // block
    if n_blocks < 4 * k:
        return x.topk(k, dim=1)
    full = n_blocks * block
    blocks = x[:, :full].unflatten(1, (n_blocks, block))  # (R, n_blocks, block), a view
    best_blocks = blocks.amax(dim=2).topk(k, dim=1).indices  # (R, k)
    candidates = blocks[torch.arange(rows, device=x.device)[:, None], best_blocks].flatten(1)  # (R, k*block)
    vals, pos = candidates.topk(k, dim=1)  # (R, k)
    cols = best_blocks.gather(1, pos.div(block, rounding_mode="floor")) * block + pos.remainder(block)
    if full < v:  # the partial block's own best, merged
        tail_vals, tail_cols = x[:, full:].topk(min(k, v - full), dim=1)
        vals, pos = torch.cat([vals, tail_vals], dim=1).topk(k, dim=1)
        cols = torch.cat([cols, tail_cols + full], dim=1).gather(1, pos)
    return vals, cols


def step_log_probs(logits: Tensor, normalized: bool) -> Tensor:
    """A step's output (R, V) as float32 log-probabilities: a log-softmax of logits, or
    log-probabilities (``normalized``) as they are."""
    # float32 even when the model ran in bf16: beam scores accumulate over many steps.
    # (log_softmax(dtype=float32) casts bf16 logits to float32 first too: the same values.)
    # A second log-softmax of log-probabilities would change nothing but the time it takes.
    return logits.float() if normalized else F.log_softmax(logits.float(), dim=-1)


def _trim_attention(steps: Tensor, src_len: int) -> Tensor:
    """(T, *inner, S) history of one hypothesis -> (*inner, T, S_i) without source padding."""
    a = steps[..., :src_len].float()
    return a.movedim(0, -2).contiguous()


class _FinishedHypotheses:
    """Finished hypotheses per sentence, plus the two per-sentence numbers the stopping
    rule needs as tensors: how many have finished, and the score of the nbest-th best."""

    def __init__(self, n: int, nbest: int) -> None:
        self.hyps: list[list[SearchHypothesis]] = [[] for _ in range(n)]
        self.nbest = nbest
        self.count = torch.zeros(n, dtype=torch.long)
        self.nbest_score = torch.full((n,), NEG_INF)

    def add(self, sent: int, hyp: SearchHypothesis) -> None:
        hyps = self.hyps[sent]
        hyps.append(hyp)
        hyps.sort(key=lambda h: -h.score)
        self.count[sent] = len(hyps)
        if len(hyps) >= self.nbest:
            self.nbest_score[sent] = hyps[self.nbest - 1].score

    def results(self) -> list[list[SearchHypothesis]]:
        return [h[:self.nbest] for h in self.hyps]


# ------------------------------------------------------- the step every search shares


@dataclass
class _LiveRows:
    """The live rows -- hypotheses being extended, one model row each -- and what a step needs
    of them. Every per-row tensor follows the rows through :meth:`select`."""

    sent: Tensor  # (R,) on the CPU: the sentence of src each row belongs to
    max_len: Tensor  # (R,) the most output tokens before EOS is forced
    prefix: Tensor  # (R, P) the forced prefix, -1 = free
    prev: Tensor  # (R,) the token the next step is fed (BOS first)
    tokens: Tensor  # (R, t) the tokens so far
    attn: Tensor | None = None  # (R, t, ..., S) cross-attention of every step so far
    constraint: ConstraintState | None = None  # what the next token may be (constrained decoding)
    columns: NarrowedVocabulary | None = None  # the steps' columns, where they narrow the vocabulary

    def add_attention(self, attn: Tensor | None) -> None:
        """Append a step's cross-attention (R, ..., S), if the model returned one."""
        if attn is not None:
            step = attn.unsqueeze(1)  # (R, 1, ..., S)
            self.attn = step if self.attn is None else torch.cat([self.attn, step], dim=1)

    def select(self, index: Tensor) -> None:
        """Keep rows ``index`` (R',) in that order: a beam's parents, or the rows not done."""
        self.sent = self.sent[index.cpu()]
        self.max_len = self.max_len.index_select(0, index)
        self.prefix = self.prefix.index_select(0, index)
        self.tokens = self.tokens.index_select(0, index)
        if self.attn is not None:
            self.attn = self.attn.index_select(0, index)
        if self.constraint is not None:
            self.constraint.select(index)

    def extend(self, tok: Tensor) -> None:
        """Each row's next token (R,): the next step's input and the last of its tokens. From a
        model that narrows its steps, ``tok`` are columns of the last step's scores, which keep
        their meaning for rows reordered since (a row keeps its sentence, and so its list)."""
        if self.columns is not None:
            tok = self.columns.ids(torch.arange(tok.numel(), device=tok.device), tok)
        self.prev = tok
        self.tokens = torch.cat([self.tokens, tok[:, None]], dim=1)
        if self.constraint is not None:
            self.constraint.advance(tok)


@dataclass
class _OngoingSearch:
    """One search's shared part: the model and its state, the live rows, the finished
    hypotheses, and the per-sentence numbers fixed at the start. Each step of every search
    is: :meth:`log_probs` (model step, then the constraints' masks), its own selection,
    :meth:`finish` for the rows that chose EOS, :meth:`reorder` + ``rows.extend``."""

    model: DecoderModel
    cfg: DecodeConfig
    masks: _StepMasks
    inputs: SearchInputs
    src_len: Tensor  # (B,) on the CPU: |x| per sentence
    max_len: Tensor  # (B,) on the CPU: the most output tokens per sentence
    total_steps: int  # steps that the longest allowed output needs (its EOS included)
    state: Any  # the model's
    rows: _LiveRows
    finished: _FinishedHypotheses

    def log_probs(self, t: int) -> Tensor:
        """Step ``t`` for every live row: the masked next-token log-probabilities (R, V), or
        (R, C) over the columns of ``rows.columns`` for a model that narrows its steps (whose
        special ids are their own columns: EOS is found, masked and chosen as in (R, V))."""
        rows = self.rows
        logits, attn = self.model.step(rows.prev, self.state, self.inputs.need_attn, self.inputs.vocabulary)
        lprobs = step_log_probs(logits, self.model.normalized)
        hist, prefix = rows.tokens, rows.prefix
        columns = rows.columns
        if columns is not None:
            row_ids = torch.arange(lprobs.size(0), device=lprobs.device)[:, None]
            if self.masks.no_repeat_ngram_size > 0:  # one-to-one: a row emits only its columns' ids
                hist = columns.columns(row_ids, hist)
            if prefix.numel():
                prefix = torch.where(prefix >= 0, columns.columns(row_ids, prefix.clamp(min=0)), prefix)
        lprobs = self.masks.apply(lprobs, t, hist, rows.max_len, prefix)
        if rows.constraint is not None:
            rows.constraint.mask(lprobs, t)
        rows.add_attention(attn)
        return lprobs

    def finish(self, index: Tensor, log_prob: list[float], t: int) -> None:
        """Store rows ``index`` ended by EOS at step ``t`` (t tokens before it) with their
        summed log-probabilities, in that order."""
        penalty = float(length_penalty(float(t + 1), self.cfg.lenpen, self.cfg.lenpen_style))
        tokens_of = self.rows.tokens.index_select(0, index).tolist()
        for i, row in enumerate(index.tolist()):
            sent = int(self.rows.sent[row])
            attention = None
            if self.rows.attn is not None:
                attention = _trim_attention(self.rows.attn[row], int(self.src_len[sent]))
            self.finished.add(sent, SearchHypothesis(tokens=tokens_of[i], score=log_prob[i] / penalty,
                                                     log_prob=log_prob[i], attention=attention))

    def reorder(self, index: Tensor, same_sources: bool = False) -> None:
        """Keep rows ``index`` of the model state and of the live rows."""
        self.state = self.model.reorder(self.state, index, same_sources=same_sources)
        if self.inputs.vocabulary is not None:
            self.inputs.vocabulary.select(index, same_sources=same_sources)
        self.rows.select(index)


def _start(model: DecoderModel, src: Tensor, cfg: DecodeConfig, inputs: SearchInputs, copies: int,
           nbest: int) -> _OngoingSearch | None:
    """Encode ``src`` and set up ``copies`` rows per sentence; None for an empty batch."""
    device = src.device
    n_sent = src.size(0)
    src_len = source_lengths(src, inputs.pad).cpu()
    prefix_all, prefix_len = _prefix_tensor(inputs.prefix, n_sent, device)
    max_len = max_output_lengths(src_len, cfg, model.max_steps, prefix_len)
    if n_sent == 0:
        return None
    vocabulary = inputs.vocabulary
    narrows = vocabulary is not None and vocabulary.narrows
    if narrows and inputs.constraint is not None:
        raise ValueError("a constraint masks the whole vocabulary: it cannot drive steps that narrow it")
    total_steps = int(max_len.max()) + 1
    state = model.init_state(src, total_steps)
    if vocabulary is not None:
        vocabulary.start(n_sent)
    sent = torch.arange(n_sent).repeat_interleave(copies)
    if copies > 1:
        state = model.reorder(state, sent.to(device))
        if vocabulary is not None:
            vocabulary.select(sent.to(device))
    n_rows = sent.numel()
    rows = _LiveRows(sent=sent, max_len=max_len.repeat_interleave(copies).to(device),
                     prefix=prefix_all.repeat_interleave(copies, dim=0),
                     prev=torch.full((n_rows,), inputs.bos, dtype=torch.long, device=device),
                     tokens=torch.empty(n_rows, 0, dtype=torch.long, device=device),
                     columns=cast(NarrowedVocabulary, vocabulary) if narrows else None)
    if inputs.constraint is not None:
        rows.constraint = inputs.constraint.start(sent.to(device), rows.max_len)
    masks = _StepMasks(cfg.min_len, cfg.no_repeat_ngram_size, inputs.pad, inputs.bos, inputs.eos)
    return _OngoingSearch(model, cfg, masks, inputs, src_len, max_len, total_steps, state, rows,
                          _FinishedHypotheses(n_sent, nbest))


# ----------------------------------------------------------------------- searches


def search(model: DecoderModel, src: Tensor, cfg: DecodeConfig,
           inputs: SearchInputs = SearchInputs()) -> list[list[SearchHypothesis]]:
    """Dispatch on ``cfg``: sampling, greedy (beam 1) or beam search.

    Returns, per sentence of ``src``, up to ``cfg.nbest`` hypotheses, best first.
    """
    cfg.validate()
    if cfg.sampling:
        strategy = sample
    elif cfg.beam == 1:
        strategy = greedy_search
    else:
        strategy = beam_search
    return strategy(model, src, cfg, inputs)


@torch.inference_mode()
def beam_search(model: DecoderModel, src: Tensor, cfg: DecodeConfig,
                inputs: SearchInputs = SearchInputs()) -> list[list[SearchHypothesis]]:
    """Beam search batched over sentences x beams (``cfg.beam`` = K).

    Each step scores all K*V continuations of a sentence's live beams and takes the 2K
    best (at most K of them end in EOS, so K live ones always remain). EOS among the K
    best finishes a hypothesis (fairseq's rule; it makes beam 1 equal greedy). A sentence
    is done when K hypotheses have finished, or -- early termination -- when no live
    hypothesis can reach the nbest-th best finished score even in the best case (its
    log-probability cannot rise, and the length penalty is at most that of the longest
    allowed output: tensor2tensor's bound), or when no live hypothesis is left. Done
    sentences leave the batch at once.

    With a constraint whose state divides the beam into banks (an ``AllocatingState``:
    lexical constraints), the K live beams are chosen by dynamic beam allocation
    (:meth:`_Beams.allocated`) instead of by score alone, and a hypothesis ends when EOS is
    among the K best continuations of the hypotheses that met every constraint
    (:meth:`_Beams.complete`).
    """
    run = _start(model, src, cfg, inputs, copies=1, nbest=cfg.nbest)
    if run is None:
        return []
    eos = inputs.eos
    # The largest length penalty a live hypothesis may still get (at the longest allowed
    # output; lp is monotone in the length, so the next length covers alpha < 0).
    lp_at_max = length_penalty(run.max_len.double() + 1, cfg.lenpen, cfg.lenpen_style).float()
    # Summed log-probabilities (n, k) of the n live sentences' k beams each; k = 1 until the
    # first step has produced K different beams.
    scores = torch.zeros(src.size(0), 1, device=src.device)
    banks = run.rows.constraint if isinstance(run.rows.constraint, AllocatingState) else None
    for t in range(run.total_steps):
        k = scores.size(1)
        lprobs = run.log_probs(t)  # (n * k, V)
        top = _Beams.best(lprobs, scores, 2 * cfg.beam)
        is_eos = top.tok == eos
        if banks is None:
            _finish_beams(run, top, is_eos, k, t)
            live = top.live(is_eos, cfg.beam)
        else:
            ending = _Beams.complete(lprobs, scores, banks, cfg.beam)
            _finish_beams(run, ending, ending.tok == eos, k, t)
            live = _Beams.allocated(lprobs, scores, top, banks, cfg.beam, eos)
        done = _beams_done(run, live, k, lp_at_max, t)
        if bool(done.all()):
            break
        scores = _advance_beams(run, live, k, done)
    logger.debug("beam search: %d sentences, beam %d, %d steps", src.size(0), cfg.beam, t + 1)
    return run.finished.results()


class _Beams(NamedTuple):
    """Candidates (n, c) of the n live sentences, best first: summed log-probability, the
    parent beam (0..k-1 within the sentence), the token."""

    scores: Tensor
    beam: Tensor
    tok: Tensor

    @staticmethod
    def best(lprobs: Tensor, scores: Tensor, c: int) -> _Beams:
        """The ``c`` best continuations per sentence of beams ``scores`` (n, k); lprobs (n * k, V)."""
        n, k = scores.shape
        # A beam's score is the same for all of its continuations, so the sentence's c best
        # candidates are among the c best tokens of each of its rows: take those per row,
        # then add the scores to (rows, c) values only, never to a (rows, vocab) tensor.
        per_row = min(c, lprobs.size(-1))
        row_vals, row_tok = row_topk(lprobs, per_row)  # (R, c)
        candidates = (scores.view(-1, 1) + row_vals).view(n, k * per_row)
        top_scores, top_pos = candidates.topk(min(c, k * per_row), dim=1)  # (n, c), best first
        top_beam = torch.div(top_pos, per_row, rounding_mode="floor")
        return _Beams(top_scores, top_beam, row_tok.view(n, k * per_row).gather(1, top_pos))

    def live(self, is_eos: Tensor, k_beam: int) -> _Beams:
        """The ``k_beam`` best candidates that do not end in EOS (stable order, best first)."""
        n_cand = self.scores.size(1)
        rank = is_eos.long() * n_cand + torch.arange(n_cand, device=is_eos.device)
        chosen = rank.topk(min(k_beam, n_cand), dim=1, largest=False)[1]
        return _Beams(*(x.gather(1, chosen) for x in self))

    @staticmethod
    def complete(lprobs: Tensor, scores: Tensor, state: AllocatingState, c: int) -> _Beams:
        """The ``c`` best continuations per sentence of its beams that have met every
        constraint token (the highest bank), -inf where there are fewer; lprobs (n * k, V).

        A hypothesis ends when EOS is among these: it competes with the hypotheses of its
        own bank, as the allocation's stripes have it, not with likelier ones of lower banks,
        which are likelier only because they have not paid for the phrases yet. (Among the
        sentence's best candidates overall, a phrase the model finds unlikely would end only
        when every lower hypothesis had become as unlikely, often at the length bound.)"""
        n, k = scores.shape
        done = (state.met_tokens() >= state.total_tokens()).nonzero(as_tuple=True)[0]  # (D,) rows
        per_row = min(c, lprobs.size(-1))
        vals = torch.full((n * k, per_row), NEG_INF, device=lprobs.device)
        toks = torch.zeros((n * k, per_row), dtype=torch.long, device=lprobs.device)
        if done.numel():
            done_vals, toks[done] = row_topk(lprobs.index_select(0, done), per_row)
            vals[done] = scores.view(-1)[done, None] + done_vals
        top_scores, top_pos = vals.view(n, k * per_row).topk(min(c, k * per_row), dim=1)
        top_beam = torch.div(top_pos, per_row, rounding_mode="floor")
        return _Beams(top_scores, top_beam, toks.view(n, k * per_row).gather(1, top_pos))

    @staticmethod
    def allocated(lprobs: Tensor, scores: Tensor, top: _Beams, state: AllocatingState, k_beam: int,
                  eos: int) -> _Beams:
        """The ``k_beam`` live candidates by dynamic beam allocation (Post & Vilar 2018), the
        slots dealt in stripes over the banks that have candidates (Hu et al. 2019).

        Candidates: the best ones (``top``), each row's best token, and each row's next
        constraint tokens (each (beam, token) pair once, EOS excluded). They are put in banks
        by the constraint tokens they have met (0 to the sentence's total). The slots go
        round the non-empty banks, highest first: the best candidate of each, then the second
        best of each, and so on; candidates with no finite score come last. Dealing only to
        non-empty banks matters when there are more banks than slots: a fixed share per bank
        would leave the slots of the (early on, empty) high banks to the likeliest candidates,
        and a phrase would be started only when the length bound forces it. The chosen ones
        come best first.
        """
        n, k = scores.shape
        dev = lprobs.device
        beams = torch.arange(k, device=dev)
        nxt = state.next_tokens()  # (n * k, C)
        per_row = nxt.size(1)
        beam = torch.cat([top.beam, beams.expand(n, k), beams.repeat_interleave(per_row).expand(n, k * per_row)], 1)
        tok = torch.cat([top.tok, lprobs.argmax(dim=1).view(n, k), nxt.reshape(n, k * per_row)], 1)
        rows = torch.arange(n, device=dev)[:, None] * k + beam  # (n, M)
        valid = (tok >= 0) & (tok != eos)
        tok = tok.clamp(min=0)
        cand = torch.where(valid, scores.gather(1, beam) + lprobs[rows, tok], NEG_INF)
        # Each (beam, token) pair once: the later copies of a key are dropped.
        key_sorted, key_order = (beam * lprobs.size(1) + tok).sort(dim=1, stable=True)
        dup_sorted = torch.zeros_like(key_sorted, dtype=torch.bool)
        dup_sorted[:, 1:] = key_sorted[:, 1:] == key_sorted[:, :-1]
        cand = cand.masked_fill(torch.zeros_like(dup_sorted).scatter_(1, key_order, dup_sorted), NEG_INF)
        total = state.total_tokens().view(n, k)[:, 0]  # (n,)
        bank = state.met_after(rows.reshape(-1), tok.reshape(-1)).view(n, -1).clamp(min=0)
        bank = torch.minimum(bank, total[:, None])
        n_banks = int(total.max()) + 1
        cand_sorted, order = cand.sort(dim=1, descending=True, stable=True)
        bank_sorted = bank.gather(1, order)
        onehot = F.one_hot(bank_sorted, n_banks)  # (n, M, banks)
        rank = (onehot.cumsum(dim=1) * onehot).sum(dim=2) - 1  # within its bank, by score
        # Stripe r holds each bank's r-th best, highest bank first.
        stripe = rank * n_banks + (n_banks - 1 - bank_sorted)
        stripe = stripe.masked_fill(~torch.isfinite(cand_sorted), cand.size(1) * n_banks)
        pick = stripe.argsort(dim=1, stable=True)[:, :k_beam].sort(dim=1).values  # best first
        chosen = order.gather(1, pick)
        return _Beams(cand.gather(1, chosen), beam.gather(1, chosen), tok.gather(1, chosen))


def _finish_beams(run: _OngoingSearch, top: _Beams, is_eos: Tensor, k: int, t: int) -> None:
    """Finish the hypotheses that chose EOS among their sentence's K best candidates (with a
    finite score); each sentence has k rows."""
    k_beam = run.cfg.beam
    finishing = is_eos[:, :k_beam] & torch.isfinite(top.scores[:, :k_beam])
    if bool(finishing.any()):
        sent_idx, cand_idx = finishing.nonzero(as_tuple=True)
        parents = sent_idx * k + top.beam[sent_idx, cand_idx]
        run.finish(parents, top.scores[sent_idx, cand_idx].tolist(), t)


def _beams_done(run: _OngoingSearch, live: _Beams, k: int, lp_at_max: Tensor, t: int) -> Tensor:
    """(n,) bool on the CPU: the sentences (k rows each) whose search is over after step ``t``."""
    cfg = run.cfg
    sent = run.rows.sent[::k]  # (n,) each live sentence's index in src
    best_live = live.scores.amax(dim=1).cpu()
    lp_next = float(length_penalty(float(t + 2), cfg.lenpen, cfg.lenpen_style))
    bound = best_live / lp_at_max[sent].clamp(min=lp_next)
    count = run.finished.count[sent]
    done = (count >= cfg.beam) | ~torch.isfinite(best_live)
    done |= (count >= cfg.nbest) & (run.finished.nbest_score[sent] >= bound)
    return done


def _advance_beams(run: _OngoingSearch, live: _Beams, k: int, done: Tensor) -> Tensor:
    """Drop the done sentences, move every row (k per sentence) to its live beam's parent and
    extend it with the beam's token; returns the new beam scores (n', K)."""
    n = live.scores.size(0)
    device = live.scores.device
    some_done = bool(done.any())
    if some_done:
        kept = (~done).nonzero(as_tuple=True)[0].to(device)
        live = _Beams(*(x[kept] for x in live))
    else:
        kept = torch.arange(n, device=device)
    # Rows stay with their sentence unless sentences left or the beams were just created.
    same_sources = not some_done and k == live.scores.size(1)
    run.reorder((kept[:, None] * k + live.beam).view(-1), same_sources=same_sources)
    run.rows.extend(live.tok.view(-1))
    return live.scores


@torch.inference_mode()
def greedy_search(model: DecoderModel, src: Tensor, cfg: DecodeConfig,
                  inputs: SearchInputs = SearchInputs()) -> list[list[SearchHypothesis]]:
    """The most probable token at each step; one hypothesis per sentence."""
    return _sample_or_greedy(model, src, cfg, inputs, greedy=True)


@torch.inference_mode()
def sample(model: DecoderModel, src: Tensor, cfg: DecodeConfig,
           inputs: SearchInputs = SearchInputs()) -> list[list[SearchHypothesis]]:
    """``cfg.beam`` independent samples per sentence; the ``cfg.nbest`` best-scored are
    returned, best first (fairseq's ``--sampling --beam K``; beam 1 = plain sampling).

    Each token is drawn from softmax(logits / temperature), restricted to the ``top_k``
    most probable tokens and to the smallest set whose probability reaches ``top_p``
    (nucleus). Scores are the model's own log-probabilities (temperature 1, unfiltered),
    length-normalised like beam hypotheses. ``cfg.seed`` seeds a private generator, so a
    call is reproducible; the draws depend on the batch's composition (as in fairseq).
    """
    return _sample_or_greedy(model, src, cfg, inputs, greedy=False)


def _filter_top_k_top_p(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """Set logits outside the top-k / nucleus to -inf, in place. logits (R, V)."""
    vocab = logits.size(-1)
    if 0 < top_k < vocab:
        kth_best = logits.topk(top_k, dim=-1)[0][:, -1:]
        logits.masked_fill_(logits < kth_best, NEG_INF)
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        logits.masked_fill_(drop, NEG_INF)
    return logits


def _draw(lprobs: Tensor, cfg: DecodeConfig, generator: torch.Generator | None) -> Tensor:
    """One token per row (R,) drawn from the tempered, top-k / nucleus-filtered ``lprobs``."""
    # Masks carry over (-inf stays -inf); temperature and filters only shape the draw.
    draw = _filter_top_k_top_p(lprobs / cfg.temperature, cfg.top_k, cfg.top_p)
    return torch.multinomial(draw.softmax(dim=-1), 1, generator=generator)[:, 0]


def _sample_or_greedy(model: DecoderModel, src: Tensor, cfg: DecodeConfig, inputs: SearchInputs,
                      greedy: bool) -> list[list[SearchHypothesis]]:
    """One row per (sentence, sample), each extended by its own token until it chooses EOS."""
    run = _start(model, src, cfg, inputs, copies=1 if greedy else cfg.beam, nbest=1 if greedy else cfg.nbest)
    if run is None:
        return []
    generator = None
    if not greedy:
        generator = torch.Generator(device=src.device)
        generator.manual_seed(cfg.seed)
    scores = torch.zeros(run.rows.prev.numel(), device=src.device)  # (R,) summed log-probabilities
    for t in range(run.total_steps):
        lprobs = run.log_probs(t)
        dead = lprobs.amax(dim=-1) == NEG_INF  # every token masked (constraints no output meets): no hypothesis
        if bool(dead.any()):
            alive = (~dead).nonzero(as_tuple=True)[0]
            if alive.numel() == 0:
                break
            run.reorder(alive)
            scores, lprobs = scores[alive], lprobs[alive]
        tok = lprobs.argmax(dim=-1) if greedy else _draw(lprobs, cfg, generator)
        scores = scores + lprobs.gather(1, tok[:, None])[:, 0]
        ended = tok == inputs.eos
        if bool(ended.any()):
            rows = ended.nonzero(as_tuple=True)[0]
            run.finish(rows, scores[rows].tolist(), t)
            keep = (~ended).nonzero(as_tuple=True)[0]
            if keep.numel() == 0:
                break
            run.reorder(keep)
            scores, tok = scores[keep], tok[keep]
        run.rows.extend(tok)
    return run.finished.results()


__all__ = [
    "BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "DecoderModel", "SearchHypothesis", "SearchInputs", "StepVocabulary",
    "beam_search",
    "greedy_search", "length_penalty", "max_output_lengths", "sample", "search", "source_lengths",
    "step_log_probs",
]
