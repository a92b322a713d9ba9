"""Initialising a model from a checkpoint whose vocabulary differs (``train.init_vocab``).

The rows of the vocabulary-indexed matrices -- the source embedding, the target embedding,
the separate output projection and the output bias, whichever the model has -- follow the
pieces: a piece of the new vocabulary that the checkpoint's vocabulary has keeps its row,
copied exactly; a new piece gets the mean of the checkpoint's rows over its text pieces
(every piece but ``<pad>``, ``<unk>``, ``<s>``, ``</s>``). Every other tensor is loaded as
it is, strictly (names and shapes must be the model's).

Modes, per side (source and target; one side for a joint vocabulary):

``same``
    the default: the vocabularies must be equal, piece for piece (no row moves).
``extend``
    the new vocabulary starts with the old one: ids ``0 .. n_old - 1`` hold the same pieces
    in both (the ids are kept), and the new pieces come after them. This is what
    ``aiayn prepare --tokenizer-dir CK --extend-vocab N`` produces.
``remap``
    any new vocabulary: each new piece takes the row of the old piece with the same string,
    wherever its id was; a piece the old vocabulary lacks is new.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.checkpoint.weights import load_model_tensors, read_model_weights
from aiayn.errors import ConfigError
from aiayn.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

log = logging.getLogger(__name__)

INIT_VOCAB_MODES = ("same", "extend", "remap")

# The weights whose rows are indexed by a vocabulary, by side.
SOURCE_ROWS = ("src_embed.weight",)
TARGET_ROWS = ("tgt_embed.weight", "output_projection.weight", "output_bias")

_NOT_TEXT = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)


@dataclass
class VocabMap:
    """Where each new id's row comes from: ``rows[new_id]`` is an old id, or None (a new piece)."""

    rows: list[int | None]
    old_size: int

    @property
    def kept(self) -> int:
        return sum(r is not None for r in self.rows)

    @property
    def added(self) -> int:
        return len(self.rows) - self.kept

    def report(self) -> dict[str, int]:
        return {"old": self.old_size, "new": len(self.rows), "kept": self.kept, "added": self.added}


def vocab_map(old: Sequence[str], new: Sequence[str], mode: str, side: str = "vocabulary") -> VocabMap:
    """The row map from the ``old`` pieces (in id order) to the ``new`` ones under ``mode``
    (a :class:`ConfigError` naming the first offending id when they do not fit it)."""
    if mode not in INIT_VOCAB_MODES:
        raise ConfigError(f"train.init_vocab: must be one of {', '.join(INIT_VOCAB_MODES)}, got {mode!r}")
    if mode in ("same", "extend"):
        limit = len(old)
        if mode == "same" and len(new) != len(old):
            raise ConfigError(
                f"train.init_from: the {side} has {len(new)} pieces, the checkpoint's {len(old)}: set "
                "train.init_vocab: extend (new pieces appended) or remap (pieces matched by string)")
        if len(new) < len(old):
            raise ConfigError(f"train.init_vocab: extend: the new {side} ({len(new)} pieces) is smaller than "
                              f"the checkpoint's ({len(old)}); use remap")
        for i in range(limit):
            if old[i] != new[i]:
                hint = "; use remap" if mode == "extend" else ": set train.init_vocab: extend or remap"
                raise ConfigError(f"train.init_vocab: {mode}: {side} id {i} is {new[i]!r}, the checkpoint's is "
                                  f"{old[i]!r}{hint}")
        return VocabMap([i if i < limit else None for i in range(len(new))], len(old))
    index: dict[str, int] = {}
    for i, piece in enumerate(old):
        index.setdefault(piece, i)
    return VocabMap([index.get(piece) for piece in new], len(old))


def remap_rows(old: Tensor, vmap: VocabMap) -> Tensor:
    """``old``'s rows (dim 0) laid out for the new vocabulary: kept rows copied exactly, new
    rows the mean of ``old``'s text-piece rows (all rows when it has none)."""
    text_ids = [i for i in range(old.size(0)) if i not in _NOT_TEXT]
    mean = (old[text_ids] if text_ids else old).mean(dim=0)
    out = mean.expand(len(vmap.rows), *old.shape[1:]).clone()
    kept_new = [n for n, o in enumerate(vmap.rows) if o is not None]
    kept_old = [o for o in vmap.rows if o is not None]
    if kept_new:
        out[torch.tensor(kept_new)] = old[torch.tensor(kept_old)]
    return out.contiguous()


def load_with_vocab(model: nn.Module, path: str | Path, old_pieces: tuple[Sequence[str], Sequence[str]],
                    new_pieces: tuple[Sequence[str], Sequence[str]], mode: str, joint: bool = False
                    ) -> dict[str, Any]:
    """Load the model.safetensors at ``path`` into ``model`` whose vocabularies are
    ``new_pieces`` (source, target) while the checkpoint's were ``old_pieces``; returns the
    report: per side, the old and new sizes and the pieces kept and added."""
    maps = {"source": vocab_map(old_pieces[0], new_pieces[0], mode, "source vocabulary"),
            "target": vocab_map(old_pieces[1], new_pieces[1], mode, "target vocabulary")}
    tensors = read_model_weights(path)
    with torch.no_grad():
        for name in list(tensors):
            side = "source" if name in SOURCE_ROWS else "target" if name in TARGET_ROWS else None
            if side is not None:
                tensors[name] = remap_rows(tensors[name], maps[side])
    load_model_tensors(model, tensors, path)
    report: dict[str, Any] = {"mode": mode}
    if joint:
        report["joint"] = maps["source"].report()
    else:
        report.update({side: m.report() for side, m in maps.items()})
    return report


def describe(report: dict[str, Any]) -> str:
    """One line: ``joint vocabulary: 8000 -> 8400 pieces, 8000 kept, 400 new (mean embedding)``."""
    parts = []
    for side in ("joint", "source", "target"):
        if side in report:
            r = report[side]
            parts.append(f"{side} vocabulary {r['old']} -> {r['new']} pieces, {r['kept']} kept, "
                         f"{r['added']} new (mean embedding)")
    return f"init_vocab {report['mode']}: " + "; ".join(parts)
