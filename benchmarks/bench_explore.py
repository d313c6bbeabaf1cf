"""Design-space exploration speed: candidates per second of ``predictor.explore``.

    python -m benchmarks.bench_explore                 # local executor, 1 and 2 workers
    python -m benchmarks.bench_explore --ray           # and Ray (the [ray] extra)
    python -m benchmarks.bench_explore --candidates 48 --workers 1,2,4
    python -m benchmarks.bench_explore --driver        # the driver's cost per candidate
    python -m benchmarks.bench_explore --same-session  # workers in the driver's session

Two spaces:

- *distinct*: a CNN family (depth x width x kernel), every candidate a
  different network, so each one is traced (the cost a search pays);
- *shared*: one network under many configs (a key the factory ignores), so
  after the first trace each candidate is a graph-memo hit plus one sweep:
  the time per candidate is the executor's own overhead plus the sweep.

Wall time covers the whole ``explore`` call (pool start, the parent's warm-up,
streaming part files into a fresh folder), not Ray's start, which is printed
on its own. CPU ms per candidate (local) counts this process and the pool's
workers. On a shared machine wall times move with other processes' load (the
load average is printed with them); with the kernel's autogroup scheduling
(``/proc/sys/kernel/sched_autogroup_enabled``) a busy machine gives this
session's processes one share together. The local executor's workers start
sessions of their own, as Ray's (started by the raylet) do, so each gets a
share; ``--same-session`` keeps them in the driver's session, as the executor
did before, to measure the difference.
"""

from __future__ import annotations

import argparse
import os
import resource
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


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the local pool's
    workers are joined when explore returns)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(space: Space, **kw) -> tuple[float, float]:
    """(wall s, CPU s of this process and the pool) of one explore call."""
    with tempfile.TemporaryDirectory() as out:
        t, c = time.perf_counter(), _cpu_s()
        res = explore(space, gpus=GPUS, batch_sizes=BATCHES, out=out, **kw)
        wall, cpu = time.perf_counter() - t, _cpu_s() - c
    assert res.failed == 0 and res.computed == len(space), res
    return wall, cpu


def driver_costs(n: int = 20_000) -> None:
    """The driver's own work per candidate, on synthetic records of 9 rows:
    writing part files, reading them back (a resume), ranking the table."""
    from predictor.exploration import PartWriter, build_table, read_parts

    rows = [{"gpu": g, "batch_size": b, "iteration_ms": 1.2, "samples_per_s": 1e3,
             "memory_gb": 1.2, "memory_capacity_gb": 16.0, "usd_per_hour": 0.5, "flops": 1e9}
            for g in GPUS for b in BATCHES]
    recs = [{"key": f"{i:032x}", "config": {"depth": 3, "width": 32, "kernel": 3},
             "status": "ok", "params": 12345, "graph": "traced", "rows": rows, "seconds": 0.1,
             "pid": 1} for i in range(n)]
    with tempfile.TemporaryDirectory() as d:
        w = PartWriter(d)
        t = time.perf_counter()
        for r in recs:
            w.add([r])
        w.flush()
        write = time.perf_counter() - t
        t = time.perf_counter()
        assert len(read_parts(d)) == n
        read = time.perf_counter() - t
    t = time.perf_counter()
    build_table(recs, "throughput", {}, 0.9)
    rank = time.perf_counter() - t
    total = write + read + rank
    print(f"driver, per candidate ({n:,} synthetic records of {len(rows)} rows): write "
          f"{1e6 * write / n:.0f} us, read back {1e6 * read / n:.0f} us, rank "
          f"{1e6 * rank / n:.0f} us; {n / total:,.0f} candidates/s on one core")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--candidates", type=int, default=24, help="distinct candidates (<= 96)")
    ap.add_argument("--shared", type=int, default=200, help="candidates of the shared space")
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--ray", action="store_true", help="also time the Ray executor")
    ap.add_argument("--same-session", action="store_true",
                    help="keep the local workers in the driver's session (for comparison)")
    ap.add_argument("--driver", action="store_true",
                    help="only the driver's own cost per candidate (synthetic records)")
    args = ap.parse_args(argv)
    if args.driver:
        driver_costs()
        return
    counts = [int(w) for w in args.workers.split(",")]
    if args.same_session:
        from predictor import candidate, executors

        executors._worker_start = lambda driver, state: candidate.set_state(state)
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; "
          f"{len(GPUS)} GPUs x {len(BATCHES)} batch sizes per candidate")
    print(f"{'executor':<10} {'workers':>7} {'space':<9} {'candidates':>10} {'wall s':>8} "
          f"{'cand/s':>8} {'ms/cand':>8} {'CPU ms/cand':>11}")
    rows = {}

    def report(executor, workers, name, n, wall, cpu):
        rows[(executor, workers, name)] = wall / n
        # Ray's workers are not this process's children: their CPU is not counted.
        cpu_text = f"{1e3 * cpu / n:>11.1f}" if executor == "local" else f"{'-':>11}"
        print(f"{executor:<10} {workers:>7} {name:<9} {n:>10} {wall:>8.2f} {n / wall:>8.2f} "
              f"{1e3 * wall / n:>8.1f} {cpu_text}", flush=True)

    # The parent's one-off warm-up (tracer imports, numba kernels), which
    # every later pool inherits, as Ray's warm-up below.
    t = time.perf_counter()
    timed(shared_space(2), workers=1)
    print(f"local warm-up (first call in this process): {time.perf_counter() - t:.2f} s")
    for w in counts:
        for name, space in (("distinct", distinct_space(args.candidates)),
                            ("shared", shared_space(args.shared))):
            wall, cpu = timed(space, workers=w)
            report("local", w, name, len(space), wall, cpu)
    if len(counts) > 1 and ("local", 1, "distinct") in rows:
        one = rows[("local", 1, "distinct")]
        for w in counts[1:]:
            print(f"local speed-up with {w} workers (distinct): {one / rows[('local', w, 'distinct')]:.2f}x")
    print(f"load average {os.getloadavg()[0]:.2f} after the local runs"
          + (" (workers in the driver's session)" if args.same_session else ""))
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
                wall, cpu = timed(space, executor="ray")
                report("ray", w, name, len(space), wall, cpu)
        finally:
            ray.shutdown()
        if ("local", w, "shared") in rows:
            over = rows[("ray", w, "shared")] - rows[("local", w, "shared")]
            print(f"Ray's per-candidate overhead against local (shared space, {w} workers): "
                  f"{1e3 * over:+.1f} ms")


if __name__ == "__main__":
    main()
