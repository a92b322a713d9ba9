"""Reading EVALB parameter files (.prm): values, defaults, list keys, and the exact message
of each malformed line, whatever the locale."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import aiayn
from aiayn.errors import DataError
from aiayn.evaluation.evalb import EvalbParams


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "DEBUG 0\nQUOTE_LABELS x\n",
            ":2: unknown EVALB parameter 'QUOTE_LABELS' (known: DEBUG, MAX_ERROR, CUTOFF_LEN, LABELED, "
            "DELETE_LABEL, DELETE_LABEL_FOR_LENGTH, QUOTE_LABEL, EQ_LABEL, EQ_WORD)",
        ),
        ("# c\nEQ_LABEL A\n", ":2: EQ_LABEL takes 2 value(s), got 1: 'A'"),
        ("EQ_WORD a b c\n", ":1: EQ_WORD takes 2 value(s), got 3: 'a b c'"),
        ("CUTOFF_LEN forty\n", ":1: CUTOFF_LEN needs an integer, got 'forty'"),
    ],
)
def test_prm_error_messages_exactly(tmp_path: Path, text: str, message: str) -> None:
    prm = write(tmp_path / "p.prm", text)
    with pytest.raises(DataError) as e:
        EvalbParams.read(prm)
    assert str(e.value) == f"{prm}{message}"


def test_prm_missing_file_message(tmp_path: Path) -> None:
    with pytest.raises(DataError) as e:
        EvalbParams.read(tmp_path / "nope.prm")
    assert str(e.value) == f"{tmp_path / 'nope.prm'}: cannot read parameter file (No such file or directory)"


def test_prm_reading_does_not_depend_on_the_locale(tmp_path: Path) -> None:
    # Under an ASCII locale (no UTF-8 mode, no locale coercion) a UTF-8 parameter file still reads.
    prm = write(tmp_path / "p.prm", "DELETE_LABEL «\nEQ_WORD é e\n")
    code = "import sys; from aiayn.evaluation.evalb import EvalbParams; print(ascii(EvalbParams.read(sys.argv[1])))"
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
           "PYTHONPATH": str(Path(aiayn.__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code, str(prm)], env=env, capture_output=True, text=True,
                          check=False)
    expected = EvalbParams(delete_labels=frozenset({"«"}), eq_words=(("é", "e"),))
    assert EvalbParams.read(prm) == expected  # in this process, whatever its locale
    assert (done.returncode, done.stdout) == (0, ascii(expected) + "\n"), done.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # keys left out take EVALB's built-in values
        ("DELETE_LABEL X\n", EvalbParams(delete_labels=frozenset({"X"}))),
        ("", EvalbParams()),
        # a number key given twice: the last line wins
        (
            "MAX_ERROR 1\nMAX_ERROR 3\nCUTOFF_LEN 30\nDEBUG 1\nLABELED 5\n",
            EvalbParams(max_error=3, cutoff_len=30, debug=1, labeled=True),
        ),
        ("LABELED -1\nCUTOFF_LEN +7\n", EvalbParams(labeled=True, cutoff_len=7)),
        ("QUOTE_LABEL ``\nQUOTE_LABEL CD\nEQ_LABEL A B\n", EvalbParams(quote_labels=frozenset({"``", "CD"}),
                                                                        eq_labels=(("A", "B"),))),
    ],
)
def test_prm_values_and_defaults(tmp_path: Path, text: str, expected: EvalbParams) -> None:
    assert EvalbParams.read(write(tmp_path / "p.prm", text)) == expected


def test_prm_reader_accumulates_lists(tmp_path: Path) -> None:
    prm = tmp_path / "p.prm"
    prm.write_text(
        "##---\nDEBUG 2\nLABELED 0   \nDELETE_LABEL TOP\nDELETE_LABEL ,\n"
        "DELETE_LABEL_FOR_LENGTH -NONE-\n\nEQ_WORD  a b\n# EQ_WORD c d\n"
    )
    assert EvalbParams.read(prm) == EvalbParams(
        debug=2,
        labeled=False,
        delete_labels=frozenset({"TOP", ","}),
        delete_labels_for_length=frozenset({"-NONE-"}),
        eq_words=(("a", "b"),),
    )
