"""`aiayn translate`'s input and output (aiayn.cli.translate_io): the same bytes whatever the
chunk size, a file output never partly written (and resumable), target prefixes, word
alignments, the reader of standard input and pipes."""

from __future__ import annotations

import gzip
import io
import json
import os
import selectors
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn.cli import translate_io
from aiayn.cli.translate import format_result, read_file_lines
from aiayn.errors import DataError
from aiayn.inference.alignment import format_alignment, hard_alignment, last_layer_mean, piece_words
from aiayn.inference.translator import Translator

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


# ------------------------------------------------------------------- the file output


def _dying_after(monkeypatch, calls: int, error: type[BaseException] = RuntimeError) -> list[int]:
    """Translator.translate_detailed raising on its call number ``calls + 1``."""
    seen: list[int] = []
    real = Translator.translate_detailed

    def dying(self, texts, *args, **kwargs):
        seen.append(len(texts))
        if len(seen) > calls:
            raise error("simulated crash")
        return real(self, texts, *args, **kwargs)

    monkeypatch.setattr(Translator, "translate_detailed", dying)
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


def test_a_partial_with_extra_bytes_is_cut_back_on_resume(tmp_path: Path) -> None:
    """A kill between writing a chunk and recording it: the unrecorded bytes are dropped."""
    out = tmp_path / "out.txt"
    identity = {"input": "abc"}
    first = translate_io.PartialOutput(out, identity)
    first.write(b"one\ntwo\n", 2)
    first._f.write(b"thr")  # the next chunk, cut short
    first._f.flush()
    first._close()  # as a killed process would: the file and the output's lock let go
    second = translate_io.PartialOutput(out, identity, resume=True)
    assert (second.lines, second.bytes) == (2, 8)
    second.write(b"three\n", 1)
    second.finish()
    assert out.read_bytes() == b"one\ntwo\nthree\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_two_runs_cannot_write_the_same_partial(tmp_path: Path) -> None:
    pytest.importorskip("fcntl", reason="platform: no fcntl (not POSIX)")
    from aiayn.errors import AiaynError

    out = tmp_path / "out.txt"
    first = translate_io.PartialOutput(out, {"input": "a"})
    with pytest.raises(AiaynError, match="is being written by another run"):
        translate_io.PartialOutput(out, {"input": "a"})
    first.write(b"x\n", 1)
    first.finish()
    assert out.read_bytes() == b"x\n"


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
    results = translator.translate_detailed(["a man", "the dog", "a cat is walking", "the ball"], nbest=2,
                                            attention=True, prefixes=prefixes, attention_summary=last_layer_mean,
                                            beam=2, max_len_b=3)
    unknown = 0
    for r in results:
        for h in r.hypotheses:
            unknown += h.text.count("⁇")
            pairs = hard_alignment(h.attention, h.src_pieces, h.tgt_pieces)
            assert {t for _, t in pairs} == set(range(len(h.text.split())))
    assert unknown >= 4


# ------------------------------------------------------------------ the stream reader


def test_stream_chunks_end_when_no_further_line_has_arrived() -> None:
    read_fd, write_fd = os.pipe()
    try:
        with os.fdopen(read_fd, "rb", buffering=0) as reader:
            chunks = translate_io.stream_chunks(reader, 10, lambda raw, n: raw.decode())
            os.write(write_fd, b"one\ntwo\nthr")
            assert next(chunks) == ["one", "two"]  # "thr" is not a line yet: no waiting for it
            os.write(write_fd, b"ee\nfour\n")
            assert next(chunks) == ["three", "four"]
            os.write(write_fd, b"".join(b"%d\n" % i for i in range(25)) + b"last")
            os.close(write_fd)
            write_fd = -1
            assert [len(c) for c in chunks] == [10, 10, 6]  # a stream that is ahead fills whole chunks
    finally:
        if write_fd >= 0:
            os.close(write_fd)


def test_stream_chunks_deliver_the_lines_before_a_bad_one() -> None:
    def decode(raw: bytes, n: int) -> str:
        if raw == b"bad":
            raise DataError(f"<stdin>:{n}: bad")
        return raw.decode()

    chunks = translate_io.stream_chunks(io.BytesIO(b"a\nb\nc\nbad\nd\n"), 2, decode)
    assert next(chunks) == ["a", "b"]
    assert next(chunks) == ["c"]
    with pytest.raises(DataError, match="<stdin>:4: bad"):
        next(chunks)


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


# ------------------------------------------------- the stream reader: block boundaries


def _pipe_reader() -> tuple[translate_io._WaitingReader, int]:
    read_fd, write_fd = os.pipe()
    reader = translate_io._WaitingReader(read_fd)
    return reader, write_fd


def test_waiting_reader_a_block_that_starts_with_a_newline() -> None:
    reader, write_fd = _pipe_reader()
    try:
        os.write(write_fd, b"\n")
        assert reader.line_waiting()  # an empty line is a whole line
        os.write(write_fd, b"x\n")  # arrives after the empty line was seen, in a block of its own
        assert reader.readline() == b"\n"
        assert reader.readline() == b"x\n"
        os.close(write_fd)
        write_fd = -1
        assert reader.line_waiting()  # the end of the input
        assert reader.readline() == b""
    finally:
        os.close(reader.fd)
        if write_fd >= 0:
            os.close(write_fd)


def test_waiting_reader_a_first_block_that_starts_with_a_newline() -> None:
    reader, write_fd = _pipe_reader()
    try:
        os.write(write_fd, b"\nx\ny")
        os.close(write_fd)
        assert [reader.readline() for _ in range(4)] == [b"\n", b"x\n", b"y", b""]
    finally:
        os.close(reader.fd)


def test_waiting_reader_only_polls(monkeypatch) -> None:
    """Telling whether a line is waiting never waits: every select has a zero timeout."""
    timeouts = []
    select = translate_io.select.select

    def spy(rlist, wlist, xlist, timeout=None):
        timeouts.append(timeout)
        return select(rlist, wlist, xlist, 0)  # a wait asked for is recorded, never made

    monkeypatch.setattr(translate_io.select, "select", spy)
    read_fd, write_fd = os.pipe()
    try:
        with os.fdopen(read_fd, "rb", buffering=0) as stream:
            reader = translate_io._WaitingReader.wrap(stream)
            assert reader is not None
            assert not reader.line_waiting()
            os.write(write_fd, b"a")
            assert not reader.line_waiting()  # a line's start, not yet a line
            os.write(write_fd, b"b\n")
            assert reader.line_waiting()
            assert reader.readline() == b"ab\n"
    finally:
        os.close(write_fd)
    assert len(timeouts) >= 4 and set(timeouts) == {0}


# ------------------------------------------------------ resuming and aborting an output


def _partial_state(out: Path) -> tuple[Path, Path]:
    partial = out.with_name(out.name + ".partial")
    return partial, partial.with_name(partial.name + ".json")


def _state_text(identity: dict, lines: int, nbytes: int) -> str:
    return json.dumps({"identity": identity, "lines": lines, "bytes": nbytes}, indent=1, sort_keys=True) + "\n"


@pytest.mark.parametrize("state", [
    b"{not json",
    b"\xff\xfe{}",  # not UTF-8
    b"[2, 8]",
    b'{"lines": 2, "bytes": 8}',
    b'{"identity": "abc", "lines": 2, "bytes": 8}',
    b'{"identity": {"input": "abc"}, "lines": "2", "bytes": 8}',
    b'{"identity": {"input": "abc"}, "lines": 2, "bytes": "8"}',
    b'{"identity": {"input": "abc"}, "lines": 2}',
], ids=["json", "utf8", "list", "no-identity", "identity-str", "lines-str", "bytes-str", "no-bytes"])
def test_resume_refuses_a_partial_whose_state_cannot_be_read(tmp_path: Path, state: bytes) -> None:
    from aiayn.errors import AiaynError

    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    partial.write_bytes(b"one\ntwo\n")
    state_file.write_bytes(state)
    with pytest.raises(AiaynError) as info:
        translate_io.PartialOutput(out, {"input": "abc"}, resume=True)
    assert str(info.value) == (f"--resume: {partial} has no readable out.txt.partial.json, so what it holds is "
                               "unknown; delete it to start again")
    assert partial.read_bytes() == b"one\ntwo\n" and state_file.read_bytes() == state
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt.partial", "out.txt.partial.json"]


def test_resume_reads_its_state_as_utf8_whatever_the_locale(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    identity = {"input": "caf\u00e9 \u00fcber"}
    partial.write_bytes(b"one\n")
    # JSON with its non-ASCII text as UTF-8 (the program itself writes \u escapes).
    state_file.write_bytes(json.dumps({"identity": identity, "lines": 1, "bytes": 4}, ensure_ascii=False).encode())
    # A Latin-1 locale: text read without an explicit encoding would be Latin-1.
    text_encoding = io.text_encoding
    monkeypatch.setattr(io, "text_encoding", lambda encoding, *a: text_encoding(encoding or "latin-1", *a))
    second = translate_io.PartialOutput(out, identity, resume=True)
    assert (second.lines, second.bytes) == (1, 4)
    second.write(b"two\n", 1)
    second.finish()
    assert out.read_bytes() == b"one\ntwo\n"


def test_resume_needs_an_identity(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        translate_io.PartialOutput(tmp_path / "out.txt", None, resume=True)
    assert str(info.value) == "resume needs an identity"


def test_resume_names_every_key_only_one_identity_has(tmp_path: Path) -> None:
    from aiayn.errors import AiaynError

    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    first = translate_io.PartialOutput(out, {"input": "abc", "beam": 4})
    first.write(b"one\n", 1)
    first._close()
    state = state_file.read_bytes()
    with pytest.raises(AiaynError) as info:
        translate_io.PartialOutput(out, {"input": "abc", "alpha": 0.6}, resume=True)
    assert str(info.value) == (f"--resume: {partial} was written with another alpha, beam; rerun with the options "
                               "it was started with, or delete it to start again")
    assert partial.read_bytes() == b"one\n" and state_file.read_bytes() == state


def test_resume_refuses_a_partial_shorter_than_its_state_counts(tmp_path: Path) -> None:
    from aiayn.errors import AiaynError

    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    identity = {"input": "abc"}
    first = translate_io.PartialOutput(out, identity)
    first.write(b"one\ntwo\n", 2)
    first._close()
    partial.write_bytes(b"one\n")  # lost its last chunk
    with pytest.raises(AiaynError) as info:
        translate_io.PartialOutput(out, identity, resume=True)
    assert str(info.value) == (f"--resume: {partial} has 4 bytes, out.txt.partial.json counts 8; "
                               "delete both to start again")
    assert partial.read_bytes() == b"one\n"
    assert state_file.read_text(encoding="utf-8") == _state_text(identity, 2, 8)


def test_abort_keeps_exactly_one_finished_chunk(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    identity = {"input": "abc"}
    output = translate_io.PartialOutput(out, identity)
    output.write(b"one\n", 1)
    assert output.abort() is True
    assert partial.read_bytes() == b"one\n"
    assert state_file.read_text(encoding="utf-8") == _state_text(identity, 1, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt.partial", "out.txt.partial.json"]


def test_abort_before_the_first_chunk_removes_the_files(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    output = translate_io.PartialOutput(out, {"input": "abc"})
    assert output.abort() is False
    assert list(tmp_path.iterdir()) == []


def test_abort_tolerates_a_partial_removed_meanwhile(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    output = translate_io.PartialOutput(out, {"input": "abc"})
    partial.unlink()  # removed by hand while the run failed
    assert output.abort() is False
    assert list(tmp_path.iterdir()) == []


def test_stream_chunks_without_waiting_read_through_the_stream(tmp_path: Path) -> None:
    """``wait=False`` reads the stream's own lines: a gzip file's decompressed text."""
    path = tmp_path / "in.txt.gz"
    path.write_bytes(gzip.compress(b"one\ntwo\nthree\n"))
    with gzip.open(path, "rb") as stream:
        chunks = list(translate_io.stream_chunks(stream, 2, lambda raw, n: raw.decode(), wait=False))
    assert chunks == [["one", "two"], ["three"]]


def test_stream_chunks_read_error_names_stdin_and_the_line() -> None:
    class Failing(io.BytesIO):
        def readline(self, size=-1):
            if self.tell() >= 4:
                raise OSError("device gone")
            return super().readline(size)

    chunks = translate_io.stream_chunks(Failing(b"a\nb\nc\n"), 5, lambda raw, n: raw.decode())
    assert next(chunks) == ["a", "b"]
    with pytest.raises(DataError) as info:
        next(chunks)
    assert str(info.value) == "<stdin>:3: read error (device gone)"


# ------------------------------------------------- the partial output's files and messages


def test_partial_output_without_resume_replaces_what_an_earlier_run_left(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    identity = {"input": "abc"}
    partial.write_bytes(b"one\ntwo\n")
    state_file.write_text(_state_text(identity, 2, 8), encoding="utf-8")
    output = translate_io.PartialOutput(out, identity)
    assert (output.lines, output.bytes, output.replaced) == (0, 0, True)
    assert partial.read_bytes() == b""
    assert state_file.read_text(encoding="utf-8") == _state_text(identity, 0, 0)
    output.finish()
    assert out.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


@pytest.mark.parametrize(("content", "state", "replaced"), [
    (None, False, False),
    (b"", False, False),
    (b"x", False, True),
    (b"", True, True),
    (b"x\n", True, True),
], ids=["nothing", "empty", "one-byte", "empty-with-state", "both"])
def test_partial_output_says_whether_it_replaced_anything(tmp_path: Path, content: bytes | None, state: bool,
                                                          replaced: bool) -> None:
    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    if content is not None:
        partial.write_bytes(content)
    if state:
        state_file.write_text(_state_text({"input": "abc"}, 1, 2), encoding="utf-8")
    output = translate_io.PartialOutput(out)
    assert output.replaced is replaced
    assert partial.read_bytes() == b""
    output.finish()
    assert out.read_bytes() == b""


def test_partial_output_resumed_has_replaced_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    identity = {"input": "abc"}
    fresh = translate_io.PartialOutput(out, identity, resume=True)
    assert (fresh.lines, fresh.bytes) == (0, 0) and fresh.replaced is False
    fresh.write(b"one\n", 1)
    fresh._close()
    resumed = translate_io.PartialOutput(out, identity, resume=True)
    assert (resumed.lines, resumed.bytes) == (1, 4) and resumed.replaced is False
    resumed.finish()
    assert out.read_bytes() == b"one\n"


def test_partial_output_counts_and_records_every_chunk(tmp_path: Path, monkeypatch) -> None:
    """Each chunk is fsynced before the state counts it; the state itself is not fsynced
    (a state behind its file only costs rewriting a chunk)."""
    out = tmp_path / "out.txt"
    partial, state_file = _partial_state(out)
    identity = {"source": "abc", "beam": 4, "alpha": 0.6}
    output = translate_io.PartialOutput(out, identity)
    assert state_file.read_text(encoding="utf-8") == _state_text(identity, 0, 0)
    synced: list[int] = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), fsync(fd))[1])
    output.write(b"one\ntwo\n", 2)
    output.write(b"three\n", 1)
    assert synced == [output._f.fileno()] * 2
    assert (output.lines, output.bytes) == (3, 14)
    assert partial.read_bytes() == b"one\ntwo\nthree\n"
    assert state_file.read_text(encoding="utf-8") == (
        '{\n "bytes": 14,\n "identity": {\n  "alpha": 0.6,\n  "beam": 4,\n  "source": "abc"\n },\n "lines": 3\n}\n')
    output.finish()
    assert out.read_bytes() == b"one\ntwo\nthree\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_partial_output_without_identity_keeps_no_state(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    output = translate_io.PartialOutput(out)
    output.write(b"one\n", 1)
    assert not _partial_state(out)[1].exists()
    output.finish()
    assert out.read_bytes() == b"one\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_partial_output_is_created_readable_and_writable_as_the_umask_allows(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    umask = os.umask(0o022)
    try:
        output = translate_io.PartialOutput(out)
    finally:
        os.umask(umask)
    output.finish()
    assert out.stat().st_mode & 0o777 == 0o644


def test_partial_output_lock_names_the_flag(tmp_path: Path) -> None:
    pytest.importorskip("fcntl", reason="platform: no fcntl (not POSIX)")
    from aiayn.errors import AiaynError

    out = tmp_path / "out.txt"
    first = translate_io.PartialOutput(out)
    try:
        for flag, kwargs in (("--output", {}), ("-o", {"flag": "-o"})):
            with pytest.raises(AiaynError) as info:
                translate_io.PartialOutput(out, **kwargs)
            assert str(info.value).startswith(f"{flag} {out}: is being written by another run (pid {os.getpid()}")
    finally:
        first.abort()


@pytest.mark.parametrize(("kwargs", "flag"), [({}, "--output"), ({"flag": "-o"}, "-o")])
def test_partial_output_that_cannot_be_opened_is_one_error(tmp_path: Path, kwargs: dict, flag: str) -> None:
    from aiayn.errors import AiaynError

    out = tmp_path / "out.txt"
    partial, _ = _partial_state(out)
    partial.mkdir()
    with pytest.raises(AiaynError) as info:
        translate_io.PartialOutput(out, **kwargs)
    assert str(info.value) == f"{flag} {out}: cannot write {partial} (Is a directory)"
    partial.rmdir()
    translate_io.PartialOutput(out).finish()  # the output's lock was let go
    assert out.read_bytes() == b""


def test_partial_output_on_a_full_disk_names_the_partial(tmp_path: Path, monkeypatch) -> None:
    import errno

    from aiayn.errors import EnvironmentFailure

    out = tmp_path / "out.txt"
    partial, _ = _partial_state(out)
    real_open = os.open

    def full_disk(path, *args, **kwargs):
        if Path(path) == partial:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", full_disk)
    with pytest.raises(EnvironmentFailure) as info:
        translate_io.PartialOutput(out, {"input": "abc"})
    assert str(info.value) == f"no space left on device writing {partial}; {out} is unchanged"
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    translate_io.PartialOutput(out).finish()  # the output's lock was let go
    assert out.read_bytes() == b""


# ------------------------------------------------------------------ reading the input


def test_text_lines_keep_spaces_and_drop_only_the_line_end(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(b"  a b  \r\n\tc\t\n \n")
    assert list(translate_io.text_lines(path, "error")) == ["  a b  ", "\tc\t", " "]


def _bad_utf8_file(tmp_path: Path) -> Path:
    path = tmp_path / "in.txt"
    path.write_bytes(b"one\nt\xffo\n")
    return path


def test_text_lines_error_names_the_line_and_the_hint(tmp_path: Path) -> None:
    path = _bad_utf8_file(tmp_path)
    where = f"{path}:2: invalid UTF-8 at byte 1 of the line (byte 5 of the file): invalid start byte"
    with pytest.raises(DataError) as info:
        list(translate_io.text_lines(path, "error"))
    assert str(info.value) == where
    with pytest.raises(DataError) as info:
        list(translate_io.text_lines(path, "error", "use --on-invalid-utf8 replace"))
    assert str(info.value) == f"{where}; use --on-invalid-utf8 replace"
    assert list(translate_io.text_lines(path, "replace")) == ["one", "t\ufffdo"]


def test_scan_text_file_error_names_the_line_and_the_hint(tmp_path: Path) -> None:
    path = _bad_utf8_file(tmp_path)
    where = f"{path}:2: invalid UTF-8 at byte 1 of the line (byte 5 of the file): invalid start byte"
    with pytest.raises(DataError) as info:
        translate_io.scan_text_file(path, "error")
    assert str(info.value) == where
    with pytest.raises(DataError) as info:
        translate_io.scan_text_file(path, "error", hint="use --on-invalid-utf8 replace")
    assert str(info.value) == f"{where}; use --on-invalid-utf8 replace"


def test_scan_text_file_counts_and_hashes_the_decoded_lines(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "in.txt"
    path.write_bytes(b"caf\xc3\xa9\r\nt\xffo\nlast")
    scan = translate_io.scan_text_file(path, "replace")
    assert scan == translate_io.TextScan(3, hashlib.sha256("caf\u00e9\nt\ufffdo\nlast\n".encode()).hexdigest())


def test_scan_text_file_checks_ten_thousand_lines_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(b"x\n" * 10_001)
    seen: list[tuple[int, int]] = []
    scan = translate_io.scan_text_file(path, "error", check=lambda chunk, first: seen.append((len(chunk), first)))
    assert scan.lines == 10_001 and seen == [(10_000, 1), (1, 10_001)]
    seen.clear()
    translate_io.scan_text_file(path, "error", size=4_000, check=lambda chunk, first: seen.append((len(chunk), first)))
    assert seen == [(4_000, 1), (4_000, 4_001), (2_001, 8_001)]


def test_checkpoint_identity_of_a_directory_without_manifest(tmp_path: Path) -> None:
    from aiayn.errors import CheckpointError

    with pytest.raises(CheckpointError) as info:
        translate_io.checkpoint_identity([tmp_path / "missing"])
    assert str(info.value) == f"{tmp_path / 'missing'}: cannot read checksums.sha256 (No such file or directory)"
