"""Attention heatmaps, training curves and the `aiayn plot` command: PNGs of the expected
pixel size, and (through the matplotlib Figure each one is saved from) what they draw:
the heatmaps' values, labels and colour scale, the curves' points, panels and legends."""

from __future__ import annotations

import argparse
import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from tests.tiny_world import SERVING

import aiayn.viz.attention as viz_attention
import aiayn.viz.curves as viz_curves
from aiayn.errors import AiaynError, DataError
from aiayn.viz.attention import attention_size, heads_size, plot_attention, plot_heads
from aiayn.viz.curves import DEFAULT_SIZE, plot_curves, read_metrics


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert len(data) > 2000, f"{path} is suspiciously small ({len(data)} bytes)"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    return width, height


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """Every Figure the plotting functions save, in order (they still write their PNGs)."""
    seen: list[Figure] = []
    save = viz_attention.save_png

    def keep(fig: Figure, path: str | Path) -> Path:
        seen.append(fig)
        return save(fig, path)

    monkeypatch.setattr(viz_attention, "save_png", keep)
    monkeypatch.setattr(viz_curves, "save_png", keep)
    return seen


def heatmaps(fig: Figure) -> list:
    """The axes holding a heatmap (not the colour bar, not a blank grid cell), in order."""
    return [ax for ax in fig.axes if ax.images]


def shown(ax) -> np.ndarray:
    return np.asarray(ax.images[0].get_array())


def ticks(labels) -> list[str]:
    return [t.get_text() for t in labels]


def colorbars(fig: Figure) -> int:
    return sum(ax.get_label() == "<colorbar>" for ax in fig.axes)


def attention(t: int, s: int, heads: int = 4, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(s), size=(heads, t))  # rows sum to 1, like softmax output


# ---------------------------------------------------------------- attention


def test_plot_attention_exact_size(tmp_path: Path, figures: list[Figure]) -> None:
    w = attention(5, 7)[0]
    out = plot_attention(w, list("abcdefg"), ["▁x", "▁y", "z", "w"], tmp_path / "sub" / "a.png", title="t",
                         size=(640, 480))
    assert out == tmp_path / "sub" / "a.png"
    assert png_size(out) == (640, 480)
    (fig,) = figures
    (ax,) = heatmaps(fig)
    assert colorbars(fig) == 1
    np.testing.assert_array_equal(shown(ax), w)  # rows: target, columns: source
    assert ax.images[0].get_clim() == (0.0, w.max())
    assert ticks(ax.get_xticklabels()) == list("abcdefg")
    # 5 rows for 4 target pieces: the last row is the EOS step.
    assert ticks(ax.get_yticklabels()) == ["▁x", "▁y", "z", "w", "</s>"]
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("t", "source", "target")


def test_plot_attention_default_size_follows_lengths_and_takes_tensors(tmp_path: Path,
                                                                       figures: list[Figure]) -> None:
    w = torch.softmax(torch.randn(12, 20), dim=-1)
    out = plot_attention(w, [f"s{i}" for i in range(20)], [f"t{i}" for i in range(12)], tmp_path / "a.png")
    assert png_size(out) == attention_size(12, 20)
    assert attention_size(30, 40)[0] > attention_size(3, 4)[0]
    np.testing.assert_array_equal(shown(heatmaps(figures[0])[0]), w.double().numpy())


def test_plot_heads_grid(tmp_path: Path, figures: list[Figure]) -> None:
    a = attention(5, 7, heads=8)
    out = plot_heads(a, list("abcdefg"), list("vwxyz"), tmp_path / "h.png", layer=1)
    assert png_size(out) == heads_size(8, 5, 7)
    out = plot_heads(a[:3], list("abcdefg"), list("vwxyz"), tmp_path / "h3.png", size=(900, 400))
    assert png_size(out) == (900, 400)
    eight, three = figures
    assert eight.get_suptitle() == "decoder layer 2: cross-attention"
    assert colorbars(eight) == 1
    panels = heatmaps(eight)
    assert [ax.get_title() for ax in panels] == [f"head {h}" for h in range(1, 9)]
    for h, ax in enumerate(panels):  # head h in panel h, one colour scale for all
        np.testing.assert_array_equal(shown(ax), a[h])
        assert ax.images[0].get_clim() == (0.0, a.max())
        assert ticks(ax.get_xticklabels()) == list("abcdefg")
        # target labels on the first column of the 2 x 4 grid only
        assert ticks(ax.get_yticklabels()) == (list("vwxyz") if h % 4 == 0 else [""] * 5)
    assert three.get_suptitle() == "cross-attention"
    assert len(heatmaps(three)) == 3 and len(three.axes) == 3 + 1  # one row of 3 panels, no blank cell
    for h, ax in enumerate(heatmaps(three)):
        np.testing.assert_array_equal(shown(ax), a[h])
        assert ax.images[0].get_clim() == (0.0, a[:3].max())


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


def lines_of(ax) -> dict[str, tuple[list[float], list[float]]]:
    """legend label -> (x values, y values) of each line drawn on ``ax``."""
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def series(run: Path, key: str) -> tuple[list[float], list[float]]:
    """``key``'s (steps, values) as write_metrics wrote them, read back from the JSON lines."""
    points = []
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # the broken tail
        if key in rec:
            points.append((float(rec["step"]), float(rec[key])))
    return [x for x, _ in points], [y for _, y in points]


def test_plot_curves_size(tmp_path: Path, figures: list[Figure]) -> None:
    run = write_metrics(tmp_path / "run")
    assert png_size(plot_curves(run, tmp_path / "c.png")) == DEFAULT_SIZE
    no_bleu = write_metrics(tmp_path / "run2", with_bleu=False, broken_tail=False)
    assert png_size(plot_curves([run, no_bleu], tmp_path / "two.png", size=(800, 500))) == (800, 500)
    one, two = figures

    # One run: 4 panels in a 2 x 2 grid, each line exactly the metrics written.
    assert one.get_suptitle() == "run"
    panels = [ax for ax in one.axes if ax.axison]
    assert [ax.get_title() for ax in panels] == ["loss", "validation BLEU", "validation perplexity", "learning rate"]
    loss, bleu, ppl, lr = (lines_of(ax) for ax in panels)
    assert loss == {"train loss": series(run, "loss"), "train NLL": series(run, "nll"),
                    "valid loss": series(run, "valid_loss")}
    assert len(loss["train loss"][0]) == 100 and len(loss["valid loss"][0]) == 4
    assert bleu == {"valid BLEU": series(run, "valid_bleu")}
    assert ppl == {"valid ppl": series(run, "valid_ppl")}
    assert lr == {"learning rate": series(run, "lr")}
    assert [ax.get_yscale() for ax in panels] == ["linear", "linear", "log", "linear"]
    assert all(ax.get_xlabel() == "step" for ax in panels)

    # Two runs, one without BLEU: both on each panel, named; only one on the BLEU panel.
    assert two.get_suptitle() == ""
    panels = two.axes
    assert [ax.get_title() for ax in panels] == ["loss", "validation BLEU", "validation perplexity", "learning rate"]
    assert sorted(lines_of(panels[0])) == sorted(f"{name}: {label}" for name in ("run", "run2")
                                                 for label in ("train loss", "train NLL", "valid loss"))
    assert lines_of(panels[1]) == {"run: valid BLEU": series(run, "valid_bleu")}
    assert lines_of(panels[2]) == {"run: valid ppl": series(run, "valid_ppl"),
                                   "run2: valid ppl": series(no_bleu, "valid_ppl")}
    assert [text.get_text() for text in panels[3].get_legend().get_texts()] == ["run: learning rate",
                                                                               "run2: learning rate"]

    # No BLEU at all: no BLEU panel; 3 panels in the 2 x 2 grid, its 4th cell blank.
    plot_curves(no_bleu, tmp_path / "no_bleu.png")
    fig = figures[2]
    assert len(fig.axes) == 4 and not fig.axes[3].axison
    assert [ax.get_title() for ax in fig.axes[:3]] == ["loss", "validation perplexity", "learning rate"]
    assert lines_of(fig.axes[1]) == {"valid ppl": series(no_bleu, "valid_ppl")}


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


def test_cli_plot_curves(tmp_path: Path, capsys: pytest.CaptureFixture, figures: list[Figure]) -> None:
    run = write_metrics(tmp_path / "run")
    assert run_cli(["plot", "curves", str(run), "--size", "640x480", "--title", "my run"]) == 0
    assert png_size(run / "curves.png") == (640, 480)
    assert capsys.readouterr().out == f"wrote {run / 'curves.png'} (from {run / 'metrics.jsonl'})\n"
    (fig,) = figures
    assert fig.get_suptitle() == "my run"
    assert lines_of(fig.axes[0])["train loss"] == series(run, "loss")
    assert lines_of(fig.axes[1]) == {"valid BLEU": series(run, "valid_bleu")}
    with pytest.raises(AiaynError, match="PNG"):
        run_cli(["plot", "curves", str(run), "--out", str(tmp_path / "c.jpg")])
    with pytest.raises(SystemExit):  # argparse rejects a malformed size
        run_cli(["plot", "curves", str(run), "--size", "big"])


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoints: Callable[..., Path]) -> Path:
    """The serving tests' tiny random checkpoint (tests/tiny_world.py, ``SERVING``)."""
    return tiny_checkpoints(**SERVING)


def test_cli_plot_attention(checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                            figures: list[Figure]) -> None:
    from aiayn.inference.translator import Translator

    text = "the young child follows some small red horses"
    translator = Translator.from_checkpoint(checkpoint)
    best = translator.translate_detailed([text], attention=True)[0].best
    expected = best.attention.double().numpy()  # (layers, heads, target, source)
    assert expected.shape[:2] == (2, 4)
    out = tmp_path / "attn.png"
    assert run_cli(["plot", "attention", "--checkpoint", str(checkpoint), "--text", text, "--out", str(out),
                    "--size", "1000x700"]) == 0
    assert png_size(out) == (1000, 700)
    assert f"translation: {best.text}\n" in capsys.readouterr().out
    # The last layer by default: its 4 heads, labelled with the source and target pieces.
    (fig,) = figures
    assert fig.get_suptitle() == "decoder layer 2: cross-attention"
    for h, ax in enumerate(heatmaps(fig)):
        np.testing.assert_allclose(shown(ax), expected[1, h], rtol=0, atol=1e-7)
    assert ticks(heatmaps(fig)[0].get_xticklabels()) == best.src_pieces
    assert ticks(heatmaps(fig)[0].get_yticklabels()) == best.tgt_pieces

    # Every layer (the tiny preset has 2), default sizes; and the head average.
    two = translator.translate_detailed([text], attention=True, beam=2)[0].best.attention.double().numpy()
    assert run_cli(["plot", "attention", "--checkpoint", str(checkpoint), "--text", text, "--out",
                    str(tmp_path / "all.png"), "--layer", "0", "--beam", "2"]) == 0
    for layer in (1, 2):
        fig = figures[layer]
        assert png_size(tmp_path / f"all_layer{layer}.png") == heads_size(4, *two.shape[2:])
        assert fig.get_suptitle() == f"decoder layer {layer}: cross-attention"
        for h, ax in enumerate(heatmaps(fig)):
            np.testing.assert_allclose(shown(ax), two[layer - 1, h], rtol=0, atol=1e-7)
    assert run_cli(["plot", "attention", "--checkpoint", str(checkpoint), "--text", text, "--out",
                    str(tmp_path / "avg.png"), "--average", "--size", "600x500"]) == 0
    assert png_size(tmp_path / "avg.png") == (600, 500)
    (ax,) = heatmaps(figures[3])
    np.testing.assert_allclose(shown(ax), expected[1].mean(axis=0), rtol=0, atol=1e-7)
    assert ax.get_title() == "decoder layer 2: cross-attention, average over heads"

    with pytest.raises(AiaynError, match="out of range"):
        run_cli(["plot", "attention", "--checkpoint", str(checkpoint), "--text", text, "--layer", "7",
                 "--out", str(tmp_path / "x.png")])
