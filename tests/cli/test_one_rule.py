"""The rules every subcommand shares, at their one place: no output is, holds or lies inside
an input (:func:`aiayn.fileio.check_not_input`: symlinks resolved, hard links compared,
pointers followed); error lines echo values capped (:func:`aiayn.cli.main.capped`); and no
search emits a hypothesis from a row its constraints left without a token (a score of -inf
written into a translation, or sampling from nothing)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from aiayn import fileio
from aiayn.cli.main import MAX_ECHO, MAX_MESSAGE, capped
from aiayn.config import DecodeConfig
from aiayn.errors import AiaynError

# ------------------------------------------------------------------ outputs and inputs


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory whose ``checkpoints/last`` names ``step_2``, a checkpoint directory."""
    ck = tmp_path / "run" / "checkpoints" / "step_2"
    ck.mkdir(parents=True)
    (ck / "model.safetensors").write_bytes(b"weights")
    (ck / "config.yaml").write_text("model: {}\n", encoding="utf-8")
    (ck.parent / "last").write_text("step_2\n", encoding="utf-8")
    return tmp_path / "run"


@pytest.mark.parametrize(("out", "inputs", "message"), [
    ("run/checkpoints/step_2/config.yaml", ["run/checkpoints/step_2"], "lies inside the input"),
    # Through the pointer: the run directory's last checkpoint is an input too.
    ("run/checkpoints/step_2/out.txt", ["run/checkpoints/last"], "lies inside the input "),
    ("link/config.yaml", ["run/checkpoints/step_2"], "lies inside the input"),  # a symlink to it
    ("hard.bin", ["run/checkpoints/step_2"], "is also the input file "),  # a hard link into it
    ("text.txt", ["text_link.txt"], "is also an input"),
])
def test_an_output_that_is_or_lies_inside_an_input_is_refused(run_dir: Path, tmp_path: Path, out: str,
                                                              inputs: list[str], message: str) -> None:
    (tmp_path / "link").symlink_to(run_dir / "checkpoints" / "step_2")
    os.link(run_dir / "checkpoints" / "step_2" / "model.safetensors", tmp_path / "hard.bin")
    (tmp_path / "text.txt").write_text("x\n", encoding="utf-8")
    (tmp_path / "text_link.txt").symlink_to(tmp_path / "text.txt")
    with pytest.raises(AiaynError, match="^--output ") as exc:
        fileio.check_not_input(tmp_path / out, [tmp_path / p for p in inputs])
    assert message in str(exc.value)
    if inputs == ["run/checkpoints/last"]:  # found through the pointer, and said so
        assert f"(through {(run_dir / 'checkpoints' / 'step_2').resolve()})" in str(exc.value)


def test_a_directory_output_holding_an_input_would_replace_it(run_dir: Path) -> None:
    with pytest.raises(AiaynError, match="would replace the input"):
        fileio.check_not_input(run_dir.parent, [run_dir / "checkpoints" / "last"], "--out", directory=True)


@pytest.mark.parametrize("out", ["elsewhere/out.txt", "run_out.txt", "hard_elsewhere.bin"])
def test_an_output_beside_the_inputs_passes(run_dir: Path, tmp_path: Path, out: str) -> None:
    (tmp_path / "elsewhere").mkdir()
    other = tmp_path / "elsewhere" / "source.bin"
    other.write_bytes(b"data")
    os.link(other, tmp_path / "hard_elsewhere.bin")  # a hard link, but not to an input
    assert fileio.check_not_input(tmp_path / out, [run_dir, None, "-"]) == tmp_path / out


# ------------------------------------------------------------------ capped messages


def test_a_long_value_is_cut_and_its_length_said() -> None:
    value = "'" + "x" * 100_000 + "'"
    line = capped(f"decode.tgt_lang: a language code, got {value}")
    assert line == f"decode.tgt_lang: a language code, got {value[:MAX_ECHO // 2]}...[100,002 characters]"


def test_a_long_message_of_short_words_is_cut_in_the_middle() -> None:
    line = capped("start " + "ab " * 50_000 + "end")
    assert len(line) <= MAX_MESSAGE + 40
    assert line.startswith("start ab ") and line.endswith(" end") and "characters]..." in line


def test_a_short_message_is_unchanged() -> None:
    text = "x" * MAX_ECHO + " " + "y" * 10
    assert capped(text) == text


# ------------------------------------------------------------------ dead ends in a search


class _DeadEnd:
    """Every token masked at step 1 for the rows of sentence 0; nothing masked otherwise."""

    def start(self, sent: torch.Tensor, max_len: torch.Tensor) -> _DeadEndState:
        return _DeadEndState(sent == 0)


class _DeadEndState:
    def __init__(self, doomed: torch.Tensor) -> None:
        self.doomed = doomed

    def mask(self, lprobs: torch.Tensor, t: int) -> None:
        if t == 1:
            lprobs[self.doomed] = float("-inf")

    def select(self, index: torch.Tensor) -> None:
        self.doomed = self.doomed[index]

    def advance(self, tokens: torch.Tensor) -> None:
        pass


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sampling"])
def test_a_row_left_without_a_token_gives_no_hypothesis(sampling: bool, tiny_config) -> None:
    from aiayn.inference.adapters import IncrementalDecoder
    from aiayn.inference.search import SearchInputs, search
    from aiayn.model import build_model

    torch.manual_seed(0)
    decoder = IncrementalDecoder(build_model(tiny_config).eval())
    src = torch.tensor([[5, 6, 7, 3], [8, 9, 10, 3]])
    cfg = DecodeConfig(beam=2 if sampling else 1, sampling=sampling, max_len_a=0.0, max_len_b=4, nbest=1)
    free = search(decoder, src, cfg)
    got = search(decoder, src, cfg, SearchInputs(constraint=_DeadEnd()))
    assert got[0] == []  # not a hypothesis scored -inf
    assert got[1] and all(torch.isfinite(torch.tensor(h.score)) for h in got[1])
    if not sampling:  # (a sample's draws depend on the rows beside it)
        assert [h.tokens for h in got[1]] == [h.tokens for h in free[1]]


def test_a_run_directory_is_read_through_its_pointers(run_dir: Path) -> None:
    """A translation may be written into the run directory it reads, beside its checkpoints."""
    assert fileio.check_not_input(run_dir / "test.hyp", [run_dir]) == run_dir / "test.hyp"
    with pytest.raises(AiaynError, match="lies inside the input"):
        fileio.check_not_input(run_dir / "checkpoints" / "step_2" / "test.hyp", [run_dir])
    with pytest.raises(AiaynError, match="is also an input"):
        fileio.check_not_input(run_dir / "checkpoints" / "last", [run_dir])


def test_a_folder_read_in_part_may_hold_an_output_but_not_be_replaced(tmp_path: Path) -> None:
    """A data mirror: prepared data may be written inside it, never over it."""
    mirror = tmp_path / "mirror"
    (mirror / "multi30k").mkdir(parents=True)
    assert fileio.check_empty_dir(mirror / "prepared", folders=[mirror]) == mirror / "prepared"
    with pytest.raises(AiaynError, match="would replace the input"):
        fileio.check_empty_dir(tmp_path, force=True, folders=[mirror])
    with pytest.raises(AiaynError, match="lies inside the input"):  # an input read whole
        fileio.check_empty_dir(mirror / "prepared", inputs=[mirror])
