"""Known corpora: an explicit table of files, URLs and checksums; mirrors; atomic downloads.

No registry: :data:`DATASETS` below is the whole list. Each file has its official URL and
its sha256 where it could be established (``None`` = unknown: the file is then checked
against an md5 where one is published, else used unverified with a warning that prints
its sha256 so it can be pinned). Sources of the checksums:

- Multi30k ``train``/``val``/``test_2016_flickr``: sha256 of the published files. The
  2017/2018 test sets: unknown.
- WMT14 training archives, the WMT19 ``dev.tgz`` (which carries newstest2013) and the
  giga/UN archives: sha256 and sizes from TensorFlow Datasets' ``url_checksums``.
- WMT14 ``test-full.tgz`` (newstest2014, 3003 sentences): no sha256 known; md5 from sacreBLEU.

:func:`download` copies files from a *mirror* folder (a directory laid out like
``multi30k/train.en.gz``; ``--data-dir`` or ``$AIAYN_DATA_MIRROR``) when it has them,
otherwise fetches the URL with a progress bar (never when ``$AIAYN_OFFLINE`` is set). Either
way the checksum is verified and the file is written to a temporary name and renamed, so an
interrupted transfer never leaves a file that looks complete.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from aiayn.errors import DataError
from aiayn.fileio import atomic_path

log = logging.getLogger(__name__)

MIRROR_ENV = "AIAYN_DATA_MIRROR"
CACHE_ENV = "AIAYN_CACHE_DIR"
OFFLINE_ENV = "AIAYN_OFFLINE"


@dataclass(frozen=True)
class RemoteFile:
    """One published file. ``name`` is its path under a mirror or download folder."""

    name: str
    url: str
    sha256: str | None  # None: not established
    md5: str | None = None
    size: int | None = None


@dataclass(frozen=True)
class Part:
    """Where one language's text of one split comes from.

    ``member``: path inside the archive ``file`` (None: ``file`` is the text itself). Its
    ``{lang}`` is the language; ``{role}`` is ``src`` for the source language and ``ref``
    for the target (WMT's test-set naming). ``sgm``: WMT's SGML test format.
    """

    file: RemoteFile
    member: str | None = None
    sgm: bool = False


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    description: str
    languages: tuple[str, ...]
    # split -> ordered parts (concatenated); a part's member/file is per language.
    splits: dict[str, tuple[str, ...]]
    default_valid: str
    default_test: str


# ------------------------------------------------------------------------- the table

_M30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/{split}.{lang}.gz"
_M30K_SHA256 = {
    ("train", "cs"): "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    ("train", "de"): "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    ("train", "en"): "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    ("train", "fr"): "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    ("val", "cs"): "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    ("val", "de"): "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    ("val", "en"): "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    ("val", "fr"): "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    ("test_2016_flickr", "cs"): "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    ("test_2016_flickr", "de"): "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    ("test_2016_flickr", "en"): "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    ("test_2016_flickr", "fr"): "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
}
# Languages published per split (Czech arrived in 2018: not in the 2017 test sets).
_M30K_SPLITS = {
    "train": ("en", "de", "fr", "cs"),
    "val": ("en", "de", "fr", "cs"),
    "test_2016_flickr": ("en", "de", "fr", "cs"),
    "test_2017_flickr": ("en", "de", "fr"),
    "test_2017_mscoco": ("en", "de", "fr"),
    "test_2018_flickr": ("en", "de", "fr", "cs"),
}
MULTI30K_FILES: dict[tuple[str, str], RemoteFile] = {
    (split, lang): RemoteFile(f"multi30k/{split}.{lang}.gz", _M30K_URL.format(split=split, lang=lang),
                              _M30K_SHA256.get((split, lang)))
    for split, langs in _M30K_SPLITS.items() for lang in langs
}

_WMT = "http://www.statmt.org"
WMT_FILES: dict[str, RemoteFile] = {
    "europarl-v7": RemoteFile(
        "wmt14/training-parallel-europarl-v7.tgz", f"{_WMT}/wmt13/training-parallel-europarl-v7.tgz",
        "0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7", size=657632379),
    "commoncrawl": RemoteFile(
        "wmt14/training-parallel-commoncrawl.tgz", f"{_WMT}/wmt13/training-parallel-commoncrawl.tgz",
        "c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5", size=918311367),
    "nc-v9": RemoteFile(
        "wmt14/training-parallel-nc-v9.tgz", f"{_WMT}/wmt14/training-parallel-nc-v9.tgz",
        "cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485", size=80418416),
    "un": RemoteFile(
        "wmt14/training-parallel-un.tgz", f"{_WMT}/wmt13/training-parallel-un.tgz",
        "29141b5c1eba149a94f7a59d3b1a834b2e47fe0f8758d68dcd77a3d3f497ee47", size=2365634246),
    "giga-fren": RemoteFile(
        "wmt14/training-giga-fren.tar", f"{_WMT}/wmt10/training-giga-fren.tar",
        "3ff8319f6919393520559bfbc7ad6a747ec81b3abc7be9993b338d4b017b4d9a", size=2595102720),
    # newstest2013 (the paper's dev set). WMT14's own dev.tgz has no published checksum;
    # the WMT19 dev.tgz carries the same dev/newstest2013.* files and has one.
    "dev": RemoteFile(
        "wmt19/dev.tgz", "http://data.statmt.org/wmt19/translation-task/dev.tgz",
        "7a7deccf82ebb05ba508dba5eb21356492224e8f630ec4f992132b029b4b25e7", size=38654961),
    # newstest2014, full version (3003 sentences), as in the paper's and fairseq's scores.
    "test-full": RemoteFile(
        "wmt14/test-full.tgz", f"{_WMT}/wmt14/test-full.tgz", None,
        md5="a8cd784e006feb32ac6f3d9ec7eb389a"),
}

# (dataset, split) -> parts. Multi30k parts are computed (one file per split and language).
_WMT_PARTS: dict[str, dict[str, tuple[Part, ...]]] = {
    "wmt14_en_de": {
        "train": (
            Part(WMT_FILES["europarl-v7"], "training/europarl-v7.de-en.{lang}"),
            Part(WMT_FILES["commoncrawl"], "commoncrawl.de-en.{lang}"),
            Part(WMT_FILES["nc-v9"], "training/news-commentary-v9.de-en.{lang}"),
        ),
        "newstest2013": (Part(WMT_FILES["dev"], "dev/newstest2013.{lang}"),),
        "newstest2014": (Part(WMT_FILES["test-full"], "test-full/newstest2014-deen-{role}.{lang}.sgm",
                              sgm=True),),
    },
    "wmt14_en_fr": {
        "train": (
            Part(WMT_FILES["europarl-v7"], "training/europarl-v7.fr-en.{lang}"),
            Part(WMT_FILES["commoncrawl"], "commoncrawl.fr-en.{lang}"),
            Part(WMT_FILES["un"], "un/undoc.2000.fr-en.{lang}"),
            Part(WMT_FILES["nc-v9"], "training/news-commentary-v9.fr-en.{lang}"),
            Part(WMT_FILES["giga-fren"], "giga-fren.release2.fixed.{lang}.gz"),
        ),
        "newstest2013": (Part(WMT_FILES["dev"], "dev/newstest2013.{lang}"),),
        "newstest2014": (Part(WMT_FILES["test-full"], "test-full/newstest2014-fren-{role}.{lang}.sgm",
                              sgm=True),),
    },
}

DATASETS: dict[str, DatasetInfo] = {
    "multi30k": DatasetInfo(
        "multi30k", "Multi30k task 1 (image captions), raw cased text; 29,000 training pairs",
        ("en", "de", "fr", "cs"), {s: langs for s, langs in _M30K_SPLITS.items()},
        default_valid="val", default_test="test_2016_flickr"),
    "wmt14_en_de": DatasetInfo(
        "wmt14_en_de", "WMT14 English-German (the paper's EN-DE): Europarl v7, Common Crawl, "
        "News Commentary v9; newstest2013 dev, newstest2014 test",
        ("en", "de"), {s: ("en", "de") for s in _WMT_PARTS["wmt14_en_de"]},
        default_valid="newstest2013", default_test="newstest2014"),
    "wmt14_en_fr": DatasetInfo(
        "wmt14_en_fr", "WMT14 English-French (the paper's EN-FR, 36M pairs): Europarl v7, Common "
        "Crawl, UN, News Commentary v9, 10^9 French-English; newstest2013 dev, newstest2014 test",
        ("en", "fr"), {s: ("en", "fr") for s in _WMT_PARTS["wmt14_en_fr"]},
        default_valid="newstest2013", default_test="newstest2014"),
}


def get_dataset(name: str) -> DatasetInfo:
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}")
    return DATASETS[name]


def parts(name: str, split: str, lang: str) -> tuple[Part, ...]:
    """The parts holding ``lang``'s text of ``split`` (in order)."""
    info = get_dataset(name)
    if split not in info.splits:
        raise DataError(f"{name}: unknown split {split!r}; choose from {', '.join(info.splits)}")
    if lang not in info.splits[split]:
        raise DataError(f"{name}: split {split!r} has no {lang!r} text "
                        f"(languages: {', '.join(info.splits[split])})")
    if name == "multi30k":
        return (Part(MULTI30K_FILES[(split, lang)]),)
    return _WMT_PARTS[name][split]


def files(name: str, splits: Iterable[str] | None = None,
          langs: Iterable[str] | None = None) -> list[RemoteFile]:
    """The distinct files of a dataset (optionally only some splits / languages)."""
    info = get_dataset(name)
    wanted_splits = list(splits) if splits is not None else list(info.splits)
    out: dict[str, RemoteFile] = {}
    for split in wanted_splits:
        for lang in (langs if langs is not None else info.splits.get(split, ())):
            for part in parts(name, split, lang):
                out.setdefault(part.file.name, part.file)
    return list(out.values())


# ----------------------------------------------------------------------- locations


def default_mirror() -> Path | None:
    value = os.environ.get(MIRROR_ENV)
    return Path(value) if value else None


def default_cache_dir() -> Path:
    value = os.environ.get(CACHE_ENV)
    return Path(value) if value else Path.home() / ".cache" / "aiayn" / "datasets"


def _mirror_path(mirror: Path, file: RemoteFile) -> Path | None:
    for candidate in (mirror / file.name, mirror / Path(file.name).name):
        if candidate.is_file():
            return candidate
    return None


# ---------------------------------------------------------------------- checksums


def _digests(path: Path) -> tuple[str, str]:
    sha, md5 = hashlib.sha256(), hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
            md5.update(block)
    return sha.hexdigest(), md5.hexdigest()


def verify(path: str | os.PathLike, file: RemoteFile, origin: str | None = None) -> str:
    """Check ``path`` against ``file``'s checksum; return its sha256. Mismatch: DataError."""
    path = Path(path)
    sha, md5 = _digests(path)
    where = origin or str(path)
    if file.sha256 is not None:
        if sha != file.sha256:
            raise DataError(f"{where}: checksum mismatch for {file.name}: sha256 is {sha}, "
                            f"expected {file.sha256} (corrupt or different file; delete it and retry)")
    elif file.md5 is not None:
        if md5 != file.md5:
            raise DataError(f"{where}: checksum mismatch for {file.name}: md5 is {md5}, "
                            f"expected {file.md5} (corrupt or different file; delete it and retry)")
    else:
        log.warning("%s: no published checksum for %s; not verified (sha256 %s)", where, file.name, sha)
    return sha


# ------------------------------------------------------------------------ download


def download(name: str, dest: str | os.PathLike, mirror: str | os.PathLike | None = None,
             splits: Iterable[str] | None = None, langs: Iterable[str] | None = None,
             progress: bool = True) -> dict[str, Path]:
    """Put the dataset's files (or some splits/languages) under ``dest``; return name -> path.

    A file already in ``dest`` with the right checksum is kept. Otherwise it is copied from
    ``mirror`` (default ``$AIAYN_DATA_MIRROR``) if the mirror has it, else downloaded.
    """
    dest = Path(dest)
    mirror_dir = Path(mirror) if mirror is not None else default_mirror()
    out = {}
    for file in files(name, splits, langs):
        out[file.name] = fetch_file(file, dest, mirror_dir, progress=progress, copy=True)
    return out


def fetch_file(file: RemoteFile, dest: Path, mirror: Path | None = None, progress: bool = True,
               copy: bool = False) -> Path:
    """A verified local copy of ``file``.

    ``copy=False`` uses a mirror's file in place (no second copy of a multi-GB archive);
    ``copy=True`` copies it into ``dest``.
    """
    target = dest / file.name
    if target.is_file():
        try:
            verify(target, file)
            return target
        except DataError as exc:
            log.warning("%s; fetching it again", exc)
    if mirror is not None:
        src = _mirror_path(mirror, file)
        if src is not None:
            if not copy:
                verify(src, file, origin=f"{src} (mirror)")
                return src
            _atomic_fetch(target, file, lambda tmp: shutil.copyfile(src, tmp), f"{src} (mirror)")
            return target
        log.info("%s not in mirror %s", file.name, mirror)
    if os.environ.get(OFFLINE_ENV):
        where = f" or in the mirror {mirror}" if mirror is not None else ""
        raise DataError(f"{file.name}: not in {dest}{where}, and ${OFFLINE_ENV} forbids downloading "
                        f"{file.url}")
    _atomic_fetch(target, file, lambda tmp: _http_get(file, tmp, progress), file.url)
    return target


def _atomic_fetch(target: Path, file: RemoteFile, write: Callable[[Path], object], origin: str) -> None:
    """``write(tmp)`` then verify the checksum; only a verified file gets ``target``'s name."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target, durable=False) as tmp:
        write(tmp)
        verify(tmp, file, origin=origin)


def _http_get(file: RemoteFile, tmp: Path, progress: bool) -> None:
    from tqdm import tqdm

    log.info("downloading %s", file.url)
    try:
        with urllib.request.urlopen(file.url, timeout=60) as resp, open(tmp, "wb") as f:
            total = int(resp.headers.get("Content-Length") or 0) or file.size
            with tqdm(total=total, unit="B", unit_scale=True, desc=Path(file.name).name,
                      disable=not progress) as bar:
                for block in iter(lambda: resp.read(1 << 20), b""):
                    f.write(block)
                    bar.update(len(block))
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise DataError(f"{file.url}: download failed ({exc}); put the file in a mirror folder "
                        f"and pass --data-dir") from None


# ------------------------------------------------------------------ split text files


def split_files(name: str, split: str, src: str, tgt: str, cache_dir: str | os.PathLike | None = None,
                mirror: str | os.PathLike | None = None, progress: bool = True
                ) -> list[tuple[Path, Path, str]]:
    """Local (source file, target file, checksum tag) per part of ``split``, ready to read.

    Plain files (Multi30k) are used where they are (mirror or cache); archive members are
    extracted once into ``cache_dir/extracted`` (SGML converted to one sentence a line).
    The tag identifies the inputs for cache keys without re-hashing extracted text.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    mirror_dir = Path(mirror) if mirror is not None else default_mirror()
    src_parts, tgt_parts = parts(name, split, src), parts(name, split, tgt)
    out = []
    for sp, tp in zip(src_parts, tgt_parts):
        paths, tags = [], []
        for part, lang in ((sp, src), (tp, tgt)):
            local = fetch_file(part.file, cache, mirror_dir, progress=progress)
            sha = part.file.sha256 or _digests(local)[0]
            if part.member is None:
                paths.append(local)
                tags.append(sha)
                continue
            member = part.member.format(lang=lang, role="src" if lang == src else "ref")
            paths.append(_extract(local, member, cache / "extracted" / sha[:16], part.sgm))
            tags.append(f"{sha}:{member}")
        out.append((paths[0], paths[1], "|".join(tags)))
    return out


_SEG = re.compile(r"<seg.*?>(.*)</seg>.*?")


def _extract(archive: Path, member: str, out_root: Path, sgm: bool) -> Path:
    """Extract one member (once; atomic). SGML becomes plain text the way sacreBLEU reads it."""
    target = out_root / (member + (".txt" if sgm else ""))
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(target, durable=False) as tmp, tarfile.open(archive) as tar:
            try:
                info = tar.getmember(member)
            except KeyError:
                raise DataError(f"{archive}: has no member {member}") from None
            f = tar.extractfile(info)
            if f is None:
                raise DataError(f"{archive}: member {member} is not a regular file")
            with f, open(tmp, "wb") as out:
                if sgm:
                    _sgm_to_text(f, out)
                else:
                    shutil.copyfileobj(f, out, 1 << 20)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DataError(f"{archive}: cannot extract {member} ({exc})") from None
    return target


def _sgm_to_text(f: IO[bytes], out: IO[bytes]) -> None:
    """The text of each ``<seg>`` of an SGML file, one a line, the way sacreBLEU reads it."""
    for raw in f:
        line = raw.decode("utf-8", errors="replace")
        if line.lstrip().startswith("<seg "):
            text = _SEG.sub(r"\1", line.strip()).strip()
            out.write(text.encode("utf-8") + b"\n")
