"""A second process compiling the same model's decoding step loads it from the compile cache
(aiayn.runtime.use_compile_cache): AOTAutograd's and inductor's caches hit, nothing is
lowered or built again, and the translations are the first process's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Two processes compile (the first from an empty cache): minutes on a busy 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

CHILD = """
import json, sys
import torch
from torch._dynamo.utils import counters
from aiayn.inference.translator import Translator

torch.set_num_threads(1)
translator = Translator.from_checkpoint(sys.argv[1], device="cpu", dtype=sys.argv[2])
translator.use_compiled()
texts = json.loads(sys.argv[3])
out = translator.translate(texts)
ran = getattr(translator.decoder, "compiled_ran", False)
print(json.dumps({"out": out, "ran": ran, "inductor": dict(counters["inductor"]),
                  "aot": dict(counters["aot_autograd"])}))
"""


def _compile_in_a_fresh_process(checkpoint: Path, dtype: str, texts: list[str], cache: Path) -> dict:
    env = dict(os.environ, AIAYN_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(checkpoint), dtype, json.dumps(texts)],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_second_process_loads_the_compiled_step_from_the_cache(tiny_checkpoint: Path, english: list[str],
                                                                 tmp_path: Path, dtype: str) -> None:
    if not any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")):
        pytest.skip("platform: no C++ compiler for inductor")
    texts = english[:4]
    first = _compile_in_a_fresh_process(tiny_checkpoint, dtype, texts, tmp_path)
    assert first["ran"], "the compiled step did not run"
    assert first["inductor"].get("fxgraph_cache_miss", 0) >= 1 and first["aot"].get("autograd_cache_miss", 0) >= 1
    second = _compile_in_a_fresh_process(tiny_checkpoint, dtype, texts, tmp_path)
    assert second["ran"] and second["out"] == first["out"]
    # Every graph came from the cache: none traced by AOTAutograd nor lowered by inductor again.
    assert second["aot"].get("autograd_cache_hit", 0) >= 1
    assert second["aot"].get("autograd_cache_miss", 0) == 0
    assert second["aot"].get("autograd_cache_bypass", 0) == 0
    assert second["inductor"].get("fxgraph_cache_miss", 0) == 0
    assert second["inductor"].get("fxgraph_cache_bypass", 0) == 0
