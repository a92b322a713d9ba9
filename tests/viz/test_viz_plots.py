"""Attention heatmaps, training curves and the `aiayn plot` command: non-empty PNGs of the
expected pixel size."""

from __future__ import annotations

import argparse
import importlib.util
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.errors import AiaynError, DataError
from aiayn.viz.attention import attention_size, heads_size, plot_attention, plot_heads
from aiayn.viz.curves import DEFAULT_SIZE, plot_curves, read_metrics

REPO = Path(__file__).resolve().parents[2]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert len(data) > 2000, f"{path} is suspiciously small ({len(data)} bytes)"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    return width, height


def attention(t: int, s: int, heads: int = 4, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(s), size=(heads, t))  # rows sum to 1, like softmax output


# ---------------------------------------------------------------- attention


def test_plot_attention_exact_size(tmp_path: Path) -> None:
    w = attention(5, 7)[0]
    out = plot_attention(w, list("abcdefg"), ["▁x", "▁y", "z", "w"], tmp_path / "sub" / "a.png", title="t",
                         size=(640, 480))
    assert out == tmp_path / "sub" / "a.png"
    assert png_size(out) == (640, 480)


def test_plot_attention_default_size_follows_lengths_and_takes_tensors(tmp_path: Path) -> None:
    w = torch.softmax(torch.randn(12, 20), dim=-1)
    out = plot_attention(w, [f"s{i}" for i in range(20)], [f"t{i}" for i in range(12)], tmp_path / "a.png")
    assert png_size(out) == attention_size(12, 20)
    assert attention_size(30, 40)[0] > attention_size(3, 4)[0]


def test_plot_heads_grid(tmp_path: Path) -> None:
    a = attention(5, 7, heads=8)
    out = plot_heads(a, list("abcdefg"), list("vwxyz"), tmp_path / "h.png", layer=1)
    assert png_size(out) == heads_size(8, 5, 7)
    out = plot_heads(a[:3], list("abcdefg"), list("vwxyz"), tmp_path / "h3.png", size=(900, 400))
    assert png_size(out) == (900, 400)


def test_plot_shapes_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="target, source"):
        plot_attention(attention(2, 3), ["a"], ["b"], tmp_path / "x.png")
    with pytest.raises(ValueError, match="heads, target, source"):
        plot_heads(attention(2, 3)[0], ["a"], ["b"], tmp_path / "x.png")


# ---------------------------------------------------------------- curves


def write_metrics(run: Path, with_bleu: bool = True, broken_tail: bool = True) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    lines = []
    for s in range(1, 101):
        lines.append(json.dumps({"step": s * 10, "epoch": 1, "loss": 5 / (1 + s / 20), "nll": 4 / (1 + s / 20),
                                 "ppl": 3.0, "lr": 1e-3 * min(s / 20, (20 / s) ** 0.5), "grad_norm": 1.0,
                                 "tokens_per_s": 1000.0, "elapsed": s}))
        if s % 25 == 0:
            valid = {"step": s * 10, "valid_loss": 5 / (1 + s / 25), "valid_ppl": 40 / s}
            if with_bleu:
                valid["valid_bleu"] = s / 4
            lines.append(json.dumps(valid))
    text = "\n".join(lines) + "\n"
    if broken_tail:
        text += '{"step": 1010, "loss":'  # a run killed mid-write
    (run / "metrics.jsonl").write_text(text, encoding="utf-8")
    return run


def test_read_metrics_keeps_what_is_there(tmp_path: Path) -> None:
    m = read_metrics(write_metrics(tmp_path / "run"))
    assert len(m.series["loss"]) == 100
    assert len(m.series["valid_bleu"]) == 4
    assert m.series["valid_loss"][0][0] == 250.0
    assert m.name == "run"


def test_plot_curves_size(tmp_path: Path) -> None:
    run = write_metrics(tmp_path / "run")
    assert png_size(plot_curves(run, tmp_path / "c.png")) == DEFAULT_SIZE
    no_bleu = write_metrics(tmp_path / "run2", with_bleu=False, broken_tail=False)
    assert png_size(plot_curves([run, no_bleu], tmp_path / "two.png", size=(800, 500))) == (800, 500)


def test_plot_curves_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no metrics file"):
        plot_curves(tmp_path / "missing", tmp_path / "c.png")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="no metrics"):
        plot_curves(tmp_path / "empty", tmp_path / "c.png")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "metrics.jsonl").write_text('{"step": 1, "foo": 2}\n', encoding="utf-8")
    with pytest.raises(DataError, match="nothing to plot"):
        plot_curves(tmp_path / "odd", tmp_path / "c.png")


# ---------------------------------------------------------------- the command


def run_cli(argv: list[str]) -> int:
    from aiayn.cli.main import build_parser

    args: argparse.Namespace = build_parser().parse_args(argv)
    return args.func(args)


def test_cli_plot_curves(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = write_metrics(tmp_path / "run")
    assert run_cli(["plot", "curves", str(run), "--size", "640x480"]) == 0
    assert png_size(run / "curves.png") == (640, 480)
    assert "curves.png" in capsys.readouterr().out
    with pytest.raises(AiaynError, match="PNG"):
        run_cli(["plot", "curves", str(run), "--out", str(tmp_path / "c.jpg")])
    with pytest.raises(SystemExit):  # argparse rejects a malformed size
        run_cli(["plot", "curves", str(run), "--size", "big"])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The same tiny random checkpoint the serving tests and the load benchmark use.
    name = "aiayn_bench_serve_load"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / "serve_load.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name].make_tiny_checkpoint(tmp_path_factory.mktemp("plot_ckpt"))


def test_cli_plot_attention(checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    text = "the young child follows some small red horses"
    out = tmp_path / "attn.png"
    assert run_cli(["plot", "attention", "--checkpoint", str(checkpoint), "--text", text, "--out", str(out),
                    "--size", "1000x700"]) == 0
    assert png_size(out) == (1000, 700)
    assert "translation:" in capsys.readouterr().out

    # Every layer (the tiny preset has 2), default sizes; and the head average.
    assert run_cli(["plot", "attention", "--checkpoint", str(checkpoint), "--text", text, "--out",
                    str(tmp_path / "all.png"), "--layer", "0", "--beam", "2"]) == 0
    for layer in (1, 2):
        w, h = png_size(tmp_path / f"all_layer{layer}.png")
        assert w >= 500 and h >= 300
    assert run_cli(["plot", "attention", "--checkpoint", str(checkpoint), "--text", text, "--out",
                    str(tmp_path / "avg.png"), "--average", "--size", "600x500"]) == 0
    assert png_size(tmp_path / "avg.png") == (600, 500)

    with pytest.raises(AiaynError, match="out of range"):
        run_cli(["plot", "attention", "--checkpoint", str(checkpoint), "--text", text, "--layer", "7",
                 "--out", str(tmp_path / "x.png")])
