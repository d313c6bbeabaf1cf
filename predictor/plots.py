"""Plots of sweep results (matplotlib, drawn off-screen with the Agg canvas).

matplotlib is imported inside the functions: prediction-only use never pays
for it, and no global backend is switched (pyplot is not used), so calling
this from a notebook or a GUI program leaves its backend alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from predictor.io import atomic_writer, plain_text_figures
from predictor.errors import InvalidArgumentError, MissingExtraError
from predictor.text import plain_log_ticks

_FORMATS = ("png", "svg", "pdf")


def plot_sweep(result, path: str | Path, *, title: str | None = None) -> Path:
    """Iteration time and samples/s against batch size, one line per GPU.

    Both axes are logarithmic (x in powers of two): a sweep spans orders of
    magnitude in both. The legend lists GPUs from the highest peak throughput
    down, so it reads as a ranking; markers show the swept batch sizes, a
    ring marks each GPU's best batch by throughput among those that fit in
    memory, and configurations that do not fit are drawn faded.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter, LogLocator
    except ImportError:  # an optional dependency
        raise MissingExtraError("matplotlib", "plot", "Plots") from None

    with plain_text_figures():  # GPU ids and model names are drawn as written, never as maths
        return _plot_sweep(result, Path(path), title, FigureCanvasAgg, Figure, FuncFormatter,
                           LogLocator)


def _plot_sweep(result, path: Path, title, FigureCanvasAgg, Figure, FuncFormatter,  # noqa: N803
                LogLocator) -> Path:
    fmt = path.suffix.lower().lstrip(".") or "png"
    if fmt not in _FORMATS:
        raise InvalidArgumentError(
            f"cannot plot to {path.name}: use a .png, .svg or .pdf file name")
    batches = np.asarray(result.batch_sizes)
    iter_ms = np.asarray(result.iteration_ms)
    thr = np.asarray(result.throughput)
    fits = np.asarray(getattr(result, "fits", np.ones(thr.shape, dtype=bool)))
    best_thr = np.where(fits, thr, -np.inf)
    order = np.argsort(-np.where(fits.any(axis=1), best_thr.max(axis=1), thr.max(axis=1) * 1e-9),
                       kind="stable")
    n = len(order)
    # Each GPU's quoted error band (predictor.expected_error), shaded around its
    # time line where there is a line and few enough GPUs leave it readable.
    p90 = np.asarray(getattr(result, "error_p90", np.full(n, np.nan)))
    bands = n <= BANDED_GPUS and len(batches) > 1 and bool(np.isfinite(p90).any())

    fig = Figure(figsize=(13, 5.2 + 0.06 * max(n - 12, 0)), layout="constrained")
    FigureCanvasAgg(fig)
    ax_t, ax_s = fig.subplots(1, 2)
    colours = _colours(n)
    styles = ("-", "--", "-.", ":")
    for rank, g in enumerate(order):
        style = dict(color=colours[rank], linestyle=styles[(rank // 10) % len(styles)],
                     linewidth=1.6, marker="o", markersize=2.8 if len(batches) > 16 else 4)
        ok = fits[g]
        label = result.gpus[g] + ("" if ok.any() else " (does not fit)")
        # Configurations that do not fit in memory: the same line, faded.
        faded = dict(style, alpha=0.22, linewidth=1.0, label=None)
        if not ok.all():
            ax_t.plot(batches, iter_ms[g], **faded)
            ax_s.plot(batches, thr[g], **faded)
        shown = np.where(ok, 1.0, np.nan)
        ax_t.plot(batches, iter_ms[g] * shown, label=label, **style)
        if bands and np.isfinite(p90[g]):
            e = p90[g] / 100.0
            ax_t.fill_between(batches, iter_ms[g] * shown * (1 - e),
                              iter_ms[g] * shown * (1 + e), color=colours[rank], alpha=0.10,
                              linewidth=0)
        ax_s.plot(batches, thr[g] * shown, **style)
        if ok.any():
            best = int(np.argmax(best_thr[g]))
            ax_s.plot(batches[best], thr[g, best], marker="o", markersize=9, fillstyle="none",
                      color=colours[rank], linestyle="none")
    pow2 = FuncFormatter(lambda v, _: f"{v:g}" if v < 1e4 else f"2^{np.log2(v):.0f}")
    for ax, label in ((ax_t, "iteration time (ms)"), (ax_s, "throughput (samples/s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        plain_log_ticks(ax)  # then the batch axis's own powers of two
        ax.xaxis.set_major_formatter(pow2)
        ax.xaxis.set_major_locator(LogLocator(base=2, numticks=12))
        ax.set_xlabel("batch size")
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.35)
        ax.grid(True, which="minor", alpha=0.12)
        if len(batches) == 1:
            ax.set_xlim(batches[0] / 2, batches[0] * 2)
    ax_t.set_title("time per training iteration" if result.mode == "train"
                   else "time per forward pass", fontsize=11)
    ax_s.set_title("samples per second (ring: best batch)", fontsize=11)
    notes = (["shaded: ±err, the 90th percentile of |error| measured for predictions made "
              "the same way"] if bands else []) \
        + (["faded: predicted not to fit in the GPU's memory"] if not fits.all() else [])
    if notes:  # below both panels, where the constrained layout keeps room for it
        fig.supxlabel(" · ".join(notes), fontsize=9, color="0.35")
    fig.suptitle(title or f"{result.model} · {result.mode} · predicted", fontsize=13)
    fig.legend(*ax_t.get_legend_handles_labels(), loc="outside right upper",
               ncols=1 if n <= 18 else 2, fontsize=9, title="GPU (fastest first)",
               title_fontsize=9, frameon=False)
    return _save_atomically(fig, path, fmt)


# Above this many GPUs a sweep plot draws no error bands (they would cover each other).
BANDED_GPUS = 8


def _colours(n: int) -> list:
    """Distinct colours: tab10 for a few lines, tab20 beyond that (line styles
    then separate repeats)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    k = cmap.N
    return [cmap(i % k) for i in range(n)]


def _save_atomically(fig, path: Path, fmt: str) -> Path:
    with atomic_writer(path) as fh:
        fig.savefig(fh, format=fmt, dpi=130)
    return path
