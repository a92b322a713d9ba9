import os
import subprocess
import sys

import pytest

CODE = "from aiayn.runtime import tune_allocator; print(tune_allocator(), tune_allocator())"


def _run(env_extra: dict[str, str]) -> str:
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env,
                          check=True).stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_allocator_tuned_once_on_glibc_and_opt_out_respected():
    assert _run({}) == "True True"  # second call: already applied, same answer
    assert _run({"AIAYN_MALLOC": "system"}) == "False False"
