"""`aiayn prepare` / prepare_data end to end: Multi30k from the mirror, files, TSV, synthetic,
errors without tracebacks or leftovers, reuse of unchanged parts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.cli.main import main
from aiayn.config import DataConfig
from aiayn.data import datasets as ds
from aiayn.data.prepare import (
    ensure_prepared,
    load_split,
    load_tokenizer,
    prepare_data,
    read_summary,
    split_text,
)
from aiayn.data.synthetic import generate
from aiayn.errors import ConfigError, DataError

# The offline data mirror (real corpora): $AIAYN_DATA_MIRROR alone, which .ci/run sets. Unset, a
# path that exists nowhere and names the variable, so the tests that need data skip saying so.
MIRROR = Path(os.environ.get("AIAYN_DATA_MIRROR") or "/AIAYN_DATA_MIRROR-is-not-set")

SRC = ["a small dog runs", "the red house", "two men play football in the park", "hello there"] * 10
TGT = ["ein kleiner hund rennt", "das rote haus", "zwei männer spielen fußball im park", "hallo da"] * 10


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ds.OFFLINE_ENV, "1")
    monkeypatch.setenv(ds.CACHE_ENV, str(tmp_path / "download-cache"))
    monkeypatch.delenv(ds.MIRROR_ENV, raising=False)


def cli(args: list[str]) -> int:
    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# ------------------------------------------------------------------ Multi30k end to end


@pytest.fixture(scope="module")
def multi30k(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (MIRROR / "multi30k").is_dir():
        pytest.skip(f"data mirror not found at {MIRROR}")
    out = tmp_path_factory.mktemp("prep") / "multi30k.en-de"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ds.OFFLINE_ENV, "1")
        code = cli(["prepare", "--dataset", "multi30k", "--src", "en", "--tgt", "de", "--data-dir",
                    str(MIRROR), "--vocab-size", "8000", "--out", str(out), "--quiet"])
    assert code == 0
    return out


def test_multi30k_summary(multi30k: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = json.loads((multi30k / "summary.json").read_text(encoding="utf-8"))
    splits = summary["splits"]
    assert (splits["train"]["pairs"], splits["valid"]["pairs"], splits["test"]["pairs"]) == (29000, 1014, 1000)
    assert (splits["valid"]["name"], splits["test"]["name"]) == ("val", "test_2016_flickr")
    assert all(s["dropped"] == {} for s in splits.values())  # default filters keep all of Multi30k
    assert summary["vocab_size"] == 8000 and summary["joint_vocab"]
    assert all(s["tokens"] > 0 for s in splits.values())
    assert sorted(p.name for p in multi30k.iterdir()) == [
        "spm.model", "summary.json", "test", "test.src.txt", "test.tgt.txt", "train", "valid",
        "valid.src.txt", "valid.tgt.txt"]


def test_multi30k_loaders(multi30k: Path) -> None:
    tok = load_tokenizer(multi30k)
    train, valid, test = (load_split(multi30k, r) for r in ("train", "valid", "test"))
    assert (len(train), len(valid), len(test)) == (29000, 1014, 1000)
    src, tgt = split_text(multi30k, "test")
    assert len(src) == len(tgt) == 1000
    assert src[0] == "A man in an orange hat starring at something."
    assert tok.decode_src(test[0][0]) == src[0]
    tsrc, ttgt = split_text(multi30k, "train")
    assert len(tsrc) == 29000 and ttgt[0] == "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."


def test_multi30k_rerun_reuses_everything(multi30k: Path) -> None:
    cfg = DataConfig(dataset="multi30k", data_dir=str(MIRROR), vocab_size=8000)
    stamp = (multi30k / "summary.json").stat().st_mtime_ns
    assert ensure_prepared(cfg, multi30k) == multi30k
    assert (multi30k / "summary.json").stat().st_mtime_ns == stamp  # up to date: untouched
    summary = prepare_data(cfg, multi30k, progress=False)
    assert all(summary["reused"].values())
    assert summary["splits"]["train"]["pairs"] == 29000


# --------------------------------------------------------------------- user files


def test_files_and_tsv_with_filters(tmp_path: Path) -> None:
    long = " ".join(["house"] * 60)
    train_src = write(tmp_path / "train.en", [*SRC, "", long])
    train_tgt = write(tmp_path / "train.de", [*TGT, "leer", long])
    valid = tmp_path / "valid.tsv"
    valid.write_text("hello there\thallo da\n\tleer\n" + f"{long}\t{long}\n", encoding="utf-8")
    out = tmp_path / "out"
    cfg = DataConfig(train_src=train_src, train_tgt=train_tgt, valid_tsv=str(valid), vocab_size=100,
                     max_len=50)
    summary = prepare_data(cfg, out, progress=False)
    assert summary["splits"]["train"]["pairs"] == 40
    assert summary["splits"]["train"]["dropped"] == {"empty": 1, "too_long": 1}
    # Validation is never filtered: the empty and the long line stay.
    assert summary["splits"]["valid"]["pairs"] == 3 and summary["splits"]["valid"]["dropped"] == {}
    assert split_text(out, "valid")[1] == ["hallo da", "leer", long]
    assert "test" not in summary["splits"]
    with pytest.raises(DataError, match="no test split"):
        load_split(out, "test")


def test_changed_test_file_rebuilds_only_test(tmp_path: Path) -> None:
    files = dict(train_src=write(tmp_path / "t.en", SRC), train_tgt=write(tmp_path / "t.de", TGT),
                 test_src=write(tmp_path / "x.en", SRC[:3]), test_tgt=write(tmp_path / "x.de", TGT[:3]))
    cfg = DataConfig(vocab_size=100, **files)
    prepare_data(cfg, tmp_path / "out", progress=False)
    write(tmp_path / "x.en", ["a small dog", "the house", "hello"])
    summary = prepare_data(cfg, tmp_path / "out", progress=False)
    assert summary["reused"] == {"tokenizer": True, "train": True, "test": False}
    assert split_text(tmp_path / "out", "test")[0] == ["a small dog", "the house", "hello"]
    # A changed vocabulary size retrains the tokenizer and so rebuilds every split.
    cfg.vocab_size = 90
    summary = prepare_data(cfg, tmp_path / "out", progress=False)
    assert not any(summary["reused"].values())


def test_separate_vocabularies(tmp_path: Path) -> None:
    cfg = DataConfig(train_src=write(tmp_path / "t.en", SRC), train_tgt=write(tmp_path / "t.de", TGT),
                     joint_vocab=False, vocab_size=80, tgt_vocab_size=70, tgt_spm_model_type="word")
    summary = prepare_data(cfg, tmp_path / "out", progress=False)
    assert not summary["joint_vocab"]
    assert (tmp_path / "out" / "spm.src.model").is_file() and (tmp_path / "out" / "spm.tgt.model").is_file()
    tok = load_tokenizer(tmp_path / "out")
    assert tok.tgt_vocab_size == 4 + len({w for t in TGT for w in t.split()})


# ------------------------------------------------------------------------ synthetic


def test_synthetic_word_level(tmp_path: Path) -> None:
    code = cli(["prepare", "--synthetic", "reverse", "--synthetic-train-size", "300",
                "--synthetic-valid-size", "40", "--out", str(tmp_path / "rev"), "--quiet"])
    assert code == 0
    summary = read_summary(tmp_path / "rev")
    assert summary["vocab_size"] == 4 + 20  # specials + s0..s19, sized automatically
    tok = load_tokenizer(tmp_path / "rev")
    src, tgt = split_text(tmp_path / "rev", "valid")
    assert len(src) == 40 and summary["splits"]["test"]["pairs"] == 40
    # The training set is generate(task, n, seed) itself (the demo holds out what it contains).
    assert list(zip(*split_text(tmp_path / "rev", "train"))) == generate("reverse", 300, 1)
    data = load_split(tmp_path / "rev", "valid")
    for i in range(5):
        x, y = data[i]
        assert len(x) == len(src[i].split()) + 1 and len(y) == len(tgt[i].split())  # one token per symbol
        assert tok.decode_tgt(y) == tgt[i] == " ".join(src[i].split()[::-1])


# ----------------------------------------------------------- bad input through the CLI


BAD_CASES = {
    "missing": ("missing.en", None, r"missing\.en: file not found"),
    "counts": ("a.en", "short.de", r"line counts differ: .*a\.en has 3 lines, .*short\.de has 2 lines"),
    "utf8": ("bad.en", "a.de", r"bad\.en:2: invalid UTF-8 at byte 4"),
    "gzip": ("broken.en.gz", "a.de", r"broken\.en\.gz:1: corrupt gzip data"),
    "tsv": ("pairs.tsv", None, r"pairs\.tsv:2: expected 2 tab-separated columns"),
}


def _bad_inputs(d: Path) -> None:
    write(d / "a.en", ["one", "two", "three"])
    write(d / "a.de", ["eins", "zwei", "drei"])
    write(d / "short.de", ["eins", "zwei"])
    (d / "bad.en").write_bytes(b"one\ntwo \xff\nthree\n")
    (d / "broken.en.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    (d / "pairs.tsv").write_text("one\teins\ntwo zwei\n", encoding="utf-8")


@pytest.mark.parametrize("case", sorted(BAD_CASES))
@pytest.mark.parametrize("role", ["train", "valid"])
def test_bad_input_clear_error_nothing_left(case: str, role: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    _bad_inputs(tmp_path)
    src, tgt, pattern = BAD_CASES[case]
    args = ["prepare", "--out", str(tmp_path / "out"), "--quiet", "--vocab-size", "50"]
    if role == "valid":
        args += ["--train-src", str(tmp_path / "a.en"), "--train-tgt", str(tmp_path / "a.de")]
    if src.endswith(".tsv"):
        args += [f"--{role}-tsv", str(tmp_path / src)]
    else:
        args += [f"--{role}-src", str(tmp_path / src), f"--{role}-tgt", str(tmp_path / (tgt or "a.de"))]
    code = cli(args)
    err = capsys.readouterr().err
    assert code != 0
    assert re.search(pattern, err), err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_failed_rebuild_keeps_previous_directory(tmp_path: Path) -> None:
    cfg = DataConfig(train_src=write(tmp_path / "t.en", SRC), train_tgt=write(tmp_path / "t.de", TGT),
                     vocab_size=60)
    prepare_data(cfg, tmp_path / "out", progress=False)
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    write(tmp_path / "t.de", TGT[:-1])
    with pytest.raises(DataError, match="line counts differ"):
        prepare_data(cfg, tmp_path / "out", progress=False)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before
    assert read_summary(tmp_path / "out")["splits"]["train"]["pairs"] == len(SRC)
    assert leftovers(tmp_path) == []


def test_refuses_to_overwrite_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    cfg = DataConfig(train_src=write(tmp_path / "t.en", SRC), train_tgt=write(tmp_path / "t.de", TGT))
    with pytest.raises(DataError, match="directory exists and is not empty"):
        prepare_data(cfg, tmp_path / "out", progress=False)
    assert (tmp_path / "out" / "precious.txt").read_text() == "keep me"


def test_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no training data"):
        prepare_data(DataConfig(), tmp_path / "out")
    with pytest.raises(ConfigError, match="train_src and train_tgt go together"):
        prepare_data(DataConfig(train_src=write(tmp_path / "t.en", SRC)), tmp_path / "out")
    with pytest.raises(ConfigError, match="has no split 'dev'"):
        prepare_data(DataConfig(dataset="multi30k", valid_split="dev", data_dir=str(MIRROR)), tmp_path / "o")


def test_cli_error_has_no_traceback_in_a_real_process(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "aiayn", "prepare", "--train-src", str(tmp_path / "no.en"),
                           "--train-tgt", str(tmp_path / "no.de"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "no.en: file not found" in proc.stderr and "Traceback" not in proc.stderr


def test_archive_dataset_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A WMT-shaped dataset (archive members, SGML test set) with default split names."""
    import hashlib
    import io
    import tarfile

    def sgm(lines: list[str]) -> bytes:
        segs = "".join(f'<seg id="{i + 1}">{line}</seg>\n' for i, line in enumerate(lines))
        return f'<srcset>\n<doc docid="d">\n{segs}</doc>\n</srcset>\n'.encode()

    entries = {"train/c.de-en.en": "\n".join(SRC).encode() + b"\n",
               "train/c.de-en.de": "\n".join(TGT).encode() + b"\n",
               "dev/nt13.en": b"hello there\n", "dev/nt13.de": b"hallo da\n",
               "test/nt14-deen-src.en.sgm": sgm(["the red house", "a small dog runs"]),
               "test/nt14-deen-ref.de.sgm": sgm(["das rote haus", "ein kleiner hund rennt"])}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (tmp_path / "mirror" / "fake").mkdir(parents=True)
    (tmp_path / "mirror" / "fake" / "all.tgz").write_bytes(buf.getvalue())
    rf = ds.RemoteFile("fake/all.tgz", "http://example.invalid/all.tgz",
                       hashlib.sha256(buf.getvalue()).hexdigest())
    monkeypatch.setitem(ds.DATASETS, "fake", ds.DatasetInfo(
        "fake", "test", ("en", "de"), {s: ("en", "de") for s in ("train", "nt13", "nt14")}, "nt13", "nt14"))
    monkeypatch.setitem(ds._WMT_PARTS, "fake", {
        "train": (ds.Part(rf, "train/c.de-en.{lang}"),),
        "nt13": (ds.Part(rf, "dev/nt13.{lang}"),),
        "nt14": (ds.Part(rf, "test/nt14-deen-{role}.{lang}.sgm", sgm=True),)})
    cfg = DataConfig(dataset="fake", data_dir=str(tmp_path / "mirror"), vocab_size=80,
                     download_dir=str(tmp_path / "cache"))
    summary = prepare_data(cfg, tmp_path / "out", progress=False)
    assert {r: (s["name"], s["pairs"]) for r, s in summary["splits"].items()} == {
        "train": ("train", len(SRC)), "valid": ("nt13", 1), "test": ("nt14", 2)}
    assert split_text(tmp_path / "out", "test") == (["the red house", "a small dog runs"],
                                                    ["das rote haus", "ein kleiner hund rennt"])
    assert ensure_prepared(cfg, tmp_path / "out") == tmp_path / "out"


def test_given_tokenizer_is_used_as_is(tmp_path: Path) -> None:
    """data.tokenizer_dir: fine-tuning data is encoded with an existing (checkpoint's) tokenizer."""
    base = DataConfig(train_src=write(tmp_path / "t.en", SRC), train_tgt=write(tmp_path / "t.de", TGT),
                      vocab_size=100)
    prepare_data(base, tmp_path / "first", progress=False)
    first = load_tokenizer(tmp_path / "first")
    other = DataConfig(train_src=write(tmp_path / "u.en", SRC[:2] * 20),
                       train_tgt=write(tmp_path / "u.de", TGT[:2] * 20), vocab_size=60,
                       tokenizer_dir=str(tmp_path / "first"))
    summary = prepare_data(other, tmp_path / "second", progress=False)
    again = load_tokenizer(tmp_path / "second")
    assert again.model_bytes() == first.model_bytes()
    assert summary["vocab_size"] == first.src_vocab_size and summary["reused"]["tokenizer"] is True
    assert ensure_prepared(other, tmp_path / "second") == tmp_path / "second"
    with pytest.raises(DataError, match="data.tokenizer_dir"):
        prepare_data(DataConfig(train_src=base.train_src, train_tgt=base.train_tgt,
                                tokenizer_dir=str(tmp_path / "missing")), tmp_path / "third", progress=False)


def test_given_tokenizer_extended_by_the_new_text(tmp_path: Path) -> None:
    """data.extend_vocab: pieces learned on the fine-tuning text are appended to the given
    tokenizer, whose ids are kept; the prepared data use them; rebuilding reuses it."""
    pytest.importorskip("google.protobuf")
    base = DataConfig(train_src=write(tmp_path / "t.en", SRC), train_tgt=write(tmp_path / "t.de", TGT),
                      vocab_size=100)
    prepare_data(base, tmp_path / "first", progress=False)
    first = load_tokenizer(tmp_path / "first")
    news_src = ["the parliament approved the budget", "inflation rose in the eurozone"] * 20
    news_tgt = ["das parlament billigte den haushalt", "die inflation stieg in der eurozone"] * 20
    n = first.src_vocab_size
    assert cli(["prepare", "--train-src", write(tmp_path / "n.en", news_src), "--train-tgt",
                 write(tmp_path / "n.de", news_tgt), "--tokenizer-dir", str(tmp_path / "first"),
                 "--extend-vocab", "12", "--out", str(tmp_path / "news"), "--quiet"]) == 0
    summary = read_summary(tmp_path / "news")
    assert summary["extended_vocab"] == {"asked": 12, "joint": {"old": n, "new": n + 12, "added": 12}}
    assert summary["vocab_size"] == n + 12 and summary["reused"]["tokenizer"] is False
    ext = load_tokenizer(tmp_path / "news")
    assert ext.src_pieces(range(n)) == first.src_pieces(range(n))
    train = load_split(tmp_path / "news", "train")
    assert any(int(i) >= n for k in range(len(train)) for side in train[k] for i in side)
    cfg = DataConfig(train_src=str(tmp_path / "n.en"), train_tgt=str(tmp_path / "n.de"),
                     tokenizer_dir=str(tmp_path / "first"), extend_vocab=12)
    again = prepare_data(cfg, tmp_path / "news", progress=False)
    assert again["reused"]["tokenizer"] is True and load_tokenizer(tmp_path / "news").model_bytes() == ext.model_bytes()
    with pytest.raises(ConfigError, match="data.extend_vocab: extends the tokenizer of data.tokenizer_dir"):
        DataConfig(extend_vocab=5).validate()
