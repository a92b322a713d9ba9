"""Binarized splits: token ids encoded once, stored as flat numpy arrays, memory-mapped.

A split directory holds, for each side, all sentences' ids concatenated in one array
(``src.ids.npy``, ``tgt.ids.npy``; uint16 when the vocabulary fits, else int32) and the
start offsets (``*.offsets.npy``, int64, n + 1 entries), plus ``meta.json``. Loading maps
all four arrays (``mmap_mode="r"``), so a 36M-pair corpus costs no RAM until batches touch
it; sentence lengths are derived from the offsets when asked for, never kept.

Caching: ``meta.json`` records a key, a hash of everything the ids depend on (the input
files' contents, the tokenizer model bytes, the filter settings, the format version).
:func:`binarize_cached` rebuilds when the key differs and reuses the directory when it
matches; it also stores the kept/dropped counts so a reused cache still reports them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.data.corpus import FilterConfig, drop_reason, read_parallel
from aiayn.errors import DataError
from aiayn.fileio import atomic_dir
from aiayn.text.tokenizer import Tokenizer
from aiayn.vocab import PAD_ID

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
META = "meta.json"
# Sentences encoded per SentencePiece call: big enough for its threads, small enough for RAM.
CHUNK = 50_000


class TokenDataset:
    """Memory-mapped (source ids incl. EOS, target ids without BOS/EOS) pairs."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        meta_path = self.directory / META
        if not meta_path.is_file():
            raise DataError(f"{self.directory}: not a binarized split (no {META}); run `aiayn prepare`")
        try:
            self.meta: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DataError(f"{meta_path}: unreadable ({exc})") from None
        if self.meta.get("format_version") != FORMAT_VERSION:
            raise DataError(f"{meta_path}: format version {self.meta.get('format_version')} "
                            f"is not {FORMAT_VERSION}; prepare the data again")
        try:
            self._src = np.load(self.directory / "src.ids.npy", mmap_mode="r")
            self._tgt = np.load(self.directory / "tgt.ids.npy", mmap_mode="r")
            self._src_off = np.load(self.directory / "src.offsets.npy", mmap_mode="r")
            self._tgt_off = np.load(self.directory / "tgt.offsets.npy", mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise DataError(f"{self.directory}: damaged binarized split ({exc}); prepare again") from None
        n = int(self.meta["pairs"])
        if len(self._src_off) != n + 1 or len(self._tgt_off) != n + 1:
            raise DataError(f"{self.directory}: offsets do not match {n} pairs; prepare again")
        self._n = n

    @property
    def src_sizes(self) -> np.ndarray:
        """Source lengths (with EOS), int32, computed afresh from the offsets on each access."""
        return _sizes(self._src_off)

    @property
    def tgt_sizes(self) -> np.ndarray:
        """Target lengths (without BOS/EOS), int32, computed afresh from the offsets on each access."""
        return _sizes(self._tgt_off)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i = int(i) % len(self)
        src = np.array(self._src[self._src_off[i]:self._src_off[i + 1]], dtype=np.int64)
        tgt = np.array(self._tgt[self._tgt_off[i]:self._tgt_off[i + 1]], dtype=np.int64)
        return src, tgt

    def padded(self, indices: np.ndarray, side: str) -> tuple[np.ndarray, np.ndarray]:
        """Sentences ``indices`` of one side as a right-padded (B, max len) int64 matrix, and lengths.

        Vectorized gather from the memory map: collation without a Python loop per sentence
        (a 25k-token batch holds ~1,000 sentences).
        """
        ids, off = (self._src, self._src_off) if side == "src" else (self._tgt, self._tgt_off)
        idx = np.asarray(indices, dtype=np.int64)
        starts = off[idx]
        lens = off[idx + 1] - starts
        width = int(lens.max()) if len(lens) else 0
        cols = np.arange(width, dtype=np.int64)
        mask = cols[None, :] < lens[:, None]
        out = np.full((len(idx), width), PAD_ID, dtype=np.int64)
        out[mask] = ids[(starts[:, None] + cols[None, :])[mask]]
        return out, lens

    @property
    def key(self) -> str:
        return str(self.meta.get("key", ""))

    @property
    def stats(self) -> dict[str, Any]:
        """``{"pairs": kept, "dropped": {reason: n}, "src_tokens", "tgt_tokens"}``."""
        return {k: self.meta[k] for k in ("pairs", "dropped", "src_tokens", "tgt_tokens")}

    @property
    def kept_lines(self) -> np.ndarray:
        """Line number (0-based) in the input of each kept pair."""
        path = self.directory / "lines.npy"
        return np.load(path) if path.is_file() else np.arange(len(self))


def _sizes(offsets: np.ndarray) -> np.ndarray:
    out = np.empty(len(offsets) - 1, dtype=np.int32)
    step = 1 << 20  # in steps: no int64 temporary of the corpus's length
    for a in range(0, len(out), step):
        out[a:a + step] = np.diff(offsets[a:a + step + 1])
    return out


@dataclass
class BinarizeStats:
    pairs: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    src_tokens: int = 0
    tgt_tokens: int = 0


# --------------------------------------------------------------------------- keys


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes (1 MiB reads)."""
    h = hashlib.new(algorithm)
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None
    return h.hexdigest()


def cache_key(inputs: Sequence[str | os.PathLike | bytes], tokenizer: Tokenizer | None,
              filters: FilterConfig | None, **extra: Any) -> str:
    """A hash of what binarized ids depend on.

    ``inputs``: files (``Path``: hashed by content) and/or strings/bytes naming other
    sources (e.g. a synthetic task's parameters, or a known checksum). Changing any of them,
    the tokenizer or the filters changes the key.
    """
    h = hashlib.sha256()
    h.update(f"aiayn-binarize-v{FORMAT_VERSION}".encode())
    for item in inputs:
        if isinstance(item, bytes):
            h.update(b"b:" + hashlib.sha256(item).digest())
        elif isinstance(item, os.PathLike):
            h.update(b"f:" + file_digest(item).encode())
        else:
            h.update(b"s:" + str(item).encode())
    if tokenizer is not None:
        for blob in tokenizer.model_bytes():
            h.update(b"t:" + hashlib.sha256(blob).digest())
    h.update(json.dumps(asdict(filters) if filters else None, sort_keys=True).encode())
    h.update(json.dumps(extra, sort_keys=True, default=str).encode())
    return h.hexdigest()


# --------------------------------------------------------------------------- writing


def binarize(pairs: Iterable[tuple[str, str]], tokenizer: Tokenizer, out_dir: str | os.PathLike,
             filters: FilterConfig | None = None, key: str = "",
             pre_dropped: dict[str, int] | None = None) -> TokenDataset:
    """Encode ``pairs`` and write a split directory atomically; return it loaded.

    With ``filters`` (training data), pairs that are empty, too long or too unbalanced are
    dropped and counted by reason; without (validation/test), every pair is kept.
    ``pre_dropped`` adds counts of pairs dropped before encoding (e.g. invalid UTF-8).
    """
    out_dir = Path(out_dir)
    dtype = np.uint16 if max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size) <= 65535 else np.int32
    # A cache: an existing split is replaced (once the new one is complete).
    with atomic_dir(out_dir, force=True) as tmp:
        stats = _write_split(pairs, tokenizer, tmp, dtype, filters)
        dropped = Counter(pre_dropped or {})
        dropped.update(stats.dropped)
        meta = {
            "format_version": FORMAT_VERSION, "key": key, "pairs": stats.pairs,
            "dropped": {k: int(v) for k, v in sorted(dropped.items())},
            "src_tokens": stats.src_tokens, "tgt_tokens": stats.tgt_tokens,
            "dtype": np.dtype(dtype).name, "filters": asdict(filters) if filters else None,
        }
        (tmp / META).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return TokenDataset(out_dir)


def binarize_cached(make_pairs: Callable[[], Iterable[tuple[str, str]]], tokenizer: Tokenizer,
                    out_dir: str | os.PathLike, key: str, filters: FilterConfig | None = None,
                    pre_dropped: Callable[[], dict[str, int]] | None = None) -> tuple[TokenDataset, bool]:
    """Reuse ``out_dir`` if its recorded key is ``key``; else build it. Returns (dataset, reused)."""
    out_dir = Path(out_dir)
    existing = read_key(out_dir)
    if existing == key:
        try:
            ds = TokenDataset(out_dir)
            log.info("%s: reusing binarized cache (key %s)", out_dir, key[:12])
            return ds, True
        except DataError as exc:
            log.warning("%s; rebuilding", exc)
    pairs = make_pairs()
    return binarize(pairs, tokenizer, out_dir, filters, key,
                    pre_dropped() if pre_dropped else None), False


def binarize_files(src_path: str | os.PathLike, tgt_path: str | os.PathLike, tokenizer: Tokenizer,
                   out_dir: str | os.PathLike, filters: FilterConfig | None = None,
                   on_invalid_utf8: str = "error") -> tuple[TokenDataset, bool]:
    """Binarize a line-aligned file pair into ``out_dir``, reusing it when nothing changed."""
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    key = cache_key([src_path, tgt_path], tokenizer, filters, on_invalid_utf8=on_invalid_utf8)
    holder: dict[str, Any] = {}

    def make() -> Iterable[tuple[str, str]]:
        corpus = read_parallel(src_path, tgt_path, on_invalid_utf8=on_invalid_utf8, drop_invalid=True)
        holder["dropped"] = corpus.dropped
        return corpus.pairs

    return binarize_cached(make, tokenizer, out_dir, key, filters, lambda: holder.get("dropped", {}))


def read_key(directory: Path) -> str | None:
    try:
        return json.loads((directory / META).read_text(encoding="utf-8")).get("key")
    except (OSError, ValueError, AttributeError):
        return None


def _write_split(pairs: Iterable[tuple[str, str]], tokenizer: Tokenizer, tmp: Path, dtype: Any,
                 filters: FilterConfig | None) -> BinarizeStats:
    dropped: Counter[str] = Counter()
    lens: dict[str, list[np.ndarray]] = {"src": [], "tgt": []}
    lines: list[np.ndarray] = []
    line_no = 0
    # Ids go to flat raw files chunk by chunk, so a corpus never has to fit in RAM as lists.
    with open(tmp / "src.raw", "wb") as src_f, open(tmp / "tgt.raw", "wb") as tgt_f:
        for chunk in _chunks(pairs, CHUNK):
            keep_s, keep_t, keep_lines = _encode_chunk(chunk, tokenizer, filters, line_no, dropped)
            line_no += len(chunk)
            if keep_s:
                src_f.write(np.fromiter(itertools.chain.from_iterable(keep_s), dtype=dtype).tobytes())
                tgt_f.write(np.fromiter(itertools.chain.from_iterable(keep_t), dtype=dtype).tobytes())
                lens["src"].append(_lengths(keep_s))
                lens["tgt"].append(_lengths(keep_t))
                lines.append(np.asarray(keep_lines, dtype=np.int64))
    stats = BinarizeStats()
    stats.pairs, stats.src_tokens = _save_side(tmp, "src", lens["src"], dtype)
    _, stats.tgt_tokens = _save_side(tmp, "tgt", lens["tgt"], dtype)
    np.save(tmp / "lines.npy", np.concatenate(lines) if lines else np.zeros(0, dtype=np.int64))
    stats.dropped = dict(dropped)
    return stats


def _encode_chunk(chunk: list[tuple[str, str]], tokenizer: Tokenizer, filters: FilterConfig | None,
                  first_line: int, dropped: Counter[str]) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """Source ids, target ids and line numbers of the chunk's pairs that pass ``filters``;
    the others are counted in ``dropped`` by reason."""
    src_ids = tokenizer.encode_src_batch([s for s, _ in chunk])
    tgt_ids = tokenizer.encode_tgt_batch([t for _, t in chunk])
    keep_s: list[list[int]] = []
    keep_t: list[list[int]] = []
    keep_lines: list[int] = []
    for j, (x, y) in enumerate(zip(src_ids, tgt_ids)):
        if filters is not None:
            # Source length without its EOS: both sides counted in pieces.
            reason = drop_reason(len(x) - 1, len(y), filters)
            if reason is not None:
                dropped[reason] += 1
                continue
        keep_s.append(x)
        keep_t.append(y)
        keep_lines.append(first_line + j)
    return keep_s, keep_t, keep_lines


def _lengths(seqs: list[list[int]]) -> np.ndarray:
    return np.fromiter((len(ids) for ids in seqs), dtype=np.int64, count=len(seqs))


def _save_side(tmp: Path, side: str, lens: list[np.ndarray], dtype: Any) -> tuple[int, int]:
    """``{side}.ids.npy`` from the raw file and ``{side}.offsets.npy``; (sentences, tokens)."""
    sizes = np.concatenate(lens) if lens else np.zeros(0, dtype=np.int64)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    np.save(tmp / f"{side}.offsets.npy", offsets)
    np.save(tmp / f"{side}.ids.npy", np.fromfile(tmp / f"{side}.raw", dtype=dtype))
    (tmp / f"{side}.raw").unlink()
    return len(sizes), int(offsets[-1])


def _chunks(items: Iterable[tuple[str, str]], size: int) -> Iterable[list[tuple[str, str]]]:
    chunk: list[tuple[str, str]] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
