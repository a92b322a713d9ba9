"""Known datasets: the table, mirror copies, checksums, atomic writes, archive members.

Never uses the network: every test runs with $AIAYN_OFFLINE set.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
from pathlib import Path

import pytest

from aiayn.data import datasets as ds
from aiayn.errors import DataError

# The offline data mirror (real corpora): $AIAYN_DATA_MIRROR alone, which .ci/run sets. Unset, a
# path that exists nowhere and names the variable, so the tests that need data skip saying so.
MIRROR = Path(os.environ.get("AIAYN_DATA_MIRROR") or "/AIAYN_DATA_MIRROR-is-not-set")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ds.OFFLINE_ENV, "1")
    monkeypatch.delenv(ds.MIRROR_ENV, raising=False)


@pytest.fixture
def mirror() -> Path:
    if not (MIRROR / "multi30k").is_dir():
        pytest.skip(f"data mirror not found at {MIRROR}")
    return MIRROR


def test_table_is_explicit_and_complete() -> None:
    assert set(ds.DATASETS) == {"multi30k", "wmt14_en_de", "wmt14_en_fr"}
    m30k = ds.get_dataset("multi30k")
    assert set(m30k.splits) == {"train", "val", "test_2016_flickr", "test_2017_flickr",
                                "test_2017_mscoco", "test_2018_flickr"}
    assert set(m30k.languages) == {"en", "de", "fr", "cs"}
    train_en = ds.MULTI30K_FILES[("train", "en")]
    assert train_en.url == "https://github.com/multi30k/dataset/raw/master/data/task1/raw/train.en.gz"
    for name in ds.DATASETS:
        for f in ds.files(name):
            assert f.url.startswith("http")
            assert f.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", f.sha256)
            assert f.md5 is None or re.fullmatch(r"[0-9a-f]{32}", f.md5)
    for name in ("wmt14_en_de", "wmt14_en_fr"):
        info = ds.get_dataset(name)
        assert (info.default_valid, info.default_test) == ("newstest2013", "newstest2014")
        assert set(info.splits) == {"train", "newstest2013", "newstest2014"}
    assert len(ds.parts("wmt14_en_fr", "train", "fr")) == 5
    with pytest.raises(DataError, match="unknown dataset"):
        ds.get_dataset("wmt99")
    with pytest.raises(DataError, match="has no 'cs'"):
        ds.parts("multi30k", "test_2017_flickr", "cs")


def test_mirror_checksums_match_the_table(mirror: Path) -> None:
    sums = dict(reversed(line.split()) for line in (mirror / "SHA256SUMS").read_text().splitlines()
                if line.strip())
    for f in ds.MULTI30K_FILES.values():
        if f.sha256 is not None:
            assert sums[f.name] == f.sha256, f.name


def test_download_copies_from_mirror_and_reuses(mirror: Path, tmp_path: Path) -> None:
    got = ds.download("multi30k", tmp_path, mirror=mirror, splits=["val"], langs=["en", "de"],
                      progress=False)
    assert sorted(got) == ["multi30k/val.de.gz", "multi30k/val.en.gz"]
    for name, path in got.items():
        assert path == tmp_path / name and path.is_file()
        assert hashlib.sha256(path.read_bytes()).hexdigest() == ds.MULTI30K_FILES[("val", path.name[4:6])].sha256
    again = ds.download("multi30k", tmp_path, mirror=None, splits=["val"], langs=["en"], progress=False)
    assert again["multi30k/val.en.gz"] == got["multi30k/val.en.gz"]  # already there, verified


def test_mirror_from_environment(mirror: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ds.MIRROR_ENV, str(mirror))
    got = ds.download("multi30k", tmp_path, splits=["test_2016_flickr"], langs=["en"], progress=False)
    assert got["multi30k/test_2016_flickr.en.gz"].is_file()


def test_checksum_mismatch_detected_nothing_left(mirror: Path, tmp_path: Path) -> None:
    fake = tmp_path / "mirror" / "multi30k"
    fake.mkdir(parents=True)
    good = (mirror / "multi30k" / "val.en.gz").read_bytes()
    (fake / "val.en.gz").write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    dest = tmp_path / "dest"
    with pytest.raises(DataError, match=r"checksum mismatch for multi30k/val\.en\.gz: sha256 is"):
        ds.download("multi30k", dest, mirror=tmp_path / "mirror", splits=["val"], langs=["en"],
                    progress=False)
    leftovers = [p for p in dest.rglob("*") if p.is_file()] if dest.exists() else []
    assert leftovers == []  # neither the bad file nor a temporary one


def test_md5_checked_when_no_sha256(tmp_path: Path) -> None:
    data = b"payload"
    f = ds.RemoteFile("x/file.bin", "http://example.invalid/file.bin", None, md5=hashlib.md5(data).hexdigest())
    (tmp_path / "file.bin").write_bytes(data)
    ds.verify(tmp_path / "file.bin", f)
    (tmp_path / "file.bin").write_bytes(b"other")
    with pytest.raises(DataError, match="md5"):
        ds.verify(tmp_path / "file.bin", f)


def test_offline_without_mirror_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"AIAYN_OFFLINE forbids downloading https://github.com/multi30k"):
        ds.download("multi30k", tmp_path, mirror=tmp_path, splits=["val"], langs=["en"], progress=False)


def _tgz(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_archive_members_and_sgml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sgm_en = (b'<srcset setid="newstest2014" srclang="any">\n<doc sysid="ref" docid="1">\n'
              b'<seg id="1">Hello there .</seg>\n<seg id="2"> Second  one </seg>\n</doc>\n</srcset>\n')
    sgm_de = b'<refset>\n<doc>\n<seg id="1">Hallo .</seg>\n<seg id="2">Zweite</seg>\n</doc>\n</refset>\n'
    archive = _tgz({"train/corpus.de-en.en": b"a\nb\n", "train/corpus.de-en.de": b"x\ny\n",
                    "test/nt-deen-src.en.sgm": sgm_en, "test/nt-deen-ref.de.sgm": sgm_de})
    mirror = tmp_path / "mirror"
    (mirror / "toy").mkdir(parents=True)
    (mirror / "toy" / "all.tgz").write_bytes(archive)
    rf = ds.RemoteFile("toy/all.tgz", "http://example.invalid/all.tgz", hashlib.sha256(archive).hexdigest())
    monkeypatch.setitem(ds.DATASETS, "toy", ds.DatasetInfo("toy", "test", ("en", "de"),
                        {"train": ("en", "de"), "test": ("en", "de")}, "test", "test"))
    monkeypatch.setitem(ds._WMT_PARTS, "toy", {
        "train": (ds.Part(rf, "train/corpus.de-en.{lang}"),),
        "test": (ds.Part(rf, "test/nt-deen-{role}.{lang}.sgm", sgm=True),)})
    cache = tmp_path / "cache"
    [(src, tgt, tag)] = ds.split_files("toy", "train", "en", "de", cache_dir=cache, mirror=mirror)
    assert src.read_text() == "a\nb\n" and tgt.read_text() == "x\ny\n" and rf.sha256 in tag
    [(src, tgt, _)] = ds.split_files("toy", "test", "en", "de", cache_dir=cache, mirror=mirror)
    assert src.read_text() == "Hello there .\nSecond  one\n" and tgt.read_text() == "Hallo .\nZweite\n"
    # The mirror's archive is used in place: nothing copied into the cache but the members.
    assert not (cache / "toy" / "all.tgz").exists()
    monkeypatch.setitem(ds._WMT_PARTS["toy"], "train", (ds.Part(rf, "missing/{lang}"),))
    with pytest.raises(DataError, match="has no member missing/en"):
        ds.split_files("toy", "train", "en", "de", cache_dir=cache, mirror=mirror)
