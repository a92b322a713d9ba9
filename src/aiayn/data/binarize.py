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
import multiprocessing as mp
import os
import shutil
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.data.corpus import FilterConfig, drop_reason, read_parallel
from aiayn.errors import DataError
from aiayn.fileio import atomic_dir, write_atomic
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
             pre_dropped: dict[str, int] | Callable[[], dict[str, int]] | None = None, *, workers: int = 1,
             state_dir: str | os.PathLike | None = None, progress: Callable[[int], None] | None = None,
             extra_meta: Callable[[], dict[str, Any]] | None = None) -> TokenDataset:
    """Encode ``pairs`` and write a split directory atomically; return it loaded.

    With ``filters`` (training data), pairs that are empty, too long or too unbalanced are
    dropped and counted by reason; without (validation/test), every pair is kept.
    ``pre_dropped`` adds counts of pairs dropped before encoding (e.g. invalid UTF-8);
    it and ``extra_meta`` (entries added to ``meta.json``) may be functions, called once
    every pair has been read.

    ``workers`` > 1 encodes chunks of :data:`CHUNK` pairs in that many processes; the
    chunks are written in input order, so the split is the same byte for byte. With
    ``state_dir``, encoded chunks are kept there as they complete (with ``key``): a call
    interrupted and made again with the same pairs, tokenizer, filters and key encodes only
    the chunks not done yet; the folder is removed once the split is complete.
    ``progress(n)`` is called as each chunk of ``n`` pairs is done (or found done).
    """
    out_dir = Path(out_dir)
    dtype = np.uint16 if max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size) <= 65535 else np.int32
    # A cache: an existing split is replaced (once the new one is complete).
    with atomic_dir(out_dir, force=True) as tmp:
        staging = Path(state_dir) if state_dir is not None else tmp / "staging"
        state = _Staging(staging, _state_key(key, tokenizer, filters, dtype) if state_dir is not None else None)
        stats = _write_split(pairs, tokenizer, tmp, dtype, filters, state, workers, progress)
        dropped = Counter((pre_dropped() if callable(pre_dropped) else pre_dropped) or {})
        dropped.update(stats.dropped)
        meta: dict[str, Any] = {
            "format_version": FORMAT_VERSION, "key": key, "pairs": stats.pairs,
            "dropped": {k: int(v) for k, v in sorted(dropped.items())},
            "src_tokens": stats.src_tokens, "tgt_tokens": stats.tgt_tokens,
            "dtype": np.dtype(dtype).name, "filters": asdict(filters) if filters else None,
        }
        meta.update(extra_meta() if extra_meta is not None else {})
        (tmp / META).write_text(json.dumps(meta, indent=2), encoding="utf-8")
        if state_dir is None:
            shutil.rmtree(staging)
    if state_dir is not None:
        shutil.rmtree(staging, ignore_errors=True)
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


def _state_key(key: str, tokenizer: Tokenizer, filters: FilterConfig | None, dtype: Any) -> str:
    return hashlib.sha256(json.dumps([FORMAT_VERSION, CHUNK, key, [hashlib.sha256(b).hexdigest()
                                      for b in tokenizer.model_bytes()], asdict(filters) if filters else None,
                                      np.dtype(dtype).name]).encode()).hexdigest()


@dataclass
class _EncodedChunk:
    """One chunk's kept pairs: flat ids, lengths, input line numbers; and its drops."""

    src: np.ndarray
    tgt: np.ndarray
    src_lens: np.ndarray  # int32
    tgt_lens: np.ndarray  # int32
    lines: np.ndarray  # int64
    dropped: dict[str, int]


# The staging files: flat ids, per-sentence lengths and kept line numbers, appended chunk by chunk.
_STAGED = {"src": "src.raw", "tgt": "tgt.raw", "src_lens": "src.lens", "tgt_lens": "tgt.lens", "lines": "lines.raw"}
_PROGRESS = "progress.json"


class _Staging:
    """Append-only files of encoded chunks, and (with a key) a record of the chunks done:
    written after each chunk, so an interrupted run's completed chunks are found again."""

    def __init__(self, directory: Path, key: str | None) -> None:
        self.directory = directory
        self.key = key
        self.done = 0  # chunks already in the files
        self.dropped: Counter[str] = Counter()
        sizes: dict[str, int] = {}
        record = _read_json(directory / _PROGRESS) if key is not None else None
        if record is not None and record.get("key") == key and all(
                (directory / f).is_file() and (directory / f).stat().st_size >= int(record["sizes"][f])
                for f in _STAGED.values()):
            self.done = int(record["chunks"])
            self.dropped.update(record["dropped"])
            sizes = {f: int(n) for f, n in record["sizes"].items()}
            log.info("%s: resuming after %d encoded chunk(s)", directory, self.done)
        elif directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.files = {}
        for name, f in _STAGED.items():
            handle = open(directory / f, "r+b" if f in sizes else "wb")
            handle.truncate(sizes.get(f, 0))  # beyond the record: a chunk being written when stopped
            handle.seek(0, os.SEEK_END)
            self.files[name] = handle

    def append(self, chunk: _EncodedChunk) -> None:
        for name, handle in self.files.items():
            handle.write(np.ascontiguousarray(getattr(chunk, name)).tobytes())
        self.dropped.update(chunk.dropped)
        self.done += 1
        if self.key is not None:
            for handle in self.files.values():
                handle.flush()
            record = {"key": self.key, "chunks": self.done, "dropped": dict(self.dropped),
                      "sizes": {_STAGED[n]: h.tell() for n, h in self.files.items()}}
            write_atomic(self.directory / _PROGRESS, json.dumps(record), durable=False)

    def close(self) -> None:
        for handle in self.files.values():
            handle.close()


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_split(pairs: Iterable[tuple[str, str]], tokenizer: Tokenizer, tmp: Path, dtype: Any,
                 filters: FilterConfig | None, state: _Staging, workers: int = 1,
                 progress: Callable[[int], None] | None = None) -> BinarizeStats:
    # Ids go to flat files chunk by chunk, so a corpus never has to fit in RAM.
    try:
        for chunk in _encoded_chunks(pairs, tokenizer, filters, dtype, state.done, workers, progress):
            state.append(chunk)
    finally:
        state.close()
    stats = BinarizeStats()
    stats.pairs, stats.src_tokens = _save_side(tmp, state.directory, "src", dtype)
    _, stats.tgt_tokens = _save_side(tmp, state.directory, "tgt", dtype)
    _copy_npy(state.directory / _STAGED["lines"], tmp / "lines.npy", np.int64)
    stats.dropped = dict(state.dropped)
    return stats


def _encoded_chunks(pairs: Iterable[tuple[str, str]], tokenizer: Tokenizer, filters: FilterConfig | None,
                    dtype: Any, skip: int, workers: int, progress: Callable[[int], None] | None
                    ) -> Iterator[_EncodedChunk]:
    """The chunks after the first ``skip`` (read, not encoded), encoded in order."""
    report = progress if progress is not None else (lambda n: None)

    def numbered() -> Iterator[tuple[int, list[tuple[str, str]]]]:
        line_no = 0
        for i, chunk in enumerate(_chunks(pairs, CHUNK)):
            first, line_no = line_no, line_no + len(chunk)
            if i < skip:
                report(len(chunk))
                continue
            yield first, chunk

    if workers <= 1:
        for first, chunk in numbered():
            yield _encode_chunk(chunk, tokenizer, filters, first, dtype)
            report(len(chunk))
        return
    # Each process encodes whole chunks on one thread; at most 2 per process are in flight
    # (the reading stays ahead without holding the corpus), and results are taken in order.
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer, filters, dtype)) as pool:
        pending: deque[tuple[int, Any]] = deque()
        for first, chunk in numbered():
            pending.append((len(chunk), pool.apply_async(_encode_in_worker, (chunk, first))))
            while len(pending) >= 2 * workers or (pending and pending[0][1].ready()):
                n, result = pending.popleft()
                yield result.get()
                report(n)
        while pending:
            n, result = pending.popleft()
            yield result.get()
            report(n)


_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer: Tokenizer, filters: FilterConfig | None, dtype: Any) -> None:
    _WORKER.update(tokenizer=tokenizer, filters=filters, dtype=dtype)


def _encode_in_worker(chunk: list[tuple[str, str]], first_line: int) -> _EncodedChunk:
    return _encode_chunk(chunk, _WORKER["tokenizer"], _WORKER["filters"], first_line, _WORKER["dtype"],
                         num_threads=1)


def _encode_chunk(chunk: list[tuple[str, str]], tokenizer: Tokenizer, filters: FilterConfig | None,
                  first_line: int, dtype: Any, num_threads: int = -1) -> _EncodedChunk:
    """The chunk's pairs that pass ``filters``, encoded; the others counted by reason."""
    src_ids = tokenizer.encode_src_batch([s for s, _ in chunk], num_threads)
    tgt_ids = tokenizer.encode_tgt_batch([t for _, t in chunk], num_threads)
    dropped: Counter[str] = Counter()
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
    src_lens = np.fromiter(map(len, keep_s), dtype=np.int32, count=len(keep_s))
    tgt_lens = np.fromiter(map(len, keep_t), dtype=np.int32, count=len(keep_t))
    return _EncodedChunk(
        np.fromiter(itertools.chain.from_iterable(keep_s), dtype=dtype, count=int(src_lens.sum())),
        np.fromiter(itertools.chain.from_iterable(keep_t), dtype=dtype, count=int(tgt_lens.sum())),
        src_lens, tgt_lens, np.asarray(keep_lines, dtype=np.int64), dict(dropped))


# Items copied per step from the staging files into the final arrays.
_COPY_STEP = 1 << 22


def _copy_npy(raw: Path, dest: Path, dtype: Any) -> int:
    """``dest`` as the .npy of the flat ``raw`` file, copied in steps; returns its length."""
    n = raw.stat().st_size // np.dtype(dtype).itemsize
    out = np.lib.format.open_memmap(dest, mode="w+", dtype=dtype, shape=(n,))
    with open(raw, "rb") as f:
        for a in range(0, n, _COPY_STEP):
            out[a:a + _COPY_STEP] = np.fromfile(f, dtype=dtype, count=min(_COPY_STEP, n - a))
    out.flush()
    del out
    return n


def _save_side(tmp: Path, staging: Path, side: str, dtype: Any) -> tuple[int, int]:
    """``{side}.ids.npy`` and ``{side}.offsets.npy`` from the staging files; (sentences, tokens)."""
    lens_path = staging / _STAGED[f"{side}_lens"]
    n = lens_path.stat().st_size // 4
    offsets = np.lib.format.open_memmap(tmp / f"{side}.offsets.npy", mode="w+", dtype=np.int64, shape=(n + 1,))
    offsets[0] = total = 0
    with open(lens_path, "rb") as f:
        for a in range(0, n, _COPY_STEP):
            lens = np.fromfile(f, dtype=np.int32, count=min(_COPY_STEP, n - a))
            run = np.cumsum(lens, dtype=np.int64) + total
            offsets[a + 1:a + 1 + len(run)] = run
            total = int(run[-1]) if len(run) else total
    offsets.flush()
    del offsets
    tokens = _copy_npy(staging / _STAGED[side], tmp / f"{side}.ids.npy", dtype)
    assert tokens == total, (tokens, total)
    return n, total


def _chunks(items: Iterable[tuple[str, str]], size: int) -> Iterable[list[tuple[str, str]]]:
    chunk: list[tuple[str, str]] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
