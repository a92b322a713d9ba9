"""Running a recipe script end to end, as a user does, from the offline data mirror."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIRROR = Path(os.environ.get("AIAYN_DATA_MIRROR", ROOT.parent / "shared" / "data"))


@pytest.fixture
def run_recipe(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_recipe(script, data, *overrides)``: ``scripts/SCRIPT`` with its data from the
    mirror's ``DATA`` folder (skipped without it), prepared data in ``tmp_path/data-bin``, the
    run in ``tmp_path/run``, the last 3 checkpoints averaged; asserts it succeeded."""

    def run(script: str, data: str, *overrides: str) -> subprocess.CompletedProcess[str]:
        if not (MIRROR / data).is_dir():
            pytest.skip(f"no {data} at {MIRROR} (set AIAYN_DATA_MIRROR)")
        env = {**os.environ, "DATA_DIR": str(MIRROR), "PREPARED": str(tmp_path / "data-bin"),
               "RUN": str(tmp_path / "run"), "AVERAGE": "3", "AIAYN": str(Path(sys.executable).with_name("aiayn"))}
        proc = subprocess.run(["bash", str(ROOT / "scripts" / script), *overrides],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    return run
