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
SCORE_MARGIN = 1e-3  # as tests/inference/test_cuda_inference.py


def test_serve_on_cuda_answers_and_translates(serve_load: ModuleType, tiny_checkpoint: Path,
                                              sentences: list[str]) -> None:
    texts = sentences[:6]
    with serve_load.start_server(tiny_checkpoint, "--threads", "1", "--device", "cuda",
                                  "--dtype", "fp32") as srv:
        assert httpx.get(f"{srv.url}/health", timeout=TIMEOUT).status_code == 200
        info = httpx.get(f"{srv.url}/v1/model", timeout=TIMEOUT).json()
        assert info["device"].startswith("cuda")
        assert info["dtype"] == "fp32"
        r = httpx.post(f"{srv.url}/v1/translate", json={"texts": texts}, timeout=TIMEOUT)
        assert r.status_code == 200, srv.log()
        served = r.json()["translations"]
    served_texts = [t if isinstance(t, str) else t["text"] for t in served]
    # The CPU translator's (float32 both): its best, or -- where its best scores lie closer
    # than the devices' float32 rounding (sums in another order) -- one of its n-best as good.
    expected = Translator.from_checkpoint(tiny_checkpoint, dtype="fp32").translate_detailed(texts, nbest=4)
    same = 0
    for text, got, cpu in zip(texts, served_texts, expected):
        best = cpu.hypotheses[0]
        if got == best.text:
            same += 1
            continue
        rivals = [h for h in cpu.hypotheses if h.text == got]
        assert rivals and abs(rivals[0].score - best.score) < SCORE_MARGIN, f"{text!r}: {got!r}"
    assert same >= len(texts) * 3 // 4
