"""Data-parallel training on one node (a first step): PyTorch DDP over N GPUs.

Every GPU runs the whole step on its own *per-GPU* batch ``b`` (global batch
``N * b``); gradients are averaged by a ring all-reduce. The model:

- **Ring all-reduce.** Each GPU sends and receives ``2 (N-1)/N x G`` bytes for
  ``G`` bytes of gradients, at the per-direction link bandwidth
  (``interconnect_gbs / 2``: the spec's figure is bidirectional per GPU: NVLink
  on SXM parts, the PCIe x16 link otherwise) times ``ALLREDUCE_EFFICIENCY``,
  plus ``2 (N-1)`` latency hops of ``HOP_LATENCY_US`` per bucket.
  ``ALLREDUCE_EFFICIENCY`` = 0.75: NCCL's protocol overhead is ~20 % on NVLink
  (370 of 450 GB/s on H100, NVIDIA/nccl-tests#212) and 8x A100 all-reduce
  measures a bus bandwidth of ~200 GB/s of 300 GB/s (NVIDIA/nccl-tests#149).
- **Overlap with backward, as DDP buckets do** (the assumption): gradients
  fill 25 MiB buckets (``bucket_cap_mb``) at a constant rate over the backward
  pass, each full bucket is all-reduced at once on a separate stream, buckets
  go one after another, and communication does not slow the backward kernels.
  With ``K`` buckets and all-reduce time ``T_ar``, the last bucket finishes at
  ``max(T_bwd + T_ar/K, T_bwd/K + T_ar)``, so the exposed communication is
  ``max(T_ar/K, T_ar - T_bwd (1 - 1/K))``.
- **Memory.** DDP copies gradients into buckets as large as the gradients
  (``gradient_as_bucket_view=False``, the default); ``predictor.memory`` adds
  them when N > 1.

Scaling efficiency = throughput on N GPUs / (N x throughput on one), which is
``T_1 / T_N`` for a fixed per-GPU batch.
"""

from __future__ import annotations

import numpy as np

from predictor import memory
from predictor.errors import InvalidArgumentError
from predictor.kernels import layout as L

ALLREDUCE_EFFICIENCY = 0.75
HOP_LATENCY_US = 5.0
BUCKET_BYTES = 25 * (1 << 20)


def check_gpus_per_node(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= 64:
        raise InvalidArgumentError(f"gpus_per_node must be an integer in 1..64, got {n!r}")
    return int(n)


def link_gbs(gpu) -> float:
    """Per-direction bandwidth (GB/s) one GPU can drive into the ring."""
    total = gpu.spec.get("interconnect_gbs") if hasattr(gpu, "spec") else None
    if not isinstance(total, (int, float)) or total <= 0:
        total = 32.0  # PCIe 3.0 x16, the slowest link any listed GPU has
    return float(total) / 2.0


def allreduce_ms(grad_bytes: float, n: int, gpu) -> float:
    """Time of one ring all-reduce of `grad_bytes` over `n` GPUs of `gpu` (ms),
    including per-bucket latency."""
    if n <= 1 or grad_bytes <= 0:
        return 0.0
    volume = 2.0 * (n - 1) / n * grad_bytes
    bw = link_gbs(gpu) * 1e9 * ALLREDUCE_EFFICIENCY
    buckets = max(1, int(np.ceil(grad_bytes / BUCKET_BYTES)))
    latency = buckets * 2 * (n - 1) * HOP_LATENCY_US * 1e-3
    return volume / bw * 1e3 + latency


def exposed_comm_ms(backward_ms: np.ndarray, grad_bytes: float, n: int, gpu) -> np.ndarray:
    """Communication not hidden behind the backward pass (ms), per batch size."""
    bwd = np.asarray(backward_ms, dtype=np.float64)
    t_ar = allreduce_ms(grad_bytes, n, gpu)
    if t_ar == 0.0:
        return np.zeros_like(bwd)
    k = max(1, int(np.ceil(grad_bytes / BUCKET_BYTES)))
    return np.maximum(t_ar / k, t_ar - bwd * (1.0 - 1.0 / k))


def gradient_bytes(graph, dtype_code: int | None = None) -> float:
    """Bytes of parameter gradients one step produces."""
    prof = getattr(graph, "memory", None)
    if prof is not None:
        g = prof.category_bytes(memory.GRADIENTS, 1, dtype_code)
        if g > 0:
            return float(g)
    item = L.DTYPE_BYTES[dtype_code] if dtype_code is not None else 4
    return float(graph.trainable_parameters * item)
