"""`aiayn translate` starts without loading what it does not use: the serving stack, plotting,
scoring, the interop libraries, torch.compile's machinery. Checked in a fresh process, so
that an import added anywhere on its path shows here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Heavy modules the eager translation path never needs (each costs tenths of a second to
# seconds of start-up, or pulls in an optional extra).
NOT_FOR_TRANSLATE = ("transformers", "fastapi", "uvicorn", "starlette", "pydantic", "httpx", "matplotlib", "PIL",
                     "sacrebleu", "sacremoses", "ctranslate2", "tensorboard", "wandb", "pandas", "scipy", "sympy",
                     "torch._dynamo", "torch._inductor")

CHECK = """
import json, sys
from aiayn.cli.main import main
try:
    main(sys.argv[2:])
except SystemExit as exc:
    assert not exc.code, exc.code
with open(sys.argv[1], "w") as f:
    json.dump(sorted(sys.modules), f)
"""


@pytest.mark.parametrize("options", [["--dtype", "fp32"], ["--dtype", "int8"], []], ids=["fp32", "int8", "defaults"])
def test_translate_imports_no_heavy_module_it_does_not_use(tiny_checkpoint: Path, tmp_path: Path,
                                                           options: list[str]) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a man is riding a bike\n", encoding="utf-8")
    loaded = tmp_path / "modules.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHECK, str(loaded), "translate", "--checkpoint", str(tiny_checkpoint),
                           "-i", str(src), *options, "--quiet"], env=env, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert len(proc.stdout.splitlines()) == 1
    modules = set(json.loads(loaded.read_text()))
    assert "aiayn.inference.translator" in modules  # the check saw the translation's imports
    assert sorted(m for m in NOT_FOR_TRANSLATE if m in modules) == []
