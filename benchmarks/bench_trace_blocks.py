"""Where the time of tracing a deep transformer goes, and what replicating its
repeated blocks could save at most.

    python -m benchmarks.bench_trace_blocks                  # gpt3-2.7b
    python -m benchmarks.bench_trace_blocks --model gpt2-large --repeat 3

For a GPT-2-architecture zoo model: the whole ``predictor.trace`` (best of
`--repeat` warm runs, after one warm-up trace of ``gpt2``), split into building
and ``make_fx`` (``_trace_once``), the lowering, the memory pass and the layout
pass; then the same model cut to 1, 2 and 3 blocks, traced the same way (best of
`--repeat` each). Any
replication that reads a 2- and a 3-block trace costs at least their sum, which
bounds its speed-up over the whole trace.
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
    args = ap.parse_args(argv)
    predictor.trace("gpt2")   # imports and first-call paths, not counted
    spent: dict[str, float] = {}
    saved = [(mod, attr, getattr(mod, attr)) for _, mod, attr in STAGES]
    for stage, mod, attr in STAGES:
        setattr(mod, attr, _timed(spent, stage, getattr(mod, attr)))
    try:
        best, split = None, {}
        for _ in range(max(args.repeat, 1)):
            spent.clear()
            t = time.perf_counter()
            graph = predictor.trace(args.model)
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
    floor = cut[2] + cut[3]
    print(f"  2- and 3-block traces together {floor:.2f} s: a replication reading them is at "
          f"most {best / floor:.1f}x faster than the whole trace")


if __name__ == "__main__":
    main()
