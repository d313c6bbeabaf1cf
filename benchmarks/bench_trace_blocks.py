"""Where the time of tracing a deep transformer goes, and what replicating its
repeated blocks saves.

    python -m benchmarks.bench_trace_blocks                  # gpt3-2.7b
    python -m benchmarks.bench_trace_blocks --model gpt2-large --repeat 3
    python -m benchmarks.bench_trace_blocks --zoo            # every zoo transformer

For a GPT-2-architecture zoo model: the whole ``predictor.trace`` of every
block (``replicate=False``; best of `--repeat` warm runs, after one warm-up
trace of ``gpt2``), split into building and ``make_fx`` (``_trace_once``),
the lowering, the memory pass and the layout pass; then the same model cut to
1, 2 and 3 blocks, traced the same way (best of `--repeat` each); then the
default ``predictor.trace`` (3 blocks traced and replicated,
predictor.frontend.blocks) against the full one, interleaved, best of
`--repeat` each, and the largest relative difference between their
predictions (iteration time, per-op times, peak memory; one GPU, and a
tensor/pipeline-parallel layout, which reads the layout analysis).
``--zoo``: for every zoo model with a known stack, the replicated and the full
trace (training; best of `--repeat`, after one untimed replicated trace of the
model), whether the two Graphs are identical
field by field, and the largest relative difference of their predictions.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import torch

import predictor
from predictor.frontend import fx, layout_pass, memory_pass
from predictor.zoo import hf

STAGES = (("build + make_fx", fx, "_trace_once"), ("lowering", fx, "lower"),
          ("memory pass", memory_pass, "profile"), ("layout pass", layout_pass, "analyse"))


def _timed(spent: dict, name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
    return wrapper


def _cut(name: str, layers: int):
    """The zoo model `name` with `layers` blocks, as a (model, inputs) factory."""
    cfg = hf.gpt2_config(name)
    cfg.n_layer = layers
    seq = hf.max_positions(name)
    batch = predictor.zoo.get(name).default_batch_size

    def factory():
        return hf._causal_lm(cfg), (torch.zeros(batch, seq, dtype=torch.long),)
    factory.__name__ = f"{name}-{layers}blocks"
    return factory


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt3-2.7b", choices=sorted(hf.GPT2_SIZES))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--zoo", action="store_true",
                    help="replicated against full trace for every zoo transformer")
    args = ap.parse_args(argv)
    predictor.trace("gpt2")   # imports and first-call paths, not counted
    if args.zoo:
        _zoo(args.repeat)
        return
    spent: dict[str, float] = {}
    saved = [(mod, attr, getattr(mod, attr)) for _, mod, attr in STAGES]
    for stage, mod, attr in STAGES:
        setattr(mod, attr, _timed(spent, stage, getattr(mod, attr)))
    try:
        best, split = None, {}
        for _ in range(max(args.repeat, 1)):
            spent.clear()
            t = time.perf_counter()
            graph = predictor.trace(args.model, replicate=False)
            wall = time.perf_counter() - t
            if best is None or wall < best:
                best, split = wall, dict(spent)
    finally:
        for mod, attr, fn in saved:
            setattr(mod, attr, fn)
    n_layers = hf.GPT2_SIZES[args.model][1]
    print(f"{args.model}: {n_layers} blocks, {graph.memory.n_steps} aten nodes, {len(graph.ops)} "
          f"op rows; load average {os.getloadavg()[0]:.1f}")
    print(f"  trace (best of {args.repeat}): {best:.2f} s")
    for stage, _, _ in STAGES:
        print(f"    {stage:16} {split.get(stage, 0.0):.2f} s")
    cut = {}
    for layers in (1, 2, 3):
        for _ in range(max(args.repeat, 1)):
            t = time.perf_counter()
            predictor.trace(_cut(args.model, layers), loss_fn=hf.causal_lm_loss)
            cut[layers] = min(cut.get(layers, float("inf")), time.perf_counter() - t)
        print(f"  cut to {layers} block{'s' if layers > 1 else ''}: {cut[layers]:.2f} s")
    rep = full = float("inf")
    for _ in range(max(args.repeat, 1)):
        t = time.perf_counter()
        replicated = predictor.trace(args.model)
        rep = min(rep, time.perf_counter() - t)
        t = time.perf_counter()
        whole = predictor.trace(args.model, replicate=False)
        full = min(full, time.perf_counter() - t)
    print(f"  replicated (3 blocks traced) {rep:.2f} s, full {full:.2f} s: {full / rep:.1f}x "
          f"(load average {os.getloadavg()[0]:.1f})")
    print(f"  largest relative difference of the predictions: {_worst(replicated, whole):.1e}")


def _zoo(repeat: int) -> None:
    from predictor.frontend import blocks
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| model | blocks | replicated s | full s | speed-up | Graphs | predictions |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for name in predictor.zoo.names():
        stack = blocks.zoo_stack(name)
        if stack is None:
            continue
        predictor.trace(name)   # the model family's first-call paths, not counted
        rep = full = float("inf")
        for _ in range(max(repeat, 1)):
            t = time.perf_counter()
            a = predictor.trace(name)
            rep = min(rep, time.perf_counter() - t)
            t = time.perf_counter()
            b = predictor.trace(name, replicate=False)
            full = min(full, time.perf_counter() - t)
        same = "identical" if _same_graph(a, b) else "DIFFER"
        print(f"| {name} | {stack.layers} | {rep:.2f} | {full:.2f} | {full / rep:.1f}x | {same} "
              f"| {_worst(a, b):.0e} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


def _same_graph(a, b) -> bool:
    """Every field of the two Graphs equal (trace_seconds aside), arrays exactly."""
    import dataclasses

    import numpy as np

    def same(x, y) -> bool:
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return type(x) is type(y) and all(
                same(getattr(x, f.name), getattr(y, f.name))
                for f in dataclasses.fields(x) if f.name != "trace_seconds")
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            return x is None and y is None or (
                x is not None and y is not None and np.asarray(x).dtype == np.asarray(y).dtype
                and np.array_equal(x, y))
        return x == y
    return same(a, b)


def _worst(a, b) -> float:
    """Largest relative difference between the predictions of graphs a and b:
    iteration time, phases, per-op times and peak memory on an H100, and the
    iteration time and memory under tp=2, pp=2 with full recomputation."""
    import numpy as np

    def rel(x, y):
        x, y = np.asarray(x, float), np.asarray(y, float)
        if x.shape != y.shape:
            return float("inf")
        return float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1e-300), initial=0.0))
    pa, pb = predictor.predict(a, "H100-SXM5-80GB"), predictor.predict(b, "H100-SXM5-80GB")
    worst = max(rel([pa.forward_ms, pa.backward_ms, pa.optimizer_ms, pa.overhead_ms],
                    [pb.forward_ms, pb.backward_ms, pb.optimizer_ms, pb.overhead_ms]),
                rel(pa.op_us, pb.op_us), rel(pa.memory_gb, pb.memory_gb))
    if a.layout is not None and b.layout is not None:
        layout = predictor.Parallel(tp=2, pp=2, microbatches=4)
        qa = predictor.predict(a, "H100-SXM5-80GB", parallel=layout, checkpoint="full")
        qb = predictor.predict(b, "H100-SXM5-80GB", parallel=layout, checkpoint="full")
        worst = max(worst, rel([qa.iteration_ms, qa.memory_gb], [qb.iteration_ms, qb.memory_gb]))
    return worst


if __name__ == "__main__":
    main()
