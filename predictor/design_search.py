"""Design-space search: which GPU, which batch size, how long, how much money.

Every (GPU, batch size) configuration is evaluated by one ``engine.sweep``
(time and peak memory; no second engine), then priced, checked against each
GPU's memory and the user's constraints, and ranked:

- ``objective="time"``: least wall-clock time for the training run when one is
  given (``samples`` x ``epochs`` or ``iterations``), else per 1M samples;
- ``objective="cost"``: least money for the run, else per 1M samples;
- ``objective="throughput"``: most samples per second.

Configurations that fit in memory and meet the constraints come first; the
rest follow, ranked the same way, so a table shows what *would* be best with
a bigger GPU. ``SearchResult.pareto()`` is the set of fitting configurations
that no other one beats on both time and cost.

Prices are the GPU database's indicative on-demand $/GPU-hour (with their
date), overridable per GPU (``prices={"H100-SXM5-80GB": 2.49}`` or
:func:`load_prices` of a TOML/JSON file). With ``gpus_per_node=N`` each
configuration is N GPUs of one type training data-parallel (see
``predictor.parallel``): the batch size is per GPU, the price is N GPUs'.

``predictor.search(graph, ...)`` is this module's :func:`search`. (A submodule
named ``predictor.search`` would shadow that function on the package once
imported.)
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from predictor import dtypes, engine, hardware, memory, parallel
from predictor.constraints import check_bounds, within_bounds
from predictor.errors import InvalidArgumentError
from predictor.io import MiB, printable, read_text

OBJECTIVES = ("time", "cost", "throughput")

# Constraint name -> (column, "max" | "min"), checked on the ranked table.
CONSTRAINTS = {
    "max_iteration_ms": ("iteration_ms", "max"),
    "min_throughput": ("samples_per_s", "min"),
    "max_usd_per_hour": ("usd_per_hour", "max"),
    "max_usd_per_1m_samples": ("usd_per_1m_samples", "max"),
    "max_hours": ("run_hours", "max"),
    "max_cost_usd": ("run_cost_usd", "max"),
    "max_memory_gb": ("memory_gb", "max"),
    "min_batch_size": ("batch_size", "min"),
    "max_batch_size": ("batch_size", "max"),
}

DEFAULT_BATCH_SIZES = tuple(2 ** i for i in range(12))  # 1 .. 2048


@dataclass
class Run:
    """A training run: total samples (samples x epochs) or total iterations."""

    samples: int | None = None
    epochs: float = 1.0
    iterations: int | None = None

    @property
    def given(self) -> bool:
        return self.samples is not None or self.iterations is not None

    def describe(self) -> str:
        if self.iterations is not None:
            return f"{self.iterations:,} iterations"
        if self.samples is not None:
            ep = f" x {self.epochs:g} epochs" if self.epochs != 1 else ""
            return f"{self.samples:,} samples{ep}"
        return "per 1M samples"


# Bounds of a run, so that hours and dollars stay finite and exact enough:
# 10^15 samples or iterations, 10^6 epochs (far beyond any training run).
MAX_RUN_SAMPLES = 10**15
MAX_EPOCHS = 1e6
# A price per GPU-hour above this is a typo (the same cap as spec files).
MAX_PRICE_USD_PER_HOUR = 1e6
MAX_PRICE_FILE_BYTES = 16 * MiB


def _check_run(samples, epochs, iterations) -> Run:
    def positive(x, what, integer=True):
        ok = isinstance(x, (int, np.integer)) if integer else isinstance(x, (int, float, np.number))
        if isinstance(x, bool) or not ok or not math.isfinite(float(x)) or x <= 0:
            raise InvalidArgumentError(f"{what} must be a positive {'integer' if integer else 'number'}, "
                                       f"got {x!r}")
        top = MAX_EPOCHS if what == "epochs" else MAX_RUN_SAMPLES
        if x > top:
            raise InvalidArgumentError(f"{what} must be at most {top:.0e}, got {x!r}")
        return x

    if iterations is not None and (samples is not None or epochs is not None):
        raise InvalidArgumentError("give either samples (and epochs) or iterations, not both")
    if epochs is not None and samples is None:
        raise InvalidArgumentError("epochs needs samples (the dataset size)")
    if iterations is not None:
        return Run(iterations=int(positive(iterations, "iterations")))
    if samples is not None:
        return Run(samples=int(positive(samples, "samples")),
                   epochs=float(positive(epochs if epochs is not None else 1, "epochs",
                                         integer=False)))
    return Run()


# ------------------------------------------------------------------ prices --

def parse_price(text: str) -> tuple[str, float]:
    """``ID=USD`` (USD per GPU-hour) -> (GPU id, price)."""
    gid, sep, value = str(text).partition("=")
    if not sep or not gid.strip():
        raise InvalidArgumentError(f"price {text!r}: expected GPU=USD_PER_HOUR, "
                                   "e.g. H100-SXM5-80GB=2.49")
    try:
        price = float(value)
    except ValueError:
        raise InvalidArgumentError(f"price {printable(repr(text))}: {printable(repr(value))} is "
                                   "not a number") from None
    if not (math.isfinite(price) and 0 <= price <= MAX_PRICE_USD_PER_HOUR):
        raise InvalidArgumentError(f"price {printable(repr(text))}: must be a number of USD per "
                                   f"GPU-hour in 0..{MAX_PRICE_USD_PER_HOUR:.0e}")
    return gid.strip(), price


def load_prices(path: str | Path) -> dict[str, float]:
    """Prices from a TOML or JSON file: a table/object ``{GPU id: USD per
    GPU-hour}``, at the top level or under ``prices``."""
    p = Path(path)
    where = printable(p)
    text = read_text(p, MAX_PRICE_FILE_BYTES, "price file", InvalidArgumentError,
                     missing="cannot read price file (no such file)")
    kind = "JSON" if p.suffix.lower() == ".json" else "TOML"
    try:
        data = json.loads(text) if kind == "JSON" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidArgumentError(f"{where}: not a valid {kind} price file ({exc})") from exc
    except RecursionError:  # both parsers recurse once per nested array or table
        raise InvalidArgumentError(f"{where}: not a price file ({kind} nested too deeply)") \
            from None
    if isinstance(data, dict) and isinstance(data.get("prices"), dict):
        data = data["prices"]
    if not isinstance(data, dict) or not data:
        raise InvalidArgumentError(f"{where}: expected a table of GPU id = USD per GPU-hour")
    out = {}
    for k, v in data.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidArgumentError(f"{where}: price of {printable(repr(k))} must be a number, "
                                       f"got {printable(repr(v))}")
        if not (math.isfinite(v) and 0 <= v <= MAX_PRICE_USD_PER_HOUR):  # NaN fails too
            raise InvalidArgumentError(f"{where}: price of {printable(repr(k))} must be in "
                                       f"0..{MAX_PRICE_USD_PER_HOUR:.0e} USD per GPU-hour, got {v!r}")
        out[str(k)] = float(v)
    return out


def _resolve_prices(overrides: Mapping[str, float] | None) -> dict[str, float]:
    out = {}
    for name, price in (overrides or {}).items():
        if isinstance(price, bool) or not isinstance(price, (int, float)) \
                or not math.isfinite(price) or not 0 <= price <= MAX_PRICE_USD_PER_HOUR:
            raise InvalidArgumentError(f"price of {printable(name)} must be a number of USD per "
                                       f"GPU-hour in 0..{MAX_PRICE_USD_PER_HOUR:.0e}, got {price!r}")
        out[hardware.get(name).id] = float(price)
    return out


# ------------------------------------------------------------------ search --

@dataclass
class SearchResult:
    """Ranked configurations (best first) of one model."""

    model: str
    objective: str
    table: Any                              # pandas DataFrame, ranked
    run: Run = field(default_factory=Run)
    gpus_per_node: int = 1
    max_memory_fraction: float = memory.DEFAULT_MAX_MEMORY_FRACTION
    max_batch_sizes: dict[str, int | None] = field(default_factory=dict)
    sweep: Any = field(default=None, repr=False)
    price_info: dict[str, dict] = field(default_factory=dict)
    price_basis: str = "cloud"

    def to_pandas(self):
        """One row per configuration, best first."""
        return self.table.copy()

    def fitting(self):
        """Configurations that fit in memory and meet the constraints."""
        t = self.table
        return t[t["fits"] & t["feasible"]].reset_index(drop=True)

    def best(self) -> dict | None:
        """The top-ranked configuration that fits and meets the constraints."""
        f = self.fitting()
        return None if f.empty else f.iloc[0].to_dict()

    def pareto(self):
        """Fitting, feasible, priced configurations not beaten on both time and
        cost by any other, fastest first."""
        f = self.fitting()
        time_col, cost_col = self.time_column, self.cost_column
        f = f[np.isfinite(f[cost_col].to_numpy(dtype=float))]
        f = f.sort_values([time_col, cost_col], kind="mergesort")
        keep, best_cost = [], math.inf
        for idx, cost in zip(f.index, f[cost_col]):
            if cost < best_cost:
                keep.append(idx)
                best_cost = cost
        return f.loc[keep].reset_index(drop=True)

    @property
    def time_column(self) -> str:
        return "run_hours" if self.run.given else "hours_per_1m_samples"

    @property
    def cost_column(self) -> str:
        return "run_cost_usd" if self.run.given else "usd_per_1m_samples"

    def to_dict(self) -> dict:
        def rows(df):
            return json.loads(df.to_json(orient="records"))

        return {
            "model": self.model, "objective": self.objective, "run": self.run.describe(),
            "gpus_per_node": self.gpus_per_node, "max_memory_fraction": self.max_memory_fraction,
            "max_batch_sizes": self.max_batch_sizes, "price_basis": self.price_basis,
            "price_basis_text": self.price_basis_text(), "prices": self.price_info,
            "configurations": rows(self.table), "pareto": rows(self.pareto()),
        }

    def price_basis_text(self) -> str:
        """Which prices the costs (and a cost ranking) use, in one line: the
        basis, the dates of the GPUs' prices, estimates and overrides."""
        from predictor.hardware import PRICE_BASES

        info = self.price_info.values()
        dates = sorted({str(p["date"]) for p in info if p.get("date") and
                        p.get("usd_per_gpu_hour") is not None})
        span = "" if not dates else dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
        text = f"{PRICE_BASES[self.price_basis][1]} USD per GPU-hour" + (f" ({span})" if span else "")
        est = sorted(g for g, p in self.price_info.items() if p.get("estimate")
                     and p.get("usd_per_gpu_hour") is not None)
        none = sorted(g for g, p in self.price_info.items() if p.get("usd_per_gpu_hour") is None)
        over = sorted(g for g, p in self.price_info.items() if p.get("source") == "override")
        if est:
            text += f"; estimates: {', '.join(est)}"
        if over:
            text += f"; overridden: {', '.join(over)}"
        if none:
            text += f"; no price on this basis: {', '.join(none)}"
        return text

    def __repr__(self) -> str:
        b = self.best()
        top = (f"best {b['gpu']} x{self.gpus_per_node} batch {b['batch_size']}: "
               f"{b['iteration_ms']:.1f} ms/iter" if b else "nothing fits")
        return (f"SearchResult({self.model}, objective={self.objective}, "
                f"{len(self.table)} configurations, {top})")


def _batch_list(graph, batch_sizes) -> list[int]:
    if batch_sizes is None:
        if not graph.batch_scalable:
            return [graph.batch_size]
        return sorted(set(DEFAULT_BATCH_SIZES) | {graph.batch_size})
    if isinstance(batch_sizes, (int, np.integer)):
        return [int(batch_sizes)]
    return list(batch_sizes)


def search(graph, *, objective: str = "time", gpus: str | Iterable[str] | None = "all",
           batch_sizes: Iterable[int] | int | None = None,
           max_memory_fraction: float = memory.DEFAULT_MAX_MEMORY_FRACTION,
           constraints: Mapping[str, float] | None = None,
           prices: Mapping[str, float] | None = None, samples: int | None = None,
           epochs: float | None = None, iterations: int | None = None,
           gpus_per_node: int = 1, dtype=None, tf32_matmul: bool | None = None,
           tf32_conv: bool | None = None, price_basis: str = "cloud") -> SearchResult:
    """Rank every (GPU, batch size) for `graph` by `objective` (see the module doc).

    constraints: bounds on the table's columns: ``max_iteration_ms``,
        ``min_throughput`` (samples/s), ``max_usd_per_hour``,
        ``max_usd_per_1m_samples``, ``max_hours`` and ``max_cost_usd`` (need a
        run), ``max_memory_gb``, ``min_batch_size``, ``max_batch_size``.
    prices: ``{GPU id or alias: USD per GPU-hour}`` overriding the GPU database's.
    price_basis: which of the database's prices to use: "cloud" (on-demand list
        prices, the default) or "marketplace"; a GPU without a price on that
        basis has none (never one from the other basis), unless `prices` gives one.
    """
    import pandas as pd

    if objective not in OBJECTIVES:
        raise InvalidArgumentError(f"objective must be one of {', '.join(OBJECTIVES)}, "
                                   f"got {objective!r}")
    memory.check_fraction(max_memory_fraction)
    n = parallel.check_gpus_per_node(gpus_per_node)
    run = _check_run(samples, epochs, iterations)
    bounds = dict(constraints or {})
    check_bounds(bounds, CONSTRAINTS)
    for key in bounds:
        if key in ("max_hours", "max_cost_usd") and not run.given:
            raise InvalidArgumentError(f"constraint {key} needs a run (samples or iterations)")
    overrides = _resolve_prices(prices)
    if price_basis not in hardware.PRICE_BASES:
        raise InvalidArgumentError(f"price basis must be one of "
                                   f"{', '.join(hardware.PRICE_BASES)}, got {price_basis!r}")

    res = engine.sweep(graph, gpus, _batch_list(graph, batch_sizes), dtype=dtype,
                       tf32_matmul=tf32_matmul, tf32_conv=tf32_conv,
                       max_memory_fraction=max_memory_fraction)
    chosen = hardware.database().resolve(res.gpus)
    code = dtypes.parse(dtype)
    batches = res.batch_sizes
    compute_ms = res.iteration_ms
    comm_ms = np.zeros_like(compute_ms)
    if n > 1:
        grad_bytes = parallel.gradient_bytes(graph, code)
        for gi, g in enumerate(chosen):
            comm_ms[gi] = parallel.exposed_comm_ms(res.backward_ms[gi], grad_bytes, n, g)
    iter_ms = compute_ms + comm_ms
    mem_bytes = memory.evaluate(graph, chosen, batches, code, data_parallel=n)
    if mem_bytes is None:
        mem_gb = np.full(iter_ms.shape, np.nan)
        fits = np.ones(iter_ms.shape, dtype=bool)
    else:
        mem_gb = mem_bytes / memory.GiB
        cap = np.asarray([g.memory_gb for g in chosen])[:, None]
        fits = mem_gb <= max_memory_fraction * cap

    price_info, unit_price = {}, []
    for g in chosen:
        if g.id in overrides:
            price_info[g.id] = {"usd_per_gpu_hour": overrides[g.id], "source": "override",
                                "basis": "override"}
        else:
            pr = g.price(price_basis)
            price_info[g.id] = {"usd_per_gpu_hour": pr.usd_per_hour, "source": pr.source,
                                "date": pr.date, "basis": price_basis, "estimate": pr.estimate}
        p = price_info[g.id]["usd_per_gpu_hour"]
        unit_price.append(np.nan if p is None else float(p))
    usd_hour = np.asarray(unit_price)[:, None] * n * np.ones_like(iter_ms)

    gi, bi = np.meshgrid(np.arange(len(chosen)), np.arange(len(batches)), indexing="ij")
    gi, bi = gi.ravel(), bi.ravel()
    global_batch = batches[bi] * n
    it = iter_ms.ravel()
    thr = global_batch / (it / 1e3)
    hours_1m = 1e6 / thr / 3600.0
    df = pd.DataFrame({
        "gpu": np.asarray(res.gpus, dtype=object)[gi],
        "gpus": n,
        "batch_size": batches[bi],
        "global_batch": global_batch,
        "iteration_ms": it,
        # The 90th percentile of |error| measured for single-GPU predictions
        # of this GPU's standing (predictor.expected_error; NaN: none).
        "error_p90_pct": res.error_p90[gi],
        "compute_ms": compute_ms.ravel(),
        "comm_ms": comm_ms.ravel(),
        "samples_per_s": thr,
        "usd_per_hour": usd_hour.ravel(),
        "hours_per_1m_samples": hours_1m,
        "usd_per_1m_samples": hours_1m * usd_hour.ravel(),
        "memory_gb": mem_gb.ravel(),
        "memory_limit_gb": max_memory_fraction * np.asarray([g.memory_gb for g in chosen])[gi],
        "fits": fits.ravel(),
    })
    if n > 1:
        one_gpu = compute_ms.ravel()
        df["scaling_efficiency"] = one_gpu / it
    if run.given:
        if run.iterations is not None:
            iters = np.full(len(df), float(run.iterations))
        else:
            iters = np.ceil(run.samples * run.epochs / global_batch)
        df["run_iterations"] = iters
        df["run_hours"] = iters * it / 3.6e6
        df["run_cost_usd"] = df["run_hours"] * df["usd_per_hour"]
    df["feasible"] = within_bounds(df, bounds, CONSTRAINTS)

    if objective == "throughput":
        key, ascending = "samples_per_s", False
    elif objective == "cost":
        key, ascending = ("run_cost_usd" if run.given else "usd_per_1m_samples"), True
    else:
        key, ascending = ("run_hours" if run.given else "hours_per_1m_samples"), True
    order = df.assign(_ok=~(df["fits"] & df["feasible"]),
                      _nan=df[key].isna(),
                      _key=df[key] if ascending else -df[key])
    order = order.sort_values(["_ok", "_nan", "_key", "iteration_ms"], kind="mergesort")
    table = df.loc[order.index].reset_index(drop=True)
    table.insert(0, "rank", np.arange(1, len(table) + 1))

    max_batches = memory.max_batch_sizes(graph, chosen, max_memory_fraction=max_memory_fraction,
                                         dtype=dtype, data_parallel=n)
    return SearchResult(model=graph.name, objective=objective, table=table, run=run,
                        gpus_per_node=n, max_memory_fraction=max_memory_fraction,
                        max_batch_sizes=max_batches, sweep=res, price_info=price_info,
                        price_basis=price_basis)
