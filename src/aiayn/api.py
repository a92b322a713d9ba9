"""The steps of the Python API that are functions: ``prepare``, ``train`` and ``average``.

Each one is its ``aiayn`` command: the same checks, the same files, the same errors (an
[AiaynError][aiayn.errors.AiaynError] whose one-line message names the field or file; the
command prints it and exits 2). The package root exports them: ``aiayn.train(...)``.
Translating and parsing are classes ([Translator][aiayn.inference.translator.Translator],
[Parser][aiayn.inference.parser.Parser]).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.checkpoint.average import average_checkpoints, last_checkpoints
from aiayn.checkpoint.directory import load_checkpoint_config, resolve_checkpoint
from aiayn.config import Config, DataConfig, apply_overrides, from_dict, load_config, to_dict
from aiayn.data.prepare import prepare_data
from aiayn.errors import CheckpointError, ConfigError
from aiayn.fileio import check_empty_dir, check_not_inside
from aiayn.recipes.train import run_training

PathLike = str | Path


def prepare(out_dir: PathLike, config: PathLike | Config | None = None, *, force: bool = False,
            progress: bool = True, **data: Any) -> dict[str, Any]:
    """Train the tokenizer and binarize a parallel corpus into ``out_dir`` (``aiayn prepare``).

    What to read and how to tokenize it are [DataConfig][aiayn.config.DataConfig] fields:
    the ``data`` section of ``config``, if given, with the keyword arguments replacing its
    values. Only the training pairs are filtered (empty, too long, length ratio);
    validation and test keep every line.

    Args:
        out_dir: The prepared-data directory: new, empty, or one ``prepare`` wrote before
            (rebuilt in place, reusing what did not change).
        config: A YAML experiment file or a [Config][aiayn.config.Config] whose ``data``
            section gives the defaults; None: DataConfig's defaults.
        force: Replace a non-empty ``out_dir`` that ``prepare`` did not write.
        progress: Progress bars on stderr.
        **data: DataConfig fields, e.g. ``train_src`` and ``train_tgt`` (line-aligned text
            files, plain or .gz), ``valid_src``, ``valid_tgt``, ``test_src``, ``test_tgt``,
            ``src_lang``, ``tgt_lang``, ``vocab_size``, ``joint_vocab``; or ``dataset`` with
            ``data_dir`` (a known corpus from a mirror folder); or ``synthetic``.

    Returns:
        The summary, also written to ``out_dir/summary.json``: pairs kept and dropped per
            split, vocabulary sizes, token counts, timings.

    Raises:
        ConfigError: An unknown field (with the closest name) or a bad value.
        DataError: A missing or misaligned file, invalid UTF-8, or a non-empty ``out_dir``.

    Example:
        ```python
        summary = aiayn.prepare("data-bin/mine", src_lang="en", tgt_lang="de", vocab_size=8000,
                                train_src="corpus/train.en", train_tgt="corpus/train.de",
                                valid_src="corpus/valid.en", valid_tgt="corpus/valid.de",
                                test_src="corpus/test.en", test_tgt="corpus/test.de")
        summary["splits"]["train"]["pairs"]
        ```
    """
    base = _config(config).data if config is not None else DataConfig()
    fields = {key: os.fspath(value) if isinstance(value, os.PathLike) else value for key, value in data.items()}
    cfg = from_dict(DataConfig, {**to_dict(base), **fields}, "data")
    return prepare_data(cfg, out_dir, progress=progress, force=force)


def train(config: PathLike | Config | None, run_dir: PathLike, overrides: Sequence[str] = (),
          resume: PathLike | None = None, threads: int | None = None) -> dict[str, Any]:
    """Train a model in ``run_dir`` (``aiayn train``); a run directory that holds a checkpoint
    is resumed exactly where it stopped.

    Checkpoints go to ``run_dir/checkpoints/`` (``last`` and ``best`` name the newest and the
    best), metrics to ``run_dir/metrics.jsonl``, the log to ``run_dir/train.log`` (to see it
    as it runs, call ``logging.basicConfig(level=logging.INFO)`` first).

    Args:
        config: A YAML experiment file (``configs/*.yaml``) or a
            [Config][aiayn.config.Config], which is not modified. None: the configuration
            of the checkpoint to resume (``resume``, else ``run_dir``'s last).
        run_dir: Where the run's files go; new, empty, or a run to resume.
        overrides: ``section.key=value`` strings applied to ``config``, as on the command
            line, e.g. ``["train.max_steps=1000", "data.prepared_dir=data-bin/mine"]``.
        resume: Continue from this run directory or checkpoint instead of ``run_dir``'s
            last checkpoint.
        threads: CPU threads; None: ``$AIAYN_NUM_THREADS``, else torch's choice.

    Returns:
        The summary, also written to ``run_dir/train_summary.json``: ``stop_reason``, ``step``,
            ``epoch``, ``last_checkpoint``, ``best_checkpoint``, ``best`` (metric, value, step),
            ``last_valid``, ``elapsed`` seconds, ...

    Raises:
        ConfigError: An unknown key or a bad value in ``config`` or ``overrides``.
        CheckpointError: No checkpoint to resume where one was asked for.
        DataError: The prepared data is missing or unreadable.

    Example:
        ```python
        summary = aiayn.train("configs/multi30k_en_de.yaml", "runs/mine",
                              overrides=["data.prepared_dir=data-bin/mine"])
        summary["last_checkpoint"]
        ```
    """
    if isinstance(overrides, str):  # one override, not a sequence of one-letter ones
        overrides = [overrides]
    cfg = _config(config) if config is not None else _resumed_config(resume or run_dir)
    # A new, validated Config even without overrides: training sets its vocabulary sizes,
    # and the caller's must not change.
    return run_training(apply_overrides(cfg, list(overrides)), run_dir, resume=resume, threads=threads)


def average(inputs: PathLike | Sequence[PathLike], out: PathLike, *, last: int | None = None,
            force: bool = False) -> Path:
    """Average the weights of checkpoints into a new checkpoint ``out`` (``aiayn average``).

    The paper averages the last 5 checkpoints of a base model, the last 20 of a big one
    (section 6.1). The result is a normal checkpoint, with the configuration and
    tokenizer of the newest input and no optimizer state.

    Args:
        inputs: With ``last``: one run directory. Without: two or more checkpoint
            directories (or anything [load_checkpoint][aiayn.checkpoint.directory.load_checkpoint]
            accepts), all of one model.
        out: The new checkpoint directory; never one that holds an input.
        last: Average the newest ``last`` periodic checkpoints (``step_*``) of the run.
        force: Replace a non-empty ``out``.

    Returns:
        ``out``, as a Path.

    Raises:
        CheckpointError: Too few checkpoints, checkpoints of different models, or a
            corrupted one.
        AiaynError: ``out`` is not empty (without ``force``) or holds an input.

    Example:
        ```python
        aiayn.average("runs/mine", "runs/mine/averaged", last=5, force=True)
        ```
    """
    paths, protected = _average_inputs(inputs, last)
    check_not_inside(out, protected, "out")
    check_empty_dir(out, force, flag="out", hint="pass force=True to replace it")
    return average_checkpoints(paths, out)


def _average_inputs(inputs: PathLike | Sequence[PathLike], last: int | None) -> tuple[list[PathLike], list[PathLike]]:
    """(the checkpoints to average, the paths that ``out`` must not replace)."""
    if isinstance(inputs, (str, Path)):
        if last is not None:
            found: list[PathLike] = list(last_checkpoints(inputs, last))
            return found, [inputs, *found]
        paths: list[PathLike] = [inputs]
    elif last is not None:
        raise CheckpointError("average: last=N takes one run directory, not a list")
    else:
        paths = list(inputs)
    if len(paths) < 2:
        where = f"{paths[0]}: " if paths else ""
        raise CheckpointError(f"average: {where}give last=N with a run directory, or two or more checkpoints")
    return paths, paths


def _config(config: PathLike | Config) -> Config:
    """``config``, or the file it names, loaded."""
    return config if isinstance(config, Config) else load_config(config)


def _resumed_config(path: PathLike) -> Config:
    """The configuration of the checkpoint a run continues from."""
    try:
        checkpoint = resolve_checkpoint(path)
    except CheckpointError:
        raise ConfigError(f"{path}: no checkpoint to take the configuration from; give a config") from None
    return load_checkpoint_config(checkpoint)
