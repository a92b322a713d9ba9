"""A lexical vocabulary shortlist: for each source piece, the target pieces most associated
with it in the training data, plus the most frequent target pieces (Marian's and
CTranslate2's ``vmap`` idea). Decoding with ``--shortlist`` scores only the union of the
lists of a batch's source pieces and the frequent pieces (:mod:`aiayn.inference.step_vocabulary`).

Built by ``aiayn prepare`` with ``data.shortlist_k`` from the binarized training pairs:
``cooc(s, t)`` is the number of pairs whose source holds piece ``s`` and whose target holds
``t`` (each counted once per pair), ``df`` the number of pairs holding a piece on its side;
a source piece keeps the ``k`` target pieces of highest Dice coefficient
``2 cooc(s, t) / (df(s) + df(t))`` (ties: the lower id), among those seen with it at least
``min_count`` times. Stored as ``shortlist.safetensors`` beside the SentencePiece model(s),
so every checkpoint carries the shortlist of its tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from safetensors.torch import load, save
from torch import Tensor

from aiayn.errors import DataError
from aiayn.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

SHORTLIST_FILE = "shortlist.safetensors"


@dataclass
class Shortlist:
    """``table`` (source vocabulary, k): target ids per source id, -1 where fewer; ``frequent``:
    the most frequent target ids, most frequent first."""

    table: Tensor
    frequent: Tensor

    def rows(self, src_ids: Iterable[int] | Tensor, extra: Iterable[int] = ()) -> Tensor:
        """The sorted target ids a batch with these source ids may emit: their lists, the
        frequent pieces, EOS and ``extra`` (e.g. the ids of a forced prefix)."""
        src = torch.as_tensor(list(src_ids) if not isinstance(src_ids, Tensor) else src_ids, dtype=torch.long)
        src = src[(src >= 0) & (src < self.table.size(0))].unique()
        listed = self.table.index_select(0, src).flatten()
        parts = [listed[listed >= 0], self.frequent, torch.tensor([EOS_ID, *extra], dtype=torch.long)]
        return torch.cat(parts).unique()

    def sentence_rows(self, src: Tensor, extras: Sequence[Iterable[int]] = (),
                      group: int = 1) -> tuple[Tensor, Tensor]:
        """The lists of each ``group`` sentences of ``src`` (B, S), padded: :meth:`rows` of their
        source ids and ``extras``, with the four special ids; as (N, C) sorted ids padded with
        PAD, N = ceil(B / group), and the lists' sizes (N,). The special ids are the lowest, so
        every list starts with them: column = id."""
        specials = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
        lists = [self.rows(src[g:g + group].flatten(), [*specials, *(i for e in extras[g:g + group] for i in e)])
                 for g in range(0, src.size(0), group)]
        sizes = torch.tensor([len(ids) for ids in lists], dtype=torch.long)
        out = torch.full((len(lists), int(sizes.max()) if lists else 0), PAD_ID, dtype=torch.long)
        for b, listed in enumerate(lists):
            out[b, :len(listed)] = listed
        return out, sizes

    def to_bytes(self) -> bytes:
        return save({"table": self.table.to(torch.int32).contiguous(),
                     "frequent": self.frequent.to(torch.int32).contiguous()}, metadata={"format": "aiayn-shortlist"})

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "shortlist", tgt_vocab: int | None = None) -> Shortlist:
        """A shortlist :meth:`to_bytes` wrote; ``tgt_vocab``: the target vocabulary's size,
        which every id must be within. Anything else is a DataError naming ``where`` and the
        entry."""
        try:
            tensors = load(data)
            table, frequent = tensors["table"], tensors["frequent"]
        except Exception as exc:  # a damaged file: safetensors raises several kinds
            raise DataError(f"{where}: not a shortlist ({exc})") from None
        integer = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
        if table.dim() != 2 or frequent.dim() != 1 or table.dtype not in integer or frequent.dtype not in integer:
            raise DataError(f"{where}: not a shortlist (table {tuple(table.shape)} {table.dtype}, frequent "
                            f"{tuple(frequent.shape)} {frequent.dtype}; expected integer ids, 2-D and 1-D)")
        table, frequent = table.long(), frequent.long()
        high = tgt_vocab
        for name, ids, low in (("table", table, -1), ("frequent", frequent, 0)):
            bad = (ids < low) | (ids >= high) if high is not None else ids < low
            if bool(bad.any()):
                at = [int(i) for i in bad.nonzero()[0]]
                index = "".join(f"[{i}]" for i in at)
                bound = f"0..{high - 1}" if high is not None else "0 or more"
                raise DataError(f"{where}: {name}{index} is {int(ids[tuple(at)])}, not a target id ({bound}"
                                f"{'; -1 pads a table row' if name == 'table' else ''})")
        return cls(table, frequent)


def build_shortlist(pairs: Iterable[tuple[Any, Any]], src_vocab: int, tgt_vocab: int,
                    k: int, frequent: int, min_count: int = 1) -> Shortlist:
    """The shortlist of ``pairs`` (source ids, target ids) as the module describes."""
    specials = np.array([PAD_ID, BOS_ID, EOS_ID])
    codes: list[np.ndarray] = []
    pending = 0
    counted = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))  # (pair codes, counts)
    src_df = np.zeros(src_vocab, dtype=np.int64)
    tgt_df = np.zeros(tgt_vocab, dtype=np.int64)
    tgt_count = np.zeros(tgt_vocab, dtype=np.int64)
    for src, tgt in pairs:
        s = np.setdiff1d(np.unique(np.asarray(src, dtype=np.int64)), specials)
        t_all = np.asarray(tgt, dtype=np.int64)
        t = np.setdiff1d(np.unique(t_all), specials)
        src_df[s] += 1
        tgt_df[t] += 1
        np.add.at(tgt_count, t_all[np.isin(t_all, specials, invert=True)], 1)
        if s.size and t.size and k > 0:
            codes.append((s[:, None] * tgt_vocab + t[None, :]).ravel())
            pending += codes[-1].size
            if pending >= _MERGE_EVERY:  # bounded memory: fold the codes so far into counts
                counted = _merge(counted, codes)
                codes, pending = [], 0
    table = np.full((src_vocab, max(k, 0)), -1, dtype=np.int64)
    counted = _merge(counted, codes)
    if counted[0].size and k > 0:
        pair_codes, cooc = counted
        keep = cooc >= min_count
        pair_codes, cooc = pair_codes[keep], cooc[keep]
        s_ids, t_ids = pair_codes // tgt_vocab, pair_codes % tgt_vocab
        dice = 2.0 * cooc / (src_df[s_ids] + tgt_df[t_ids])
        # Per source id: best Dice first, the lower target id among equals.
        order = np.lexsort((t_ids, -dice, s_ids))
        s_sorted, t_sorted = s_ids[order], t_ids[order]
        starts = np.searchsorted(s_sorted, np.arange(src_vocab), side="left")
        rank = np.arange(len(s_sorted)) - starts[s_sorted]
        top = rank < k
        table[s_sorted[top], rank[top]] = t_sorted[top]
    by_count = np.lexsort((np.arange(tgt_vocab), -tgt_count))
    by_count = by_count[tgt_count[by_count] > 0][:max(frequent, 0)]
    return Shortlist(torch.from_numpy(table), torch.from_numpy(by_count.astype(np.int64)))


_MERGE_EVERY = 4_000_000


def _merge(counted: tuple[np.ndarray, np.ndarray], codes: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``counted`` (sorted unique codes, counts) with ``codes`` added, one count each."""
    if not codes:
        return counted
    new, new_counts = np.unique(np.concatenate(codes), return_counts=True)
    merged, inverse = np.unique(np.concatenate([counted[0], new]), return_inverse=True)
    counts = np.bincount(inverse, weights=np.concatenate([counted[1], new_counts]), minlength=merged.size)
    return merged, counts.astype(np.int64)
