"""Static plots (matplotlib, Agg): attention heatmaps and training curves."""

from aiayn.viz.attention import plot_attention, plot_heads
from aiayn.viz.curves import plot_curves

__all__ = ["plot_attention", "plot_curves", "plot_heads"]
