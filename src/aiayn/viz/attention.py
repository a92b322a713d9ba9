"""Attention heatmaps as PNG files (matplotlib, no display needed).

Figures are built with :class:`matplotlib.figure.Figure` and the Agg canvas directly,
not through ``pyplot``: no global backend switch, no figure registry to leak, safe in a
server thread or under pytest. Sizes are exact pixel sizes (no ``bbox_inches="tight"``),
so callers and tests know what they get.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from aiayn.fileio import atomic_path, check_output_file

log = logging.getLogger(__name__)

DPI = 100
CMAP = "viridis"  # the page (serving/static/app.js) uses the same map


def as_array(x: Any) -> np.ndarray:
    """A torch tensor, numpy array or nested list as a float numpy array."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _labels(tokens: Sequence[str], n: int) -> list[str]:
    # The search's attention has one row more than the output tokens (the EOS step).
    tokens = [str(t) for t in tokens]
    return tokens[:n] if len(tokens) >= n else tokens + ["</s>"] * (n - len(tokens))


def _fontsize(n: int, cell_px: float) -> float:
    return float(max(5.0, min(11.0, cell_px * 0.55)))


def attention_size(n_tgt: int, n_src: int) -> tuple[int, int]:
    """The default (width, height) in pixels of :func:`plot_attention`."""
    width = min(2400, max(480, 160 + 32 * n_src))
    height = min(2400, max(400, 160 + 32 * n_tgt))
    return width, height


def heads_grid(n_heads: int) -> tuple[int, int]:
    """(rows, columns) of the grid :func:`plot_heads` draws."""
    cols = min(4, max(1, n_heads))
    return math.ceil(n_heads / cols), cols


def heads_size(n_heads: int, n_tgt: int, n_src: int) -> tuple[int, int]:
    """The default (width, height) in pixels of :func:`plot_heads`."""
    rows, cols = heads_grid(n_heads)
    panel_w = min(600, max(260, 90 + 22 * n_src))
    panel_h = min(600, max(240, 90 + 22 * n_tgt))
    return cols * panel_w + 80, rows * panel_h + 60


def save_png(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` atomically (its folder is created)."""
    path = Path(path)
    with contextlib.suppress(OSError):  # an unwritable place: check_output_file says so in one line
        path.parent.mkdir(parents=True, exist_ok=True)
    check_output_file(path, flag="--out")
    FigureCanvasAgg(fig)
    with atomic_path(path, durable=False) as tmp:
        fig.savefig(tmp, dpi=DPI, format="png")
    log.info("wrote %s", path)
    return path


def _heatmap(ax: Any, w: np.ndarray, src: list[str], tgt: list[str], fontsize: float, vmax: float) -> Any:
    im = ax.imshow(w, cmap=CMAP, vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(src)))
    ax.set_xticklabels(src, rotation=60, ha="right", rotation_mode="anchor", fontsize=fontsize)
    ax.set_yticks(range(len(tgt)))
    ax.set_yticklabels(tgt, fontsize=fontsize)
    ax.tick_params(length=0)
    return im


def plot_attention(weights: Any, src_tokens: Sequence[str], tgt_tokens: Sequence[str], path: str | Path,
                   title: str | None = None, size: tuple[int, int] | None = None) -> Path:
    """One heatmap: ``weights`` (T x S), rows = target tokens, columns = source tokens.

    ``size`` is (width, height) in pixels; by default it grows with the sentence lengths
    (:func:`attention_size`). Returns ``path``.
    """
    w = as_array(weights)
    if w.ndim != 2:
        raise ValueError(f"plot_attention: weights must be (target, source), got shape {w.shape}")
    n_tgt, n_src = w.shape
    width, height = size or attention_size(n_tgt, n_src)
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    src, tgt = _labels(src_tokens, n_src), _labels(tgt_tokens, n_tgt)
    cell = min(width / max(n_src, 1), height / max(n_tgt, 1))
    im = _heatmap(ax, w, src, tgt, _fontsize(max(n_src, n_tgt), cell), vmax=max(float(w.max(initial=0.0)), 1e-9))
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    if title:
        ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    return save_png(fig, path)


def plot_heads(attn: Any, src_tokens: Sequence[str], tgt_tokens: Sequence[str], path: str | Path,
               layer: int | None = None, title: str | None = None, size: tuple[int, int] | None = None) -> Path:
    """A grid with one heatmap per head: ``attn`` (H x T x S) of one decoder layer.

    All panels share one colour scale (0 .. the largest weight), so heads compare by eye.
    ``layer`` (0-based) only labels the figure. Returns ``path``.
    """
    a = as_array(attn)
    if a.ndim != 3:
        raise ValueError(f"plot_heads: attn must be (heads, target, source), got shape {a.shape}")
    n_heads, n_tgt, n_src = a.shape
    rows, cols = heads_grid(n_heads)
    width, height = size or heads_size(n_heads, n_tgt, n_src)
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    src, tgt = _labels(src_tokens, n_src), _labels(tgt_tokens, n_tgt)
    cell = min(width / cols / max(n_src, 1), height / rows / max(n_tgt, 1))
    fs = _fontsize(max(n_src, n_tgt), cell)
    vmax = max(float(a.max(initial=0.0)), 1e-9)
    im = None
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= n_heads:
            ax.set_axis_off()
            continue
        im = _heatmap(ax, a[h], src, tgt, fs, vmax)
        ax.set_title(f"head {h + 1}", fontsize=10)
        if h % cols:  # target labels on the first column only
            ax.set_yticklabels([])
    heading = title or (f"decoder layer {layer + 1}: cross-attention" if layer is not None else "cross-attention")
    fig.suptitle(heading)
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.02, pad=0.01)
    return save_png(fig, path)
