"""The host side of an iteration: CPU time to dispatch ops and launch kernels.

PyTorch eager dispatch is asynchronous. For every op the host thread runs the
Python binding, the dispatcher (and, in training, autograd bookkeeping), then
``cudaLaunchKernel`` for each kernel, and moves on without waiting: the GPU
drains a queue of launched kernels. So within a phase (forward, backward,
optimizer step; each ends in a synchronisation in a timed loop)

- the GPU can never finish before its own work is done: ``T >= G``, the sum of
  kernel times the per-op model predicts;
- nor before the host has issued the last kernel: ``T >= C``, the host time;
- and while the host is ahead (a deep queue), the GPU never waits, so when the
  host/GPU work ratio is even across the phase, ``T = max(G, C)``.

We use ``T = max(G, C)`` per phase. (Summing ``max(g, c)`` op by op would be the
other extreme: no run-ahead at all. Large kernels let the host run ahead and
hide the launch cost of the small kernels around them, which is what happens
in real models.) The exposed overhead ``T - G`` is zero for large models and
large batches and dominates for small batches on fast GPUs, where kernels take
less time than their launches.

The host time is ``C = HOST_DISPATCH_US * ops + HOST_LAUNCH_US * kernels``:
every aten op (views included: they launch nothing but still cost a dispatch)
plus every kernel launch. The two constants are properties of the host
software stack, not of the GPU, and are shared by every GPU. They were fitted
on the per-node measurements that come with the training data
(``python -m benchmarks.e2e --fit-overhead``; medians over every host of the
five measured GPUs, never one label):

- a view op (``view``, ``permute``, ``transpose``, ``expand``) costs its
  CUDA-event time minus the time of a host-only call (``size``, ``getitem``);
- a tiny kernel op (``ones``, ``arange``, a small ``add``) costs the same
  dispatch plus one launch plus the GPU's own per-kernel floor.
"""

from __future__ import annotations

import numpy as np

from predictor.kernels import layout as L

# Host cost of dispatching one aten op from eager PyTorch (us). Fitted per
# host: 2.6 (A100's), 4.4 (P100's), 4.1 (P4's), 4.0 (T4's), 4.7 (V100's).
HOST_DISPATCH_US = 4.1
# Host cost of one kernel launch on top of its op's dispatch (us), assuming a
# 2.5 us GPU-side floor per kernel: 5.2, 7.0, 6.7, 5.8, 6.5 on the same hosts.
HOST_LAUNCH_US = 6.5


def host_ops_per_phase(graph, ops=None) -> np.ndarray:
    """aten ops the host dispatches per phase (float[n_phases])."""
    recorded = list(getattr(graph, "host_ops", None) or [])
    if len(recorded) == len(L.PHASE_NAMES):
        return np.asarray(recorded, dtype=np.float64)
    # A graph saved before host ops were recorded: count its kernel-running ops.
    t = graph.ops if ops is None else ops
    return np.bincount(t.phase, weights=t.count, minlength=len(L.PHASE_NAMES)).astype(np.float64)


def kernels_per_phase(ops) -> np.ndarray:
    """Kernel launches per phase (float[n_phases]). A convolution's layout
    transposes (predictor.families._layout_transposes) launch only when the
    convolution runs on tensor cores: counted in half precision (the host
    model does not know the GPU), not in fp32."""
    launches = ops.count * ops.kernels
    transposes = (ops.family == L.COPY) & (ops.dbase[:, L.MEM_LAYOUT] > 0) \
        & (ops.dtype != L.F16) & (ops.dtype != L.BF16)
    if transposes.any():
        launches = np.where(transposes, 0, launches)
    return np.bincount(ops.phase, weights=launches,
                       minlength=len(L.PHASE_NAMES)).astype(np.float64)


def host_ms(graph, ops=None, dispatch_us: float = HOST_DISPATCH_US,
            launch_us: float = HOST_LAUNCH_US) -> np.ndarray:
    """Host (CPU) time of each phase, ms (float[n_phases]). Batch-independent:
    the ops and launches do not depend on the tensors' sizes."""
    t = graph.ops if ops is None else ops
    return (dispatch_us * host_ops_per_phase(graph, t) + launch_us * kernels_per_phase(t)) * 1e-3


def combine(gpu_phase_ms: np.ndarray, host_phase_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(phase times, exposed host overhead) from GPU times [..., phase] and the
    host time per phase: ``T = max(G, C)``, overhead ``T - G``."""
    total = np.maximum(gpu_phase_ms, host_phase_ms)
    return total, total - gpu_phase_ms
