"""The four sections of an experiment and the whole: ``Config(model, data, train, decode)``.

Every field has the paper's value as its default where the paper gives one; variants are
options. Each section's ``validate`` raises a :class:`ConfigError` naming the field, e.g.
``model.n_heads: d_model=512 is not divisible by n_heads=7``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from aiayn.config.coercion import short_repr, to_dict
from aiayn.config.options import DecodeOption, HttpField, decode_option
from aiayn.errors import ConfigError

# ---------------------------------------------------------------------- validation


def _check_finite(section: Any, prefix: str) -> None:
    """NaN or infinity in a numeric field is a mistake (``--lenpen nan`` would decode silently)."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}.{f.name}: must be a finite number, got {value}")


def _choice(prefix: str, name: str, value: Any, choices: tuple[str, ...]) -> None:
    """``value`` is one of ``choices``, else an error listing them."""
    if value not in choices:
        raise ConfigError(f"{prefix}.{name}: {short_repr(value)} is not one of {', '.join(choices)}")


# --------------------------------------------------------------------------- model


@dataclass
class ModelConfig:
    """The Transformer's shape. Defaults are the paper's base model (Table 3, row 'base')."""

    src_vocab_size: int = 32000
    tgt_vocab_size: int = 32000
    d_model: int = 512
    n_heads: int = 8
    # Head dimension d_k = d_v. None means d_model / n_heads (the paper); Table 3 (A)/(B)
    # vary it independently, so it can be set explicitly.
    d_head: int | None = None
    # d_k (queries, keys) and d_v (values) on their own: Table 3 row (B) shrinks d_k only
    # (its 58M/60M parameters add up with d_v = 64). None: d_head, else d_model / n_heads.
    d_k: int | None = None
    d_v: int | None = None
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    # P_drop of section 5.4: on every sub-layer output and on embeddings + positions.
    dropout: float = 0.1
    # tensor2tensor also drops attention probabilities and the FFN's hidden activation;
    # fairseq defaults both to 0, as does the paper's text.
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"  # relu | gelu | swish
    positions: str = "sinusoidal"  # sinusoidal | learned
    # interleaved: the paper's formula, PE(pos, 2i) = sin, PE(pos, 2i+1) = cos.
    # concat: all sines then all cosines (fairseq, tensor2tensor, Marian, HF Marian).
    sinusoid_layout: str = "interleaved"
    # post: LayerNorm(x + Dropout(Sublayer(x))), the paper. pre: x + Sublayer(LayerNorm(x))
    # plus a final LayerNorm after each stack (tensor2tensor v2+).
    norm: str = "post"
    # all: one matrix for source embedding, target embedding and pre-softmax projection
    # (section 3.4; needs a shared vocabulary). decoder: target embedding tied to the
    # projection only. none: three separate matrices.
    share_embeddings: str = "all"
    max_positions: int = 1024
    pad_id: int = 0
    layer_norm_eps: float = 1e-5
    # A bias on the pre-softmax projection (HF Marian's final_logits_bias). Off in the paper.
    output_bias: bool = False

    @property
    def head_dim(self) -> int:
        """d_k, the query/key size per head (the paper's d_k = d_v; see :attr:`value_dim`)."""
        return self.key_dim

    @property
    def key_dim(self) -> int:
        """d_k: W_Q and W_K project d_model to n_heads * d_k."""
        return self.d_k if self.d_k is not None else self._shared_head_dim()

    @property
    def value_dim(self) -> int:
        """d_v: W_V projects d_model to n_heads * d_v, W_O back from n_heads * d_v."""
        return self.d_v if self.d_v is not None else self._shared_head_dim()

    def _shared_head_dim(self) -> int:
        return self.d_head if self.d_head is not None else self.d_model // self.n_heads

    def validate(self, prefix: str = "model") -> None:
        _check_finite(self, prefix)
        self._validate_sizes(prefix)
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise ConfigError(f"{prefix}.{name}: must be in [0, 1), got {p}")
        _choice(prefix, "activation", self.activation, ("relu", "gelu", "swish"))
        _choice(prefix, "positions", self.positions, ("sinusoidal", "learned"))
        _choice(prefix, "sinusoid_layout", self.sinusoid_layout, ("interleaved", "concat"))
        _choice(prefix, "norm", self.norm, ("post", "pre"))
        _choice(prefix, "share_embeddings", self.share_embeddings, ("all", "decoder", "none"))
        if self.sinusoid_layout and self.d_model % 2 != 0 and self.positions == "sinusoidal":
            raise ConfigError(f"{prefix}.d_model: sinusoidal positions need an even d_model")
        if self.share_embeddings == "all" and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError(
                f"{prefix}.share_embeddings: 'all' needs one shared vocabulary, but "
                f"src_vocab_size={self.src_vocab_size} != tgt_vocab_size={self.tgt_vocab_size}"
            )
        if not 0 <= self.pad_id < min(self.src_vocab_size, self.tgt_vocab_size):
            raise ConfigError(f"{prefix}.pad_id: {self.pad_id} is outside the vocabulary")
        if self.layer_norm_eps <= 0:
            raise ConfigError(f"{prefix}.layer_norm_eps: must be positive")

    def _validate_sizes(self, prefix: str) -> None:
        positive = (
            "src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff",
            "max_positions",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{prefix}.{name}: must be positive, got {getattr(self, name)}")
        for name in ("n_encoder_layers", "n_decoder_layers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{prefix}.{name}: must be at least 1, got {getattr(self, name)}")
        self._validate_heads(prefix)

    def _validate_heads(self, prefix: str) -> None:
        for name in ("d_head", "d_k", "d_v"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ConfigError(f"{prefix}.{name}: must be a positive integer or null, got {short_repr(value)}")
        defaulted = self.d_head is None and (self.d_k is None or self.d_v is None)
        if defaulted and self.d_model % self.n_heads != 0:
            raise ConfigError(
                f"{prefix}.n_heads: d_model={self.d_model} is not divisible by "
                f"n_heads={self.n_heads} (set {prefix}.d_head to choose d_k explicitly)"
            )


MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # Table 3 of the paper.
    "base": dict(d_model=512, d_ff=2048, n_heads=8, n_encoder_layers=6,
                 n_decoder_layers=6, dropout=0.1),
    "big": dict(d_model=1024, d_ff=4096, n_heads=16, n_encoder_layers=6,
                n_decoder_layers=6, dropout=0.3),
    # For tests and the demo: small enough to train in seconds on a CPU.
    "tiny": dict(d_model=64, d_ff=128, n_heads=4, n_encoder_layers=2,
                 n_decoder_layers=2, dropout=0.0, src_vocab_size=64, tgt_vocab_size=64,
                 max_positions=256),
}


def model_preset(name: str, **overrides: Any) -> ModelConfig:
    """A :class:`ModelConfig` for a named preset (``base``, ``big``, ``tiny``)."""
    if name not in MODEL_PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; choose from {sorted(MODEL_PRESETS)}")
    cfg = ModelConfig(**{**MODEL_PRESETS[name], **overrides})
    cfg.validate()
    return cfg


# ---------------------------------------------------------------------------- data


@dataclass
class DataConfig:
    """Where the data comes from and how it is tokenized and filtered."""

    # A known corpus (see aiayn.data.datasets), or None for user files / synthetic.
    dataset: str | None = None
    # A mirror folder holding the corpus files (`--data-dir`; None: $AIAYN_DATA_MIRROR);
    # files the mirror lacks are downloaded into download_dir.
    data_dir: str | None = None
    src_lang: str = "en"
    tgt_lang: str = "de"
    # Multilingual models (OPUS-MT's convention): every source sequence starts with the
    # target-language tag >>tgt_lang<<, a control piece of the source vocabulary; at
    # translation time --tgt-lang (decode.tgt_lang) picks another language of the vocabulary.
    tgt_lang_tag: bool = False
    # The output of `aiayn prepare`: tokenizer model(s), binarized splits, summary.json.
    prepared_dir: str | None = None
    train_src: str | None = None
    train_tgt: str | None = None
    valid_src: str | None = None
    valid_tgt: str | None = None
    test_src: str | None = None
    test_tgt: str | None = None
    # One two-column file (source<TAB>target) instead of a file pair; per split.
    train_tsv: str | None = None
    valid_tsv: str | None = None
    test_tsv: str | None = None
    # Where downloaded (not mirrored) corpus files and extracted archive members are kept;
    # None: $AIAYN_CACHE_DIR or ~/.cache/aiayn/datasets.
    download_dir: str | None = None
    # Seeds synthetic-task generation and SentencePiece's sentence sampling.
    seed: int = 1
    valid_split: str = "val"
    test_split: str = "test_2016_flickr"
    # Built-in synthetic task (copy | reverse | sort | toy): used when dataset is None
    # and no files are given.
    synthetic: str | None = None
    synthetic_train_size: int = 20000
    synthetic_valid_size: int = 500
    synthetic_min_len: int = 3
    synthetic_max_len: int = 12
    synthetic_vocab: int = 20
    # SentencePiece.
    vocab_size: int = 8000
    joint_vocab: bool = True
    character_coverage: float = 1.0
    spm_model_type: str = "bpe"  # bpe | unigram | word (word: synthetic tasks)
    spm_input_sentence_size: int = 2_000_000
    # Separate (joint_vocab: false) vocabularies may differ in size and model type, e.g.
    # parsing: BPE over words on the source, whole-token ("word") on the tree side.
    tgt_vocab_size: int | None = None
    tgt_spm_model_type: str | None = None
    # Parsing (`prepare --task parsing`): what stands for a word in the target tree,
    # "placeholders" (XX, the paper) or "words" (the word itself; see aiayn.data.trees).
    parsing_target: str = "placeholders"
    # With "words": words seen fewer times in the training trees stay placeholders.
    parsing_min_count: int = 2
    # Train on every phrase of the training trees spanning this many words or more as well,
    # each as a pair of its own (aiayn.data.treebank.phrase_subtrees); 0: the whole trees only.
    parsing_subtrees: int = 0
    # Also train on this many variants of every training pair (trees and phrases) in which
    # each word is replaced, with probability parsing_substitution_rate, by a training word
    # of the same POS tag (aiayn.data.treebank.substituted; seeded by data.seed); 0: off.
    parsing_substitutions: int = 0
    parsing_substitution_rate: float = 0.5
    # Use this directory's tokenizer (spm*.model, e.g. a checkpoint's) instead of training
    # one: needed to fine-tune a checkpoint (train.init_from) on new data.
    tokenizer_dir: str | None = None
    # With tokenizer_dir: add this many pieces learned on the training text to that tokenizer,
    # every old id kept (aiayn.text.extend; fine-tune with train.init_vocab: extend). 0: off.
    extend_vocab: int = 0
    # Vocabulary shortlist (aiayn.text.shortlist; decode with --shortlist): for each source
    # piece, the shortlist_k target pieces most associated with it in the training pairs, plus
    # the shortlist_frequent most frequent target pieces. 0: none is built.
    shortlist_k: int = 0
    shortlist_frequent: int = 100
    # Training-data filters (validation and test are never filtered).
    max_len: int = 256
    max_len_ratio: float = 9.0
    on_invalid_utf8: str = "error"  # error | replace | skip
    # Subword regularization (aiayn.data.sampling): in every epoch, each training sentence
    # gets a new segmentation drawn from the tokenizer, deterministically in (train.seed,
    # epoch, sentence), so a resumed run sees the same ones. Validation and test keep the
    # one segmentation prepare wrote, and so does a side whose alpha is 0 (the default: off).
    # `aiayn prepare` ignores these fields: they act when training batches are made.
    # alpha, per side: for a BPE model, the probability of skipping each merge (BPE-dropout);
    # for a unigram model, the exponent on a segmentation's likelihood (lower: flatter).
    subword_alpha_src: float = 0.0
    subword_alpha_tgt: float = 0.0
    # Unigram models: the draw is among the nbest most likely segmentations (2..512, the
    # range SentencePiece's n-best list allows). BPE-dropout has no such list and ignores it.
    subword_nbest: int = 64
    # Training batches a background thread gathers, collates and pins ahead of the loop
    # (aiayn.data.prefetch): the same batches in the same order, resumed exactly. None: by
    # device, 2 on CUDA, 0 (no thread) on a CPU, where it would take a core from the model.
    prefetch_batches: int | None = None

    def validate(self, prefix: str = "data") -> None:
        _check_finite(self, prefix)
        if self.prefetch_batches is not None and self.prefetch_batches < 0:
            raise ConfigError(f"{prefix}.prefetch_batches: must be 0 (no prefetching), a number of batches, "
                              f"or null (by device), got {self.prefetch_batches}")
        if self.vocab_size < 8:
            raise ConfigError(f"{prefix}.vocab_size: must be at least 8, got {self.vocab_size}")
        self._validate_extension(prefix)
        if self.parsing_subtrees < 0:
            raise ConfigError(f"{prefix}.parsing_subtrees: must be 0 (off) or a number of words, "
                              f"got {self.parsing_subtrees}")
        if self.parsing_substitutions < 0:
            raise ConfigError(f"{prefix}.parsing_substitutions: must be 0 (off) or a number of variants, "
                              f"got {self.parsing_substitutions}")
        if not 0.0 < self.parsing_substitution_rate <= 1.0:
            raise ConfigError(f"{prefix}.parsing_substitution_rate: must be in (0, 1], "
                              f"got {self.parsing_substitution_rate}")
        if not 0.0 < self.character_coverage <= 1.0:
            raise ConfigError(f"{prefix}.character_coverage: must be in (0, 1]")
        if self.max_len < 1:
            raise ConfigError(f"{prefix}.max_len: must be at least 1")
        if self.max_len_ratio < 1.0:
            raise ConfigError(f"{prefix}.max_len_ratio: must be at least 1.0")
        _choice(prefix, "on_invalid_utf8", self.on_invalid_utf8, ("error", "replace", "skip"))
        _choice(prefix, "spm_model_type", self.spm_model_type, ("bpe", "unigram", "word"))
        _choice(prefix, "parsing_target", self.parsing_target, ("placeholders", "words"))
        if self.tgt_spm_model_type is not None:
            _choice(prefix, "tgt_spm_model_type", self.tgt_spm_model_type, ("bpe", "unigram", "word"))
        if self.tgt_vocab_size is not None and self.tgt_vocab_size < 8:
            raise ConfigError(f"{prefix}.tgt_vocab_size: must be at least 8, got {self.tgt_vocab_size}")
        if self.synthetic is not None:
            _choice(prefix, "synthetic", self.synthetic, ("copy", "reverse", "sort", "toy"))
        self._validate_subword_sampling(prefix)

    def _validate_extension(self, prefix: str) -> None:
        if self.shortlist_k < 0 or self.shortlist_frequent < 0:
            raise ConfigError(f"{prefix}.shortlist_k / shortlist_frequent: must not be negative")
        if self.extend_vocab < 0:
            raise ConfigError(f"{prefix}.extend_vocab: must be 0 (off) or a number of pieces, got {self.extend_vocab}")
        if self.extend_vocab and self.tokenizer_dir is None:
            raise ConfigError(f"{prefix}.extend_vocab: extends the tokenizer of {prefix}.tokenizer_dir, "
                              "which is not set")

    def _validate_subword_sampling(self, prefix: str) -> None:
        for name in ("subword_alpha_src", "subword_alpha_tgt"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{prefix}.{name}: must be in [0, 1] (0 = off), got {getattr(self, name)}")
        # One candidate would not be a choice; SentencePiece lists at most 512.
        if not 2 <= self.subword_nbest <= 512:
            raise ConfigError(f"{prefix}.subword_nbest: must be in 2..512, got {self.subword_nbest}")

    @property
    def subword_sampling(self) -> bool:
        """Whether training sentences are segmented afresh each epoch (either alpha above 0)."""
        return self.subword_alpha_src > 0 or self.subword_alpha_tgt > 0


# ------------------------------------------------------------------------ training


# What train.loggers may name (aiayn.training.loggers); jsonl is written either way.
TRAIN_LOGGERS = ("jsonl", "tensorboard", "wandb")
# Schedules that decay to train.min_lr at train.max_steps, or at the end of train.max_time_minutes
# when max_steps is 0 (aiayn.training.schedule).
DECAY_SCHEDULES = ("cosine", "linear")
LR_SCHEDULES = ("noam", "inverse_sqrt", "constant", *DECAY_SCHEDULES)


@dataclass
class TrainConfig:
    """The paper's recipe (section 5) by default."""

    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda
    # fp32 | bf16 | fp16 (mixed precision: autocast) | auto (bf16 where the hardware runs it
    # natively: AVX-512 BF16 / AMX CPUs, bf16-capable GPUs; fp32 elsewhere).
    dtype: str = "fp32"
    # torch.compile the training forward. compile_mode: default, or reduce-overhead (CUDA graphs:
    # every batch padded to static shapes, its lengths to a multiple of length_multiple tokens
    # and its rows to max_tokens // its longer length; docs/gpu.md).
    compile: bool = False
    compile_mode: str = "default"  # default | reduce-overhead
    length_multiple: int = 16
    # Batch: padded tokens on the longer side per batch (as fairseq counts), per GPU;
    # max_tokens x GPUs x update_freq is the effective batch (~25k in the paper).
    max_tokens: int = 4096
    update_freq: int = 1
    # What max_tokens bounds: padded (batch size x longest sequence on either side) or real
    # (non-pad source tokens and non-pad target tokens, each side at most max_tokens).
    max_tokens_mode: str = "padded"
    # Stopping: whichever comes first; 0 means no limit.
    max_steps: int = 100_000
    max_epochs: int = 0
    max_time_minutes: float = 0.0  # a budget: stops before an update that would pass it
    # Optimizer (section 5.3): Adam, beta1 0.9, beta2 0.98, eps 1e-9.
    optimizer: str = "adam"  # adam | adamw
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    # Learning-rate schedule: noam (the paper), inverse_sqrt (fairseq), constant, or cosine /
    # linear (warmup, then down to min_lr at max_steps: HF's and fairseq's decays to the end; with
    # max_steps 0, at the end of max_time_minutes).
    lr_schedule: str = "noam"
    lr_scale: float = 1.0  # multiplies the noam rate
    lr: float = 5e-4  # peak rate for inverse_sqrt / constant / cosine / linear
    min_lr: float = 0.0  # where cosine / linear end
    # cosine / linear decay over the last decay_fraction of their horizon (after the warmup for
    # max_steps, of the whole time budget for max_time_minutes), lr held before it; 1 = all of it.
    decay_fraction: float = 1.0
    warmup_steps: int = 4000
    warmup_init_lr: float = 1e-7
    label_smoothing: float = 0.1
    clip_norm: float = 0.0  # 0 = off, as in the paper
    # Logging, validation, checkpoints.
    log_every: int = 100
    valid_every: int = 1000
    valid_bleu: bool = False
    save_every: int = 1000  # steps; 0 = off
    save_every_minutes: float = 0.0  # the paper wrote one every 10 minutes; 0 = off
    keep_last: int = 5
    best_metric: str = "valid_loss"  # valid_loss | valid_ppl | valid_bleu
    max_nonfinite: int = 10  # stop after this many consecutive non-finite losses
    # Early stopping (fairseq --patience): stop once best_metric has not improved for this
    # many validations in a row; 0 = off. Needs validation (valid_every).
    patience: int = 0
    # Where the training scalars go (docs/training.md). metrics.jsonl is always written,
    # listed or not; tensorboard and wandb need their extras (pip install "aiayn[wandb]").
    loggers: tuple[str, ...] = ("jsonl",)
    # Deprecated spelling of loggers: [jsonl, tensorboard]; kept because the config.yaml of
    # every earlier checkpoint holds it.
    tensorboard: bool = False
    wandb_project: str = "aiayn"
    wandb_run_name: str | None = None  # None: the run directory's name
    num_workers: int = 0
    # Adam kernels: auto (fused on CUDA, foreach on CPU) | fused | foreach | loop.
    optimizer_impl: str = "auto"
    # Keep the checkpoint with the best validation metric beside the last keep_last.
    keep_best: bool = True
    # Initialise the weights of a fresh run from this checkpoint (or run directory),
    # e.g. one imported from Hugging Face; the optimizer and step start fresh.
    init_from: str | None = None
    # How init_from's vocabulary maps onto this run's (aiayn.checkpoint.vocab_init): same (equal,
    # the default), extend (the new vocabulary starts with the old one: ids kept) or remap
    # (pieces matched by string). Kept pieces keep their rows; new ones get the mean row.
    init_vocab: str = "same"
    # tqdm progress bar on an interactive terminal (log lines go to the log either way).
    progress_bar: bool = True

    def validate(self, prefix: str = "train") -> None:
        _check_finite(self, prefix)
        _choice(prefix, "dtype", self.dtype, ("fp32", "bf16", "fp16", "auto"))
        _choice(prefix, "device", self.device, ("auto", "cpu", "cuda"))
        _choice(prefix, "optimizer", self.optimizer, ("adam", "adamw"))
        _choice(prefix, "lr_schedule", self.lr_schedule, LR_SCHEDULES)
        self._validate_decay(prefix)
        _choice(prefix, "best_metric", self.best_metric, ("valid_loss", "valid_ppl", "valid_bleu"))
        _choice(prefix, "optimizer_impl", self.optimizer_impl, ("auto", "fused", "foreach", "loop"))
        _choice(prefix, "max_tokens_mode", self.max_tokens_mode, ("padded", "real"))
        _choice(prefix, "init_vocab", self.init_vocab, ("same", "extend", "remap"))
        self._validate_compile(prefix)
        for name in ("max_tokens", "update_freq"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{prefix}.{name}: must be at least 1, got {getattr(self, name)}")
        for name in ("max_steps", "max_epochs", "warmup_steps", "save_every", "keep_last",
                     "log_every", "valid_every", "num_workers"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{prefix}.{name}: must not be negative, got {getattr(self, name)}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"{prefix}.label_smoothing: must be in [0, 1), got {self.label_smoothing}")
        if self.lr <= 0 or self.lr_scale <= 0:
            raise ConfigError(f"{prefix}.lr: learning rates must be positive")
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ConfigError(f"{prefix}.adam_betas: need two values in [0, 1), got {self.adam_betas}")
        if self.adam_eps <= 0:
            raise ConfigError(f"{prefix}.adam_eps: must be positive")
        if self.weight_decay < 0 or self.clip_norm < 0:
            raise ConfigError(f"{prefix}.weight_decay / clip_norm: must not be negative")
        if self.max_nonfinite < 1:
            raise ConfigError(f"{prefix}.max_nonfinite: must be at least 1")
        self._validate_watching(prefix)

    def _validate_compile(self, prefix: str) -> None:
        """compile_mode reduce-overhead: static shapes from padded token-budget batches."""
        _choice(prefix, "compile_mode", self.compile_mode, ("default", "reduce-overhead"))
        if not 1 <= self.length_multiple <= max(self.max_tokens, 1):
            raise ConfigError(f"{prefix}.length_multiple: must be in 1..{prefix}.max_tokens ({self.max_tokens}), "
                              f"got {self.length_multiple}")
        if self.compile_mode != "reduce-overhead":
            return
        if not self.compile:
            raise ConfigError(f"{prefix}.compile_mode: reduce-overhead applies to a compiled forward, but "
                              f"{prefix}.compile is false")
        if self.max_tokens_mode != "padded":
            raise ConfigError(f"{prefix}.compile_mode: reduce-overhead pads every batch to max_tokens padded "
                              f"tokens, which needs {prefix}.max_tokens_mode padded, got {self.max_tokens_mode}")

    def _validate_decay(self, prefix: str) -> None:
        """cosine / linear decay over max_steps (past the warmup), or over max_time_minutes."""
        if self.lr_schedule not in DECAY_SCHEDULES:
            return
        timed = self.max_steps == 0 and self.max_time_minutes > 0
        if not timed and self.max_steps <= self.warmup_steps:
            raise ConfigError(f"{prefix}.lr_schedule: {self.lr_schedule} decays until {prefix}.max_steps, which "
                              f"must be above {prefix}.warmup_steps ({self.warmup_steps}), got {self.max_steps} "
                              f"(or set max_steps 0 and max_time_minutes to decay over a time budget)")
        if not 0.0 <= self.min_lr < self.lr:
            raise ConfigError(f"{prefix}.min_lr: must be in [0, {prefix}.lr), got {self.min_lr}")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ConfigError(f"{prefix}.decay_fraction: must be in (0, 1], got {self.decay_fraction}")

    def _validate_watching(self, prefix: str) -> None:
        """The loggers and early stopping."""
        for name in self.loggers:
            _choice(prefix, "loggers", name, TRAIN_LOGGERS)
        if not self.wandb_project:
            raise ConfigError(f"{prefix}.wandb_project: must not be empty")
        if self.patience < 0:
            raise ConfigError(f"{prefix}.patience: must not be negative, got {self.patience}")
        if self.patience and not self.valid_every:
            raise ConfigError(f"{prefix}.patience: early stopping counts validations, but "
                              f"{prefix}.valid_every is 0 (no validation)")
        if self.patience and self.best_metric == "valid_bleu" and not self.valid_bleu:
            raise ConfigError(f"{prefix}.patience: best_metric valid_bleu is never computed "
                              f"without {prefix}.valid_bleu: true")


# ------------------------------------------------------------------------ decoding


LENPEN_STYLES = ("gnmt", "fairseq")



@dataclass
class DecodeConfig:
    """Section 6.1: beam 4, alpha 0.6, max output length = input length + 50.

    The one declaration of the decoding options: each field's :class:`DecodeOption` (see
    :func:`decode_options`) generates the CLI flags (:mod:`aiayn.cli.options`) and the HTTP
    request body (:mod:`aiayn.serving.schemas`).
    """

    beam: int = decode_option(4, "beam size; 1 = greedy",
                        http=HttpField(ge=1, le=64, position=1, description="beam size (1 = greedy)"))
    lenpen: float = decode_option(0.6, "length-penalty alpha",
                            http=HttpField(ge=0.0, le=10.0, position=4,
                                           description="length-penalty alpha (0.6 in the paper)"))
    lenpen_style: str = decode_option("gnmt", "gnmt: ((5+|Y|)/6)^alpha (the paper); fairseq: |Y|^alpha",
                                choices=LENPEN_STYLES)
    max_len_a: float = decode_option(1.0, "max output tokens = a * source tokens + b",
                               http=HttpField(ge=0.0, le=10.0, position=5,
                                              description="max output length = a * source length + b"))
    max_len_b: int = decode_option(50, "see --max-len-a", http=HttpField(ge=0, le=1024, position=6))
    min_len: int = decode_option(0, "output tokens before EOS is allowed", http=HttpField(ge=0, le=1024, position=7))
    nbest: int = decode_option(1, "hypotheses per sentence (<= beam; default 1)", argument=True,
                         http=HttpField(ge=1, le=64, position=2,
                                        description="hypotheses returned per sentence (<= beam)"))
    no_repeat_ngram_size: int = decode_option(0, "forbid repeating n-grams of this size",
                                        http=HttpField(ge=0, le=16, position=8))
    batch_tokens: int = decode_option(4096, "padded source tokens per batch")
    sampling: bool = decode_option(False, "sample instead of searching: --beam K independent samples, "
                                    "the --nbest best returned")
    temperature: float = decode_option(1.0, "sampling temperature")
    top_k: int = decode_option(0, "sample among the k most probable tokens (0 = all)")
    top_p: float = decode_option(1.0, "nucleus sampling threshold (1 = off)")
    seed: int = decode_option(0, "sampling seed")
    shortlist: bool = decode_option(
        False, "score only a vocabulary shortlist (the lists of the source pieces of each few sentences and "
               "the most frequent pieces; the checkpoint needs one: prepare with data.shortlist_k)",
        http=HttpField(ge=None, le=None, position=10,
                       description="score only a vocabulary shortlist (faster; needs one in the checkpoint)"))
    tgt_lang: str = decode_option(
        "", "target language of a multilingual model: the source starts with its tag >>xx<< "
            "(default: the checkpoint's data.tgt_lang when it was trained with data.tgt_lang_tag)",
        http=HttpField(ge=None, le=None, position=9,
                       description="target language of a multilingual model (its tag >>xx<< starts the source)"))

    def max_output_len(self, source_len: int) -> int:
        """The most tokens a translation of ``source_len`` source tokens has before EOS is
        forced: ``int(max_len_a * source_len + max_len_b)``. The one rule of the output bound:
        the search, the server's limits and both exports apply it through this method."""
        return int(self.max_len_a * source_len + self.max_len_b)

    def validate(self, prefix: str = "decode") -> None:
        _check_finite(self, prefix)
        if self.beam < 1:
            raise ConfigError(f"{prefix}.beam: must be at least 1, got {self.beam}")
        if not 1 <= self.nbest <= self.beam:
            raise ConfigError(f"{prefix}.nbest: must be between 1 and beam={self.beam}, got {self.nbest}")
        _choice(prefix, "lenpen_style", self.lenpen_style, LENPEN_STYLES)
        if self.max_len_a < 0 or self.max_len_b < 0 or self.min_len < 0:
            raise ConfigError(f"{prefix}.max_len_a / max_len_b / min_len: must not be negative")
        if self.temperature <= 0:
            raise ConfigError(f"{prefix}.temperature: must be positive")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"{prefix}.top_p: must be in (0, 1]")
        if self.top_k < 0 or self.no_repeat_ngram_size < 0 or self.batch_tokens < 1:
            raise ConfigError(f"{prefix}.top_k / no_repeat_ngram_size / batch_tokens: out of range")
        if self.tgt_lang and not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", self.tgt_lang):
            raise ConfigError(f"{prefix}.tgt_lang: a language code (letters, digits, _ and -), got {self.tgt_lang!r}")

    def with_overrides(self, **overrides: Any) -> DecodeConfig:
        """A validated copy with ``overrides`` applied; a None value keeps this config's value.
        An unknown name is a :class:`ConfigError` naming ``decode.<name>``."""
        names = [f.name for f in dataclasses.fields(self)]
        changes = {}
        for key, value in overrides.items():
            if key not in names:
                raise ConfigError(f"decode.{key}: unknown decoding option; choose from {', '.join(sorted(names))}")
            if value is not None:
                changes[key] = value
        cfg = dataclasses.replace(self, **changes)
        cfg.validate()
        return cfg


def decode_options() -> list[tuple[dataclasses.Field, DecodeOption]]:
    """Every :class:`DecodeConfig` field with its :class:`DecodeOption`, in declaration order."""
    return [(f, f.metadata["option"]) for f in dataclasses.fields(DecodeConfig)]


def check_decode_bounds(values: dict[str, Any], prefix: str = "decode") -> None:
    """The bounds of an HTTP request's decoding options (their :class:`HttpField`), applied
    to ``values`` given elsewhere (command-line flags): one set of limits, so that a
    command cannot ask for a search the server refuses (``--beam 100000``)."""
    fields = {f.name: opt.http for f, opt in decode_options() if opt.http is not None}
    for name, value in values.items():
        bounds = fields.get(name)
        if bounds is None or value is None or isinstance(value, bool):
            continue
        if bounds.ge is not None and value < bounds.ge:
            raise ConfigError(f"{prefix}.{name}: must be at least {bounds.ge}, got {value}")
        if bounds.le is not None and value > bounds.le:
            raise ConfigError(f"{prefix}.{name}: must be at most {bounds.le}, got {value}")


# ---------------------------------------------------------------------- experiment


@dataclass
class Config:
    """A whole experiment: the four sections of a ``configs/*.yaml`` file."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def validate(self) -> None:
        self.model.validate("model")
        self.data.validate("data")
        self.train.validate("train")
        self.decode.validate("decode")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)
