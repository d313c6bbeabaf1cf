"""Speed of the peak-memory kernel and of a whole search.

    python -m pytest benchmarks/bench_memory.py --benchmark-only -s

Figures are printed as they are measured (``-s`` shows them). Each model is
traced once per session; the memory pass itself is timed on its own.
"""

from __future__ import annotations

import numpy as np
import pytest

import predictor
from predictor.frontend import memory_pass

MODELS = ("resnet50", "gpt2-large")
BATCHES = np.arange(1, 1025, dtype=np.int64)  # 1,024 batch sizes


@pytest.fixture(scope="module", params=MODELS)
def graph(request):
    return predictor.trace(request.param)


def test_memory_pass(graph, benchmark):
    """The fx memory pass alone (runs once per trace)."""
    from predictor.frontend import fx

    spec = fx._spec_for(graph.name, None, None, 0, graph.batch_size, graph.seq_len, None)
    gm, marks, _ = fx._trace_once(spec, "train", "adam", fx.SENTINEL_BATCH)
    prof = benchmark(memory_pass.profile, gm, marks, fx.SENTINEL_BATCH)
    print(f"\n{graph.name}: memory pass over {len(gm.graph.nodes):,} nodes -> {len(prof):,} "
          f"storages: {benchmark.stats.stats.min * 1e3:.1f} ms (best)")


def test_peak_over_batches(graph, benchmark):
    """Peak memory at 1,024 batch sizes (the numba kernel, warm)."""
    graph.memory.peak(BATCHES[:2])  # load the compiled kernel
    benchmark(graph.memory.peak, BATCHES)
    best = benchmark.stats.stats.min
    print(f"\n{graph.name}: peak at {len(BATCHES):,} batch sizes in {best * 1e3:.2f} ms "
          f"({len(BATCHES) / best:,.0f} batch sizes/s; {len(graph.memory):,} storages, "
          f"{graph.memory.n_steps:,} ops)")


def test_search_all_gpus(graph, benchmark):
    """A whole search: every GPU x 12 batch sizes, priced, ranked, max batch per GPU."""
    predictor.search(graph, gpus="T4", batch_sizes=[1])  # load the kernels
    res = benchmark(predictor.search, graph, objective="cost", gpus="all")
    print(f"\n{graph.name}: search over {len(res.table):,} configurations in "
          f"{benchmark.stats.stats.min * 1e3:.0f} ms (best)")
