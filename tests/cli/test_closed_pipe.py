"""A reader that closes standard output early (`aiayn evaluate ... | head -1`) ends the command
quietly with a shell's SIGPIPE code, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_closed_standard_output_is_a_quiet_exit(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("ein Hund läuft .\nzwei Katzen .\n", encoding="utf-8")
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to standard output fails with EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "aiayn", "evaluate", "--hyp", str(text), "--ref", str(text)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")
