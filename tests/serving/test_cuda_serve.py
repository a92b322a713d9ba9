"""``aiayn serve --device cuda``: a real server on the GPU answers health checks and
translates as the CPU translator does. Runs where a GPU is present (``pytest -m cuda``)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")

from aiayn.inference.translator import Translator  # noqa: E402

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="platform: no CUDA device")]

TIMEOUT = 120.0


def test_serve_on_cuda_answers_and_translates(serve_load: ModuleType, tiny_checkpoint: Path,
                                              sentences: list[str]) -> None:
    texts = sentences[:6]
    with serve_load.start_server(tiny_checkpoint, "--threads", "1", "--device", "cuda") as srv:
        assert httpx.get(f"{srv.url}/health", timeout=TIMEOUT).status_code == 200
        info = httpx.get(f"{srv.url}/v1/model", timeout=TIMEOUT).json()
        assert info["device"].startswith("cuda")
        r = httpx.post(f"{srv.url}/v1/translate", json={"texts": texts}, timeout=TIMEOUT)
        assert r.status_code == 200, srv.log()
        served = r.json()["translations"]
    expected = Translator.from_checkpoint(tiny_checkpoint, device="cuda").translate(texts)
    assert [t if isinstance(t, str) else t["text"] for t in served] == expected
