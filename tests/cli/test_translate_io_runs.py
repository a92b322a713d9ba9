"""`aiayn translate` run through its input and output (aiayn.cli.translate_io): the same bytes
whatever the chunk size, a file output never partly written and resumable after a crash,
target prefixes, word alignments, and a program reading each translation as it comes."""

from __future__ import annotations

import gzip
import json
import os
import selectors
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn.cli.translate import format_result, read_file_lines
from aiayn.inference.alignment import format_alignment, hard_alignment, last_layer_mean, piece_words
from aiayn.inference.request import TranslationRequest
from aiayn.inference.translator import Translator

# Tiny models run fastest on one thread (the translations in-process and through the CLI).
pytestmark = pytest.mark.usefixtures("one_thread")

TRICKY = (
    b"a man is riding a bike\n"
    b"\n"
    + b" ".join([b"riding"] * 400) + b"\n"  # longer than the model's 64 positions
    + b"a dog \xff\xfe on the street\n"  # invalid UTF-8
    + b"windows line\r\n"
    + b"   \n"
    + "a cat\u2028with odd line breaks\x0c\x1c\x85 inside".encode() + b"\n"
    + b"the woman is walking\n"
    + b"\n"
    + b"a red ball in the park\n"
    + b"no final newline"
)
N_TRICKY = 11
# Decoding kept short: the point is the chunking, not the translations.
FAST = ["--beam", "2", "--max-len-b", "3", "--threads", "1"]


@pytest.fixture
def tricky_file(tmp_path: Path) -> Path:
    path = tmp_path / "in.txt"
    path.write_bytes(TRICKY)
    return path


def reference(checkpoint: Path, path: Path, chunk: int | None = None, nbest: int = 1, fmt: str = "text",
              scores: bool = False, alignment: bool = False, prefixes: list[str | None] | None = None,
              **overrides) -> bytes:
    """The output through the Python API: the whole file at once, or ``chunk`` lines at a time."""
    lines = read_file_lines(path, "replace")
    translator = Translator.from_checkpoint(checkpoint)
    settings = {"beam": 2, "max_len_b": 3, **overrides}
    results = []
    size = chunk or max(len(lines), 1)
    for start in range(0, len(lines), size):
        part = prefixes[start:start + size] if prefixes is not None else None
        results += translator.translate_detailed(lines[start:start + size], nbest=nbest, attention=alignment,
                                                 prefixes=part, **settings)
    if alignment:  # the full weights here, the CLI keeps only their summary: the same alignment
        for r in results:
            for h in r.hypotheses:
                h.attention = last_layer_mean(h.attention) if h.attention is not None else None
    return "".join(format_result(r, k + 1, nbest, fmt, scores, alignment) + "\n"
                   for k, r in enumerate(results)).encode("utf-8")


# ------------------------------------------------------------- chunks change nothing


def test_translations_are_the_same_bytes_whatever_the_chunk_size(tiny_checkpoint, tricky_file, run_cli) -> None:
    expected = reference(tiny_checkpoint, tricky_file)
    assert expected.count(b"\n") == N_TRICKY
    base = ["translate", "--checkpoint", str(tiny_checkpoint), "--on-invalid-utf8", "replace", "--truncate",
            "--quiet", *FAST]
    for size in ("1", "3", "7", "1000"):
        code, out, err = run_cli([*base, "--input", str(tricky_file), "--chunk-size", size])
        assert code == 0, err
        assert out == expected, f"--chunk-size {size}"
        code, out, err = run_cli([*base, "--chunk-size", size], stdin=TRICKY)
        assert code == 0, err
        assert out == expected, f"stdin, --chunk-size {size}"


def _hypotheses(out: bytes, fmt: str) -> list[list[tuple[str, float]]]:
    if fmt == "jsonl":
        return [[(h["text"], h["score"]) for h in json.loads(line)["hypotheses"]] for line in out.splitlines()]
    fields = [line.split("\t") for line in out.decode("utf-8").split("\n")[:-1]]
    return [[(f[k], float(f[k + 1])) for k in range(0, len(f), 2) if f[k + 1]] for f in fields]


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
def test_scores_in_chunks(tiny_checkpoint, tricky_file, run_cli, fmt: str) -> None:
    """Each chunk's bytes are exactly the API's for that chunk. Across chunk sizes the
    hypotheses are the same but a score can move in its last bits: a sentence's float sums
    depend on the batch it shares (padding width, number of rows), and batches are made
    within a chunk."""
    whole = _hypotheses(reference(tiny_checkpoint, tricky_file, nbest=2, fmt=fmt, scores=True), fmt)
    base = ["translate", "--checkpoint", str(tiny_checkpoint), "--on-invalid-utf8", "replace", "--truncate",
            "--quiet", "--nbest", "2", "--scores", "--format", fmt, *FAST]
    for size in (1, 3, 1000):
        code, out, err = run_cli([*base, "--input", str(tricky_file), "--chunk-size", str(size)])
        assert code == 0, err
        assert out == reference(tiny_checkpoint, tricky_file, chunk=size, nbest=2, fmt=fmt, scores=True)
        got = _hypotheses(out, fmt)
        assert [[text for text, _ in hyps] for hyps in got] == [[text for text, _ in hyps] for hyps in whole]
        assert [[score for _, score in hyps] for hyps in got] == \
            [[pytest.approx(score, abs=2e-4) for _, score in hyps] for hyps in whole]


def test_multi30k_test_set_in_chunks_equals_one_chunk(tiny_checkpoint, mirror, tmp_path, run_cli) -> None:
    source = mirror / "multi30k" / "test_2016_flickr.en.gz"
    n_lines = sum(1 for _ in gzip.open(source))
    expected = reference(tiny_checkpoint, source, max_len_a=0.0)
    assert expected.count(b"\n") == n_lines == 1000
    outputs = {}
    for size in ("7", "1000", "1000000"):
        out = tmp_path / f"out.{size}.de"
        code, _, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(source),
                                "--output", str(out), "--truncate", "--quiet", "--chunk-size", size, *FAST,
                                "--max-len-a", "0"])
        assert code == 0, err
        outputs[size] = out.read_bytes()
    assert outputs == {size: expected for size in outputs}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"out.{s}.de" for s in outputs)


def test_a_file_is_checked_whole_before_the_first_chunk(tiny_checkpoint, tmp_path, run_cli) -> None:
    """Invalid UTF-8 or an over-long line in the last chunk: nothing written, not even chunk 1."""
    for bad, message in ((b"a dog \xff on the street", ":4: invalid UTF-8"),
                         (b" ".join([b"riding"] * 400), ":4: 401 source tokens")):
        path = tmp_path / "in.txt"
        path.write_bytes(b"a man\nthe dog\na cat\n" + bad + b"\n")
        code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(path),
                                  "--chunk-size", "1", *FAST])
        assert code == 2 and out == b""
        assert f"{path}{message}" in err and "Traceback" not in err


def test_progress_bar_counts_lines_with_a_total_for_a_file(tiny_checkpoint, tricky_file, run_cli,
                                                           monkeypatch) -> None:
    import tqdm

    bars: list[dict] = []
    real = tqdm.tqdm

    def recording(*args, **kwargs):
        bar = real(*args, **kwargs)
        bars.append({"total": kwargs.get("total"), "disable": kwargs.get("disable"), "bar": bar})
        return bar

    monkeypatch.setattr(tqdm, "tqdm", recording)
    base = ["translate", "--checkpoint", str(tiny_checkpoint), "--on-invalid-utf8", "replace", "--truncate",
            "--chunk-size", "4", *FAST]
    assert run_cli([*base, "--input", str(tricky_file)])[0] == 0
    assert run_cli(base, stdin=TRICKY)[0] == 0
    assert run_cli([*base, "--quiet"], stdin=TRICKY)[0] == 0
    assert [(b["total"], b["disable"], b["bar"].n) for b in bars] == [
        (N_TRICKY, False, N_TRICKY), (None, False, N_TRICKY), (None, True, 0)]  # a disabled bar counts nothing


def test_chunk_size_flag(tiny_checkpoint, tricky_file, run_cli) -> None:
    for flag in ("--chunk-size", "--buffer-size"):
        code, out, err = run_cli(["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(tricky_file),
                                  flag, "0"])
        assert code == 2 and out == b""
        assert "--chunk-size: must be at least 1, got 0" in err


# ----------------------------------------------------- a run that dies, and resuming it


def _dying_after(monkeypatch, calls: int, error: type[BaseException] = RuntimeError) -> list[int]:
    """Translator.run raising on its call number ``calls + 1``."""
    seen: list[int] = []
    real = Translator.run

    def dying(self, request, *args, **kwargs):
        seen.append(len(request.texts))
        if len(seen) > calls:
            raise error("simulated crash")
        return real(self, request, *args, **kwargs)

    monkeypatch.setattr(Translator, "run", dying)
    return seen


def test_a_run_that_dies_leaves_the_output_as_it_was_then_resumes(tiny_checkpoint, tricky_file, tmp_path,
                                                                  run_cli, capsysbinary, monkeypatch) -> None:
    out = tmp_path / "out.de"
    out.write_bytes(b"previous translation\n")
    expected = reference(tiny_checkpoint, tricky_file, chunk=3)
    argv = ["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(tricky_file), "--output", str(out),
            "--on-invalid-utf8", "replace", "--truncate", "--chunk-size", "3", *FAST]
    seen = _dying_after(monkeypatch, 1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_cli(argv)
    assert seen == [3, 3]
    assert out.read_bytes() == b"previous translation\n"
    partial = tmp_path / "out.de.partial"
    assert partial.read_bytes() == b"".join(expected.splitlines(keepends=True)[:3])
    state = json.loads((tmp_path / "out.de.partial.json").read_text(encoding="utf-8"))
    assert (state["lines"], state["bytes"]) == (3, partial.stat().st_size)
    assert b"out.de.partial keeps the first 3 lines" in capsysbinary.readouterr().err

    # A resumed run starts at line 4: it translates 8 lines, in chunks 4-6, 7-9, 10-11.
    monkeypatch.undo()
    seen = _dying_after(monkeypatch, 100)
    code, stdout, err = run_cli([*argv, "--resume"])
    assert code == 0, err
    assert seen == [3, 3, 2] and stdout == b""
    assert "resuming" in err and "3 of 11 lines done" in err
    assert out.read_bytes() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.de"]


def test_resume_refuses_another_input_checkpoint_or_option(tiny_checkpoint, second_checkpoint, tricky_file,
                                                           tmp_path, run_cli, monkeypatch) -> None:
    out = tmp_path / "out.de"
    argv = ["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(tricky_file), "--output", str(out),
            "--on-invalid-utf8", "replace", "--truncate", "--chunk-size", "4", *FAST]
    _dying_after(monkeypatch, 1, KeyboardInterrupt)
    code, _, err = run_cli(argv)
    assert code == 130 and "interrupted" in err
    monkeypatch.undo()
    partial = (tmp_path / "out.de.partial").read_bytes()
    changed = tmp_path / "changed.txt"
    changed.write_bytes(TRICKY.replace(b"bike", b"ball"))
    for variant, what in (([*argv, "--beam", "3"], "decode.beam"),
                          ([*argv, "--scores"], "--scores"),
                          ([*argv, "--chunk-size", "5"], "--chunk-size"),
                          ([*argv, "--checkpoint", str(second_checkpoint)], "--checkpoint"),
                          ([*argv, "--input", str(changed)], "input")):
        code, _, err = run_cli([*variant, "--resume"])
        assert code == 2, variant
        assert f"--resume: {out}.partial was written with another {what};" in err
        assert not out.exists() and (tmp_path / "out.de.partial").read_bytes() == partial
    # Without --resume, a new run replaces what the old one left.
    code, _, err = run_cli([*argv, "--beam", "3"])
    assert code == 0, err
    assert f"replacing {out}.partial" in err
    assert out.read_bytes() == reference(tiny_checkpoint, tricky_file, chunk=4, beam=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["changed.txt", "in.txt", "out.de"]


def test_resume_without_a_partial_starts_afresh_and_needs_files(tiny_checkpoint, tricky_file, tmp_path,
                                                               run_cli) -> None:
    out = tmp_path / "out.de"
    base = ["translate", "--checkpoint", str(tiny_checkpoint), "--on-invalid-utf8", "replace", "--truncate",
            "--quiet", *FAST, "--resume"]
    code, _, err = run_cli([*base, "--input", str(tricky_file), "--output", str(out)])
    assert code == 0, err
    assert out.read_bytes() == reference(tiny_checkpoint, tricky_file)
    code, _, err = run_cli([*base, "--output", str(tmp_path / "o2")], stdin=TRICKY)
    assert code == 2 and "--resume: needs a regular --input file" in err
    code, _, err = run_cli([*base, "--input", str(tricky_file)])
    assert code == 2 and "--resume: needs an --output file" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.de"]


# -------------------------------------------------------------------------- prefixes


def test_prefix_file_forces_the_start_of_each_translation(tiny_checkpoint, tmp_path, run_cli) -> None:
    source = tmp_path / "in.en"
    source.write_text("a man is riding a bike\nthe dog\n\na red ball in the park\nthe woman\n", encoding="utf-8")
    prefixes = ["ein mann", "", "der", "der rot", "die frau"]
    prefix_file = tmp_path / "prefix.de"
    prefix_file.write_text("\n".join(prefixes) + "\n", encoding="utf-8")
    base = ["translate", "--checkpoint", str(tiny_checkpoint), "--quiet", *FAST, "--chunk-size", "2"]
    code, out, err = run_cli([*base, "--input", str(source), "--prefix-file", str(prefix_file)])
    assert code == 0, err
    assert out == reference(tiny_checkpoint, source, chunk=2, prefixes=prefixes)
    lines = out.decode("utf-8").split("\n")[:-1]
    assert lines[0].startswith("ein mann") and lines[3].startswith("der rot") and lines[4].startswith("die frau")
    assert lines[2] == ""  # an empty input line stays empty, whatever its prefix
    _, plain, _ = run_cli([*base, "--input", str(source)])
    assert lines[1] == plain.decode("utf-8").split("\n")[1]  # an empty prefix is no prefix
    # The same from standard input.
    code, out_stdin, err = run_cli([*base, "--prefix-file", str(prefix_file)], stdin=source.read_bytes())
    assert code == 0, err
    assert out_stdin == out


@pytest.mark.parametrize("n_prefixes", [3, 6])
def test_prefix_file_line_count_mismatch_is_one_error(tiny_checkpoint, tmp_path, run_cli, n_prefixes: int) -> None:
    source = tmp_path / "in.en"
    source.write_text("a man\nthe dog\na cat\nthe woman\nthe ball\n", encoding="utf-8")
    prefix_file = tmp_path / "prefix.de"
    prefix_file.write_text("ein\n" * n_prefixes, encoding="utf-8")
    out = tmp_path / "out.de"
    base = ["translate", "--checkpoint", str(tiny_checkpoint), "--prefix-file", str(prefix_file), "--output",
            str(out), *FAST, "--chunk-size", "2"]
    code, stdout, err = run_cli([*base, "--input", str(source)])
    assert code == 2 and stdout == b""
    assert f"--prefix-file {prefix_file}: {n_prefixes} lines, but {source} has 5; give one prefix per input " \
           "line (an empty line for none)" in err
    assert "Traceback" not in err
    code, _, err = run_cli(base, stdin=source.read_bytes())
    assert code == 2 and "Traceback" not in err
    assert f"--prefix-file {prefix_file}: " in err and "give one prefix per input line" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.en", "prefix.de"]



# ------------------------------------------------------------------------- alignment


def test_piece_words_golden() -> None:
    assert piece_words(["▁a", "▁man", "▁", "<unk>", "z", "</s>"]) == [0, 1, 2, 2, 2, None]
    # Decoded, <unk> is " ⁇ ": a word of its own, and what follows it another.
    assert piece_words(["▁ein", "▁", "<unk>", "an", "n", "▁", "<unk>", "▁rot", "</s>"], unk_is_word=True) == \
        [0, 1, 1, 2, 2, 3, 3, 4, None]
    assert piece_words([",", "▁ein", "s"]) == [0, 1, 1]
    assert piece_words(["▁a", "▁", "</s>"]) == [0, None, None]
    assert piece_words(["<s>", "▁", "a", "▁b"]) == [None, 0, 0, 1]


def test_hard_alignment_golden() -> None:
    src = ["▁a", "▁ma", "n", "</s>"]  # words: a, man
    tgt = ["▁ein", "▁mann", "e", "</s>"]  # words: ein, manne
    weights = torch.tensor([
        [0.6, 0.1, 0.1, 0.2],
        [0.1, 0.2, 0.3, 0.4],  # EOS has the most: never chosen, "n" is
        [0.5, 0.1, 0.1, 0.3],
        [0.0, 0.0, 0.0, 1.0],  # the EOS row: never aligned
    ])
    assert hard_alignment(weights, src, tgt) == [(0, 0), (0, 1), (1, 1)]
    assert format_alignment(hard_alignment(weights, src, tgt)) == "0-0 0-1 1-1"
    tie = torch.full((4, 4), 0.25)
    assert hard_alignment(tie, src, tgt) == [(0, 0), (0, 1)]  # a tie goes to the first piece
    assert hard_alignment(None, src, tgt) == []
    with pytest.raises(ValueError, match="expected"):
        hard_alignment(weights[:3], src, tgt)
    layers = torch.rand(3, 2, 4, 4)
    assert torch.equal(last_layer_mean(layers), (layers[2, 0] + layers[2, 1]) / 2)


def test_alignment_output(tiny_checkpoint, tmp_path, run_cli, english) -> None:
    source = tmp_path / "in.en"
    texts = [*english[:6], "", *english[6:]]
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    base = ["translate", "--checkpoint", str(tiny_checkpoint), "--input", str(source), "--quiet", *FAST,
            "--chunk-size", "5"]
    code, out, err = run_cli([*base, "--alignment"])
    assert code == 0, err
    assert out == reference(tiny_checkpoint, source, chunk=5, alignment=True)
    lines = out.decode("utf-8").split("\n")[:-1]
    assert len(lines) == len(texts)
    _, plain, _ = run_cli(base)
    assert [line.split("\t")[0] for line in lines] == plain.decode("utf-8").split("\n")[:-1]
    for text, line in zip(texts, lines):
        hyp, alignment = line.split("\t")
        pairs = [tuple(int(i) for i in pair.split("-")) for pair in alignment.split()]
        assert pairs == sorted(set(pairs))
        assert all(0 <= s < len(text.split()) for s, _ in pairs)
        assert {t for _, t in pairs} == set(range(len(hyp.split())))  # every target word, once or more
    code, out, err = run_cli([*base, "--alignment", "--format", "jsonl"])
    assert code == 0, err
    records = [json.loads(line) for line in out.decode("utf-8").splitlines()]
    assert [format_alignment(r["hypotheses"][0]["alignment"]) for r in records] == \
        [line.split("\t")[1] for line in lines]


def test_alignment_target_words_match_the_output_with_unknown_pieces(tiny_checkpoint) -> None:
    """Prefixes with characters the vocabulary lacks put <unk> (written " ⁇ ") in the output."""
    translator = Translator.from_checkpoint(tiny_checkpoint)
    prefixes = ["ein Mann ,", "X", "der Hund. und", "Ä ö ü"]
    request = TranslationRequest(["a man", "the dog", "a cat is walking", "the ball"],
                                 translator.decode_config(nbest=2, beam=2, max_len_b=3), attention=True,
                                 prefixes=prefixes, attention_summary=last_layer_mean)
    results = translator.run(request)
    unknown = 0
    for r in results:
        for h in r.hypotheses:
            unknown += h.text.count("⁇")
            pairs = hard_alignment(h.attention, h.src_pieces, h.tgt_pieces)
            assert {t for _, t in pairs} == set(range(len(h.text.split())))
    assert unknown >= 4


# ------------------------------------------------------- a program reading line by line


def test_a_program_gets_each_translation_before_sending_the_next_line(tiny_checkpoint) -> None:
    """Default chunk size, a pipe, one line at a time: no deadlock waiting for a full chunk."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "aiayn", "translate", "--checkpoint", str(tiny_checkpoint),
                             "--quiet", *FAST], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    answers = []
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            for line in (b"a man is riding\n", b"\n", b"the dog\n"):
                proc.stdin.write(line)
                proc.stdin.flush()
                assert sel.select(timeout=600), "no translation came back"  # a deadlock, not a timing
                answers.append(proc.stdout.readline())
        proc.stdin.close()
        assert proc.wait(timeout=600) == 0
    finally:
        proc.kill()
    assert len(answers) == 3 and answers[1] == b"\n"
    assert all(a.endswith(b"\n") for a in answers)
