"""The bad-input matrix: every subcommand over a table of bad inputs.

Each row runs ``aiayn ARGS`` in-process and asserts: exit code 2; one error line, which
names the file, line or field and says what is wrong with it (``expect``); no traceback;
every input file byte-identical afterwards; no output left behind where none existed. The table is documented in
docs/bad-input.md (keep them in step).

Placeholders in ``args``: ``{ck}`` a valid checkpoint, ``{good}`` a valid text file,
``{ref}`` a reference with as many lines, ``{out}`` a fresh output path, and one name per
bad file built by :func:`_files` (``{empty}``, ``{badutf8}``, ``{nul}``, ``{huge}``,
``{pickled}``, ``{truncated}``, ``{garbage_cfg}``, ``{nonempty}``, ...).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from tests.tiny_world import sentences, snapshot, two_checkpoints

from aiayn.cli.main import main


class Case(NamedTuple):
    id: str
    args: str  # split on spaces after formatting
    expect: str  # must appear in the error line: what it names (file, line, field) and why


MATRIX: list[Case] = [
    # ---------------------------------------------------------------- translate
    Case("translate/missing-input", "translate --checkpoint {ck} -i {missing}", "missing.txt: file not found"),
    Case("translate/dir-input", "translate --checkpoint {ck} -i {dir}", "a_dir: is a directory"),
    Case("translate/invalid-utf8", "translate --checkpoint {ck} -i {badutf8}", "badutf8.txt:2: invalid UTF-8"),
    Case("translate/nul-byte", "translate --checkpoint {ck} -i {nul}", "nul.txt:2: NUL byte"),
    Case("translate/huge-line", "translate --checkpoint {ck} -i {huge}", "huge.txt:1: 400001 source tokens"),
    Case("translate/output-is-input", "translate --checkpoint {ck} -i {good} -o {good}",
         "--output good.txt: is also an input"),
    Case("translate/output-unwritable", "translate --checkpoint {ck} -i {good} -o /proc/x",
         "--output /proc/x: cannot write there"),
    Case("translate/output-is-dir", "translate --checkpoint {ck} -i {good} -o {dir}", "--output a_dir: is a directory"),
    Case("translate/output-under-file", "translate --checkpoint {ck} -i {good} -o {good}/x",
         "good.txt/x: directory good.txt does not exist"),
    Case("translate/bogus-device", "translate --checkpoint {ck} -i {good} --device bogus",
         "--device bogus: not a device"),
    Case("translate/bogus-dtype", "translate --checkpoint {ck} -i {good} --dtype fp7", "invalid choice: 'fp7'"),
    Case("translate/nan-lenpen", "translate --checkpoint {ck} -i {good} --lenpen nan",
         "decode.lenpen: must be a finite number"),
    Case("translate/zero-beam", "translate --checkpoint {ck} -i {good} --beam 0", "decode.beam: must be at least 1"),
    Case("translate/missing-checkpoint", "translate --checkpoint {missing} -i {good}",
         "missing.txt: no such checkpoint or run directory"),
    Case("translate/pickled-checkpoint", "translate --checkpoint {pickled} -i {good}",
         "model.safetensors: checksum mismatch"),
    Case("translate/truncated-checkpoint", "translate --checkpoint {truncated} -i {good}",
         "model.safetensors: checksum mismatch"),
    Case("translate/garbage-config", "translate --checkpoint {garbage_cfg} -i {good}",
         "config.yaml: checksum mismatch"),
    Case("translate/nan-weights", "translate --checkpoint {nan_weights} -i {good}", "NaN or infinite"),
    Case("translate/prefix-count", "translate --checkpoint {ck} -i {good} --prefix-file {empty}",
         "--prefix-file empty.txt: 0 lines, but good.txt has 4"),
    Case("translate/constraints-count", "translate --checkpoint {ck} -i {good} --constraints {empty}",
         "--constraints empty.txt: 0 lines, but good.txt has 4"),
    Case("translate/constraints-not-json", "translate --checkpoint {ck} -i {good} --constraints {good}",
         "good.txt:1: not JSON"),
    Case("translate/terms-row", "translate --checkpoint {ck} -i {good} --terms {good}",
         "good.txt:1: expected 'source<TAB>target' (two non-empty fields), got 1 field"),
    Case("translate/negative-threads", "translate --checkpoint {ck} -i {good} --threads -1", "--threads -1"),
    Case("translate/output-in-checkpoint", "translate --checkpoint {ck} -i {good} -o {ck}/config.yaml",
         "config.yaml: lies inside the input"),
    Case("translate/output-hard-link", "translate --checkpoint {ck} -i {good} -o {hard_link}",
         "--output hard_link.bin: is also the input file"),
    Case("translate/constraints-nested", "translate --checkpoint {ck} -i {good} --constraints {nested}",
         "nested.txt:1: JSON nested too deeply"),
    Case("translate/constraints-long-integer", "translate --checkpoint {ck} -i {good} --constraints {digits}",
         "digits.txt:1: a number of more than 4300 digits"),
    Case("translate/constraints-surrogate", "translate --checkpoint {ck} -i {good} --constraints {surrogate}",
         "surrogate.txt:1: constraints[0]: a lone surrogate (U+D800)"),
    Case("translate/constraints-missing", "translate --checkpoint {ck} -i {good} --constraints {missing}",
         "--constraints missing.txt: file not found"),
    Case("translate/constraints-dir", "translate --checkpoint {ck} -i {good} --constraints {dir}",
         "--constraints a_dir: is a directory"),
    Case("translate/constraints-stdin", "translate --checkpoint {ck} -i {good} --constraints -",
         "--constraints -: standard input is the --input's"),
    Case("translate/terms-missing", "translate --checkpoint {ck} -i {good} --terms {missing}",
         "--terms missing.txt: file not found"),
    Case("translate/terms-dir", "translate --checkpoint {ck} -i {good} --terms {dir}", "--terms a_dir: is a directory"),
    Case("translate/terms-stdin", "translate --checkpoint {ck} -i {good} --terms -",
         "--terms -: standard input is the --input's"),
    Case("translate/constraints-huge-phrase", "translate --checkpoint {ck} -i {good} --constraints {huge_phrase}",
         "huge_phrase.txt:1: constraints.exclude[0]: a phrase of 399999 characters; at most 1000"),
    Case("translate/constraints-conflict-sampling",
         "translate --checkpoint {ck} -i {one} --constraints {conflict} --sampling --max-len-a 0 --max-len-b 2",
         "one.txt:1: no translation within the length bound meets its constraints"),
    Case("translate/shortlist-out-of-range", "translate --checkpoint {shortlist_high} -i {good} --shortlist",
         "shortlist.safetensors: table[5][1] is 5000, not a target id"),
    Case("translate/shortlist-negative", "translate --checkpoint {shortlist_negative} -i {good} --shortlist",
         "shortlist.safetensors: frequent[2] is -7, not a target id"),
    Case("translate/huge-tgt-lang", "translate --checkpoint {ck} -i {good} --tgt-lang {huge_value}",
         "decode.tgt_lang: a language code"),
    # ---------------------------------------------------------------- evaluate
    Case("evaluate/missing-hyp", "evaluate --hyp {missing} --ref {ref}", "missing.txt: file not found"),
    Case("evaluate/empty-hyp", "evaluate --hyp {empty} --ref {ref}", "ref.txt has 4 lines but empty.txt has 0"),
    Case("evaluate/line-count", "evaluate --hyp {good} --ref {short}", "short.txt has 1 lines but good.txt has 4"),
    Case("evaluate/invalid-utf8", "evaluate --hyp {badutf8} --ref {ref4}", "badutf8.txt:2: invalid UTF-8"),
    Case("evaluate/output-is-ref", "evaluate --checkpoint {ck} --input {good} --ref {ref} --output {ref}",
         "--output ref.txt: is also an input"),
    Case("evaluate/output-in-checkpoint", "evaluate --checkpoint {ck} --input {good} --ref {ref} --output {ck}/x.txt",
         "x.txt: lies inside the input"),
    Case("evaluate/output-unwritable", "evaluate --checkpoint {ck} --input {good} --ref {ref} --output /proc/x",
         "--output /proc/x: cannot write there"),
    # ---------------------------------------------------------------- average
    Case("average/out-is-input", "average {ck} {ck2} --out {ck}", "would replace the input"),
    Case("average/out-nonempty", "average {ck} {ck2} --out {nonempty}", "nonempty: directory exists and is not empty"),
    Case("average/out-in-checkpoint", "average {ck} {ck2} --out {ck}/avg", "avg: lies inside the input"),
    Case("average/missing", "average {ck} {missing} --out {out}", "missing.txt: no such checkpoint or run directory"),
    Case("average/pickled", "average {ck} {pickled} --out {out}", "model.safetensors: checksum mismatch"),
    # ---------------------------------------------------------------- prepare
    Case("prepare/missing-corpus", "prepare --train-src {missing} --train-tgt {good} --out {out}",
         "missing.txt: file not found"),
    Case("prepare/empty-corpus", "prepare --train-src {empty} --train-tgt {empty} --out {out}",
         "empty.txt: no training sentences"),
    Case("prepare/invalid-utf8", "prepare --train-src {badutf8} --train-tgt {ref4} --out {out}",
         "badutf8.txt:2: invalid UTF-8"),
    Case("prepare/misaligned", "prepare --train-src {good} --train-tgt {short} --out {out}",
         "good.txt has 4 lines, short.txt has 1 lines"),
    Case("prepare/out-nonempty", "prepare --train-src {good} --train-tgt {ref} --out {nonempty}",
         "nonempty: directory exists and is not empty"),
    Case("prepare/out-unwritable", "prepare --train-src {good} --train-tgt {ref} --out /proc/x",
         "/proc: cannot write there"),
    Case("prepare/out-is-file", "prepare --train-src {good} --train-tgt {ref} --out {good}",
         "--out good.txt: would replace the input good.txt"),
    Case("prepare/out-in-tokenizer", "prepare --train-src {good} --train-tgt {ref} --tokenizer-dir {ck}/tokenizer "
         "--out {ck}/tokenizer/data", "data: lies inside the input"),
    Case("prepare/vocab-size-int32", "prepare --train-src {good} --train-tgt {ref} --out {out} --vocab-size 2147483648",
         "data.vocab_size: at most 2,147,483,647 (SentencePiece's integers), got 2,147,483,648"),
    # ---------------------------------------------------------------- train
    Case("train/missing-config", "train --config {missing} --run-dir {out}", "missing.txt: config file not found"),
    Case("train/invalid-yaml", "train --config {bad_yaml} --run-dir {out}", "bad.yaml: invalid YAML"),
    Case("train/nan-override", "train --config {cfg} --run-dir {out} train.lr=nan",
         "train.lr: must be a finite number"),
    Case("train/unknown-key", "train --config {cfg} --run-dir {out} train.lr_typo=1", "train.lr_typo: unknown field"),
    Case("train/bogus-device", "train --config {cfg} --run-dir {out} --device bogus", "invalid choice: 'bogus'"),
    Case("train/unknown-logger", "train --config {cfg} --run-dir {out} train.loggers=[mlflow]",
         "train.loggers: 'mlflow' is not one of"),
    Case("train/missing-data", "train --config {cfg} --run-dir {out} data.prepared_dir={missing}",
         "missing.txt: no tokenizer found"),
    Case("train/missing-resume", "train --config {cfg} --run-dir {out} --resume {missing}",
         "missing.txt: no such checkpoint or run directory"),
    Case("train/run-dir-in-init", "train --config {cfg} --run-dir {ck}/run --init-from {ck}",
         "run: lies inside the input"),
    Case("train/run-dir-nonempty", "train --config {cfg} --run-dir {nonempty}",
         "nonempty: directory exists and is not empty"),
    # ---------------------------------------------------------------- parse
    Case("parse/missing-input", "parse --checkpoint {ck} --input {missing}", "missing.txt: file not found"),
    Case("parse/pickled-checkpoint", "parse --checkpoint {pickled} --input {good}",
         "model.safetensors: checksum mismatch"),
    Case("parse/translation-checkpoint", "parse --checkpoint {ck} --input {good}", "not a parsing checkpoint"),
    Case("parse/output-is-input", "parse --checkpoint {ck} --input {good} --output {good}",
         "--output good.txt: is also an input"),
    Case("parse/output-in-checkpoint", "parse --checkpoint {ck} --input {good} --output {ck}/config.yaml",
         "config.yaml: lies inside the input"),
    Case("parse/invalid-utf8", "parse --checkpoint {ck} --input {badutf8}", "badutf8.txt:2: invalid UTF-8"),
    # ---------------------------------------------------------------- export / import
    Case("export/missing-checkpoint", "export hf {missing} {out}", "missing.txt: no such checkpoint or run directory"),
    Case("export/out-nonempty", "export hf {ck} {nonempty}", "nonempty: directory exists and is not empty"),
    Case("export/out-is-checkpoint", "export hf {ck} {ck} --force", "would replace the input"),
    Case("export/out-in-checkpoint", "export hf {ck} {ck}/hf", "hf: lies inside the input"),
    Case("import/missing", "import hf {missing} {out}", "missing.txt: no such directory"),
    Case("import/not-marian", "import hf {hf_pickle} {out}", "hf_pickle: Marian tokenizer files missing"),
    Case("import/out-nonempty", "import hf {hf_pickle} {nonempty}", "nonempty: directory exists and is not empty"),
    # ---------------------------------------------------------------- tune-decoding
    Case("tune-decoding/zero-beam", "tune-decoding --checkpoint {ck} --input {good} --ref {ref} --beams 0",
         "--beams: must be at least 1"),
    Case("tune-decoding/test-split", "tune-decoding --checkpoint {ck} --dataset multi30k --split test_2016_flickr",
         "--split test_2016_flickr: a test split"),
    # ---------------------------------------------------------------- model-info, plot, serve, demo
    Case("model-info/bogus-preset", "model-info --preset huge-ish", "unknown model preset 'huge-ish'"),
    Case("model-info/nan-size", "model-info model.dropout=nan", "model.dropout: must be a finite number"),
    Case("model-info/heads", "model-info model.d_model=100 model.n_heads=3",
         "model.n_heads: d_model=100 is not divisible by n_heads=3"),
    Case("plot/missing-run", "plot curves {missing}", "missing.txt: no metrics file"),
    Case("plot/out-unwritable", "plot curves {run_with_metrics} --out /proc/x.png",
         "--out /proc/x.png: cannot write there"),
    Case("plot/attention-out-in-checkpoint", "plot attention --checkpoint {ck} --text a --out {ck}/a.png",
         "a.png: lies inside the input"),
    Case("plot/attention-missing", "plot attention --checkpoint {missing} --text a",
         "missing.txt: no such checkpoint or run directory"),
    Case("serve/missing-checkpoint", "serve --checkpoint {missing}",
         "missing.txt: no such checkpoint or run directory"),
    Case("serve/bogus-device", "serve --checkpoint {ck} --device bogus", "--device bogus: not a device"),
    Case("serve/cors-origin-path", "serve --checkpoint {ck} --cors-origin https://example.com/app",
         "an origin has no path"),
    Case("serve/api-key-not-ascii", "serve --checkpoint {ck} --api-key clé",
         "--api-key: the API key must be printable ASCII"),
    Case("demo/out-is-file", "demo --out {good}", "good.txt: exists and is not a directory"),
    Case("demo/out-nonempty", "demo --out {nonempty}", "nonempty: directory exists and is not empty"),
]


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return two_checkpoints(tmp_path_factory.mktemp("matrix_ck"))


def _broken_checkpoint(src: Path, dst: Path, how: str) -> Path:
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    if how == "pickled":
        weights.write_bytes(pickle.dumps({"weight": [1.0, 2.0]}))
    elif how == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif how == "garbage_cfg":
        (dst / "config.yaml").write_text("model: [unclosed\n", encoding="utf-8")
    return dst


def _nan_checkpoint(src: Path, dst: Path) -> Path:
    """A checkpoint whose weights are NaN, saved properly (checksums match): a diverged run."""
    from aiayn.checkpoint.directory import load_checkpoint, save_checkpoint

    loaded = load_checkpoint(src)
    with torch.no_grad():
        next(loaded.model.parameters()).fill_(float("nan"))
    return save_checkpoint(dst, loaded.model, loaded.config, tokenizer=src / "tokenizer", state={"step": 1})


def _shortlist_checkpoint(src: Path, dst: Path, at: tuple[int, ...], value: int, which: str) -> Path:
    """A copy of ``src`` whose tokenizer carries a shortlist with ``value`` at ``which[at]``,
    its checksum recorded (so that only the shortlist itself is wrong)."""
    import hashlib

    from aiayn.text.shortlist import SHORTLIST_FILE, Shortlist

    shutil.copytree(src, dst)
    table = torch.arange(4 * 20 * 2).view(-1, 2) % 20  # 40 source ids, 2 target ids each
    shortlist = Shortlist(table, torch.arange(10))
    getattr(shortlist, which)[at] = value
    data = shortlist.to_bytes()
    (dst / "tokenizer" / SHORTLIST_FILE).write_bytes(data)
    with open(dst / "checksums.sha256", "a", encoding="utf-8") as f:
        f.write(f"{hashlib.sha256(data).hexdigest()}  tokenizer/{SHORTLIST_FILE}\n")
    return dst


def _files(root: Path, ck: Path) -> dict[str, Path]:
    """The matrix's inputs, bad ones and good ones."""
    f: dict[str, Path] = {}

    def text(name: str, data: bytes) -> None:
        f[name] = root / f"{name}.txt"
        f[name].write_bytes(data)

    good = sentences(4, 5)
    text("good", ("\n".join(good) + "\n").encode())
    text("ref", ("\n".join(sentences(4, 6)) + "\n").encode())
    text("ref4", ("\n".join(sentences(4, 7)) + "\n").encode())
    text("short", b"one line only\n")
    text("empty", b"")
    text("badutf8", b"a man\nthe \xff\xfe dog\n")
    text("nul", b"a man\nthe \x00 dog\n")
    text("huge", (" ".join(["dog"] * 400_000) + "\n").encode())
    f["missing"] = root / "missing.txt"
    f["dir"] = root / "a_dir"
    f["dir"].mkdir()
    f["nonempty"] = root / "nonempty"
    f["nonempty"].mkdir()
    (f["nonempty"] / "precious.txt").write_text("keep me\n", encoding="utf-8")
    f["bad_yaml"] = root / "bad.yaml"
    f["bad_yaml"].write_text("model: [unclosed\n", encoding="utf-8")
    for how in ("pickled", "truncated", "garbage_cfg"):
        f[how] = _broken_checkpoint(ck, root / how, how)
    f["nan_weights"] = _nan_checkpoint(ck, root / "nan_weights")
    f["cfg"] = root / "tiny.yaml"
    f["cfg"].write_text("model: {d_model: 16, n_heads: 2, d_ff: 32, n_encoder_layers: 1, n_decoder_layers: 1}\n"
                        "data: {synthetic: copy, synthetic_train_size: 50}\ntrain: {max_steps: 1}\n", encoding="utf-8")
    f["hf_pickle"] = root / "hf_pickle"
    f["hf_pickle"].mkdir()
    (f["hf_pickle"] / "config.json").write_text('{"model_type": "marian"}', encoding="utf-8")
    torch.save({"x": torch.zeros(2)}, f["hf_pickle"] / "pytorch_model.bin")
    f["hard_link"] = root / "hard_link.bin"
    os.link(ck / "model.safetensors", f["hard_link"])
    text("nested", ("[" * 100_000 + "]" * 100_000 + "\n" + "[]\n" * 3).encode())
    text("digits", ("[" + "9" * 5000 + "]\n" + "[]\n" * 3).encode())
    text("surrogate", b'["\\ud800"]\n' + b"[]\n" * 3)
    text("huge_phrase", (json.dumps({"exclude": [" ".join(["dog"] * 100_000)]}) + "\n" + "[]\n" * 3).encode())
    text("one", b"dog\n")
    # Two tokens before EOS must hold both phrases, and either order is excluded: no output meets them.
    text("conflict", json.dumps({"include": ["dog", "cat"], "exclude": ["dog cat", "cat dog"]}).encode() + b"\n")
    f["shortlist_high"] = _shortlist_checkpoint(ck, root / "shortlist_high", (5, 1), 5000, "table")
    f["shortlist_negative"] = _shortlist_checkpoint(ck, root / "shortlist_negative", (2,), -7, "frequent")
    f["run_with_metrics"] = root / "run_with_metrics"
    f["run_with_metrics"].mkdir()
    (f["run_with_metrics"] / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n',
                                                         encoding="utf-8")
    return f


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, checkpoints: tuple[Path, Path]) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("matrix_in")
    return root, _files(root, checkpoints[0])


# ---------------------------------------------------------------------- the test


@pytest.mark.parametrize("case", MATRIX, ids=[c.id for c in MATRIX])
def test_bad_input(case: Case, checkpoints: tuple[Path, Path], inputs: tuple[Path, dict[str, Path]],
                   tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    if case.id.startswith(("export/", "import/")):
        pytest.importorskip("transformers", reason="the 'interop' extra is not installed")
    if case.id.startswith("serve/"):
        pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")
    root, files = inputs
    monkeypatch.chdir(tmp_path)  # anything written to a relative path lands here
    names = {k: str(v) for k, v in files.items()}
    names.update(ck=str(checkpoints[0]), ck2=str(checkpoints[1]), out=str(tmp_path / "out"), huge_value="x" * 100_000)
    argv = case.args.format(**names).split()
    watched = [root, checkpoints[0].parent]
    before = [snapshot(r) for r in watched]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    errors = [line for line in captured.err.splitlines() if line.startswith("aiayn ")]
    assert exc.value.code == 2, (exc.value.code, captured.err)
    assert len(errors) == 1, captured.err
    # Paths relative to the folders the inputs and outputs live in, as docs/bad-input.md shows them.
    message = errors[0].replace(str(root) + "/", "").replace(str(tmp_path) + "/", "")
    assert case.expect in message, message
    assert len(message) <= 2100, "an error line of unbounded length"
    if os.environ.get("AIAYN_BAD_INPUT_MESSAGES"):  # docs/bad-input.md's examples come from here
        with open(os.environ["AIAYN_BAD_INPUT_MESSAGES"], "a", encoding="utf-8") as f:
            f.write(f"{case.id}\t{message}\n")
    assert [snapshot(r) for r in watched] == before, "an input changed"
    assert not (tmp_path / "out").exists(), "an output was left behind"
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "stray files in the working directory"


def test_the_documented_table_is_this_table() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "bad-input.md").read_text(encoding="utf-8")
    documented = re.findall(r"^\| `([a-z0-9-]+/[a-z0-9-]+)` \|", doc, re.M)
    assert documented == [c.id for c in MATRIX]
