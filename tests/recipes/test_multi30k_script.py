"""scripts/multi30k.sh refuses bad settings with one line and exit 2, before any training
starts (the end-to-end run itself is the slow test beside this file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import MIRROR, ROOT


def _script(tmp_path: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "DATA_DIR": str(MIRROR), "PREPARED": str(tmp_path / "data-bin"),
                "RUN": str(tmp_path / "run"), "AIAYN": str(Path(sys.executable).with_name("aiayn")), **env}
    return subprocess.run(["bash", str(ROOT / "scripts" / "multi30k.sh"), *overrides],
                          cwd=ROOT, env=full_env, capture_output=True, text=True)


@pytest.mark.parametrize("members", ["0", "two", "-1", "1.5"])
def test_members_must_be_a_whole_number(tmp_path: Path, members: str) -> None:
    proc = _script(tmp_path, MEMBERS=members)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"multi30k.sh: MEMBERS={members}: give a whole number of models, 1 or more"]
    assert not (tmp_path / "data-bin").exists() and not (tmp_path / "run").exists()


def test_a_bad_override_stops_before_the_members_start(tmp_path: Path) -> None:
    if not (MIRROR / "multi30k").is_dir():
        pytest.skip(f"no multi30k at {MIRROR} (set AIAYN_DATA_MIRROR)")
    proc = _script(tmp_path, "train.max_stepz=3")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "train.max_stepz" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # no member was started
