"""The training recipe: one run of ``aiayn train`` (also under torchrun), wired from its parts.

The building blocks know nothing of each other: the data (aiayn.data), the model
(aiayn.model), the trainer and its stopping rules and validation (aiayn.training), and the
validation BLEU, which decodes with aiayn.inference and scores with aiayn.evaluation. This
module builds them in order, hands each one what it needs, and runs the trainer: the run
directory and its log file, the process group, the prepared data, the vocabulary sizes, the
model and optimizer, and the resume point.
"""

from __future__ import annotations

import logging
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aiayn.checkpoint.directory import load_checkpoint_config, load_tokenizer_dir, resolve_checkpoint, verify_checkpoint
from aiayn.checkpoint.layout import CHECKPOINTS_DIR, MODEL_FILE, TOKENIZER_DIR
from aiayn.checkpoint.manager import CheckpointManager
from aiayn.checkpoint.vocab_init import describe, load_with_vocab
from aiayn.checkpoint.weights import load_model_weights
from aiayn.config import Config, DecodeConfig, save_config
from aiayn.data.batching import BatchIterator
from aiayn.data.prepare import ensure_prepared, load_split, load_tokenizer, split_text
from aiayn.data.sampling import training_pairs
from aiayn.errors import AiaynError, CheckpointError, ConfigError
from aiayn.evaluation.bleu import corpus_bleu
from aiayn.fileio import check_empty_dir
from aiayn.inference.translator import Translator
from aiayn.model import Transformer, build_model
from aiayn.runtime.process import set_threads
from aiayn.training.distributed import DistInfo, all_gather_json, barrier, cleanup, init_distributed
from aiayn.training.loggers import check_available
from aiayn.training.optim import build_optimizer
from aiayn.training.static_shapes import BucketedPairs, StaticShapes
from aiayn.training.trainer import Trainer
from aiayn.training.validation import BleuFn

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def default_run_dir(config_path: str | Path | None) -> Path:
    """``runs/<config file stem>`` when no --run-dir is given."""
    return Path("runs") / (Path(config_path).stem if config_path else "run")


# ------------------------------------------------------------------ data


@dataclass
class RunData:
    """The prepared data as this process sees it (validation on the main process only)."""

    prepared: Path
    tokenizer: Any
    train: BatchIterator  # this process's shard
    valid: list[Any] | None = None  # validation batches
    valid_text: tuple[list[str], list[str]] | None = None  # (sources, references), for BLEU


def build_data(cfg: Config, run_dir: Path, info: DistInfo) -> RunData:
    """Prepared data for this process: tokenizer, sharded training batches, validation."""
    if cfg.data.prepared_dir:
        prepared = Path(cfg.data.prepared_dir)
    else:
        # The main process prepares (tokenizer training, binarizing); the others wait,
        # then find it ready.
        if info.is_main:
            prepared = ensure_prepared(cfg.data, run_dir / "data")
        barrier(info)
        if not info.is_main:
            prepared = ensure_prepared(cfg.data, run_dir / "data")
    tokenizer = load_tokenizer(prepared)
    # Subword sampling applies here, to the training split only: validation keeps its ids.
    train_pairs = training_pairs(load_split(prepared, "train"), tokenizer, cfg)
    if cfg.train.compile and cfg.train.compile_mode == "reduce-overhead":  # batches by length bucket
        train_pairs = BucketedPairs(train_pairs, StaticShapes.for_config(cfg.train))
    train = BatchIterator(train_pairs, cfg.train.max_tokens, seed=cfg.train.seed,
                          shuffle=True, num_shards=info.world_size, shard_id=info.rank,
                          mode=cfg.train.max_tokens_mode)
    data = RunData(prepared, tokenizer, train)
    if info.is_main:
        _add_validation(data, cfg)
    return data


def _add_validation(data: RunData, cfg: Config) -> None:
    try:
        valid_ds = load_split(data.prepared, "valid")
    except (AiaynError, FileNotFoundError) as exc:
        log.warning("no validation set (%s): validation skipped", exc)
        return
    it = BatchIterator(valid_ds, cfg.train.max_tokens, shuffle=False, mode=cfg.train.max_tokens_mode)
    data.valid = [it.make_batch(idx) for idx in it.epoch_batches(1)]
    if cfg.train.valid_bleu:
        try:
            data.valid_text = split_text(data.prepared, "valid")
        except (AiaynError, FileNotFoundError) as exc:
            log.warning("validation text unavailable (%s): no validation BLEU", exc)


def match_vocab(cfg: Config, tokenizer: Any) -> Config:
    """The model's vocabulary sizes follow the tokenizer's, as fairseq's follow its dictionary."""
    src, tgt = int(tokenizer.src_vocab_size), int(tokenizer.tgt_vocab_size)
    m = cfg.model
    if (m.src_vocab_size, m.tgt_vocab_size) != (src, tgt):
        log.info("model vocabulary sizes set from the tokenizer: source %d, target %d", src, tgt)
        m.src_vocab_size, m.tgt_vocab_size = src, tgt
    if m.share_embeddings == "all" and src != tgt:
        raise ConfigError(
            f"model.share_embeddings: 'all' needs one shared vocabulary, but the tokenizer has "
            f"{src} source and {tgt} target pieces (set data.joint_vocab: true, or "
            "model.share_embeddings: decoder)")
    m.validate()
    return cfg


# ------------------------------------------------------------------ validation BLEU


def validation_bleu(text: tuple[list[str], list[str]] | None, tokenizer: Any, decode: DecodeConfig,
                    device: torch.device) -> BleuFn:
    """The trainer's BLEU scorer: beam search (``decode``) over the validation sources with
    the model as it is now, scored with sacreBLEU against the references."""

    def bleu(model: Transformer) -> float | None:
        if text is None or tokenizer is None:
            log.info("valid_bleu: no validation text or tokenizer; BLEU skipped")
            return None
        src, ref = text
        # A new translator each time: it prepares its own copies of the weights, which
        # would go stale as training updates them.
        translator = Translator(model, tokenizer, decode, device=device)
        return float(corpus_bleu(translator.translate(list(src)), list(ref)))

    return bleu


# ------------------------------------------------------------------ the run


def _setup_file_logging(run_dir: Path) -> logging.Handler:
    handler = logging.FileHandler(run_dir / "train.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("aiayn").addHandler(handler)
    if logging.getLogger("aiayn").getEffectiveLevel() > logging.INFO:
        logging.getLogger("aiayn").setLevel(logging.INFO)
    return handler


def _resume_point(run_dir: Path, resume: str | Path | None, keep_last: int, info: DistInfo,
                  device: torch.device) -> Path | None:
    """The checkpoint to continue from: ``resume``, else the run directory's last one (a
    run started again with the same command continues); incomplete saves are cleaned.
    Under torchrun rank 0's choice holds for every rank, and each must find it on its node."""
    manager = CheckpointManager(run_dir, keep_last)
    if info.is_main:
        manager.clean_incomplete()
    point: Path | None = None
    error: str | None = None
    try:
        point = resolve_checkpoint(resume) if resume is not None else manager.last()
    except CheckpointError as exc:
        if not info.enabled:
            raise
        error = str(exc)
    if info.enabled:
        point = _agreed_resume_point(point, error, run_dir, info, device)
    if point is not None and resume is None and info.is_main:
        log.info("%s has a checkpoint: resuming from %s", run_dir, point)
    return point


def _agreed_resume_point(point: Path | None, error: str | None, run_dir: Path, info: DistInfo,
                         device: torch.device) -> Path | None:
    """Rank 0's resume point, on every rank; the same error on every rank (rather than one
    rank failing while the others wait) when rank 0 has none to give or a rank lacks it."""
    views = all_gather_json([None if point is None else point.name, error], info, device)
    chosen, chosen_error = views[0]
    if chosen_error is not None:
        raise CheckpointError(chosen_error)
    if chosen is None:
        return None  # rank 0 starts afresh: so does every rank
    lacking = [f"rank {r} has {name or 'none'}" for r, (name, _) in enumerate(views) if name != chosen]
    if lacking:
        raise CheckpointError(
            f"{run_dir}: rank 0 resumes from checkpoint {chosen}, but {', '.join(lacking)}: every node "
            "needs the run directory (a shared filesystem, or rank 0's run directory copied to each node)")
    return point


def _note_world_change(cfg: Config, resume_from: Path, saved_world: int, world: int) -> None:
    """One line when a run resumes with another number of processes: it continues, and the
    line says what that changes."""
    if saved_world == world:
        return
    saved_freq = load_checkpoint_config(resume_from).train.update_freq
    freq = cfg.train.update_freq
    shards, saved_shards = world * freq, saved_world * saved_freq
    if shards == saved_shards:
        batch = f"each update still sums {shards} batch(es) of train.max_tokens"
    elif (saved_shards % world) == 0:
        batch = (f"each update sums {shards} batch(es) of train.max_tokens instead of {saved_shards} "
                 f"(train.update_freq={saved_shards // world} keeps them)")
    else:
        batch = f"each update sums {shards} batch(es) of train.max_tokens instead of {saved_shards}"
    log.warning("%s was written by %d process(es), this run has %d: training continues from its step; %s; "
                "the data position is carried over by batches seen and random streams (dropout) differ "
                "from an uninterrupted run", resume_from, saved_world, world, batch)


def _build_model(cfg: Config, resume_from: Path | None, info: DistInfo, tokenizer: Any = None,
                 report: dict[str, Any] | None = None) -> Transformer:
    """The model, initialised from ``train.init_from`` in a fresh run; what happened to the
    vocabulary rows (``train.init_vocab``) goes into ``report``."""
    # Same seed on every process: identical initial weights (DDP also broadcasts them).
    seed_everything(cfg.train.seed)
    model = build_model(cfg.model)
    if cfg.train.init_from and resume_from is None:
        src = resolve_checkpoint(cfg.train.init_from)
        verify_checkpoint(src)
        old_tokenizer = load_tokenizer_dir(src / TOKENIZER_DIR)
        if old_tokenizer is None or tokenizer is None:
            if cfg.train.init_vocab != "same":
                raise ConfigError(f"train.init_vocab: {cfg.train.init_vocab} needs the tokenizers of both the "
                                  f"run and train.init_from ({src} has none)" if old_tokenizer is None else
                                  f"train.init_vocab: {cfg.train.init_vocab} needs the run's tokenizer")
            load_model_weights(model, src / MODEL_FILE)
        else:
            result = load_with_vocab(model, src / MODEL_FILE, _pieces(old_tokenizer), _pieces(tokenizer),
                                     cfg.train.init_vocab, joint=bool(tokenizer.joint and old_tokenizer.joint))
            if report is not None:
                report.update(result)
            if info.is_main:
                log.info("%s", describe(result))
        log.info("initialised weights from %s", src)
    if info.enabled:
        # Different dropout masks per process; the data already differ by shard.
        torch.manual_seed(cfg.train.seed + 1000003 * info.rank)
    return model


def _pieces(tokenizer: Any) -> tuple[list[str], list[str]]:
    """(source pieces, target pieces), in id order."""
    return (tokenizer.src_pieces(range(tokenizer.src_vocab_size)),
            tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size)))


def build_trainer(cfg: Config, run_dir: Path, info: DistInfo, device: torch.device,
                  resume_from: Path | None) -> Trainer:
    """Data, model, optimizer and validation for ``cfg``, in a trainer at ``resume_from``'s
    position (or at the start); the resolved config is saved in the run directory."""
    seed_everything(cfg.train.seed)
    data = build_data(cfg, run_dir, info)
    cfg = match_vocab(cfg, data.tokenizer)
    init_report: dict[str, Any] = {}
    model = _build_model(cfg, resume_from, info, data.tokenizer, init_report).to(device)
    optimizer = build_optimizer(model, cfg.train, device)
    # Validation sources start with the target-language tag, as the training sources do.
    valid_tokenizer = data.tokenizer.tagged(cfg.data.tgt_lang) if cfg.data.tgt_lang_tag else data.tokenizer
    bleu = validation_bleu(data.valid_text, valid_tokenizer, cfg.decode, device) if cfg.train.valid_bleu else None
    trainer = Trainer(cfg, model, run_dir, train_batches=data.train, valid_batches=data.valid,
                      tokenizer=data.tokenizer, device=device, dist_info=info, optimizer=optimizer, bleu=bleu)
    if resume_from is not None:
        trainer.load(resume_from)
        trainer.metrics.truncate_after(trainer.state.step)
        if info.is_main:
            _note_world_change(cfg, resume_from, trainer.state.world_size, info.world_size)
    if init_report:
        trainer.summary_extra["init_vocab"] = init_report
    if info.is_main:
        save_config(cfg, run_dir / "config.yaml")
    return trainer


def _check_fp16(cfg: Config) -> None:
    # Before the process group exists: a user error, not a crash of every rank.
    if cfg.train.dtype == "fp16" and not (cfg.train.device != "cpu" and torch.cuda.is_available()):
        raise ConfigError("train.dtype: fp16 needs a CUDA device (it relies on a gradient "
                          "scaler); use bf16 on CPU")


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a run's files (checkpoints, metrics or its log): a run to resume."""
    return any((path / name).exists() for name in (CHECKPOINTS_DIR, "metrics.jsonl", "train.log"))


def run_training(cfg: Config, run_dir: str | Path, resume: str | Path | None = None,
                 threads: int | None = None) -> dict[str, Any]:
    """Train ``cfg`` in ``run_dir``: fresh, or resumed from ``resume`` / the run directory's
    last checkpoint. The entry point of ``aiayn train`` (also under torchrun). ``threads``:
    CPU threads (None: ``$AIAYN_NUM_THREADS``, else torch's choice)."""
    set_threads(threads)
    _check_fp16(cfg)
    check_available(cfg.train)  # a logger's missing package: before any data is prepared
    info, device = init_distributed(cfg.train.device)
    run_dir = Path(run_dir)
    handler = None
    created = False
    try:
        if info.is_main:
            # Resumed when it is a run directory; anything else non-empty is somebody's data.
            check_empty_dir(run_dir, own=is_run_dir, hint="and holds no run to resume: choose another directory")
            created = not run_dir.exists()
            run_dir.mkdir(parents=True, exist_ok=True)
            handler = _setup_file_logging(run_dir)
        else:
            logging.getLogger("aiayn").setLevel(logging.WARNING)
        barrier(info)
        resume_from = _resume_point(run_dir, resume, cfg.train.keep_last, info, device)
        trainer = build_trainer(cfg, run_dir, info, device, resume_from)
        created = False  # training starts: from here on the directory is the run's record
        summary = trainer.train()
        barrier(info)
        return summary
    finally:
        if handler is not None:
            logging.getLogger("aiayn").removeHandler(handler)
            handler.close()
        if created:  # refused before training began (bad data, resume point, ...): leave nothing
            shutil.rmtree(run_dir, ignore_errors=True)
        cleanup()
