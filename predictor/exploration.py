"""Many models: trace and sweep every candidate of a design space, in parallel,
streaming results to disk and resuming after a crash.

    space = predictor.Space(factory, {"depth": [2, 4, 8], "width": [64, 128]})
    res = predictor.explore(space, gpus=["T4", "H100-SXM5-80GB"], batch_sizes=[8, 32],
                            objective="throughput", constraints={"latency_ms": 20},
                            out="runs/nas1")
    res.to_pandas()   # one row per (candidate, GPU, batch size), best first

``factory(**config)`` returns ``(model, example_inputs)``, as the CLI's
``file.py:factory`` specs do. Each candidate is traced once (``predictor.trace``)
and its graph swept over every GPU and batch size by one ``predictor.search``
(the numba grid kernel); what a candidate yields is a *record* (its config,
parameters, and a row per GPU x batch, or a one-line error).

Where work goes:

- executors: ``"local"`` (the default) runs a process pool over this machine's
  cores (``predictor.executors``); ``"ray"`` runs one Ray task per candidate,
  or per `chunk_size` candidates, on a Ray cluster (``predictor.ray_executor``,
  the ``[ray]`` extra). A worker that dies is retried (``max_retries``); a
  candidate that fails is recorded with its one-line error, and the run goes on.
- ``out``: records stream into ``out/parts/part-*.jsonl`` files, each written
  atomically (``predictor.io``), a file every ``flush_seconds`` (2 s) or
  ``flush_every`` candidates (4,096), whichever comes first; many files are
  merged into one when a run starts. A run killed at any point loses at most
  the records not yet flushed: the same call (or CLI command) again reads what is there and
  computes only the missing candidates. A candidate is identified by a hash of
  its config, the factory's name and source, the settings that change its
  numbers (GPUs, batch sizes, dtype, amp, TF32, mode, optimizer, prices) and the
  predictor's version and graph-producing sources.
- graphs: candidates that build the same network (the same structure and input
  shapes, ``predictor.fingerprint``) share one trace: in a worker's memory, and
  on disk in ``out/graphs`` (or `graph_cache`), which every worker reads.

Ranking, fit and constraints are applied when the records are read, so the
objective and constraints can change between runs without recomputing.

``predictor.explore(...)`` is this module's :func:`explore` (a submodule named
``predictor.explore`` would shadow the function on the package).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import itertools
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from predictor import __version__
from predictor.candidate import Settings
from predictor.constraints import check_bounds, within_bounds
from predictor.errors import InvalidArgumentError
from predictor.io import printable

EXECUTORS = ("local", "ray")
OBJECTIVES = ("throughput", "latency", "cost")

# explore's constraint names -> (column, "max" | "min"). memory_fraction is the
# fit threshold (a fraction of each GPU's memory), not a column bound.
CONSTRAINTS = {
    "latency_ms": ("iteration_ms", "max"),
    "max_iteration_ms": ("iteration_ms", "max"),
    "min_throughput": ("samples_per_s", "min"),
    "max_usd_per_hour": ("usd_per_hour", "max"),
    "max_usd_per_1m_samples": ("usd_per_1m_samples", "max"),
    "max_memory_gb": ("memory_gb", "max"),
    "max_params": ("params", "max"),
    "min_params": ("params", "min"),
    "max_flops": ("flops", "max"),
    "min_batch_size": ("batch_size", "min"),
    "max_batch_size": ("batch_size", "max"),
}
DEFAULT_MEMORY_FRACTION = 0.9

# A grid larger than this is a typo (and would not fit in memory as configs).
MAX_CANDIDATES = 10_000_000
PARTS = "parts"
GRAPHS = "graphs"


# ------------------------------------------------------------------- space --

def _canonical(config: Any, where: str) -> str:
    if not isinstance(config, Mapping):
        raise InvalidArgumentError(f"{where}: a config must be a dict of keyword arguments, "
                                   f"got {type(config).__name__}")
    for k in config:
        if not isinstance(k, str) or not k.isidentifier():
            raise InvalidArgumentError(f"{where}: config keys must be argument names, "
                                       f"got {printable(repr(k), 100)}")
    try:
        return json.dumps(config, sort_keys=True, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{where}: config values must be JSON numbers, strings, "
                                   f"booleans, None, lists or dicts ({exc})") from None


class Space:
    """The candidates of a design space: `factory` and a list of configs.

    ``Space(factory, {"depth": [18, 34], "width": [32, 64]})`` is the grid
    product of the lists (4 configs); ``Space(factory, [{"depth": 18}, ...])``
    (any iterable of dicts) is an explicit list; ``Space(factory)`` is one
    candidate, ``factory()``. Configs equal as JSON are one candidate.
    ``factory(**config)`` must return ``(model, example_inputs)``.
    """

    def __init__(self, factory: Callable, configs: Mapping[str, Iterable] | Iterable[Mapping] | None = None,
                 *, name: str | None = None):
        if not callable(factory):
            raise InvalidArgumentError(f"Space needs a factory function, got "
                                       f"{type(factory).__name__}")
        self.factory = factory
        self.name = name or getattr(factory, "__name__", type(factory).__name__)
        if configs is None:
            items: Iterable[Mapping] = [{}]
        elif isinstance(configs, Mapping):
            items = self._grid(configs)
        elif isinstance(configs, (str, bytes)) or not isinstance(configs, Iterable):
            raise InvalidArgumentError("Space configs: a dict of lists (a grid) or a list of "
                                       f"config dicts, got {type(configs).__name__}")
        else:
            items = configs
        self.configs: list[dict] = []
        self.canonical: list[str] = []
        seen = set()
        for i, c in enumerate(items):
            if i >= MAX_CANDIDATES:
                raise InvalidArgumentError(f"Space: more than {MAX_CANDIDATES:,} candidates")
            text = _canonical(c, f"config {i}")
            if text not in seen:
                seen.add(text)
                self.configs.append(dict(c))
                self.canonical.append(text)
        if not self.configs:
            raise InvalidArgumentError("Space: no candidate (an empty list of configs)")

    @staticmethod
    def _grid(grid: Mapping[str, Iterable]):
        keys, values = [], []
        size = 1
        for k, v in grid.items():
            if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Iterable):
                raise InvalidArgumentError(f"Space grid: the values of {printable(repr(k), 100)} "
                                           f"must be a list, got {printable(repr(v), 100)}")
            v = list(v)
            if not v:
                raise InvalidArgumentError(f"Space grid: no value for {printable(repr(k), 100)}")
            keys.append(k)
            values.append(v)
            size *= len(v)
        if size > MAX_CANDIDATES:
            raise InvalidArgumentError(f"Space grid: {size:,} candidates, more than "
                                       f"{MAX_CANDIDATES:,}")
        return (dict(zip(keys, combo)) for combo in itertools.product(*values))

    def __len__(self) -> int:
        return len(self.configs)

    def __iter__(self):
        return iter(self.configs)

    def __repr__(self) -> str:
        return f"Space({self.name}, {len(self)} candidates)"


def factory_identity(factory: Callable) -> dict:
    """What names a factory in a candidate's key: its qualified name and a
    hash of its own source (editing the factory recomputes; editing the grid
    around it does not)."""
    target = factory.func if hasattr(factory, "func") else factory  # functools.partial
    try:
        src = inspect.getsource(target)
    except (OSError, TypeError):
        src = None
    ident = {"name": f"{getattr(target, '__module__', '?')}:"
                     f"{getattr(target, '__qualname__', type(target).__name__)}",
             "source": hashlib.sha256(src.encode()).hexdigest() if src else None}
    if hasattr(factory, "func"):
        ident["partial"] = _canonical({"args": list(factory.args), "kw": dict(factory.keywords)},
                                      "factory partial")
    return ident


def candidate_keys(space: Space, settings: Settings) -> list[str]:
    from predictor import cache

    base = json.dumps({"factory": factory_identity(space.factory), "settings": settings.to_json(),
                       "predictor": __version__, "sources": cache.source_hash()},
                      sort_keys=True)
    prefix = hashlib.sha256(base.encode()).digest()
    return [hashlib.sha256(prefix + c.encode()).hexdigest()[:32] for c in space.canonical]


# ------------------------------------------------------------- part files --

class PartWriter:
    """Buffers records and writes them as atomically written JSONL part files."""

    def __init__(self, out: Path | None, flush_every: int = 4096, flush_seconds: float = 2.0):
        self.dir = None if out is None else Path(out) / PARTS
        self.flush_every, self.flush_seconds = flush_every, flush_seconds
        self.buffer: list[dict] = []
        self.last = time.monotonic()
        self.seq = 0
        self.files: list[Path] = []

    def add(self, records: list[dict]) -> None:
        self.buffer.extend(records)
        if len(self.buffer) >= self.flush_every or \
                time.monotonic() - self.last >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        self.last = time.monotonic()
        if not self.buffer or self.dir is None:
            self.buffer = [] if self.dir is not None else self.buffer
            return
        from predictor.io import atomic_write_text

        name = f"part-{time.time_ns():020d}-{os.getpid()}-{self.seq:05d}.jsonl"
        self.seq += 1
        text = "".join(json.dumps(r, allow_nan=False, separators=(",", ":")) + "\n"
                       for r in self.buffer)
        path = self.dir / name
        atomic_write_text(path, text)
        self.files.append(path)
        self.buffer = []


def _part_files(out: str | Path) -> list[Path]:
    folder = Path(out) / PARTS
    return sorted(folder.glob("part-*.jsonl")) if folder.is_dir() else []


def read_parts(out: str | Path, files: list[Path] | None = None) -> dict[str, dict]:
    """Every record under `out` by key; a later file's record replaces an
    earlier one's, except that a failure never replaces a success."""
    found: dict[str, dict] = {}
    for path in (_part_files(out) if files is None else files):
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("key"), str):
                continue
            old = found.get(rec["key"])
            if old is not None and old.get("status") == "ok" and rec.get("status") != "ok":
                continue
            found[rec["key"]] = rec
    return found


# Part files beyond this are merged into one when a run starts.
COMPACT_ABOVE = 256


def compact(out: str | Path) -> dict[str, dict]:
    """Read every record under `out`; when there are many part files, write
    them as one (atomically) and then remove the files it replaces. A kill
    between the two leaves duplicates, which reading resolves."""
    files = _part_files(out)
    records = read_parts(out, files)
    if len(files) > COMPACT_ABOVE and records:
        from predictor.io import atomic_write_text

        name = f"part-{time.time_ns():020d}-{os.getpid()}-compact.jsonl"
        atomic_write_text(Path(out) / PARTS / name, "".join(
            json.dumps(r, allow_nan=False, separators=(",", ":")) + "\n"
            for r in records.values()))
        for f in files:
            try:
                f.unlink()
            except OSError:
                pass
    return records


# ----------------------------------------------------------------- result --

ROW_COLUMNS = ("rank", "candidate", "config", "params", "flops", "gpu", "batch_size",
               "iteration_ms", "samples_per_s", "memory_gb", "memory_limit_gb", "fits",
               "feasible", "usd_per_hour", "usd_per_1m_samples")


@dataclass
class ExploreResult:
    """Ranked (candidate, GPU, batch size) rows, best first, and the failures."""

    table: Any                       # pandas DataFrame
    failures: Any                    # pandas DataFrame: candidate, config, error
    objective: str
    candidates: int
    computed: int = 0
    reused: int = 0
    seconds: float = 0.0
    out: Path | None = None
    executor: str = "local"
    workers: int = 1
    graph_sources: dict = field(default_factory=dict)

    def to_pandas(self):
        """One row per (candidate, GPU, batch size), best first: config,
        params, FLOPs per iteration, ms, samples/s, GiB, fits, $."""
        return self.table.copy()

    def fitting(self):
        """Rows that fit in memory and meet the constraints."""
        t = self.table
        return t[t["fits"] & t["feasible"]].reset_index(drop=True)

    def best(self) -> dict | None:
        f = self.fitting()
        return None if f.empty else f.iloc[0].to_dict()

    @property
    def failed(self) -> int:
        return len(self.failures)

    def __repr__(self) -> str:
        b = self.best()
        top = (f"best {b['config']} on {b['gpu']} batch {b['batch_size']}: "
               f"{b['iteration_ms']:.2f} ms" if b else "nothing fits")
        return (f"ExploreResult({self.candidates} candidates, {self.failed} failed, "
                f"objective={self.objective}, {top})")


def check_constraints(constraints: Mapping[str, float] | None) -> tuple[dict, float]:
    """(column bounds, memory fraction) from explore's constraints."""
    bounds = dict(constraints or {})
    fraction = bounds.pop("memory_fraction", DEFAULT_MEMORY_FRACTION)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
            or not math.isfinite(fraction) or not 0 < fraction <= 1:
        raise InvalidArgumentError(f"constraint memory_fraction must be in (0, 1], "
                                   f"got {fraction!r}")
    check_bounds(bounds, CONSTRAINTS, also=("memory_fraction",))
    return bounds, float(fraction)


def build_table(records: list[dict], objective: str, bounds: dict, fraction: float):
    """(ranked rows, failures) from candidate records."""
    import pandas as pd

    rows, fails = [], []
    for rec in records:
        cand = rec["key"][:12]
        if rec.get("status") != "ok":
            fails.append({"candidate": cand, "config": rec.get("config"),
                          "error": rec.get("error", "unknown error")})
            continue
        for r in rec["rows"]:
            usd = r["usd_per_hour"]
            rows.append({
                "candidate": cand, "config": rec["config"], "params": rec["params"],
                "flops": r["flops"], "gpu": r["gpu"], "batch_size": r["batch_size"],
                "iteration_ms": r["iteration_ms"], "samples_per_s": r["samples_per_s"],
                "memory_gb": np.nan if r["memory_gb"] is None else r["memory_gb"],
                "memory_limit_gb": fraction * r["memory_capacity_gb"],
                "usd_per_hour": np.nan if usd is None else usd,
            })
    failures = pd.DataFrame(fails, columns=["candidate", "config", "error"])
    if not rows:
        return pd.DataFrame(columns=list(ROW_COLUMNS)), failures
    df = pd.DataFrame(rows)
    df["usd_per_1m_samples"] = 1e6 / df["samples_per_s"] / 3600.0 * df["usd_per_hour"]
    mem = df["memory_gb"].to_numpy(dtype=float)
    df["fits"] = np.isnan(mem) | (mem <= df["memory_limit_gb"].to_numpy(dtype=float))
    df["feasible"] = within_bounds(df, bounds, CONSTRAINTS)
    key, ascending = {"throughput": ("samples_per_s", False), "latency": ("iteration_ms", True),
                      "cost": ("usd_per_1m_samples", True)}[objective]
    order = df.assign(_ok=~(df["fits"] & df["feasible"]), _nan=df[key].isna(),
                      _key=df[key] if ascending else -df[key])
    order = order.sort_values(["_ok", "_nan", "_key", "iteration_ms", "candidate", "gpu",
                               "batch_size"], kind="mergesort")
    df = df.loc[order.index].reset_index(drop=True)
    df.insert(0, "rank", np.arange(1, len(df) + 1))
    return df[list(ROW_COLUMNS)], failures


# ---------------------------------------------------------------- explore --

def _check_batches(batch_sizes) -> tuple[int, ...] | None:
    if batch_sizes is None:
        return None
    if isinstance(batch_sizes, (int, np.integer)):
        batch_sizes = [batch_sizes]
    out = []
    for b in batch_sizes:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b <= 0:
            raise InvalidArgumentError(f"batch sizes must be positive integers, got {b!r}")
        out.append(int(b))
    if not out:
        raise InvalidArgumentError("no batch size given")
    return tuple(sorted(set(out)))


def _check_positive_int(x, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x <= 0:
        raise InvalidArgumentError(f"{what} must be a positive integer, got {x!r}")
    return int(x)


def explore(space: Space, *, gpus: str | Iterable[str] = "T4", batch_sizes: Iterable[int] | int | None = None,
            objective: str = "throughput", constraints: Mapping[str, float] | None = None,
            executor: str = "local", workers: int | None = None, address: str | None = None,
            out: str | Path | None = None, graph_cache: str | Path | None = None,
            mode: str = "train", optimizer: str | None = "adam", dtype: str | None = None,
            tf32_matmul: bool | None = None, amp: str | None = None,
            prices: Mapping[str, float] | None = None,
            chunk_size: int = 1, max_retries: int = 3, retry_failed: bool = False,
            flush_every: int = 4096, flush_seconds: float = 2.0,
            progress: bool = False) -> ExploreResult:
    """Trace and sweep every candidate of `space` (see the module doc).

    gpus, batch_sizes: the GPUs and per-GPU batch sizes to predict (batch sizes
        default to each candidate's traced one).
    objective: "throughput" (most samples/s), "latency" (least ms per
        iteration) or "cost" (least USD per 1M samples).
    constraints: ``memory_fraction`` (a row fits when its peak memory is at most
        this fraction of the GPU's; default 0.9), ``latency_ms``, and bounds on
        the table's columns (see ``CONSTRAINTS``: ``min_throughput``,
        ``max_params``, ``max_usd_per_1m_samples``, ...).
    executor: "local" (a process pool of `workers`, default the machine's
        cores) or "ray" (Ray tasks; `address` of a cluster, e.g. "auto", or a
        local one of `workers` CPUs).
    out: a folder the records stream to; a second call with the same folder
        resumes (computes only the candidates missing there). Without it the
        results live in memory only.
    retry_failed: compute again the candidates recorded as failed.
    amp: trace every candidate under autocast ("bf16", or "fp16" with a
        GradScaler), as ``predictor.trace(amp=)``; `dtype` does not combine
        with it.
    """
    from predictor import design_search, dtypes, hardware, memory
    from predictor.frontend import autocast, optimizers

    if not isinstance(space, Space):
        raise InvalidArgumentError(f"explore needs a predictor.Space, got {type(space).__name__}")
    if objective not in OBJECTIVES:
        raise InvalidArgumentError(f"objective must be one of {', '.join(OBJECTIVES)}, "
                                   f"got {printable(repr(objective), 100)}")
    if executor not in EXECUTORS:
        raise InvalidArgumentError(f"executor must be 'local' or 'ray', got "
                                   f"{printable(repr(executor), 100)}")
    bounds, fraction = check_constraints(constraints)
    memory.check_fraction(fraction)
    if mode not in ("train", "inference"):
        raise InvalidArgumentError(f"mode must be 'train' or 'inference', got {mode!r}")
    optimizer = optimizers.check(optimizer) if mode == "train" else None
    dtypes.parse(dtype)
    amp = autocast.check(amp)
    if amp is not None and dtype is not None:
        raise InvalidArgumentError(f"amp={amp!r} traces each candidate under autocast, which "
                                   "gives every op its dtype; drop dtype= (or amp=)")
    chosen = hardware.database().resolve(gpus)
    if amp == "fp8":
        chosen = hardware.float8_gpus(chosen, gpus, warn=True)
    overrides = design_search._resolve_prices(prices)
    chunk_size = _check_positive_int(chunk_size, "chunk_size")
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise InvalidArgumentError(f"max_retries must be a non-negative integer, got {max_retries!r}")
    if workers is not None:
        workers = _check_positive_int(workers, "workers")
    settings = Settings(gpus=tuple(g.id for g in chosen), batch_sizes=_check_batches(batch_sizes),
                        mode=mode, optimizer=optimizer, dtype=dtype, tf32_matmul=tf32_matmul,
                        prices=tuple(sorted(overrides.items())), amp=amp)
    out_path = None if out is None else Path(out)
    if out_path is not None and out_path.exists() and not out_path.is_dir():
        raise InvalidArgumentError(f"out {printable(out_path, 300)}: exists and is not a folder")
    graph_dir = str(graph_cache) if graph_cache is not None else \
        (None if out_path is None else str(out_path / GRAPHS))

    start = time.perf_counter()
    keys = candidate_keys(space, settings)
    done = compact(out_path) if out_path is not None else {}
    wanted = set(keys)
    todo = [i for i, k in enumerate(keys)
            if k not in done or (retry_failed and done[k].get("status") != "ok")]
    records = {k: r for k, r in done.items() if k in wanted}
    writer = PartWriter(out_path, flush_every=flush_every, flush_seconds=flush_seconds)
    state = {"factory": space.factory, "configs": space.configs, "keys": keys,
             "settings": settings, "graph_dir": graph_dir}
    chunks = [todo[i:i + chunk_size] for i in range(0, len(todo), chunk_size)]
    n_workers = workers or os.cpu_count() or 1
    sources: dict[str, int] = {}

    stack = contextlib.ExitStack()
    if executor == "ray" and chunks:
        from predictor import ray_executor

        # Connected (or refused in one line) before the progress bar starts.
        stack.enter_context(ray_executor.session(workers, address))
    bar = _progress(progress, len(todo), len(keys) - len(todo))
    failed = 0

    def on_records(recs: list[dict]) -> None:
        nonlocal failed
        for r in recs:
            records[r["key"]] = r
            if r.get("status") == "ok":
                sources[r["graph"]] = sources.get(r["graph"], 0) + 1
            else:
                failed += 1
        writer.add(recs)
        if bar is not None:
            bar.update(len(recs))
            bar.set_postfix(failed=failed, refresh=False)

    try:
        if chunks:
            if executor == "ray":
                ray_executor.run(state, chunks, on_records, max_retries=max_retries)
            else:
                from predictor import executors

                executors.run_local(state, chunks, on_records, workers=min(n_workers, len(chunks)),
                                    max_retries=max_retries)
    finally:
        writer.flush()
        if bar is not None:
            bar.close()
        stack.close()

    ordered = [records[k] for k in dict.fromkeys(keys) if k in records]
    table, failures = build_table(ordered, objective, bounds, fraction)
    return ExploreResult(table=table, failures=failures, objective=objective,
                         candidates=len(keys), computed=len(todo), reused=len(keys) - len(todo),
                         seconds=time.perf_counter() - start, out=out_path, executor=executor,
                         workers=n_workers if executor == "local" else (workers or 0),
                         graph_sources=sources)


def _progress(show: bool, total: int, already: int):
    """A progress bar on stderr: candidates done, per second, ETA, failures."""
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="explore" + (f" ({already:,} done before)" if already else ""),
                unit="cand", file=sys.stderr, dynamic_ncols=True, smoothing=0.1,
                postfix={"failed": 0})
