"""Calibrate once on the local device (Habitat's idea on our op list).

``calibrate(graph)`` times every distinct row of the graph's OpTable on the
local device (CUDA when present, else the CPU) at one or more batch sizes,
times the real training step at the same batch sizes, and returns a
:class:`~predictor.calibration.file.Calibration`. The engine then predicts
each op as *measured x f(target) / f(origin)*, with ``f`` the pure-mode model:
the model's bias cancels in the ratio (``predictor.calibrated``: evaluating a
calibration is the core's; measuring one is this package's).

    >>> g = predictor.trace(model, inputs)
    >>> cal = predictor.calibrate(g)                      # minutes at most
    >>> cal.save("my_model.cal.npz")
    >>> predictor.predict(g, "H100-SXM5-80GB", calibration=cal, batch_size=256)
    >>> predictor.predict(g, cal.device, calibration=cal, batch_size=4 * g.batch_size)

The sum of per-op times is not the iteration: between ops the host runs
Python, autograd and the allocator (and a GPU may wait for launches). That
difference is measured and modelled explicitly (``Calibration.overhead``:
``real = (1 + scale) * ops + fixed_ms``, fitted over the calibrated batch
sizes) and added back on the calibrated device.

A CPU calibration describes that CPU only: its measurements are scaled to
other batch sizes on the same CPU, never to a GPU (no ratio of two models
bridges a CPU and a GPU).
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import torch

from predictor.calibrated import model_params_for
from predictor.calibration.device import probe, resolve_device
from predictor.calibration.file import Calibration, OverheadModel, graph_fingerprint, load, now_iso
from predictor.calibration import checks
from predictor.calibration.measure import measure_table, time_progress
from predictor.calibration.step import StepUnavailable, build_step, step_samples
from predictor.engine import model_params
from predictor.errors import InvalidArgumentError
from predictor.kernels import layout as L
from predictor.kernels.grid import evaluate_ops

# Timing samples per op (each sample is at least `MIN_SAMPLE_S` long).
DEFAULT_REPEATS = {"cpu": 5, "cuda": 15}
MIN_SAMPLE_S = {"cpu": 2e-3, "cuda": 1e-3}


def _batch_sizes(graph, batch_sizes: Iterable[int] | int | None) -> list[int]:
    if batch_sizes is None:
        b = graph.batch_size
        # Three batch sizes a factor 8 apart let the overhead model separate
        # the fixed cost of an iteration (pinned by the small batch) from the
        # part that grows with the work; the ops are then scaled from the
        # nearest of them. A graph that does not rescale has one.
        return sorted({max(1, b // 4), b, 2 * b}) if graph.batch_scalable else [b]
    if isinstance(batch_sizes, (int, np.integer)):
        batch_sizes = [int(batch_sizes)]
    out = sorted({graph.check_batch(int(b)) for b in batch_sizes})
    if not out:
        raise InvalidArgumentError("no calibration batch size given")
    return out


def origin_model_us(ops, batch: int, device_info, params: np.ndarray) -> np.ndarray:
    """Pure-model time of one execution of every row at `batch` on the
    calibrated device (for rows that could not be measured)."""
    out = np.zeros(len(ops))
    none = (np.zeros(0), np.zeros(0, dtype=np.int64), device_info.features)
    evaluate_ops(ops.family, ops.dtype, ops.kernels, ops.dbase, ops.dslope, np.int64(batch),
                 device_info.features, model_params_for(device_info, params), np.zeros(0),
                 *none, out)
    return out


def _settings(device, device_info, clock: str, repeats: int, graph) -> dict:
    cuda = torch.version.cuda if device.type == "cuda" else None
    cudnn = torch.backends.cudnn.version() if device.type == "cuda" else None
    return {
        "torch": torch.__version__,
        "cuda": cuda,
        "cudnn": cudnn,
        "default_dtype": str(torch.get_default_dtype()).replace("torch.", ""),
        "dtypes": sorted({L.DTYPE_NAMES[int(c)] for c in np.unique(graph.ops.dtype)}),
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_conv": bool(torch.backends.cudnn.allow_tf32),
        "threads": torch.get_num_threads(),
        "clock": clock if device.type == "cpu" else "cuda-events",
        "repeats": repeats,
        "mode": graph.mode,
        "optimizer": graph.optimizer,
        "seq_len": graph.seq_len,
        "traced_with_torch": graph.torch_version,
    }


def calibrate(graph, *, device=None, repeats: int | None = None,
              batch_sizes: Iterable[int] | int | None = None, iterations: int = 5,
              measure_iteration: bool = True, spec_id: str | None = None,
              clock: str = "wall", threads: int | None = None, progress: bool = True,
              on_pass: Callable[[int, int], None] | None = None):
    """Measure `graph`'s ops (and its real step) on the local device.

    device: "cpu", "cuda", "cuda:1", a torch.device, or None (CUDA when present).
    repeats: timing samples per op (median); default 5 on a CPU, 15 on CUDA.
    batch_sizes: where to measure; default a quarter of the graph's batch size,
        the batch size and twice it.
    iterations: timed real iterations per batch size (median, after a warm-up),
        interleaved with the `repeats` passes over the ops.
    measure_iteration: also time the real step (needs the model's source; a
        graph loaded from a file has none, and the overhead model stays empty).
    spec_id: the GPU's id in the GPU database when its name does not match one.
    clock: CPU timer, "wall" or "cpu" (process CPU time: robust on a shared
        machine when torch runs one thread).
    threads: torch's CPU threads while measuring (restored afterwards); the
        calibration describes the device at that thread count. Default: as set.
    on_pass: called as ``on_pass(batch, pass)`` after each pass over the ops,
        so that a harness can interleave its own measurements with the
        calibration's and both see the same state of a shared machine.
    """
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InvalidArgumentError(f"threads must be a positive integer, got {threads!r}")
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return calibrate(graph, device=device, repeats=repeats, batch_sizes=batch_sizes,
                             iterations=iterations, measure_iteration=measure_iteration,
                             spec_id=spec_id, clock=clock, progress=progress, on_pass=on_pass)
        finally:
            torch.set_num_threads(before)

    if clock not in ("wall", "cpu"):
        raise InvalidArgumentError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if getattr(graph, "amp", None) == "fp8":
        raise InvalidArgumentError(
            f"{graph.name} was traced with amp='fp8': its float8 linears are torchao's kernels, "
            "which calibration does not run; calibrate the amp='bf16' trace of the model")
    dev = resolve_device(device)
    if repeats is None:
        repeats = DEFAULT_REPEATS[dev.type]
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InvalidArgumentError(f"repeats must be a positive integer, got {repeats!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise InvalidArgumentError(f"iterations must be a positive integer, got {iterations!r}")
    batches = _batch_sizes(graph, batch_sizes)
    # numba's OpenMP layer resets the process's OpenMP thread count after a
    # parallel kernel (a sweep): pin torch's before every measurement.
    pinned = torch.get_num_threads()
    torch.set_num_threads(pinned)
    info = probe(dev, spec_id, clock)
    params = model_params()
    ops = graph.ops
    k = len(batches)
    measured = np.zeros((k, len(ops)))
    iteration_ms = np.full(k, np.nan)
    ops_ms = np.zeros(k)
    unmeasured_ms = np.zeros(k)
    skipped: dict[str, int] = {}
    notes: list[str] = []
    source = getattr(graph, "source", None)
    # One progress bar over every batch size, in the seconds the model of this
    # device expects each sample to take (at least MIN_SAMPLE_S, plus its warm
    # call): an ETA that follows time, not a count of rows of unequal cost.
    model_us = [origin_model_us(ops, b, info, params) for b in batches]
    model_ms = [float((m * ops.count).sum() * 1e-3) for m in model_us]
    weights = [np.maximum(m * 1e-6, MIN_SAMPLE_S[dev.type]) + m * 1e-6 for m in model_us]
    distinct = _distinct_rows(ops)
    step_s = [2 * ms * 1e-3 for ms in model_ms]  # a real step: forward + backward, roughly
    total_s = sum(repeats * float(w[distinct].sum()) + (iterations + 2) * s
                  for w, s in zip(weights, step_s))
    bar = time_progress(total_s, f"calibrating {graph.name} on {dev.type} (batches "
                        f"{', '.join(str(b) for b in batches)})", progress)
    samples_by_batch: list[list[float]] = []
    try:
        for j, b in enumerate(batches):
            real = _measure_batch(graph, ops, b, j, dev, info, pinned, repeats, iterations, clock,
                                  measure_iteration, source, notes, skipped, measured, on_pass,
                                  bar, weights[j], step_s[j])
            if real is None:  # the real step cannot be run at all: not at other batches either
                measure_iteration, real = False, []
            samples_by_batch.append(real)
            if real:
                iteration_ms[j] = float(np.median(real))
            have = measured[j] > 0
            ops_ms[j] = float((np.where(have, measured[j], model_us[j]) * ops.count).sum() * 1e-3)
            unmeasured_ms[j] = float((model_us[j] * ops.count)[~have].sum() * 1e-3)
    finally:
        bar(None)
    if skipped:
        notes.append(f"{sum(skipped.values())} of {len(ops)} rows not measured; the model "
                     "predicts them")
    overhead = OverheadModel.fit(ops_ms, iteration_ms)
    problems = checks.problems(batches, ops_ms, model_ms, samples_by_batch, overhead)
    notes.extend(f"check failed: {p}" for p in problems)
    cal = Calibration(
        model=graph.name, fingerprint=graph_fingerprint(graph), device_info=info,
        batch_sizes=np.asarray(batches, dtype=np.int64), measured_us=measured,
        iteration_ms=iteration_ms, ops_ms=ops_ms, unmeasured_ms=unmeasured_ms,
        overhead=overhead, skipped=skipped, settings=_settings(dev, info, clock, repeats, graph),
        notes=notes, created=now_iso())
    # What calibration.checks found (one line each; empty: it looks sane).
    cal.problems = problems
    return cal


def _distinct_rows(ops) -> np.ndarray:
    """Indices of the rows measure_table times: one per family, dtype,
    kernels, dims and op name (as measure_table keys them)."""
    seen: dict[tuple, int] = {}
    for i in range(len(ops)):
        key = (int(ops.family[i]), int(ops.dtype[i]), int(ops.kernels[i]),
               tuple(int(x) for x in ops.dbase[i]), tuple(int(x) for x in ops.dslope[i]),
               int(ops.op[i]))
        seen.setdefault(key, i)
    return np.asarray(sorted(seen.values()), dtype=np.int64)


def _measure_batch(graph, ops, b, j, dev, info, pinned, repeats, iterations, clock,
                   measure_iteration, source, notes, skipped, measured, on_pass, bar, weights,
                   step_s) -> list[float] | None:
    """Time every row at batch `b` (into measured[j]) and the real step
    between the passes; the real step's times (None: it cannot be run)."""
    torch.set_num_threads(pinned)
    real: list[float] = []
    step = None
    unavailable = False
    if measure_iteration:
        try:
            step = build_step(source, graph.mode, graph.optimizer, b, dev,
                              getattr(graph, "amp", None))
            step_samples(step, dev, iterations=1, warmup=1, clock=clock)  # warm-up
        except StepUnavailable as exc:
            notes.append(f"real iteration not measured: {exc}")
            step, unavailable = None, True
        except (RuntimeError, ValueError, TypeError) as exc:
            step = None
            notes.append(_step_failed(b, exc, dev))
        bar(2 * step_s)

    def between_passes(p: int) -> None:
        # Real iterations interleaved with the op passes see the same
        # interference from other work on the machine as the ops do;
        # `iterations` of them spread evenly over the `repeats` passes.
        nonlocal step
        if on_pass is not None:
            on_pass(b, p)
        count = (p + 1) * iterations // repeats - p * iterations // repeats
        if step is None or count == 0:
            return
        torch.set_num_threads(pinned)
        try:
            real.extend(step_samples(step, dev, iterations=count, warmup=0, clock=clock))
        except (RuntimeError, ValueError, TypeError) as exc:
            step = None
            notes.append(_step_failed(b, exc, dev))
        bar(count * step_s)

    times = measure_table(ops, b, dev, repeats=repeats, min_sample_s=MIN_SAMPLE_S[dev.type],
                          progress=False, clock=clock, between_passes=between_passes,
                          description=f"{graph.name}: ops at batch {b}", bar=bar,
                          weights=weights)
    measured[j] = times.us
    for reason, n in times.skipped.items():
        skipped[reason] = max(skipped.get(reason, 0), n)
    return None if unavailable else real


def _step_failed(batch: int, exc: BaseException, dev) -> str:
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return (f"real iteration at batch {batch} not measured: "
            f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}")


def load_calibration(path, graph=None):
    """Read a calibration file (checked against `graph` when given)."""
    return load(path, graph)


__all__ = ["calibrate", "load_calibration", "origin_model_us"]
