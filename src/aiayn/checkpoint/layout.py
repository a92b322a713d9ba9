"""The names of a checkpoint directory's files, of a run's pointers, and the format version.

Layout of a checkpoint directory::

    step_000100/
      model.safetensors      weights; tied matrices stored once (aliases in the metadata);
                             names without `module.` / `_orig_mod.` prefixes
      config.yaml            the whole experiment (model, data/tokenizer, train, decode)
      state.json             step, epoch, data-iterator position, RNG states, best metric,
                             format version ... (whatever the trainer passes, plus versions)
      optimizer.safetensors  optimizer tensors (Adam moments, step counts)   [optional]
      optimizer.json         optimizer scalars and param groups                [optional]
      tokenizer/             the SentencePiece model(s)                        [optional]
      checksums.sha256       SHA-256 of every other file (`sha256sum -c` format)

A run directory keeps its checkpoints in ``RUN/checkpoints/``; the text file
``RUN/checkpoints/last`` names the newest complete one and ``RUN/checkpoints/best`` the best
by the validation metric (:mod:`aiayn.checkpoint.manager`).

Atomicity: everything is written into ``checkpoints/.tmp-<name>-*``, fsynced, then
renamed to ``<name>`` (:func:`aiayn.fileio.atomic_dir`); the ``last`` pointer is replaced
(write, fsync, rename) only after that. A process killed at any moment leaves either the
previous checkpoint as ``last`` or the new one, complete; stale temporaries (``.tmp-*``) are
ignored and cleaned later.
"""

from __future__ import annotations

FORMAT_VERSION = 1
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"
STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_JSON = "optimizer.json"
TOKENIZER_DIR = "tokenizer"
MANIFEST_FILE = "checksums.sha256"
CHECKPOINTS_DIR = "checkpoints"
LAST_POINTER = "last"
BEST_POINTER = "best"
REQUIRED_FILES = (MODEL_FILE, CONFIG_FILE, STATE_FILE)
TMP_PREFIX = ".tmp-"
"""Every temporary name in a checkpoints directory starts with this (cleaned after a kill)."""
