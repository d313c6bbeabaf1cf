"""Design-space exploration speed: candidates per second of ``predictor.explore``.

    python -m benchmarks.bench_explore                 # local executor, 1 and 2 workers
    python -m benchmarks.bench_explore --ray           # and Ray (the [ray] extra)
    python -m benchmarks.bench_explore --candidates 48 --workers 1,2,4

Two spaces:

- *distinct*: a CNN family (depth x width x kernel), every candidate a
  different network, so each one is traced (the cost a search pays);
- *shared*: one network under many configs (a key the factory ignores), so
  after the first trace each candidate is a graph-memo hit plus one sweep:
  the time per candidate is the executor's own overhead plus the sweep.

Wall time covers the whole ``explore`` call (pool start, the parent's warm-up,
streaming part files into a fresh folder), not Ray's start, which is printed
on its own. On a shared machine the figures move with other processes' load;
the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from predictor.exploration import Space, explore

GPUS = ["T4", "A100-SXM4-40GB", "H100-SXM5-80GB"]
BATCHES = [16, 64, 256]


def cnn(depth=2, width=32, kernel=3, tag=0):
    """A small CNN on 32x32 images: `depth` conv-BN-ReLU blocks of `width`
    channels, then a linear head. `tag` changes nothing in the network."""
    layers, c = [], 3
    for _ in range(depth):
        layers += [torch.nn.Conv2d(c, width, kernel, padding=kernel // 2),
                   torch.nn.BatchNorm2d(width), torch.nn.ReLU()]
        c = width
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(c, 10)]
    return torch.nn.Sequential(*layers), (torch.zeros(16, 3, 32, 32),)


def distinct_space(n: int) -> Space:
    configs = [{"depth": d, "width": w, "kernel": k}
               for d in range(1, 9) for w in (16, 24, 32, 48, 64, 96) for k in (3, 5)]
    return Space(cnn, configs[:n])


def shared_space(n: int) -> Space:
    return Space(cnn, [{"depth": 3, "width": 32, "tag": i} for i in range(n)])


def timed(space: Space, **kw) -> tuple[float, object]:
    with tempfile.TemporaryDirectory() as out:
        t = time.perf_counter()
        res = explore(space, gpus=GPUS, batch_sizes=BATCHES, out=out, **kw)
        wall = time.perf_counter() - t
    assert res.failed == 0 and res.computed == len(space), res
    return wall, res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--candidates", type=int, default=24, help="distinct candidates (<= 96)")
    ap.add_argument("--shared", type=int, default=200, help="candidates of the shared space")
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--ray", action="store_true", help="also time the Ray executor")
    args = ap.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; "
          f"{len(GPUS)} GPUs x {len(BATCHES)} batch sizes per candidate")
    print(f"{'executor':<10} {'workers':>7} {'space':<9} {'candidates':>10} {'wall s':>8} "
          f"{'cand/s':>8} {'ms/cand':>8}")
    rows = {}

    def report(executor, workers, name, n, wall):
        rows[(executor, workers, name)] = wall / n
        print(f"{executor:<10} {workers:>7} {name:<9} {n:>10} {wall:>8.2f} {n / wall:>8.2f} "
              f"{1e3 * wall / n:>8.1f}", flush=True)

    for w in counts:
        for name, space in (("distinct", distinct_space(args.candidates)),
                            ("shared", shared_space(args.shared))):
            wall, _ = timed(space, workers=w)
            report("local", w, name, len(space), wall)
    if len(counts) > 1 and ("local", 1, "distinct") in rows:
        one = rows[("local", 1, "distinct")]
        for w in counts[1:]:
            print(f"local speed-up with {w} workers (distinct): {one / rows[('local', w, 'distinct')]:.2f}x")
    if args.ray:
        import ray

        w = max(counts)
        t = time.perf_counter()
        ray.init(num_cpus=w, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        print(f"ray.init(num_cpus={w}): {time.perf_counter() - t:.2f} s")
        try:
            # The first tasks start the Ray workers (imports, numba): a warm-up run.
            wall, _ = timed(shared_space(2 * w), executor="ray")
            print(f"ray warm-up ({2 * w} candidates, worker start): {wall:.2f} s")
            for name, space in (("distinct", distinct_space(args.candidates)),
                                ("shared", shared_space(args.shared))):
                # The shared space's network is already in the workers' memo
                # after the warm-up, as in the local runs after their first trace.
                wall, _ = timed(space, executor="ray")
                report("ray", w, name, len(space), wall)
        finally:
            ray.shutdown()
        if ("local", w, "shared") in rows:
            over = rows[("ray", w, "shared")] - rows[("local", w, "shared")]
            print(f"Ray's per-candidate overhead against local (shared space, {w} workers): "
                  f"{1e3 * over:+.1f} ms")


if __name__ == "__main__":
    main()
