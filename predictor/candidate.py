"""One candidate of ``predictor.explore``, as a worker evaluates it.

``evaluate`` builds the model (``factory(**config)`` under a FakeTensorMode),
finds its traced graph (in this process's memory or the run's graph folder,
by a fingerprint of the model's structure and input shapes: see
``predictor.fingerprint``) or traces it, sweeps it over every GPU and batch
size with one ``predictor.search``, and returns a JSON-able *record*: the
config, parameters, a row per (GPU, batch size), or the one-line error that
stopped it. It never raises for a problem with the candidate.

The executors (``predictor.executors``, ``predictor.ray_executor``) call
``evaluate_chunk`` in their workers; ``predictor.exploration`` drives them.
"""

from __future__ import annotations

import math
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from predictor.errors import InvalidArgumentError, PredictorError, TraceError
from predictor.io import printable


def one_line(exc: BaseException) -> str:
    """A one-line description of an exception from user code."""
    if isinstance(exc, PredictorError):
        return printable(str(exc), 2000)
    msg = " ".join(str(exc).split())
    if len(msg) > 300:
        msg = msg[:297] + "..."
    return printable(f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__, 2000)


# --------------------------------------------------------------- settings --

@dataclass(frozen=True)
class Settings:
    """What a candidate's numbers depend on, besides its config."""

    gpus: tuple[str, ...]
    batch_sizes: tuple[int, ...] | None      # None: each candidate's traced batch size
    mode: str = "train"
    optimizer: str | None = "adam"
    dtype: str | None = None
    tf32_matmul: bool | None = None
    prices: tuple[tuple[str, float], ...] = ()
    amp: str | None = None                    # traced under autocast ("bf16", "fp16", "fp8")

    def to_json(self) -> dict:
        return {"gpus": list(self.gpus), "batch_sizes": None if self.batch_sizes is None
                else list(self.batch_sizes), "mode": self.mode, "optimizer": self.optimizer,
                "dtype": self.dtype, "tf32_matmul": self.tf32_matmul,
                "prices": [list(p) for p in self.prices], "amp": self.amp}


# ----------------------------------------------------------- one candidate --

_MEMO: "OrderedDict[str, Any]" = OrderedDict()  # fingerprint -> Graph, per worker process
_MEMO_SIZE = 16


def _build(factory: Callable, config: dict, device: str | None = "meta"):
    """(model, inputs) from factory(**config) with tensors on the meta device
    (no memory, no initialisation compute); device=None builds them under a
    FakeTensorMode instead."""
    import contextlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    where = torch.device(device) if device else FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with where if device else contextlib.nullcontext(), \
                contextlib.nullcontext() if device else where:
            built = factory(**config)
    except PredictorError:
        raise
    except Exception as exc:  # noqa: BLE001 - user code
        raise TraceError(f"the factory raised {one_line(exc)}") from None
    if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], torch.nn.Module)):
        raise TraceError(f"the factory returned {type(built).__name__}; expected "
                         "(model, example_inputs)")
    return built


def _trace(factory: Callable, config: dict, model, inputs, settings: Settings):
    """Trace the module built on the meta device (`model`; None when it could
    not be built there); a model that cannot be traced from there (a forward
    that mixes in tensors it makes itself) is traced from the factory, called
    again under the tracer's own fake mode."""
    import predictor

    try:
        if model is not None:
            return predictor.trace(model, inputs, optimizer=settings.optimizer,
                                   mode=settings.mode, name="candidate", amp=settings.amp)
    except PredictorError:
        pass
    return predictor.trace(lambda: _build(factory, config, None),
                           optimizer=settings.optimizer, mode=settings.mode, name="candidate",
                           amp=settings.amp)


def _graph(factory: Callable, config: dict, settings: Settings, graph_dir: str | None):
    """(Graph, where it came from: 'traced' | 'memory' | 'disk')."""
    from predictor import cache, fingerprint

    try:
        model, inputs = _build(factory, config)
        meta = True
    except TraceError:
        # A factory that computes with real values (x.item(), torch.load) cannot
        # build on the meta device; a fake mode carries values it can check.
        model, inputs = _build(factory, config, None)
        meta = False
    fp = fingerprint.structure(model, inputs, mode=settings.mode, optimizer=settings.optimizer,
                               amp=settings.amp)
    key = None
    if fp is not None:
        if fp in _MEMO:
            _MEMO.move_to_end(fp)
            return _MEMO[fp], "memory"
        key = cache.graph_key({"structure": fp}, batch_size=0, seq_len=None, mode=settings.mode,
                              optimizer=settings.optimizer, extra="explore")
        if graph_dir is not None:
            g = cache.load(key, "candidate", graph_dir)
            if g is not None:
                _remember(fp, g)
                return g, "disk"
    g = _trace(factory, config, model if meta else None, inputs, settings)
    if fp is not None:
        _remember(fp, g)
        if graph_dir is not None:
            cache.store(key, g, "candidate", graph_dir)
    return g, "traced"


def _remember(fp: str, g) -> None:
    _MEMO[fp] = g
    while len(_MEMO) > _MEMO_SIZE:
        _MEMO.popitem(last=False)


def _rows(graph, settings: Settings) -> list[dict]:
    """A row per (GPU, batch size) from one engine sweep of the graph."""
    from predictor import engine, hardware

    batches = [graph.batch_size] if settings.batch_sizes is None else list(settings.batch_sizes)
    res = engine.sweep(graph, list(settings.gpus), batches, dtype=settings.dtype,
                       tf32_matmul=settings.tf32_matmul, max_memory_fraction=1.0)
    chosen = hardware.database().resolve(res.gpus)
    prices = dict(settings.prices)
    ms = res.iteration_ms
    mem = res.memory_gb if res.memory_bytes is not None else None
    rows = []
    for bi, b in enumerate(res.batch_sizes):
        b = int(b)
        flops = float(sum(graph.flops(b).values()))
        for gi, g in enumerate(chosen):
            t = float(ms[gi, bi])
            thr = b / (t / 1e3)
            if not (math.isfinite(t) and t > 0 and math.isfinite(thr) and thr > 0):
                raise InvalidArgumentError(f"non-finite prediction on {g.id} at batch {b}")
            price = prices.get(g.id, g.price_per_hour)
            rows.append({
                "gpu": g.id, "batch_size": b, "iteration_ms": t, "samples_per_s": thr,
                "memory_gb": None if mem is None else _num(mem[gi, bi]),
                "memory_capacity_gb": float(g.memory_gb),
                "usd_per_hour": None if price is None else _num(price), "flops": flops,
            })
    return rows


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def evaluate(factory: Callable, config: dict, key: str, settings: Settings,
             graph_dir: str | None) -> dict:
    """One candidate's record: never raises for a problem with the candidate."""
    start = time.perf_counter()
    rec: dict[str, Any] = {"key": key, "config": config}
    try:
        graph, source = _graph(factory, config, settings, graph_dir)
        rows = _rows(graph, settings)
        rec.update(status="ok", params=int(graph.parameters), graph=source, rows=rows)
    except Exception as exc:  # noqa: BLE001 - a bad candidate is recorded, not fatal
        rec.update(status="failed", error=one_line(exc))
    rec["seconds"] = round(time.perf_counter() - start, 4)
    rec["pid"] = os.getpid()
    return rec


_WARM: list[bool] = []


def warm_up(settings: Settings) -> None:
    """Import the tracer, load the numba kernels and take the first-call paths
    of common layers (convolution, batch and layer norm, linear, attention) once,
    by tracing and sweeping two tiny models: forked workers then start warm
    (each would otherwise spend seconds on the same). Once per process."""
    if _WARM:
        return
    _WARM.append(True)
    import torch

    def cnn():
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
            torch.nn.Linear(4, 4)), (torch.zeros(2, 3, 8, 8),)

    def encoder():
        return torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), \
            (torch.zeros(2, 4, 8),)

    for tiny in (cnn, encoder):
        try:
            graph, _ = _graph(tiny, {}, settings, None)
            _rows(graph, settings)
        except Exception:  # noqa: BLE001 - only an optimisation
            pass
    _MEMO.clear()


# A worker's view of the run (set once per process: by fork, or by the pool's initializer).
_STATE: dict[str, Any] = {}


def set_state(state: dict) -> None:
    _STATE.clear()
    _STATE.update(state)
    _single_threaded()


def _single_threaded() -> None:
    """One thread per worker: the workers are the parallelism."""
    try:
        import torch

        torch.set_num_threads(1)
    except Exception:  # noqa: BLE001 - best effort
        pass
    try:
        import numba

        numba.set_num_threads(1)
    except Exception:  # noqa: BLE001
        pass


def evaluate_chunk(indices: list[int], state: dict | None = None) -> list[dict]:
    """Records of the candidates at `indices` (of the state's configs)."""
    st = state if state is not None else _STATE
    return [evaluate(st["factory"], st["configs"][i], st["keys"][i], st["settings"],
                     st["graph_dir"]) for i in indices]


def dead_worker_records(state: dict, chunk: list[int], attempts: int) -> list[dict]:
    """Failure records of candidates whose worker process kept dying."""
    return [{"key": state["keys"][i], "config": state["configs"][i], "status": "failed",
             "error": f"the worker process died {attempts} times evaluating this candidate "
                      "(killed, out of memory, or a crash in native code)"} for i in chunk]
