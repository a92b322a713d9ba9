"""`aiayn prepare`: text in, a self-contained prepared-data directory out.

Layout of a prepared directory::

    spm.model                    joint SentencePiece model (or spm.src.model + spm.tgt.model)
    train/ valid/ test/          binarized splits (aiayn.data.binarize), memory-mapped
    valid.src.txt valid.tgt.txt  every line of the validation set, for BLEU references
    test.src.txt  test.tgt.txt   every line of the test set
    summary.json                 pairs kept / dropped per split and why, vocabulary, tokens,
                                 timings, and the keys that decide what can be reused

Sources, per role (train / valid / test), first match wins: explicit files
(``train_src`` + ``train_tgt``, or ``train_tsv``), a known ``dataset`` (fetched through
:mod:`aiayn.data.datasets` from the mirror ``data_dir`` / ``$AIAYN_DATA_MIRROR`` or the
network), or a ``synthetic`` task (generated from ``seed``; word-level SentencePiece model
so that each symbol is one token, vocabulary sized to the symbols).

Only training pairs are filtered (empty, too long, length ratio; see
:mod:`aiayn.data.corpus`); validation and test keep every line, so scores cover the full
sets. The directory is built in a temporary sibling and swapped in at the end: an error
leaves the previous directory (or nothing) behind, never a partial one. Rebuilding reuses
the tokenizer and any binarized split whose inputs (hashed) did not change.

Large corpora: ``workers`` processes encode the training pairs (the output is the same
byte for byte for any number), with a progress bar counting pairs against the input's line
count. A prepare that stops before the end (interrupted, killed, a crash) keeps what it
finished in a sibling ``.NAME.partial`` folder: the tokenizer, complete splits, and the
encoded chunks of the split it was in; the next prepare of the same inputs and settings
continues from there, and its result equals an uninterrupted one byte for byte (the
summary's timings and ``reused`` flags aside). Bad input (an error with a message) and
success remove that folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from aiayn.config import DataConfig
from aiayn.data import datasets as ds
from aiayn.data.binarize import (
    FORMAT_VERSION,
    TokenDataset,
    binarize,
    cache_key,
    file_digest,
    read_key,
)
from aiayn.data.corpus import FilterConfig, ReadStats, iter_parallel, iter_tsv
from aiayn.data.synthetic import generate
from aiayn.errors import AiaynError, ConfigError, DataError, EnvironmentFailure
from aiayn.fileio import atomic_dir, atomic_file, check_empty_dir, count_lines, environment_failure, write_atomic
from aiayn.text.extend import add_source_controls, extend_tokenizer
from aiayn.text.shortlist import SHORTLIST_FILE, build_shortlist
from aiayn.text.tokenizer import EmptyTrainingText, Tokenizer, lang_tag, leading_tag, train_tokenizer

log = logging.getLogger(__name__)

ROLES = ("train", "valid", "test")
SUMMARY = "summary.json"
SYNTHETIC_SEED_OFFSET = {"train": 0, "valid": 100_003, "test": 200_003}
PREPARE_VERSION = 1


# ------------------------------------------------------------------------- sources


@dataclass
class Source:
    """Where one role's pairs come from, and a tag identifying that content."""

    role: str
    name: str  # corpus split name ("val", "test_2016_flickr"), or file name(s)
    tag: str  # content identity for cache keys: checksums / file hashes / generator params
    open: Callable[[bool, ReadStats], Iterator[tuple[str, str]]]  # (drop_invalid, stats) -> pairs
    files: list[str] = field(default_factory=list)
    count: Callable[[], int | None] = lambda: None  # lines to read, where cheap to know (progress)


def _file_source(role: str, src: str | None, tgt: str | None, tsv: str | None, on_invalid: str
                 ) -> Source | None:
    if tsv is not None:
        if src is not None or tgt is not None:
            raise ConfigError(f"data.{role}_tsv: give either {role}_tsv or {role}_src + {role}_tgt")
        path = Path(tsv)
        return Source(role, path.name, "tsv:" + file_digest(path),
                      lambda drop, st: iter_tsv(path, on_invalid, drop, st), [str(path)],
                      lambda: count_lines(path, gzipped=False))
    if src is None and tgt is None:
        return None
    if src is None or tgt is None:
        missing = f"{role}_tgt" if tgt is None else f"{role}_src"
        raise ConfigError(f"data.{missing}: {role}_src and {role}_tgt go together")
    sp, tp = Path(src), Path(tgt)
    tag = "files:" + file_digest(sp) + ":" + file_digest(tp)
    return Source(role, f"{sp.name} / {tp.name}", tag,
                  lambda drop, st: iter_parallel(sp, tp, on_invalid, drop, st), [str(sp), str(tp)],
                  lambda: count_lines(sp, gzipped=False))


def _split_name(info: ds.DatasetInfo, requested: str, role: str) -> str:
    if requested in info.splits:
        return requested
    generic = DataConfig.valid_split if role == "valid" else DataConfig.test_split
    if requested == generic:  # the config default names a Multi30k split
        return info.default_valid if role == "valid" else info.default_test
    raise ConfigError(f"data.{role}_split: {info.name} has no split {requested!r}; "
                      f"choose from {', '.join(info.splits)}")


def _dataset_source(cfg: DataConfig, role: str, progress: bool) -> Source:
    assert cfg.dataset is not None
    info = ds.get_dataset(cfg.dataset)
    for lang, what in ((cfg.src_lang, "src_lang"), (cfg.tgt_lang, "tgt_lang")):
        if lang not in info.languages:
            raise ConfigError(f"data.{what}: {info.name} has no language {lang!r} "
                              f"(languages: {', '.join(info.languages)})")
    if cfg.src_lang == cfg.tgt_lang:
        raise ConfigError("data.tgt_lang: source and target language are the same")
    split = "train" if role == "train" else _split_name(
        info, cfg.valid_split if role == "valid" else cfg.test_split, role)
    mirror = cfg.data_dir if cfg.data_dir is not None else ds.default_mirror()
    src_parts = ds.parts(info.name, split, cfg.src_lang)
    tgt_parts = ds.parts(info.name, split, cfg.tgt_lang)
    # The identity comes from the table (checksums, or the official URL where none is
    # known), so an up-to-date prepared directory is recognized without the raw files.
    ids = []
    names = []
    for part, lang in [(p, cfg.src_lang) for p in src_parts] + [(p, cfg.tgt_lang) for p in tgt_parts]:
        member = (part.member or "").format(lang=lang, role="src" if lang == cfg.src_lang else "ref")
        ids.append(f"{part.file.sha256 or part.file.md5 or part.file.url}:{member}")
        names.append(part.file.name + (f":{member}" if member else ""))
    tag = f"{info.name}:{split}:{cfg.src_lang}-{cfg.tgt_lang}:" + "|".join(ids)
    on_invalid = cfg.on_invalid_utf8
    fetched: list[tuple[Path, Path, str]] = []

    def open_(drop: bool, stats: ReadStats) -> Iterator[tuple[str, str]]:
        if not fetched:  # fetch (verify, extract) once, on first use
            fetched.extend(ds.split_files(info.name, split, cfg.src_lang, cfg.tgt_lang,
                                          cache_dir=cfg.download_dir, mirror=mirror, progress=progress))
        for src, tgt, _ in fetched:
            yield from iter_parallel(src, tgt, on_invalid, drop, stats)

    return Source(role, split, tag, open_, names)


def _synthetic_source(cfg: DataConfig, role: str) -> Source:
    assert cfg.synthetic is not None
    n = cfg.synthetic_train_size if role == "train" else cfg.synthetic_valid_size
    # Training data is generate(task, n, seed, ...) with the config's own seed, so a caller can
    # reproduce it (e.g. to hold out sequences it contains); valid/test are fresh samples.
    seed = cfg.seed + SYNTHETIC_SEED_OFFSET[role]
    params = dict(task=cfg.synthetic, n=n, seed=seed, min_len=cfg.synthetic_min_len,
                  max_len=cfg.synthetic_max_len, vocab=cfg.synthetic_vocab)

    def open_(drop: bool, stats: ReadStats) -> Iterator[tuple[str, str]]:
        pairs = generate(**params)  # type: ignore[arg-type]
        stats.lines = len(pairs)
        return iter(pairs)

    return Source(role, f"synthetic:{cfg.synthetic}", "synthetic:" + json.dumps(params, sort_keys=True),
                  open_, count=lambda: n)


def resolve_sources(cfg: DataConfig, progress: bool = True) -> dict[str, Source]:
    """The source of each role that has one (train is required)."""
    if cfg.dataset is not None and cfg.synthetic is not None:
        raise ConfigError("data.synthetic: give either a dataset or a synthetic task, not both")
    out: dict[str, Source] = {}
    for role in ROLES:
        src = _file_source(role, getattr(cfg, f"{role}_src"), getattr(cfg, f"{role}_tgt"),
                           getattr(cfg, f"{role}_tsv"), cfg.on_invalid_utf8)
        if src is None and cfg.dataset is not None:
            src = _dataset_source(cfg, role, progress)
        if src is None and cfg.synthetic is not None:
            src = _synthetic_source(cfg, role)
        if src is not None:
            out[role] = src
    if "train" not in out:
        raise ConfigError("data: no training data; give a dataset (--dataset), files "
                          "(--train-src/--train-tgt or --train-tsv) or a synthetic task (--synthetic)")
    return out


# -------------------------------------------------------------------------- keys


def _filters(cfg: DataConfig) -> FilterConfig:
    return FilterConfig(max_len=cfg.max_len, max_len_ratio=cfg.max_len_ratio)


def _spm_settings(cfg: DataConfig) -> dict[str, Any]:
    word = cfg.synthetic is not None and cfg.dataset is None
    settings = dict(
        joint=cfg.joint_vocab,
        model_type="word" if word else cfg.spm_model_type,
        tgt_model_type=None if word else cfg.tgt_spm_model_type,
        vocab_size=None if word else cfg.vocab_size,  # synthetic: sized to the symbols
        tgt_vocab_size=None if word else cfg.tgt_vocab_size,
        character_coverage=cfg.character_coverage,
        input_sentence_size=cfg.spm_input_sentence_size,
        seed=cfg.seed,
    )
    if cfg.tgt_lang_tag:  # only then: the keys of untagged directories stay what they were
        settings["src_control_symbols"] = _source_tags(cfg)
    return settings


def _source_tags(cfg: DataConfig, train: Source | None = None) -> list[str]:
    """The control pieces the source vocabulary needs with data.tgt_lang_tag: the tag of
    data.tgt_lang and (given ``train``) those its sources start with, sorted."""
    if not cfg.tgt_lang_tag:
        return []
    tags = {lang_tag(cfg.tgt_lang)}
    if train is not None:
        tags.update(t for s, _ in train.open(True, ReadStats()) if (t := leading_tag(s)))
    return sorted(tags)


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _given_tokenizer(cfg: DataConfig) -> Tokenizer | None:
    """``data.tokenizer_dir``: an existing tokenizer (e.g. a checkpoint's, for fine-tuning
    with ``train.init_from``) used as is instead of training a new one."""
    if cfg.tokenizer_dir is None:
        return None
    if not Path(cfg.tokenizer_dir).is_dir():
        raise DataError(f"data.tokenizer_dir: {cfg.tokenizer_dir} is not a directory")
    return Tokenizer.load(cfg.tokenizer_dir)


def _tokenizer_key(cfg: DataConfig, train: Source, given: Tokenizer | None = None) -> str:
    if given is not None:  # keyed by the model files' contents, not by where they lie
        files = [hashlib.sha256(b).hexdigest() for b in given.model_bytes()]
        if cfg.tgt_lang_tag:
            files.append(f"tags:{_source_tags(cfg)}:{train.tag}")  # and those of the sources
        if not cfg.extend_vocab:
            return _digest("tokenizer", PREPARE_VERSION, files)
        return _digest("tokenizer", PREPARE_VERSION, files, "extended", cfg.extend_vocab, train.tag,
                       cfg.on_invalid_utf8, _spm_settings(cfg))
    return _digest("tokenizer", PREPARE_VERSION, train.tag, cfg.on_invalid_utf8, _spm_settings(cfg))


def input_key(cfg: DataConfig, sources: dict[str, Source]) -> str:
    """Everything the prepared directory depends on (contents, not paths)."""
    return _digest("prepared", PREPARE_VERSION, FORMAT_VERSION, {r: s.tag for r, s in sources.items()},
                   _spm_settings(cfg), dataclasses.asdict(_filters(cfg)), cfg.on_invalid_utf8,
                   cfg.src_lang, cfg.tgt_lang,
                   _tokenizer_key(cfg, sources["train"], _given_tokenizer(cfg)) if cfg.tokenizer_dir else None,
                   *([("shortlist", cfg.shortlist_k, cfg.shortlist_frequent, SHORTLIST_SAMPLE)]
                     if cfg.shortlist_k else []))


# ------------------------------------------------------------------------ prepare


def read_summary(prepared_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(prepared_dir) / SUMMARY
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{prepared_dir}: not a prepared-data directory (no {SUMMARY}); "
                        f"run `aiayn prepare`") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable ({exc})") from None


def _old_summary(out: Path) -> dict[str, Any]:
    try:
        return read_summary(out)
    except DataError:
        return {}


def prepare_data(cfg: DataConfig, out_dir: str | os.PathLike, progress: bool = True,
                 extra_files: dict[str, Path] | None = None,
                 extra_summary: dict[str, Any] | None = None, force: bool = False,
                 workers: int = 1) -> dict[str, Any]:
    """Build the prepared directory ``out_dir`` from ``cfg``; return (and write) the summary.

    ``extra_files`` (name -> file) are copied into the directory and ``extra_summary`` merged
    into the summary, both before it is swapped in (used by the parsing task for gold trees).
    ``workers``: processes encoding the training pairs.
    """
    t0 = time.perf_counter()
    cfg.validate()
    _check_sentencepiece_sizes(cfg)
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, got {workers}")
    out = check_empty_dir(out_dir, force, DataError, inputs=_input_paths(cfg, extra_files), own=is_prepared_dir,
                          folders=[cfg.data_dir, cfg.download_dir])
    sources = resolve_sources(cfg, progress)
    old = _old_summary(out)
    work = partial_dir(out)
    existed = out.exists()
    timings: dict[str, float] = {}
    reused: dict[str, bool] = {}
    try:
        with atomic_dir(out, force=True) as tmp:
            work.mkdir(parents=True, exist_ok=True)
            t = time.perf_counter()
            tokenizer, tok_key = _prepare_tokenizer(cfg, sources["train"], out, tmp, old, reused, work)
            timings["tokenizer"] = time.perf_counter() - t
            splits: dict[str, dict[str, Any]] = {}
            for role, source in sources.items():
                t = time.perf_counter()
                splits[role] = _prepare_split(cfg, role, source, tokenizer, out, tmp, reused,
                                              _Build(work, workers, progress))
                timings[role] = time.perf_counter() - t
            t = time.perf_counter()
            _prepare_shortlist(cfg, tokenizer, tmp)
            timings["shortlist"] = time.perf_counter() - t
            summary = _summary(cfg, sources, tokenizer, tok_key, splits, reused, timings)
            summary.update(extra_summary or {})
            for name, path in (extra_files or {}).items():
                shutil.copyfile(path, tmp / name)
            summary["time_s"]["total"] = round(time.perf_counter() - t0, 3)
            (tmp / SUMMARY).write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except EnvironmentFailure as exc:
        # A full disk while encoding: the work folder goes too (it is what filled the disk),
        # and the message speaks of the output, as for any other file of the command.
        shutil.rmtree(work, ignore_errors=True)
        kept = "the previous contents are unchanged" if existed else "nothing was left there"
        raise environment_failure(exc, out, kept, within=work) or exc from None
    except AiaynError:
        # Bad input or settings: what was done is of no use once they are fixed.
        shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)
    log.info("prepared %s in %.1f s", out, summary["time_s"]["total"])
    return summary


def partial_dir(out: Path) -> Path:
    """Where an unfinished prepare of ``out`` keeps its completed work."""
    return out.with_name(f".{out.name}.partial")


@dataclass
class _Build:
    """How splits are built: in ``work`` (kept if interrupted), by ``workers`` processes."""

    work: Path
    workers: int = 1
    progress: bool = False


def is_prepared_dir(out: Path) -> bool:
    """A directory this command wrote: rebuilt in place, reusing what did not change."""
    return (out / SUMMARY).is_file()


# SentencePiece keeps its sizes as 32-bit signed integers.
SPM_INT_MAX = 2**31 - 1


def _check_sentencepiece_sizes(cfg: DataConfig) -> None:
    """The sizes SentencePiece takes, within its integers: an error naming the field, not its parser's."""
    for name in ("vocab_size", "tgt_vocab_size", "extend_vocab", "spm_input_sentence_size"):
        value = getattr(cfg, name, None)
        if value is not None and abs(value) > SPM_INT_MAX:
            raise ConfigError(f"data.{name}: at most {SPM_INT_MAX:,} (SentencePiece's integers), got {value:,}")


def _input_paths(cfg: DataConfig, extra_files: dict[str, Path] | None) -> list[str | Path]:
    """Files and folders ``prepare`` reads whole: the output directory must not be, hold or lie inside one
    (the data and download folders, read in part, may hold it)."""
    names = ("tokenizer_dir", "train_src", "train_tgt", "valid_src", "valid_tgt", "test_src", "test_tgt",
             "train_tsv", "valid_tsv", "test_tsv")
    paths: list[str | Path] = [v for v in (getattr(cfg, n) for n in names) if v]
    return paths + list((extra_files or {}).values())


def _prepare_tokenizer(cfg: DataConfig, train: Source, out: Path, tmp: Path, old: dict[str, Any],
                       reused: dict[str, bool], work: Path) -> tuple[Tokenizer, str]:
    """The tokenizer and its key: a given one, else the previous one if trained on the same
    text with the same settings (in ``out``, or in ``work`` from an unfinished prepare),
    else a new one; saved into ``tmp``."""
    given = _given_tokenizer(cfg)
    tok_key = _tokenizer_key(cfg, train, given)
    tokenizer = None
    if given is not None and not cfg.extend_vocab:
        tokenizer = add_source_controls(given, _source_tags(cfg, train))
        tokenizer.save(tmp)
        reused["tokenizer"] = tokenizer is given
    elif old.get("tokenizer_key") == tok_key:
        try:
            tokenizer = Tokenizer.load(out)
            tokenizer.save(tmp)
            reused["tokenizer"] = True
        except DataError:
            tokenizer = None
    if tokenizer is None and _read_text(work / TOKENIZER_KEY) == tok_key:
        try:
            tokenizer = Tokenizer.load(work / "tokenizer")
            tokenizer.save(tmp)
            reused["tokenizer"] = True
        except DataError:
            tokenizer = None
    if tokenizer is None and given is not None:
        tokenizer = _extend(cfg, given, train, tmp)
        reused["tokenizer"] = False
    if tokenizer is None:
        tokenizer = _train(cfg, train, tmp)
        reused["tokenizer"] = False
        tokenizer.save(work / "tokenizer")
        write_atomic(work / TOKENIZER_KEY, tok_key, durable=False)
    return tokenizer, tok_key


def _extend(cfg: DataConfig, given: Tokenizer, train: Source, tmp: Path) -> Tokenizer:
    """``data.extend_vocab`` pieces learned on the training text added to the given tokenizer."""
    log.info("extending %s's tokenizer by %d pieces learned on %s", cfg.tokenizer_dir, cfg.extend_vocab, train.name)

    side = _sides(cfg, train)
    try:
        tokenizer, report = extend_tokenizer(given, side(0), side(1), cfg.extend_vocab, seed=cfg.seed,
                                             character_coverage=cfg.character_coverage,
                                             input_sentence_size=cfg.spm_input_sentence_size)
    except EmptyTrainingText:
        raise DataError(f"{train.name}: no training sentences to learn new pieces from") from None
    for name, r in report.items():
        log.info("%s vocabulary extended: %d -> %d pieces (%d added)", name, r["old"], r["new"], r["added"])
    tokenizer = add_source_controls(tokenizer, _source_tags(cfg, train))
    tokenizer.save(tmp)
    return tokenizer


SHORTLIST_SAMPLE = 200_000  # training pairs the shortlist is counted on, at most (seeded draw)


def _prepare_shortlist(cfg: DataConfig, tokenizer: Tokenizer, tmp: Path) -> None:
    """``data.shortlist_k``: the shortlist of the binarized training pairs, saved with the
    tokenizer; else none (a reused or given tokenizer's is dropped: it belongs to other data)."""
    tokenizer.shortlist = None
    (tmp / SHORTLIST_FILE).unlink(missing_ok=True)
    if not cfg.shortlist_k:
        return
    train = TokenDataset(tmp / "train")
    n = len(train)
    indices = range(n) if n <= SHORTLIST_SAMPLE else sorted(
        np.random.default_rng(cfg.seed).choice(n, SHORTLIST_SAMPLE, replace=False).tolist())
    tokenizer.shortlist = build_shortlist((train[i] for i in indices), tokenizer.src_vocab_size,
                                          tokenizer.tgt_vocab_size, cfg.shortlist_k, cfg.shortlist_frequent)
    tokenizer.save(tmp)
    log.info("shortlist: %d target pieces per source piece, %d frequent ones", cfg.shortlist_k,
             len(tokenizer.shortlist.frequent))


TOKENIZER_KEY = "tokenizer.key"


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None


def _prepare_split(cfg: DataConfig, role: str, source: Source, tokenizer: Tokenizer, out: Path, tmp: Path,
                   reused: dict[str, bool], build: _Build) -> dict[str, Any]:
    """One binarized split in ``tmp``, reused from ``out`` (or from an unfinished prepare's
    ``build.work``) when its key (inputs, tokenizer, filters) did not change; returns its
    entry of the summary."""
    filters = _filters(cfg) if role == "train" else None
    extra: dict[str, Any] = {"on_invalid_utf8": cfg.on_invalid_utf8}
    if cfg.tgt_lang_tag:  # every source sequence starts with the target-language tag
        tokenizer = tokenizer.tagged(cfg.tgt_lang)
        extra["src_tag"] = tokenizer.src_tag
    key = cache_key([source.tag], tokenizer, filters, **extra)
    dataset = None
    for where in (out, build.work):
        if dataset is None and read_key(where / role) == key and (role == "train" or _has_text(where, role)):
            try:
                dataset = _reuse_split(where, tmp, role)
                reused[role] = True
            except (DataError, OSError):
                dataset = None
    if dataset is None:
        _build_split(source, role, tokenizer, build, filters, key, ReadStats())
        dataset = _reuse_split(build.work, tmp, role, quiet=True)
        reused[role] = False
    meta = dataset.meta
    return {
        "name": source.name,
        "pairs": int(meta["pairs"]),
        "lines": int(meta.get("lines", meta["pairs"])),
        "dropped": dict(meta["dropped"]),
        "tokens": int(meta["src_tokens"]) + int(meta["tgt_tokens"]),
        "src_tokens": int(meta["src_tokens"]),
        "tgt_tokens": int(meta["tgt_tokens"]),
        "replaced_invalid_utf8": int(meta.get("replaced", 0)),
        "files": source.files,
    }


def _summary(cfg: DataConfig, sources: dict[str, Source], tokenizer: Tokenizer, tok_key: str,
             splits: dict[str, dict[str, Any]], reused: dict[str, bool], timings: dict[str, float]
             ) -> dict[str, Any]:
    return {
        "format_version": PREPARE_VERSION,
        "source": {"dataset": cfg.dataset, "synthetic": cfg.synthetic,
                   "src_lang": cfg.src_lang, "tgt_lang": cfg.tgt_lang},
        "splits": splits,
        "vocab_size": tokenizer.src_vocab_size,
        "src_vocab_size": tokenizer.src_vocab_size,
        "tgt_vocab_size": tokenizer.tgt_vocab_size,
        "joint_vocab": tokenizer.joint,
        "tokenizer_files": tokenizer.model_files,
        "extended_vocab": _extension_report(cfg, tokenizer),
        "shortlist": {"k": cfg.shortlist_k, "frequent": cfg.shortlist_frequent} if cfg.shortlist_k else None,
        "spm": _spm_settings(cfg),
        "filters": dataclasses.asdict(_filters(cfg)),
        "on_invalid_utf8": cfg.on_invalid_utf8,
        "input_key": input_key(cfg, sources),
        "tokenizer_key": tok_key,
        "reused": reused,
        "time_s": {k: round(v, 3) for k, v in timings.items()},
        "config": dataclasses.asdict(cfg),
    }


def _extension_report(cfg: DataConfig, tokenizer: Tokenizer) -> dict[str, Any] | None:
    """With data.extend_vocab: per model, the given tokenizer's size and the size now."""
    given = _given_tokenizer(cfg) if cfg.extend_vocab else None
    if given is None:
        return None
    sides = {"joint": (given.src_vocab_size, tokenizer.src_vocab_size)} if tokenizer.joint else {
        "source": (given.src_vocab_size, tokenizer.src_vocab_size),
        "target": (given.tgt_vocab_size, tokenizer.tgt_vocab_size)}
    return {"asked": cfg.extend_vocab, **{k: {"old": o, "new": n, "added": n - o} for k, (o, n) in sides.items()}}


def ensure_prepared(cfg: DataConfig, out_dir: str | os.PathLike) -> Path:
    """``out_dir`` if it was prepared from exactly these inputs and settings; else prepare it."""
    out = Path(out_dir)
    old = _old_summary(out)
    if old:
        sources = resolve_sources(cfg, progress=False)
        if old.get("input_key") == input_key(cfg, sources) and _complete(out, old):
            log.info("%s: up to date", out)
            return out
    prepare_data(cfg, out)
    return out


def _complete(out: Path, summary: dict[str, Any]) -> bool:
    if not all((out / f).is_file() for f in summary.get("tokenizer_files", [])):
        return False
    if summary.get("shortlist") and not (out / SHORTLIST_FILE).is_file():
        return False
    return all((out / role / "meta.json").is_file() and (role == "train" or _has_text(out, role))
               for role in summary.get("splits", {}))


def _has_text(out: Path, role: str) -> bool:
    return (out / f"{role}.src.txt").is_file() and (out / f"{role}.tgt.txt").is_file()


def _train(cfg: DataConfig, train: Source, tmp: Path) -> Tokenizer:
    try:
        return _train_tokenizer(cfg, train, tmp)
    except EmptyTrainingText:
        raise DataError(f"{train.name}: no training sentences (empty files, or every pair was dropped as "
                        "empty or too long)") from None


def _train_tokenizer(cfg: DataConfig, train: Source, tmp: Path) -> Tokenizer:
    settings = _spm_settings(cfg)
    side = _sides(cfg, train)

    if settings["model_type"] == "word":
        # Synthetic: a word model with every symbol (each one token), nothing unknown.
        pairs = list(zip(side(0), side(1)))
        src_syms = {w for s, _ in pairs for w in s.split()}
        tgt_syms = {w for _, t in pairs for w in t.split()}
        specials = 4
        tags = _source_tags(cfg, train)
        vocab = (len(src_syms | tgt_syms) if cfg.joint_vocab else len(src_syms)) + specials + len(tags)
        return train_tokenizer([s for s, _ in pairs], [t for _, t in pairs], tmp, vocab,
                               joint=cfg.joint_vocab, model_type="word",
                               tgt_vocab_size=len(tgt_syms) + specials, seed=cfg.seed,
                               input_sentence_size=0, src_control_symbols=tags)
    log.info("training SentencePiece (%s, vocabulary %d%s)", settings["model_type"], cfg.vocab_size,
             ", joint" if cfg.joint_vocab else "")
    return train_tokenizer(
        _ReadAfreshEachPass(lambda: side(0)), _ReadAfreshEachPass(lambda: side(1)), tmp, cfg.vocab_size,
        joint=cfg.joint_vocab, character_coverage=cfg.character_coverage, model_type=cfg.spm_model_type,
        input_sentence_size=cfg.spm_input_sentence_size, tgt_vocab_size=cfg.tgt_vocab_size,
        tgt_model_type=cfg.tgt_spm_model_type, seed=cfg.seed, src_control_symbols=_source_tags(cfg, train))


def _sides(cfg: DataConfig, train: Source) -> Callable[[int], Iterator[str]]:
    """``side(i)``: the training sources (0) or targets (1), read afresh; with
    data.tgt_lang_tag the sources without the tag they start with (a control piece:
    SentencePiece learns pieces of the text only)."""

    def side(i: int) -> Iterator[str]:
        texts = (pair[i] for pair in train.open(True, ReadStats()))
        if i == 0 and cfg.tgt_lang_tag:
            return (_without_tag(s) for s in texts)
        return texts

    return side


def _without_tag(text: str) -> str:
    tag = leading_tag(text)
    return text.lstrip()[len(tag):].lstrip() if tag else text


class _ReadAfreshEachPass:
    """An iterable of sentences read afresh on each pass (a corpus can be larger than RAM)."""

    def __init__(self, make: Callable[[], Iterator[str]]) -> None:
        self._make = make

    def __iter__(self) -> Iterator[str]:
        return self._make()


def _build_split(source: Source, role: str, tokenizer: Tokenizer, build: _Build,
                 filters: FilterConfig | None, key: str, stats: ReadStats) -> TokenDataset:
    """The split ``role`` (and, for evaluation, its text) built in ``build.work``; its
    ``meta.json`` is complete (key included) only once everything else is."""
    train = role == "train"
    work = build.work
    pairs = source.open(train, stats)
    if not train:
        # Evaluation text is kept verbatim (all lines) for BLEU references.
        pairs_list = list(pairs)
        _write_text(work / f"{role}.src.txt", (s for s, _ in pairs_list))
        _write_text(work / f"{role}.tgt.txt", (t for _, t in pairs_list))
        pairs = iter(pairs_list)
    total = source.count() if build.progress and train else None
    with tqdm(total=total, unit=" pairs", unit_scale=True, desc=f"encode {role}", file=sys.stderr,
              disable=not (build.progress and train), dynamic_ncols=True) as bar:
        # Reading-stage drops (invalid UTF-8 under `skip`) join the filter counts in meta.json.
        dataset = binarize(pairs, tokenizer, work / role, filters, key, lambda: dict(stats.dropped),
                           workers=build.workers if train else 1, state_dir=work / f"{role}.chunks",
                           progress=bar.update, extra_meta=lambda: dict(lines=stats.lines, replaced=stats.replaced))
    meta = dataset.meta
    if not meta["pairs"] and train:
        raise DataError(f"{source.name}: no training pairs left after filtering "
                        f"(dropped: {meta['dropped']})")
    if not train and meta["pairs"] != stats.lines:
        raise AssertionError("evaluation data must keep every line")
    return dataset


def _reuse_split(out: Path, tmp: Path, role: str, quiet: bool = False) -> TokenDataset:
    """The split ``role`` of ``out`` (and its text) linked into ``tmp``."""
    _link_tree(out / role, tmp / role)
    if role != "train":
        for side in ("src", "tgt"):
            _link_file(out / f"{role}.{side}.txt", tmp / f"{role}.{side}.txt")
    if not quiet:
        log.info("%s: reusing the binarized %s split", out, role)
    return TokenDataset(tmp / role)


def _link_file(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # same filesystem: no copy
    except OSError:
        shutil.copy2(src, dst)


def _link_tree(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    for item in src.iterdir():
        if item.is_file():
            _link_file(item, dst / item.name)


def _write_text(path: Path, lines: Iterator[str]) -> None:
    # Replaced, not written in place: a reused split's file here may be a hard link to the
    # previous directory's, which must stay intact until the swap.
    with atomic_file(path, "wb", durable=False) as f:
        for line in lines:
            f.write((line + "\n").encode("utf-8"))


# -------------------------------------------------------------------------- loading


def load_split(prepared_dir: str | os.PathLike, role: str) -> TokenDataset:
    """The binarized ``train`` / ``valid`` / ``test`` split of a prepared directory."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    directory = Path(prepared_dir) / role
    if not directory.is_dir():
        raise DataError(f"{prepared_dir}: has no {role} split (prepare it with a {role} set)")
    return TokenDataset(directory)


def load_tokenizer(prepared_dir: str | os.PathLike) -> Tokenizer:
    return Tokenizer.load(prepared_dir)


def split_text(prepared_dir: str | os.PathLike, role: str) -> tuple[list[str], list[str]]:
    """Source and target sentences of a split.

    valid/test: the raw lines, all of them (BLEU references). train: the kept pairs decoded
    from their ids (SentencePiece-normalized text; the raw training text is not stored).
    """
    directory = Path(prepared_dir)
    if role == "train":
        data, tok = load_split(directory, "train"), load_tokenizer(directory)
        pairs = [data[i] for i in range(len(data))]
        return [tok.decode_src(s) for s, _ in pairs], [tok.decode_tgt(t) for _, t in pairs]
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    out = []
    for side in ("src", "tgt"):
        path = directory / f"{role}.{side}.txt"
        if not path.is_file():
            raise DataError(f"{path}: not found; prepare {prepared_dir} with a {role} set")
        # Bytes, not read_text(): universal newlines would split a sentence at a stray \r.
        text = path.read_bytes().decode("utf-8")
        out.append(text.split("\n")[:-1] if text else [])
    return out[0], out[1]
