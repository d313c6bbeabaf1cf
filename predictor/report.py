"""A self-contained HTML report of a design-space search.

``write_report(result, folder)`` writes ``folder/report.html`` (plots embedded
as base64 PNG, no external files, scripts or fonts) and ``folder/search.json``
(the numbers behind the plots and tables; also embedded in the HTML). Both
are written atomically. Plots are drawn off-screen on matplotlib's Agg canvas
without pyplot, so no global backend is touched.

Plots: iteration time against batch size per GPU; $ per 1M samples against
batch size per GPU; predicted peak memory against batch size with each GPU's
usable memory; the Pareto front of time against cost. Per-GPU plots show the
GPUs with the best configurations (``max_gpus``); the table and the JSON hold
every configuration.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from predictor.errors import MissingExtraError
from predictor.io import atomic_write_text, plain_text_figures
from predictor.memory import has_profile
from predictor.text import plain_log_ticks, precision_words

MAX_GPUS_PLOTTED = 10
TABLE_ROWS = 25


def _png(fig) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(title: str, xlabel: str, ylabel: str, *, logx=True, logy=True, width=7.2):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 4.0))
    ax = fig.add_subplot(1, 1, 1)
    ax.set_title(title, fontsize=11, loc="left")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.grid(True, which="major", alpha=0.3)
    return fig, ax


def _legend_below(ax, ncol: int = 3, title: str | None = None) -> None:
    ax.legend(fontsize=7, ncol=ncol, loc="upper center", bbox_to_anchor=(0.5, -0.17),
              frameon=False, title=title, title_fontsize=7)


def _plotted_gpus(result, max_gpus: int) -> list[str]:
    """GPUs in the order of their best row in the ranking, at most `max_gpus`."""
    seen: list[str] = []
    for gpu in result.table["gpu"]:
        if gpu not in seen:
            seen.append(gpu)
        if len(seen) == max_gpus:
            break
    return seen


def _colors(n: int):
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _per_gpu_plot(result, gpus, column: str, title: str, ylabel: str) -> str:
    t = result.table
    fig, ax = _figure(title, "batch size per GPU", ylabel)
    for gpu, color in zip(gpus, _colors(len(gpus))):
        rows = t[t["gpu"] == gpu].sort_values("batch_size")
        x = rows["batch_size"].to_numpy(dtype=float)
        y = rows[column].to_numpy(dtype=float)
        ok = (rows["fits"] & rows["feasible"]).to_numpy()
        if not np.isfinite(y).any():
            continue
        ax.plot(x, y, "-", color=color, lw=1.4, alpha=0.9, label=gpu)
        ax.plot(x[ok], y[ok], "o", color=color, ms=4)
        ax.plot(x[~ok], y[~ok], "x", color=color, ms=5, alpha=0.8)
    plain_log_ticks(ax)
    _legend_below(ax, 4, title="o fits in memory (and meets the constraints), x does not")
    return _png(fig)


def _memory_plot(result, max_lines: int = 8) -> str:
    t = result.table
    frac = result.max_memory_fraction
    fig, ax = _figure(f"Predicted peak memory (dashed: {frac:.0%} of each GPU's memory)",
                      "batch size per GPU", "GiB")
    per_batch = t.groupby("batch_size")["memory_gb"].max().sort_index()
    x = per_batch.index.to_numpy(dtype=float)
    y = per_batch.to_numpy(dtype=float)
    if np.isfinite(y).any():
        ax.plot(x, y, "o-", color="black", lw=2, ms=4, label="predicted peak", zorder=3)
    caps: dict[float, list[str]] = {}
    for gpu, limit in t.groupby("gpu", sort=False)["memory_limit_gb"].first().items():
        caps.setdefault(round(float(limit), 1), []).append(gpu)
    levels = sorted(caps)
    if len(levels) > max_lines:  # keep the smallest, the largest and an even spread
        idx = np.unique(np.linspace(0, len(levels) - 1, max_lines).round().astype(int))
        levels = [levels[i] for i in idx]
    for level, color in zip(levels, _colors(len(levels))):
        names = caps[level]
        label = ", ".join(names[:3]) + (f" +{len(names) - 3}" if len(names) > 3 else "")
        ax.axhline(level, color=color, ls="--", lw=1.1, label=f"{level:g} GiB: {label}")
    plain_log_ticks(ax)
    _legend_below(ax, 2)
    return _png(fig)


def _pareto_plot(result) -> str:
    fit = result.fitting()
    tcol, ccol = result.time_column, result.cost_column
    unit = "run" if result.run.given else "1M samples"
    fig, ax = _figure(f"Time vs cost per {unit} (fitting configurations; front in red)",
                      f"hours per {unit}", f"USD per {unit}", logx=False)
    ax.set_xscale("log")
    x = fit[tcol].to_numpy(dtype=float)
    y = fit[ccol].to_numpy(dtype=float)
    ok = np.isfinite(x) & np.isfinite(y) & (y > 0)
    ax.scatter(x[ok], y[ok], s=12, color="0.6", alpha=0.7, label="configurations")
    front = result.pareto()
    if not front.empty:
        fx = front[tcol].to_numpy(dtype=float)
        fy = front[ccol].to_numpy(dtype=float)
        ax.step(fx, fy, where="post", color="tab:red", lw=1.5)
        ax.scatter(fx, fy, s=28, color="tab:red", zorder=3, label="Pareto front")
        for i, row in enumerate(front.head(12).itertuples()):
            ax.annotate(f"{row.gpu} b{row.batch_size}", (fx[i], fy[i]), fontsize=7,
                        xytext=(5, 6 if i % 2 == 0 else -11), textcoords="offset points")
    plain_log_ticks(ax)
    _legend_below(ax, 2)
    return _png(fig)


def _fmt(v, digits=3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        a = abs(float(v))
        if a >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"
    return html.escape(str(v))


_COLUMNS = [
    ("rank", "#"), ("gpu", "GPU"), ("gpus", "GPUs"), ("batch_size", "batch/GPU"),
    ("iteration_ms", "iter ms"), ("error_p90_pct", "±err %"), ("samples_per_s", "samples/s"),
    ("usd_per_hour", "$/h"), ("usd_per_1m_samples", "$/1M samples"), ("run_hours", "run h"),
    ("run_cost_usd", "run $"),
    ("scaling_efficiency", "scaling eff."), ("memory_gb", "memory GiB"),
    ("memory_limit_gb", "limit GiB"), ("fits", "fits"), ("feasible", "constraints met"),
]


def _table_html(df, rows: int) -> str:
    cols = [(c, h) for c, h in _COLUMNS if c in df.columns]
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in cols)
    body = []
    for rec in df.head(rows).to_dict(orient="records"):
        cls = "" if (rec.get("fits", True) and rec.get("feasible", True)) else ' class="nofit"'
        body.append(f"<tr{cls}>" + "".join(f"<td>{_fmt(rec[c])}</td>" for c, _ in cols) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1100px;
color:#222;line-height:1.4}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:13px}.best{background:#eef6ee;border:1px solid #9c9;padding:10px 14px;
border-radius:6px}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:16px}.grid img{width:100%;border:1px solid #eee}
table{border-collapse:collapse;font-size:12px;width:100%}th,td{padding:3px 6px;text-align:right;
border-bottom:1px solid #eee}th{background:#f5f5f5}td:nth-child(2),th:nth-child(2){text-align:left}
tr.nofit{color:#999}table.narrow{width:auto;min-width:260px}.note{font-size:12px;color:#555}
@media (max-width:900px){.grid{grid-template-columns:1fr}}
"""


def render_html(result, graph=None, *, max_gpus: int = MAX_GPUS_PLOTTED,
                precision: str | None = None) -> tuple[str, dict]:
    """(HTML text, JSON-able data) of the report for a SearchResult;
    `precision`: how the step's ops run, as the tables' titles say it
    ("amp bf16", "float32", ...)."""
    try:
        import matplotlib  # noqa: F401  (every plot below draws with it)
    except ImportError:  # an optional dependency
        raise MissingExtraError("matplotlib", "plot", "Search reports") from None
    gpus = _plotted_gpus(result, max_gpus)
    with plain_text_figures():  # GPU ids and model names are drawn as written, never as maths
        plots = {
            "time": _per_gpu_plot(result, gpus, "iteration_ms", "Iteration time per GPU",
                                  "ms per iteration"),
            "cost": _per_gpu_plot(result, gpus, "usd_per_1m_samples",
                                  "Cost per 1M samples per GPU", "USD per 1M samples"),
            "memory": _memory_plot(result),
            "pareto": _pareto_plot(result),
        }
    data = result.to_dict()
    data["generated"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if graph is not None:
        data["graph"] = {"parameters": int(graph.parameters), "mode": graph.mode,
                         "optimizer": graph.optimizer, "seq_len": graph.seq_len,
                         "traced_batch_size": int(graph.batch_size)}
    best = result.best()
    if best:
        best_html = (f"<div class='best'><b>Best ({html.escape(result.objective)}):</b> "
                     f"{html.escape(str(best['gpu']))} x{result.gpus_per_node}, batch "
                     f"{best['batch_size']} per GPU: {_fmt(best['iteration_ms'])} ms/iteration, "
                     f"{_fmt(best['samples_per_s'])} samples/s, "
                     f"${_fmt(best['usd_per_1m_samples'])} per 1M samples, "
                     f"{_fmt(best['memory_gb'])} GiB peak memory"
                     + (f"; the run takes {_fmt(best['run_hours'])} h and costs "
                        f"${_fmt(best['run_cost_usd'])}" if result.run.given else "")
                     + "</div>")
    else:
        best_html = "<div class='best'><b>No configuration fits</b> in memory within the constraints.</div>"
    params = f"{graph.parameters / 1e6:,.1f} M parameters · " if graph is not None else ""
    params += f"{html.escape(precision)} · " if precision else ""
    meta = (f"{params}objective: {html.escape(result.objective)} · run: "
            f"{html.escape(result.run.describe())} · {result.gpus_per_node} GPU(s) per configuration · "
            + (f"fits = peak ≤ {result.max_memory_fraction:.0%} of GPU memory · "
               if graph is None or has_profile(graph)
               else "peak memory not predicted (the graph carries no memory profile): "
                    "whether a configuration fits is not checked · ")
            + ("±err = 90th percentile of |error| measured for predictions of the GPU's standing "
               "(trained on, unseen, tensor cores) · "
               if "error_p90_pct" in result.table else "")
            + f"generated {data['generated']}")
    maxb = "".join(f"<tr><td>{html.escape(k)}</td><td>{_fmt(v)}</td></tr>"
                   for k, v in sorted(result.max_batch_sizes.items(),
                                      key=lambda kv: -(kv[1] or 0)))
    prices = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{_fmt(v.get('usd_per_gpu_hour'))}</td>"
        f"<td>{html.escape(str(v.get('date') or ''))}</td>"
        f"<td style='text-align:left'>{html.escape(str(v.get('source') or ''))}</td></tr>"
        for k, v in result.price_info.items())
    img = lambda key, alt: f"<img alt='{alt}' src='data:image/png;base64,{plots[key]}'>"  # noqa: E731
    payload = script_json(data)
    text = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(result.model)}: GPU and batch size search</title>
<style>{_CSS}</style></head><body>
<h1>{html.escape(result.model)}: which GPU, which batch size</h1>
<div class="meta">{meta}</div>
<p>{best_html}</p>
<h2>Plots</h2>
<div class="grid">
{img("time", "iteration time against batch size per GPU")}
{img("cost", "cost per 1M samples against batch size per GPU")}
{img("memory", "predicted peak memory against batch size with GPU limits")}
{img("pareto", "Pareto front of time against cost")}
</div>
<p class="note">Per-GPU plots show the {len(gpus)} GPUs with the best-ranked configurations; the
table below and <code>search.json</code> hold all {len(result.table)} configurations.</p>
<h2>Ranked configurations (top {min(TABLE_ROWS, len(result.table))})</h2>
{_table_html(result.table, TABLE_ROWS)}
<h2>Pareto front (time vs cost)</h2>
{_table_html(result.pareto(), 50)}
<h2>Largest batch per GPU that fits</h2>
<table class="narrow"><thead><tr><th>GPU</th><th>batch</th></tr></thead><tbody>{maxb}</tbody></table>
<h2>Prices (USD per GPU-hour)</h2>
<p class="note">{html.escape(result.price_basis_text())}</p>
<table><thead><tr><th>GPU</th><th>$/h</th><th>date</th><th>source</th></tr></thead>
<tbody>{prices}</tbody></table>
<h2>How these numbers are made</h2>
<p class="note">Times: dnn-predictor's per-op model summed over the traced training step.
Memory: a liveness pass over the traced step (parameters, gradients, optimizer state,
activations saved for backward, temporaries) with the CUDA caching allocator's rounding, plus
the CUDA context and cuBLAS workspaces (see <code>predictor/memory.py</code>). Prices are
the GPU database's, on one basis (cloud on-demand list prices unless
<code>--price-basis marketplace</code>), each with the date it was read; override them with
<code>--price GPU=USD</code>. Data-parallel configurations assume DDP's gradient buckets
overlap with the backward pass (see <code>predictor/parallel.py</code>).</p>
<script type="application/json" id="search-data">{payload}</script>
</body></html>
"""
    return text, data


# Inside <script type="application/json">, "<!--" or "<script" in a string
# (a GPU id, a price source) switches the HTML parser into a state where
# "</script>" no longer closes the block, which then swallows the page. JSON
# allows \uXXXX for any character, so these are written escaped: the data
# parses the same, and the block can hold no markup at all.
_SCRIPT_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                                 "\u2028": "\\u2028", "\u2029": "\\u2029"})


def script_json(data) -> str:
    """`data` as JSON safe to embed in an HTML <script> element (F8)."""
    return json.dumps(data, allow_nan=False, default=str).translate(_SCRIPT_ESCAPES)


def write_report(result, folder: str | Path, graph=None, *,
                 max_gpus: int = MAX_GPUS_PLOTTED, precision: str | None = None) -> Path:
    """Write report.html and search.json into `folder` (created if missing);
    returns the HTML path.

    The HTML is self-sufficient: it embeds the same data as search.json
    (``<script id="search-data">``), and both carry the same ``generated``
    stamp. It is written first; search.json, the secondary copy, second. A
    writer killed between the two leaves a complete new report beside the
    previous JSON (their stamps differ), never a report without its data."""
    folder = Path(folder)
    text, data = render_html(result, graph, max_gpus=max_gpus, precision=precision)
    out = folder / "report.html"
    atomic_write_text(out, text)
    atomic_write_text(folder / "search.json", json.dumps(data, indent=2, allow_nan=False,
                                                         default=str) + "\n")
    return out


# ------------------------------------------------------------ layout search --
# ``predictor search MODEL --n-gpus N --global-batch B --report DIR``: the ranked
# parallel layouts, the time split of each (compute, communication, bubble,
# optimizer) and its memory per GPU by kind against the GPU's usable memory.

LAYOUTS_PLOTTED = 15
_TIME_PARTS = (("compute_ms", "compute (incl. recomputation)"), ("comm_ms", "communication"),
               ("bubble_ms", "pipeline bubble"), ("optimizer_ms", "optimizer step"))
_MEMORY_PARTS = (("model_states", "model states"), ("activations", "activations"),
                 ("weight_copies", "half weight copies"), ("transient", "temporaries"),
                 ("gathered_params", "gathered (ZeRO-3)"), ("context_workspace", "context"))


def layout_label(r: dict) -> str:
    ck = r.get("checkpoint") or "none"
    return (f"#{r['rank']} {r['gpu']} dp{r['dp']} tp{r['tp']} pp{r['pp']} "
            f"mb{r['micro_batch']}x{r['microbatches']} z{r['zero']} {ck}")


def _stacked(rows: list[dict], parts, value, title: str, xlabel: str, limit=None) -> str:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.2, 0.32 * len(rows) + 1.6))
    ax = fig.add_subplot(1, 1, 1)
    ax.set_title(title, fontsize=11, loc="left")
    ax.set_xlabel(xlabel)
    y = np.arange(len(rows))[::-1]
    left = np.zeros(len(rows))
    colors = _colors(len(parts))
    for i, (key, name) in enumerate(parts):
        w = np.asarray([float(value(r, key) or 0.0) for r in rows])
        ax.barh(y, w, left=left, color=colors[i], label=name, height=0.7)
        left += w
    if limit is not None:
        for yy, lim in zip(y, limit):
            ax.plot([lim, lim], [yy - 0.4, yy + 0.4], color="#c00", linewidth=1.5)
    ax.set_yticks(y)
    ax.set_yticklabels([layout_label(r) for r in rows], fontsize=7)
    ax.grid(True, axis="x", alpha=0.3)
    _legend_below(ax, 3)
    return _png(fig)


_LAYOUT_COLUMNS = [
    ("rank", "#"), ("gpu", "GPU"), ("dp", "dp"), ("tp", "tp"), ("pp", "pp"),
    ("micro_batch", "micro-batch"), ("microbatches", "micro-batches"), ("zero", "ZeRO"),
    ("checkpoint", "recompute"), ("sequence_parallel", "SP"), ("iteration_ms", "iter ms"),
    ("compute_ms", "compute ms"), ("comm_ms", "comm ms"), ("bubble_ms", "bubble ms"),
    ("optimizer_ms", "opt ms"), ("tokens_per_s", "tokens/s"), ("samples_per_s", "samples/s"),
    ("usd_per_step", "$/step"), ("memory_gb", "GiB/GPU"), ("memory_limit_gb", "limit GiB"),
    ("fits", "fits"),
]


def render_layout_html(rows: list[dict], meta: dict, graph=None, *,
                       plotted: int = LAYOUTS_PLOTTED) -> tuple[str, dict]:
    """(HTML text, JSON-able data) of the report of a layout search."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingExtraError("matplotlib", "plot", "Search reports") from None
    shown = [r for r in rows if r["fits"]][:plotted] or rows[:plotted]
    parts = lambda r, k: (r.get("memory_parts_gb") or {}).get(k, 0.0)  # noqa: E731
    plots = {}
    if shown:
        with plain_text_figures():
            plots["time"] = _stacked(shown, _TIME_PARTS, lambda r, k: r.get(k),
                                     "Iteration time split per layout", "ms per optimizer step")
            plots["memory"] = _stacked(shown, _MEMORY_PARTS, parts,
                                       "Memory per GPU (fullest stage); red: usable memory",
                                       "GiB per GPU",
                                       limit=[r.get("memory_limit_gb") for r in shown])
    data = {**meta, "layouts": rows,
            "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    if graph is not None:
        data["graph"] = {"parameters": int(graph.parameters), "mode": graph.mode,
                         "optimizer": graph.optimizer, "seq_len": graph.seq_len,
                         "amp": getattr(graph, "amp", None)}
    cols = [(c, h) for c, h in _LAYOUT_COLUMNS if any(c in r for r in rows)]
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in cols)
    body = []
    for r in rows[:TABLE_ROWS * 2]:
        cls = "" if r["fits"] else ' class="nofit"'
        cells = "".join(f"<td>{_fmt(r.get(c) if c != 'checkpoint' else (r.get(c) or 'none'))}"
                        "</td>" for c, _ in cols)
        body.append(f"<tr{cls}>{cells}</tr>")
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    best = next((r for r in rows if r["fits"]), None)
    if best is not None:
        split = ", ".join(f"{name} {_fmt(best.get(k))} ms" for k, name in _TIME_PARTS)
        mem = ", ".join(f"{name} {_fmt(parts(best, k))}" for k, name in _MEMORY_PARTS)
        best_html = (f"<div class='best'><b>Best layout ({html.escape(meta['objective'])}):</b> "
                     f"{html.escape(layout_label(best))}: {_fmt(best['iteration_ms'])} ms per "
                     f"step = {split}; {_fmt(best['memory_gb'])} GiB per GPU ({mem} GiB)</div>")
    else:
        best_html = "<div class='best'><b>No layout fits</b> in GPU memory.</div>"
    params = f"{graph.parameters / 1e9:,.2f} B parameters · " if graph is not None else ""
    precision = precision_words(meta.get("amp"), meta.get("dtype"), False, traced="")
    params += f"{html.escape(precision)} · " if precision else ""
    meta_html = (f"{params}{meta['n_gpus']} GPUs · global batch {meta['global_batch']} · "
                 f"{meta['gpus_per_node']} GPUs per node · fits = peak ≤ "
                 f"{meta['max_memory_fraction']:.0%} of GPU memory · generated {data['generated']}")
    img = lambda key, alt: (f"<img alt='{alt}' src='data:image/png;base64,{plots[key]}'>"  # noqa: E731
                            if key in plots else "")
    text = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(meta['model'])}: parallel layout search</title>
<style>{_CSS}</style></head><body>
<h1>{html.escape(meta['model'])}: which parallel layout</h1>
<div class="meta">{meta_html}</div>
<p>{best_html}</p>
<h2>Time split and memory per GPU (the {len(shown)} best layouts)</h2>
<div class="grid">
{img("time", "iteration time split into compute, communication, bubble and optimizer")}
{img("memory", "memory per GPU by kind against the GPU's usable memory")}
</div>
<h2>Ranked layouts (top {min(TABLE_ROWS * 2, len(rows))} of {len(rows)})</h2>
{table}
<h2>How these numbers are made</h2>
<p class="note">The traced step is transformed for each layout without retracing
(<code>predictor/layouts.py</code>): tensor-parallel ops run with their sharded dims divided,
pipeline stages run the 1F1B schedule (bubble <code>(pp-1)/(interleave&middot;m)</code> of the
slowest stage), communication is priced with ring/tree costs over NVLink within a node and the
inter-node network between nodes, and the part not hidden behind compute is shown. Memory is
the fullest stage's: model states (sharded by ZeRO), activations in flight, temporaries,
gathered ZeRO-3 blocks and the CUDA context. <code>layouts.json</code> holds every layout.</p>
<script type="application/json" id="search-data">{script_json(data)}</script>
</body></html>
"""
    return text, data


def write_layout_report(rows: list[dict], meta: dict, folder: str | Path, graph=None) -> Path:
    """Write report.html and layouts.json into `folder`; returns the HTML path
    (both atomically, the HTML first, as ``write_report``)."""
    folder = Path(folder)
    text, data = render_layout_html(rows, meta, graph)
    out = folder / "report.html"
    atomic_write_text(out, text)
    atomic_write_text(folder / "layouts.json", json.dumps(data, indent=2, allow_nan=False,
                                                          default=str) + "\n")
    return out
