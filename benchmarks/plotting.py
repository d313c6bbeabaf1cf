"""The predicted-against-measured figure the harnesses draw: log-log axes
with the identity line and a ±20 % band, saved atomically."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from predictor.io import atomic_writer


def identity_axes(fig, measured, predicted, xlabel: str, ylabel: str):
    """One log-log axes on `fig` spanning both series, with y = x and a
    ±20 % band drawn; returns it for the caller's points."""
    ax = fig.add_subplot(1, 1, 1)
    lo = min(np.min(measured), np.min(predicted)) / 1.5
    hi = max(np.max(measured), np.max(predicted)) * 1.5
    xs = np.geomspace(lo, hi, 50)
    ax.plot(xs, xs, color="black", lw=1)
    ax.fill_between(xs, xs / 1.2, xs * 1.2, color="0.9", label="±20 %")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", lw=0.3)
    return ax


def new_figure():
    """A 6.4 x 6.0 inch figure on the Agg canvas (no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 6.0))
    FigureCanvasAgg(fig)
    return fig


def save(fig, path) -> Path:
    """Write `fig` to `path` atomically, in the format its suffix names."""
    path = Path(path)
    with atomic_writer(path) as fh:
        fig.savefig(fh, format=path.suffix.lstrip(".").lower() or "png", dpi=120,
                    bbox_inches="tight")
    return path
