"""Training curves from a run's ``metrics.jsonl``: loss, validation loss/BLEU, learning rate.

The trainer writes one JSON object per line: training entries (``step``, ``loss``,
``lr``, ...) and validation entries (``step``, ``valid_loss``, ``valid_ppl``, maybe
``valid_bleu``). Which keys exist depends on the run (BLEU only when ``train.valid_bleu``),
so every panel is drawn only when its data is there.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from aiayn.errors import DataError
from aiayn.viz.attention import save_png

log = logging.getLogger(__name__)

DPI = 100
METRICS_FILE = "metrics.jsonl"
DEFAULT_SIZE = (1200, 800)

# (panel title, y label, [(key, legend label)], log scale)
PANELS: list[tuple[str, str, list[tuple[str, str]], bool]] = [
    ("loss", "loss (nats/token)", [("loss", "train loss"), ("nll", "train NLL"), ("valid_loss", "valid loss")], False),
    ("validation BLEU", "BLEU", [("valid_bleu", "valid BLEU")], False),
    ("validation perplexity", "perplexity", [("valid_ppl", "valid ppl")], True),
    ("learning rate", "lr", [("lr", "learning rate")], False),
]


@dataclass
class RunMetrics:
    """Per key, the (step, value) points found in one ``metrics.jsonl``."""

    name: str
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def has(self, key: str) -> bool:
        return bool(self.series.get(key))


def metrics_path(run: str | Path) -> Path:
    """``run`` is a run directory (holding metrics.jsonl) or the file itself."""
    p = Path(run)
    if p.is_dir():
        p = p / METRICS_FILE
    if not p.is_file():
        raise DataError(f"{p}: no metrics file (expected a run directory with {METRICS_FILE})")
    return p


def read_metrics(run: str | Path, name: str | None = None) -> RunMetrics:
    """Read numeric ``key: value`` pairs with a ``step`` from every line.

    A malformed line (e.g. the last one of a run killed mid-write) is skipped with a
    warning naming the line, so a crashed run can still be plotted.
    """
    path = metrics_path(run)
    out = RunMetrics(name or (path.parent.name if path.name == METRICS_FILE else path.stem))
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                log.warning("%s:%d: skipped, not JSON (%s)", path, lineno, exc.msg)
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), (int, float)):
                log.warning("%s:%d: skipped, no numeric 'step'", path, lineno)
                continue
            step = float(rec["step"])
            for key, value in rec.items():
                if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                if math.isfinite(value):
                    out.series.setdefault(key, []).append((step, float(value)))
    if not out.series:
        raise DataError(f"{path}: no metrics with a step in it")
    return out


def plot_curves(runs: str | Path | Sequence[str | Path], path: str | Path,
                size: tuple[int, int] = DEFAULT_SIZE, title: str | None = None) -> Path:
    """One PNG with a panel per available quantity, against steps; several runs overlay.

    ``runs``: run directories or metrics.jsonl files. ``size``: (width, height) in pixels.
    """
    if isinstance(runs, (str, Path)):
        runs = [runs]
    data = [read_metrics(r) for r in runs]
    panels = [p for p in PANELS if any(d.has(k) for d in data for k, _ in p[2])]
    if not panels:
        found = sorted({k for d in data for k in d.series})
        raise DataError(f"nothing to plot: none of loss, valid_loss, valid_bleu, valid_ppl, lr in the "
                        f"metrics (found: {', '.join(found) or 'nothing'})")
    width, height = size
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    n = len(panels)
    cols = 1 if n == 1 else 2
    rows = math.ceil(n / cols)
    axes = fig.subplots(rows, cols, squeeze=False)
    for i, (heading, ylabel, keys, log_scale) in enumerate(panels):
        ax = axes[i // cols][i % cols]
        for d in data:
            for key, label in keys:
                points = d.series.get(key)
                if not points:
                    continue
                xs, ys = zip(*sorted(points))
                legend = f"{d.name}: {label}" if len(data) > 1 else label
                # Validation points are sparse: markers make single points visible.
                marker = "o" if key.startswith("valid_") else None
                ax.plot(xs, ys, label=legend, marker=marker, markersize=3, linewidth=1.2)
        ax.set_title(heading)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if log_scale:
            ax.set_yscale("log")
            # Plain numbers (2, 5, 10) rather than 2x10^0; minor ticks get labels only
            # when the data spans less than a decade (else they would crowd the axis).
            plain = FuncFormatter(lambda v, _: f"{v:g}")
            ax.yaxis.set_major_formatter(plain)
            low, high = ax.get_ylim()
            ax.yaxis.set_minor_formatter(plain if high / max(low, 1e-12) < 10 else NullFormatter())
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].set_axis_off()
    if title or len(data) == 1:
        fig.suptitle(title or data[0].name)
    return save_png(fig, path)
