"""Text in, text out: a trained checkpoint, its SentencePiece model, and the search.

    translator = Translator.from_checkpoint("runs/base", device="cpu")  # dtype "auto"
    translator.translate(["A man is riding a bike."])            # -> ["Ein Mann ..."]
    translator.translate_detailed(texts, nbest=4, attention=True)  # scores, pieces, weights

Sentences are sorted by length and grouped into batches of at most ``batch_tokens``
padded source tokens (DecodeConfig.batch_tokens), so padding is small, and results come
back in input order. Text crosses the model boundary only through the checkpoint's own
tokenizer, both ways (``encode_src`` in, ``decode_tgt`` out).

Several checkpoint paths are *averaged* (element-wise mean of the weights, as ``aiayn
average`` writes and as the paper does with its last 5 or 20 checkpoints, section 6.1):
one model, one decoder pass per step, the speed of a single model. With ``ensemble=True``
they are *ensembled* instead: each step runs every model and searches the mean of their
probabilities (``aiayn.inference.adapters.EnsembleDecoder``), n passes per step, for
models trained apart (other seeds) whose weights cannot be averaged meaningfully.

Decoding options (beam, lenpen, max_len_a, ...) default to the checkpoint's ``decode``
section; any :class:`~aiayn.config.DecodeConfig` field can be overridden per call.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.checkpoint.average import average_weights
from aiayn.checkpoint.directory import LoadedCheckpoint, load_checkpoint
from aiayn.config import Config, DecodeConfig, to_dict
from aiayn.errors import CheckpointError, ConfigError
from aiayn.inference.adapters import EnsembleDecoder, IncrementalDecoder
from aiayn.inference.compiled import CompiledDecoder, compile_pays
from aiayn.inference.constraints import Constraint, LexicalConstraint
from aiayn.inference.cuda_graphs import CudaGraphDecoder, graphs_pay, uses_cuda_graphs
from aiayn.inference.optimize import optimize_for_inference
from aiayn.inference.search import SearchHypothesis, max_output_lengths, search
from aiayn.inference.shortlist import SENTENCES_PER_LIST, SentenceShortlistDecoder, ShortlistDecoder
from aiayn.inference.step_packages import weights_fingerprint
from aiayn.inference.terms import ConstraintError, LexicalConstraints, constraints_list
from aiayn.model import Transformer, count_parameters
from aiayn.runtime import (
    INFERENCE_PRECISIONS,
    TORCH_DTYPES,
    DtypeChoice,
    compile_cache_dir,
    cpu_flags,
    resolve_device,
    resolve_inference_dtype,
    torch_dtype,
)
from aiayn.text.tokenizer import lang_tag
from aiayn.vocab import BOS_ID, EOS_ID, EOS_PIECE, PAD_ID, UNK_ID

log = logging.getLogger(__name__)

# How bf16 runs: "cast" converts the weights (of the inference copy); "autocast" keeps fp32
# weights and lets torch.autocast pick per op. Casting is the faster of the two, with the
# same outputs on the test models: autocast re-casts every weight matrix at every step.
BF16_MODE = "cast"


@dataclass
class Hypothesis:
    """One translation of one sentence.

    Attributes:
        text: The translation, detokenized.
        tokens: Its target ids, without EOS.
        score: Log-probability / length penalty; hypotheses are sorted by it.
        src_pieces: The source pieces with the final ``</s>``: the attention's columns.
        tgt_pieces: The target pieces plus ``</s>``: the attention's rows.
        attention: Cross-attention weights (layers, heads, target pieces, source pieces),
            float32 on the CPU, when asked for; else None.
        log_prob: The summed log-probability (EOS included), before the length penalty.
    """

    text: str  # detokenized
    tokens: list[int]  # target ids, without EOS
    score: float  # log-probability / length penalty; hypotheses are sorted by it
    src_pieces: list[str]  # source pieces incl. the final "</s>": the attention's columns
    tgt_pieces: list[str]  # target pieces plus "</s>": the attention's rows
    # Cross-attention weights (layers, heads, len(tgt_pieces), len(src_pieces)), float32 on
    # the CPU (or what translate_detailed's attention_summary made of them); None unless
    # attention was asked for.
    attention: Tensor | None = None
    log_prob: float = 0.0  # summed log-probability (EOS included), before the length penalty


@dataclass
class TranslationResult:
    """All hypotheses of one input sentence, best first.

    Attributes:
        source: The input text.
        hypotheses: Its translations, best first; ``best`` is the first.
        src_tokens: The encoder's input ids, EOS included.
    """

    source: str
    hypotheses: list[Hypothesis] = field(default_factory=list)
    src_tokens: list[int] = field(default_factory=list)  # the encoder's input, EOS included

    @property
    def best(self) -> Hypothesis:
        return self.hypotheses[0]


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """'fp32' and 'int8' -> None (float32 weights; int8 quantizes them afterwards),
    'bf16' -> torch.bfloat16, 'fp16' (GPU only)."""
    if dtype == "int8":
        if device.type != "cpu":
            raise ConfigError(f"--dtype int8 is a CPU path (oneDNN int8 matmuls); on {device} use fp16 or bf16")
        return None
    if dtype not in TORCH_DTYPES:
        raise ConfigError(f"--dtype {dtype}: choose from {', '.join(INFERENCE_PRECISIONS)}")
    out = torch_dtype(dtype)
    if out is torch.float16 and device.type != "cuda":
        raise ConfigError("--dtype fp16 needs a CUDA device; use bf16 on the CPU")
    return out


class Translator:
    """A model + tokenizer + decoding defaults, translating lists of sentences.

    Made from a checkpoint with
    [from_checkpoint][aiayn.inference.translator.Translator.from_checkpoint]:

        translator = Translator.from_checkpoint("runs/mine/averaged")
        translator.translate(["A man is riding a bike."])  # ["Ein Mann fährt Fahrrad."]

    ``config`` is the checkpoint's [Config][aiayn.config.Config] (a bare ``DecodeConfig`` is
    accepted too, e.g. from the trainer's validation). The model is put in eval mode and moved to
    ``device`` in place, and nothing else is changed in it: decoding runs an inference copy
    of it (``aiayn.inference.optimize.optimize_for_inference``), built here from the
    weights as they are now; ``self.model`` is that copy. ``dtype="auto"`` picks the fastest
    precision of this device that keeps float32's quality
    (``aiayn.runtime.auto_inference_dtype``; ``self.dtype`` is the one
    chosen, ``self.dtype_choice`` says why); the constructor's default is fp32, the
    weights as trained (``from_checkpoint``'s is ``auto``). With ``dtype="bf16"`` the copy's
    weights are bfloat16 (see ``BF16_MODE``); with ``dtype="int8"`` its linear layers
    are quantized (``aiayn.inference.quantize``, CPU only); log-probabilities are always
    computed in float32. With ``compile=True`` the decoding steps run compiled ahead of time
    (``aiayn.inference.compiled``): the first batch takes tens of seconds to compile, unless
    an earlier run left the compiled step of the same weights on disk; later ones run faster.

    ``model`` may be a list of models sharing ``tokenizer``: they are decoded as an ensemble
    (``self.decoder`` is then an ``EnsembleDecoder``; ``self.model`` is the first one's copy).
    """

    def __init__(self, model: Transformer | Sequence[Transformer], tokenizer: Any,
                 config: Config | DecodeConfig | None = None, device: str | torch.device = "cpu",
                 dtype: str = "fp32", compile: bool = False) -> None:
        if config is None:
            config = Config()
        elif isinstance(config, DecodeConfig):
            config = Config(decode=config)
        self.config = config
        self.tokenizer = tokenizer
        self.device = resolve_device(device)
        self.dtype_choice: DtypeChoice = resolve_inference_dtype(dtype, self.device)
        self.dtype = dtype = self.dtype_choice.dtype
        half = resolve_dtype(dtype, self.device)
        autocast = half if half is torch.bfloat16 and BF16_MODE == "autocast" else None
        weights = torch.int8 if dtype == "int8" else (None if autocast is not None else half)
        trained = [model] if isinstance(model, Transformer) else list(model)
        if not trained:
            raise ConfigError("no model given")
        # Counted on the trained models (an int8 copy keeps its weights outside nn.Parameters);
        # an ensemble's are the sums over its models.
        counts = [count_parameters(m) for m in trained]
        self.parameters = {key: sum(c[key] for c in counts) for key in counts[0]}
        self._optimized = [optimize_for_inference(m.to(self.device).eval(), dtype=weights) for m in trained]
        self._autocast = autocast
        self._fingerprint: str | None = None  # of the weights, for compile_marker
        self.model = self._optimized[0].model
        self.compiled = False  # whether the decoding steps run compiled (see use_compiled)
        self.decoder: Any = self._decoder(compiled=False)
        if compile:
            self.use_compiled()
        limits = [n for m in trained if (n := getattr(m.src_positions, "max_positions", None)) is not None]
        self.max_src_len: int | None = min(limits) if limits else None

    # --------------------------------------------------------------- construction

    @classmethod
    def from_checkpoint(cls, path: str | Path | Sequence[str | Path], device: str | torch.device = "cpu",
                        dtype: str = "auto", compile: bool = False, ensemble: bool = False) -> Translator:
        """Load a checkpoint: its model, tokenizer and decoding defaults.

        Args:
            path: A checkpoint directory, a run directory (its last checkpoint) or a
                ``last``/``best`` pointer file. Several paths: their weights are averaged;
                the configuration and tokenizer come from the last one, and all must have
                the same model configuration (with ``ensemble``: the same tokenizer).
            device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (a GPU if there is one).
            dtype: ``auto`` (the default: the fastest precision of this device that keeps
                float32's quality, see ``aiayn.runtime.auto_inference_dtype``;
                ``$AIAYN_DTYPE`` pins it), ``fp32``, ``bf16``, ``fp16`` (GPU only) or ``int8``
                (CPU only).
            compile: Run the decoding steps compiled (AOTInductor; see the class).
            ensemble: Decode with the ensemble of the paths' models (the mean of their
                probabilities at each step) instead of averaging their weights.

        Returns:
            The translator, its model in eval mode on ``device``.

        Raises:
            CheckpointError: A missing, incomplete or corrupted checkpoint, one saved
                without its tokenizer, or an ensemble whose tokenizers differ.
            ConfigError: A device or dtype that this machine does not have.

        Example:
            ```python
            translator = Translator.from_checkpoint("runs/mine/averaged", dtype="bf16")
            ```
        """
        paths = [path] if isinstance(path, (str, Path)) else list(path)
        if not paths:
            raise CheckpointError("no checkpoint given")
        if ensemble:
            members = [_load_with_tokenizer(p) for p in paths]
            _check_same_tokenizer(members)
            loaded = members[-1]
            log.info("loaded an ensemble of %s (%s)", ", ".join(str(p) for p in paths), loaded.tokenizer)
            return cls([m.model for m in members], loaded.tokenizer, loaded.config, device=device, dtype=dtype,
                       compile=compile)
        loaded = _load_with_tokenizer(paths[-1])
        if len(paths) > 1:
            _load_average(loaded.model, paths)
        log.info("loaded %s (%s)", ", ".join(str(p) for p in paths), loaded.tokenizer)
        return cls(loaded.model, loaded.tokenizer, loaded.config, device=device, dtype=dtype, compile=compile)

    # ------------------------------------------------------------ compiled steps

    def _decoder(self, compiled: bool) -> Any:
        # Compiled steps: CUDA graphs on a GPU, AOTInductor packages on a CPU.
        step = IncrementalDecoder if not compiled else (
            CudaGraphDecoder if uses_cuda_graphs(self.device) else CompiledDecoder)
        decoders = [step(optimized, autocast=self._autocast) for optimized in self._optimized]
        return decoders[0] if len(decoders) == 1 else EnsembleDecoder(decoders)

    def use_compiled(self, warm_up: Sequence[Sequence[str]] = ()) -> None:
        """From now on decode with compiled steps (``aiayn.inference.compiled``), kept on disk
        (:mod:`aiayn.inference.step_packages`), so that a later process with the same weights
        loads them instead of compiling. ``warm_up``: batches of texts translated
        with the compiled steps before they replace the current ones, so that the calls
        meanwhile (e.g. a server's, from another thread) keep the eager steps until the
        compiled ones are ready."""
        if self.compiled:
            return
        decoder = self._decoder(compiled=True)
        if warm_up:
            shadow = copy.copy(self)
            shadow.decoder = decoder
            for texts in warm_up:
                shadow.translate(list(texts))
        self.decoder, self.compiled = decoder, True

    def compile_pays(self, lines: int | None) -> bool:
        """Whether compiling the steps wins back its warm-up over ``lines`` more lines
        (None: unknown, a stream) on this device (:func:`aiayn.inference.compiled.compile_pays`),
        counting on a cheaper warm-up where an earlier run compiled this model's steps."""
        if uses_cuda_graphs(self.device):
            return graphs_pay(lines)
        parameters = self.parameters["parameters"]
        if not compile_pays(lines, parameters, self.device, warm=True):
            return False  # too few lines even for a warm cache: no need to look for one
        return compile_pays(lines, parameters, self.device, warm=self.compile_marker().is_file())

    def compile_marker(self) -> Path:
        """A file in the compile cache that says an earlier run compiled steps of these weights
        in this precision on this device and CPU kind (see :meth:`record_compiled`): their
        packages are on disk (:mod:`aiayn.inference.step_packages`)."""
        if self._fingerprint is None:
            self._fingerprint = weights_fingerprint(o.model for o in self._optimized)
        key = json.dumps({"weights": self._fingerprint, "dtype": self.dtype, "device": self.device.type,
                          "cpu": sorted(cpu_flags())}, sort_keys=True)
        return compile_cache_dir() / "aiayn-compiled" / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")

    def record_compiled(self) -> None:
        """Write :meth:`compile_marker` once a compiled step has run (the cache then holds its
        graphs); a no-op otherwise, and where the cache folder cannot be written."""
        members = getattr(self.decoder, "members", [self.decoder])
        if not any(getattr(m, "compiled_ran", False) for m in members):
            return
        marker = self.compile_marker()
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(json.dumps({"dtype": self.dtype, "device": self.device.type}) + "\n", encoding="utf-8")
        except OSError as exc:
            log.debug("compile cache marker not written: %s", exc)

    # ----------------------------------------------------------------- decoding

    def decode_config(self, **overrides: Any) -> DecodeConfig:
        """The checkpoint's decoding options with ``overrides`` (None values are ignored)."""
        return self.config.decode.with_overrides(**overrides)

    def source_lengths(self, texts: Sequence[str]) -> list[int]:
        """Source tokens (EOS included) of each text as encoded, before any truncation."""
        # num_threads=1: the server calls this on its event loop; short texts need no thread pool.
        return [len(ids) for ids in self.tokenizer.encode_src_batch(list(texts), num_threads=1)]

    def describe(self) -> dict[str, Any]:
        """The model's configuration, languages, vocabulary and parameter counts (``GET /v1/model``)."""
        cfg, tok = self.config, self.tokenizer
        return {"config": to_dict(cfg),
                "languages": {"source": cfg.data.src_lang, "target": cfg.data.tgt_lang},
                "vocabulary": {"source": tok.src_vocab_size, "target": tok.tgt_vocab_size,
                               "joint": bool(getattr(tok, "joint", False))},
                "parameters": self.parameters}

    def translate(self, texts: Sequence[str], constraints: Sequence[Any] | None = None,
                  constraints_best_effort: bool = False, **decode_overrides: Any) -> list[str]:
        """The best translation of each text, in input order.

        Args:
            texts: The sentences, one string each; an empty one gets an empty translation.
            constraints: Terminology, one entry per text: None (none), a list of phrases
                that must appear in its translation (``["Hund", "roten Ball"]``), an object
                ``{"include": [...], "exclude": [...]}`` (``exclude``: phrases that must
                not appear) or an ``aiayn.inference.terms.LexicalConstraints``.
            constraints_best_effort: Translate a text whose constraints cannot be met
                within the length bound without them (with a warning) instead of raising
                ``ConstraintError``.
            **decode_overrides: Decoding options for this call, replacing the checkpoint's
                ``decode`` section: ``beam``, ``lenpen``, ``max_len_a``, ``max_len_b``,
                ``min_len``, ``no_repeat_ngram_size``, ``sampling``, ... (the fields of
                ``aiayn.config.DecodeConfig``, the options of ``aiayn translate``).

        Returns:
            One translation per text.

        Raises:
            ConfigError: An unknown decoding option or a bad value.
            DataError: Malformed constraints.
            ConstraintError: A text whose constraints cannot be met (a phrase the target
                vocabulary cannot spell, phrases longer than the length bound allows, a
                phrase that contains an excluded one, or no hypothesis found).

        Example:
            ```python
            translator.translate(["A man is riding a bike."], beam=5, lenpen=1.0)
            translator.translate(["A dog chases a red ball."], constraints=[["Hund", "roten Ball"]])
            ```
        """
        return [r.hypotheses[0].text if r.hypotheses else ""
                for r in self.translate_detailed(texts, nbest=1, constraints=constraints,
                                                 constraints_best_effort=constraints_best_effort,
                                                 **decode_overrides)]

    def translate_detailed(self, texts: Sequence[str], nbest: int = 1, attention: bool = False,
                           prefixes: Sequence[str | None] | None = None,
                           progress: Callable[[int], None] | None = None,
                           constraint_for: Callable[[list[int]], Constraint] | None = None,
                           attention_summary: Callable[[Tensor], Tensor] | None = None,
                           first_number: int = 1,
                           constraints: Sequence[Any] | None = None,
                           constraints_best_effort: bool = False,
                           **decode_overrides: Any) -> list[TranslationResult]:
        """Up to ``nbest`` hypotheses per text with scores, pieces and (optionally) the
        cross-attention of each hypothesis.

        ``prefixes``: per text, a target-side text the translation must start with (None or
        "" for none). ``progress`` is called with the number of sentences of each finished
        batch. ``constraint_for``: given the indices (into ``texts``) of a batch's sentences,
        in batch order, the ``aiayn.inference.constraints.Constraint`` their outputs must
        satisfy (constrained decoding, e.g. the parser's tree grammar). An empty (or
        all-whitespace) text gets one empty hypothesis, without running the model.
        ``attention_summary``: with ``attention``, what each hypothesis keeps instead of its
        (layers, heads, target, source) weights, computed from them batch by batch (e.g.
        ``aiayn.inference.alignment.last_layer_mean``), so that many texts need not hold
        every layer's weights at once. ``first_number``: the number of ``texts[0]`` in
        warnings (its line, when ``texts`` is a chunk of a file). ``constraints`` and
        ``constraints_best_effort``: terminology, as in :meth:`translate` (not together with
        ``constraint_for``).
        """
        cfg = self.decode_config(**{**decode_overrides, "nbest": nbest})
        if prefixes is not None and len(prefixes) != len(texts):
            raise ConfigError(f"prefixes: {len(prefixes)} given for {len(texts)} texts")
        results = [TranslationResult(source=t) for t in texts]
        todo = [i for i, t in enumerate(texts) if t.strip()]
        for i in range(len(texts)):
            if not texts[i].strip():
                results[i].hypotheses = [Hypothesis("", [], 0.0, [EOS_PIECE], [EOS_PIECE])]
        if progress is not None and len(todo) < len(texts):
            progress(len(texts) - len(todo))
        if not todo:
            return results
        self._encode_sources(texts, todo, results, first_number, self.source_tokenizer(cfg))
        prefix_ids = self._encode_prefixes(prefixes, todo)
        lexical: dict[int, tuple[list[list[int]], list[list[int]]]] = {}
        if constraints is not None:
            if constraint_for is not None:
                raise ConfigError("constraints: lexical constraints cannot be combined with another constraint")
            lexical = self._encode_constraints(constraints_list(constraints, len(texts)), todo, results, cfg,
                                               prefix_ids, constraints_best_effort, first_number)
        for batch in self._batches(todo, [len(results[i].src_tokens) for i in todo], cfg.batch_tokens):
            constraint = constraint_for(batch) if constraint_for is not None else None
            hyps = self._search(batch, results, cfg, attention, prefix_ids, constraint, lexical,
                                constraints_best_effort, first_number)
            for i, per_sent in zip(batch, hyps):
                results[i].hypotheses = [self._hypothesis(results[i].src_tokens, h, attention_summary)
                                         for h in per_sent]
            if progress is not None:
                progress(len(batch))
        return results

    def _shortlisted(self, src: Tensor, prefix: list[list[int]] | None, required: list[int],
                     whole_vocabulary: bool) -> Any:
        """The decoder restricted to the shortlist: on a single eager model, each few sentences
        to their own list (and their forced prefixes) unless a constraint needs
        ``whole_vocabulary`` scores; else the batch to its list (and the ids of its forced
        prefixes and ``required`` constraint pieces)."""
        shortlist = getattr(self.tokenizer, "shortlist", None)
        if shortlist is None:
            raise ConfigError("decode.shortlist: the checkpoint has no vocabulary shortlist (prepare its data "
                              "with data.shortlist_k)")
        vocab_size = int(self.tokenizer.tgt_vocab_size)
        if type(self.decoder) is IncrementalDecoder and not whole_vocabulary:
            lists, sizes = shortlist.sentence_rows(src.cpu(), prefix or (), group=SENTENCES_PER_LIST)
            return SentenceShortlistDecoder(self.decoder, lists.to(self.device), sizes, vocab_size,
                                            sentences_per_list=SENTENCES_PER_LIST)
        extra = [*(i for p in prefix or [] for i in p), *required]
        rows = shortlist.rows(src.flatten().cpu(), extra).to(self.device)
        return ShortlistDecoder(self.decoder, rows, vocab_size)

    def source_tokenizer(self, cfg: DecodeConfig) -> Any:
        """The tokenizer that encodes the sources under ``cfg``: with the target-language tag
        of ``cfg.tgt_lang``, else of the checkpoint's ``data.tgt_lang`` when it was trained
        with ``data.tgt_lang_tag``, else none (the tokenizer as given)."""
        data = self.config.data
        lang = cfg.tgt_lang or (data.tgt_lang if data.tgt_lang_tag else "")
        if not lang:
            return self.tokenizer
        tag = lang_tag(lang)
        if not hasattr(self.tokenizer, "tagged") or not self.tokenizer.has_src_piece(tag):
            tags = self.tokenizer.lang_tags() if hasattr(self.tokenizer, "lang_tags") else []
            known = f"its languages: {', '.join(t[2:-2] for t in tags)}" if tags else "it has no language tags"
            raise ConfigError(f"decode.tgt_lang: the model's source vocabulary has no tag {tag} ({known})")
        return self.tokenizer.tagged(lang)

    def _encode_sources(self, texts: Sequence[str], todo: list[int], results: list[TranslationResult],
                        first_number: int = 1, tokenizer: Any = None) -> None:
        """Each text's source ids (EOS included), cut to the model's positions with a warning."""
        tokenizer = self.tokenizer if tokenizer is None else tokenizer
        src_ids = tokenizer.encode_src_batch([texts[i] for i in todo], num_threads=1)
        for n, i in enumerate(todo):
            ids = src_ids[n]
            if self.max_src_len is not None and len(ids) > self.max_src_len:
                log.warning("sentence %d: %d source tokens, truncated to the model's %d positions",
                            i + first_number, len(ids), self.max_src_len)
                ids = ids[:self.max_src_len - 1] + [EOS_ID]
            results[i].src_tokens = ids

    def _search(self, batch: list[int], results: list[TranslationResult], cfg: DecodeConfig, attention: bool,
                prefix_ids: dict[int, list[int]], constraint: Constraint | None,
                lexical: dict[int, tuple[list[list[int]], list[list[int]]]], best_effort: bool,
                first_number: int) -> list[list[SearchHypothesis]]:
        """One batch's hypotheses; a sentence with lexical constraints for which the search
        found none raises ConstraintError, or with ``best_effort`` is searched again without."""
        src = _pad([results[i].src_tokens for i in batch]).to(self.device)
        prefix = [prefix_ids.get(i, []) for i in batch] if prefix_ids else None
        required = [piece for i in batch for phrase in lexical.get(i, ([], []))[0] for piece in phrase]
        constrained = constraint is not None or any(i in lexical for i in batch)
        decoder = self._shortlisted(src, prefix, required, constrained) if cfg.shortlist else self.decoder
        if any(i in lexical for i in batch):
            include, exclude = zip(*(lexical.get(i, ([], [])) for i in batch))
            constraint = LexicalConstraint(include, exclude, eos=EOS_ID)
        hyps = search(decoder, src, cfg, prefix=prefix, need_attn=attention,
                      pad=PAD_ID, bos=BOS_ID, eos=EOS_ID, constraint=constraint)
        for k in [k for k, i in enumerate(batch) if not hyps[k] and i in lexical]:
            reason = "no translation within the length bound meets its constraints"
            if not best_effort:
                raise ConstraintError(batch[k], reason)
            log.warning("sentence %d: %s; translated without them", batch[k] + first_number, reason)
            hyps[k] = search(decoder, src[k:k + 1], cfg, prefix=[prefix[k]] if prefix else None,
                             need_attn=attention, pad=PAD_ID, bos=BOS_ID, eos=EOS_ID)[0]
        return hyps

    def _encode_constraints(self, constraints: list[LexicalConstraints], todo: list[int],
                            results: list[TranslationResult], cfg: DecodeConfig, prefix_ids: dict[int, list[int]],
                            best_effort: bool, first_number: int) -> dict[int, tuple[list[list[int]], list[list[int]]]]:
        """Each text's constraint phrases as target pieces (SentencePiece's segmentation of the
        phrase as words inside a sentence), checked: every phrase must be spelled without the
        unknown piece, contain no excluded phrase, and all must fit the length bound. A text
        that fails raises ConstraintError, or with ``best_effort`` loses what fails (a
        warning says so)."""
        out: dict[int, tuple[list[list[int]], list[list[int]]]] = {}
        tok = self.tokenizer
        for i in todo:
            con = constraints[i]
            if not con:
                continue

            def fail(reason: str, i: int = i, dropped: str = "it") -> None:
                if not best_effort:
                    raise ConstraintError(i, reason)
                log.warning("sentence %d: %s; translated without %s", i + first_number, reason, dropped)

            exclude = [ids for p in con.exclude if (ids := tok.encode_tgt(p))]
            include = []
            for phrase in con.include:
                ids = tok.encode_tgt(phrase)
                inside = next((q for q, q_ids in zip(con.exclude, exclude) if _contains(ids, q_ids)), None)
                if not ids or UNK_ID in ids:
                    fail(f"constraint {_short(phrase)}: the target vocabulary cannot spell it (an unknown piece)")
                elif inside is not None:
                    fail(f"constraint {_short(phrase)} contains the excluded phrase {_short(inside)}")
                else:
                    include.append(ids)
            src_len = torch.tensor([len(results[i].src_tokens)])
            prefix_len = torch.tensor([len(prefix_ids.get(i, []))])
            room = int(max_output_lengths(src_len, cfg, self.decoder.max_steps, prefix_len)[0]) - int(prefix_len[0])
            needed = sum(len(ids) for ids in include)
            if needed > room:
                fail(f"the constraints need {needed} target pieces; the length bound (max_len_a x source length "
                     f"+ max_len_b, less any prefix) leaves {room}", dropped="them")
                include = []
            if include or exclude:
                out[i] = (include, exclude)
        return out

    def _encode_prefixes(self, prefixes: Sequence[str | None] | None, todo: list[int]) -> dict[int, list[int]]:
        if prefixes is None:
            return {}
        return {i: self.tokenizer.encode_tgt(p) for i in todo if (p := prefixes[i])}

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _batches(indices: list[int], lengths: list[int], budget: int) -> list[list[int]]:
        """Indices sorted by length (longest first), cut so that sentences x longest <= budget.

        Sorting keeps padding small; a sentence longer than the budget is a batch alone.
        """
        order = sorted(range(len(indices)), key=lambda k: -lengths[k])
        batches: list[list[int]] = []
        current: list[int] = []
        width = 0
        for k in order:
            w = max(width, lengths[k])
            if current and w * (len(current) + 1) > budget:
                batches.append(current)
                current, w = [], lengths[k]
            current.append(indices[k])
            width = w
        if current:
            batches.append(current)
        return batches

    def _hypothesis(self, src_tokens: list[int], h: SearchHypothesis,
                    attention_summary: Callable[[Tensor], Tensor] | None = None) -> Hypothesis:
        tok = self.tokenizer
        attention = h.attention
        if attention is not None and attention_summary is not None:
            attention = attention_summary(attention)
        return Hypothesis(
            text=tok.decode_tgt(h.tokens),
            tokens=list(h.tokens),
            score=float(h.score),
            src_pieces=tok.src_pieces(src_tokens),
            tgt_pieces=tok.tgt_pieces(h.tokens) + [EOS_PIECE],
            attention=attention.cpu() if attention is not None else None,
            log_prob=float(h.log_prob),
        )


def _short(phrase: str, limit: int = 60) -> str:
    """A phrase quoted for a message, cut to ``limit`` characters."""
    return repr(phrase if len(phrase) <= limit else phrase[:limit] + "...")


def _contains(seq: list[int], part: list[int]) -> bool:
    """``part`` occurs in ``seq`` as consecutive items."""
    n = len(part)
    return any(seq[k:k + n] == part for k in range(len(seq) - n + 1))


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


def _load_average(model: Transformer, paths: Sequence[str | Path]) -> None:
    """Replace ``model``'s weights with the element-wise mean over ``paths``."""
    averaged, _, dirs = average_weights(list(paths))
    model.load_state_dict(averaged, strict=True)
    log.info("averaged the weights of %d checkpoints", len(dirs))
