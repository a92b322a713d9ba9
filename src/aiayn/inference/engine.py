"""The decoding engine: trained models on one device, ready to search.

Built once from models (or checkpoints, :func:`load_models`) and a device, it owns what a
decoding step depends on:

- the precision, resolved once (:func:`aiayn.runtime.precision.resolve_inference_dtype`;
  a :class:`~aiayn.runtime.precision.DtypeChoice` the command line already resolved passes
  through), and the inference copies of the weights in it (fused, cast or quantized:
  :func:`aiayn.inference.optimize.optimize_for_inference`);
- the ensemble: several models decoded as one (:class:`~aiayn.inference.adapters.EnsembleDecoder`);
- the compiled step and its cache on disk: AOTInductor packages on a CPU
  (:mod:`aiayn.inference.compiled`, :mod:`aiayn.inference.step_packages`), CUDA graphs on a GPU
  (:mod:`aiayn.inference.cuda_graphs`);
- worker processes that search a request's batches side by side on a CPU
  (:mod:`aiayn.inference.workers`).

``decoder`` is the one step function the search drives (``init_state`` / ``step(tokens, state,
need_attn, vocabulary)`` / ``reorder``), eager or compiled behind the same interface; a
vocabulary shortlist is the step's ``vocabulary`` argument (:mod:`aiayn.inference.step_vocabulary`).
:meth:`DecodingEngine.search` runs one batch of an encoded request, :meth:`DecodingEngine.search_batches`
all of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.checkpoint.average import average_weights
from aiayn.checkpoint.directory import LoadedCheckpoint, load_checkpoint
from aiayn.config import Config
from aiayn.errors import CheckpointError, ConfigError, ConstraintError
from aiayn.inference.adapters import EnsembleDecoder, IncrementalDecoder
from aiayn.inference.compiled import CompiledDecoder, compile_pays
from aiayn.inference.cuda_graphs import CudaGraphDecoder, graphs_pay, uses_cuda_graphs
from aiayn.inference.optimize import optimize_for_inference
from aiayn.inference.phrase_constraints import PhraseConstraint
from aiayn.inference.quantize import Int8Linear
from aiayn.inference.request import EncodedSentence, SourceLimits, TranslationRequest
from aiayn.inference.search import DecoderModel, SearchHypothesis, SearchInputs, StepVocabulary, search
from aiayn.inference.step_vocabulary import SENTENCES_PER_LIST, BatchVocabulary, SentenceVocabulary
from aiayn.inference.workers import SearchWorkers
from aiayn.model import Transformer, count_parameters
from aiayn.runtime.devices import resolve_device
from aiayn.runtime.precision import INFERENCE_PRECISIONS, DtypeChoice, resolve_inference_dtype, torch_dtype
from aiayn.vocab import EOS_ID, PAD_ID

log = logging.getLogger(__name__)


@dataclass
class LoadedModels:
    """Trained models and what decoding them needs: the tokenizer and configuration of the last."""

    models: list[Transformer]
    tokenizer: Any
    config: Config


def load_models(paths: Sequence[str | Path], ensemble: bool = False) -> LoadedModels:
    """Checkpoints (directories, run directories or ``last``/``best`` pointers) as models. Several
    paths: one model with their weights averaged (element-wise mean, as ``aiayn average`` and the
    paper's last checkpoints), or with ``ensemble`` one model each, sharing one tokenizer. The
    configuration and tokenizer come from the last path."""
    if not paths:
        raise CheckpointError("no checkpoint given")
    if ensemble:
        members = [_load_with_tokenizer(p) for p in paths]
        _check_same_tokenizer(members)
        log.info("loaded an ensemble of %s (%s)", ", ".join(str(p) for p in paths), members[-1].tokenizer)
        return LoadedModels([m.model for m in members], members[-1].tokenizer, members[-1].config)
    loaded = _load_with_tokenizer(paths[-1])
    if len(paths) > 1:
        averaged, _, dirs = average_weights(list(paths))
        loaded.model.load_state_dict(averaged, strict=True)
        log.info("averaged the weights of %d checkpoints", len(dirs))
    log.info("loaded %s (%s)", ", ".join(str(p) for p in paths), loaded.tokenizer)
    return LoadedModels([loaded.model], loaded.tokenizer, loaded.config)


def weight_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The dtype an inference copy's weights are cast to for ``precision`` on ``device``: None
    for fp32 (as trained), ``torch.int8`` for int8 (its linear layers quantized, CPU only),
    bfloat16, float16 (GPU only)."""
    if precision == "int8":
        if device.type != "cpu":
            raise ConfigError(f"--dtype int8 is a CPU path (oneDNN int8 matmuls); on {device} use fp16 or bf16")
        return torch.int8
    if precision not in INFERENCE_PRECISIONS:
        raise ConfigError(f"--dtype {precision}: choose from {', '.join(INFERENCE_PRECISIONS)}")
    out = torch_dtype(precision)
    if out is torch.float16 and device.type != "cuda":
        raise ConfigError("--dtype fp16 needs a CUDA device; use bf16 on the CPU")
    return out


class DecodingEngine:
    """``models`` (one, or several decoded as an ensemble; put in eval mode and moved to
    ``device`` in place, nothing else changed) as inference copies in precision ``dtype``
    (``auto``, a name of :data:`~aiayn.runtime.precision.INFERENCE_PRECISIONS`, or a resolved
    :class:`~aiayn.runtime.precision.DtypeChoice`), decoding eagerly until :meth:`use_compiled`
    (at once with ``compile``)."""

    def __init__(self, models: Transformer | Sequence[Transformer], device: str | torch.device = "cpu",
                 dtype: str | DtypeChoice = "fp32", compile: bool = False) -> None:
        trained = [models] if isinstance(models, Transformer) else list(models)
        if not trained:
            raise ConfigError("no model given")
        self.device = resolve_device(device)
        self.precision = dtype if isinstance(dtype, DtypeChoice) else resolve_inference_dtype(dtype, self.device)
        weights = weight_dtype(self.precision.dtype, self.device)
        # Counted on the trained models (an int8 copy keeps its weights outside nn.Parameters);
        # an ensemble's are the sums over its models.
        counts = [count_parameters(m) for m in trained]
        self.parameters = {key: sum(c[key] for c in counts) for key in counts[0]}
        self.optimized = [optimize_for_inference(m.to(self.device).eval(), dtype=weights) for m in trained]
        self.model = self.optimized[0].model
        self.decoder: DecoderModel = self._joined([IncrementalDecoder(o) for o in self.optimized])
        self.limits = SourceLimits(min(m.src_positions.max_positions for m in trained), self.decoder.max_steps)
        self._compiled: DecoderModel | None = None
        self._compiled_members: list[CompiledDecoder] = []
        self._workers: tuple[int, int] = (1, 0)  # (processes, threads each) asked for
        self._pool: tuple[Any, SearchWorkers] | None = None  # (its shortlist, the workers)
        if compile:
            self.use_compiled()

    # ------------------------------------------------------------ compiled steps

    @property
    def compiled(self) -> bool:
        """Whether the decoding steps run compiled."""
        return self._compiled is not None and self.decoder is self._compiled

    @staticmethod
    def _joined(members: list[Any]) -> DecoderModel:
        return members[0] if len(members) == 1 else EnsembleDecoder(members)

    def compiled_decoder(self) -> DecoderModel:
        """The decoder with compiled steps (built once): CUDA graphs on a GPU, AOTInductor
        packages on a CPU, their cache keyed by the weights (:mod:`aiayn.inference.step_packages`)."""
        if self._compiled is None:
            step = CudaGraphDecoder if uses_cuda_graphs(self.device) else CompiledDecoder
            self._compiled_members = [step(optimized) for optimized in self.optimized]
            self._compiled = self._joined(self._compiled_members)
        return self._compiled

    @property
    def steps_compile_well(self) -> bool:
        """Whether compiled steps are fast and compute what the eager ones do: false where an
        int8 layer's exported form (``torch._int_mm``) would be slow or saturate on this CPU
        (:meth:`~aiayn.inference.quantize.Int8Linear.compiles_well`)."""
        return all(m.compiles_well() for o in self.optimized for part in (o.model, o.step_projection)
                   for m in part.modules() if isinstance(m, Int8Linear))

    def use_compiled(self, warm_up: Callable[[DecoderModel], None] | None = None) -> None:
        """From now on decode with :meth:`compiled_decoder`. ``warm_up(decoder)`` runs first
        (e.g. a few searches), so that calls meanwhile from another thread (a server's) keep
        the eager steps until the compiled ones are ready. Where compiled steps would be slow or
        inexact (:attr:`steps_compile_well`), the steps stay eager, with a warning."""
        if self.compiled:
            return
        if not self.steps_compile_well:
            log.warning("int8 decoding steps are not compiled on a CPU without VNNI or AMX (torch._int_mm, "
                        "which they would run, is slow or inexact there); decoding with the eager steps")
            return
        decoder = self.compiled_decoder()
        if warm_up is not None:
            warm_up(decoder)
        self.decoder = decoder

    def compile_pays(self, lines: int | None, per_source: int) -> bool:
        """Whether compiling the steps wins back its warm-up over ``lines`` more lines (None:
        unknown, a stream) on this device (:func:`aiayn.inference.compiled.compile_pays`),
        counting on a cheaper warm-up where an earlier run left the packages of these weights
        for ``per_source`` rows per sentence (the beam) in the compile cache."""
        if uses_cuda_graphs(self.device):
            return graphs_pay(lines)
        if not self.steps_compile_well:
            return False
        parameters = self.parameters["parameters"]
        if not compile_pays(lines, parameters, self.device, warm=True):
            return False  # too few lines even for a warm cache: no need to look for one
        self.compiled_decoder()
        warm = all(m.packages.path(per_source, self.device).is_file() for m in self._compiled_members)
        return compile_pays(lines, parameters, self.device, warm=warm)

    # ------------------------------------------------------------ worker processes

    def use_workers(self, workers: int, threads: int = 1) -> None:
        """Search the batches of each later request in ``workers`` processes of ``threads``
        torch threads each (:mod:`aiayn.inference.workers`); 1: in this process. Workers run
        the eager steps: a compiled decoder, a request with a grammar (the parser's) or a
        decoder given to :meth:`search_batches` searches here."""
        if self._pool is not None and self._workers != (workers, threads):
            self._pool[1].close()
            self._pool = None
        self._workers = (workers, threads)

    @property
    def searches_in_workers(self) -> bool:
        """Whether :meth:`search_batches` hands requests (those without a grammar) to worker
        processes: more than one asked for, and the steps eager."""
        return self._workers[0] > 1 and not self.compiled

    def _worker_pool(self, shortlist: Any) -> SearchWorkers:
        if self._pool is not None and self._pool[0] is not shortlist:
            self._pool[1].close()
            self._pool = None
        if self._pool is None:  # forked now: the workers hold the engine and shortlist as they are
            def search(batch: list[EncodedSentence], request: TranslationRequest) -> list[list[SearchHypothesis]]:
                return self.search(batch, request, shortlist)

            self._pool = (shortlist, SearchWorkers(search, *self._workers))
        return self._pool[1]

    def search_batches(self, batches: Iterable[list[EncodedSentence]], request: TranslationRequest,
                       shortlist: Any = None, decoder: DecoderModel | None = None,
                       ) -> Iterator[tuple[list[EncodedSentence], list[list[SearchHypothesis]]]]:
        """Each batch with its hypotheses (:meth:`search`), in order: in the worker processes
        of :meth:`use_workers` where they apply, else here one batch after another."""
        if self.searches_in_workers and decoder is None and request.grammar is None:
            yield from self._worker_pool(shortlist).map(batches, request)
            return
        for batch in batches:
            yield batch, self.search(batch, request, shortlist, decoder)

    # ----------------------------------------------------------------- searching

    def vocabulary(self, decoder: DecoderModel, shortlist: Any, src: Tensor, prefix: list[list[int]] | None,
                   required: list[int], whole_vocabulary: bool) -> StepVocabulary:
        """The shortlist as ``decoder``'s steps' vocabulary: on one that projects onto per-sentence
        lists, each few sentences their own list (and their forced prefixes) unless a
        constraint needs ``whole_vocabulary`` scores; else the batch's list (and the ids of its
        forced prefixes and ``required`` constraint pieces)."""
        vocab_size = int(self.model.output_weight.size(0))
        if decoder.projects_sentence_lists and not whole_vocabulary:
            lists, sizes = shortlist.sentence_rows(src.cpu(), prefix or (), group=SENTENCES_PER_LIST)
            return SentenceVocabulary(self.model, lists.to(self.device), sizes, vocab_size,
                                      sentences_per_list=SENTENCES_PER_LIST)
        extra = [*(i for p in prefix or [] for i in p), *required]
        return BatchVocabulary(shortlist.rows(src.flatten().cpu(), extra).to(self.device), vocab_size)

    def search(self, batch: list[EncodedSentence], request: TranslationRequest, shortlist: Any = None,
               decoder: DecoderModel | None = None) -> list[list[SearchHypothesis]]:
        """One batch's hypotheses, per sentence. A sentence with lexical constraints for which
        the search found none raises ConstraintError, or with the request's ``best_effort`` is
        searched again without them. ``shortlist``: the tokenizer's, for ``decode.shortlist``;
        ``decoder``: one of this engine's other than :attr:`decoder`."""
        cfg = request.decode
        decoder = self.decoder if decoder is None else decoder
        src = _pad([s.source for s in batch]).to(self.device)
        prefix = [s.prefix for s in batch] if any(s.prefix for s in batch) else None
        constraint = request.grammar([s.index for s in batch]) if request.grammar is not None else None
        lexical = any(s.constrained for s in batch)
        vocabulary = None
        if cfg.shortlist:
            if shortlist is None:
                raise ConfigError("decode.shortlist: the checkpoint has no vocabulary shortlist (prepare its data "
                                  "with data.shortlist_k)")
            required = [piece for s in batch for phrase in s.include for piece in phrase]
            vocabulary = self.vocabulary(decoder, shortlist, src, prefix, required, constraint is not None or lexical)
        if lexical:
            constraint = PhraseConstraint([s.include for s in batch], [s.exclude for s in batch], eos=EOS_ID)
        inputs = SearchInputs(prefix=prefix, need_attn=request.attention, constraint=constraint,
                              vocabulary=vocabulary)
        hyps = search(decoder, src, cfg, inputs)
        for k, sentence in enumerate(batch):
            if hyps[k] or not sentence.constrained:
                continue
            reason = "no translation within the length bound meets its constraints"
            if not request.best_effort:
                raise ConstraintError(sentence.index, reason)
            log.warning("sentence %d: %s; translated without them", sentence.index + request.first_number, reason)
            alone = SearchInputs(prefix=[prefix[k]] if prefix else None, need_attn=request.attention,
                                 vocabulary=vocabulary)
            hyps[k] = search(decoder, src[k:k + 1], cfg, alone)[0]
        return hyps


def _pad(seqs: list[list[int]]) -> Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    for r, s in enumerate(seqs):
        out[r, :len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def _load_with_tokenizer(path: str | Path) -> LoadedCheckpoint:
    loaded = load_checkpoint(path, device="cpu")
    if loaded.tokenizer is None:
        raise CheckpointError(f"{loaded.path}: the checkpoint has no tokenizer/ directory, so "
                              "text cannot be encoded; save it with its tokenizer")
    return loaded


def _check_same_tokenizer(members: Sequence[LoadedCheckpoint]) -> None:
    """An ensemble adds up probabilities id by id: its models must share one vocabulary."""
    last = members[-1]
    for member in members[:-1]:
        assert member.tokenizer is not None and last.tokenizer is not None  # _load_with_tokenizer
        if member.tokenizer.model_bytes() != last.tokenizer.model_bytes():
            raise CheckpointError(f"{member.path} and {last.path}: different tokenizers; the models of an "
                                  "ensemble must share one SentencePiece vocabulary")


__all__ = ["DecodingEngine", "LoadedModels", "load_models", "weight_dtype"]
