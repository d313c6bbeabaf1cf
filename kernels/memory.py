"""Peak memory of one iteration over many batch sizes at once.

The memory pass (``predictor.memory``) reduces a traced step to a list of
storages: each has a size ``coef * b**power`` elements of ``itemsize`` bytes at
batch ``b``, is allocated before op ``alloc`` runs and freed after op ``free``
runs. Which storages are alive at each op does not depend on the batch, so a
peak at any batch is one sweep over the ops: O(storages + ops) per batch size.

The sizes follow PyTorch's CUDA caching allocator
(c10/cuda/CUDACachingAllocator.cpp): every block is rounded up to 512 bytes
(``kMinBlockSize``, what ``torch.cuda.memory_allocated`` counts); blocks of at
most 1 MiB (``kSmallSize``) share 2 MiB segments (``kSmallBuffer``); larger
blocks get segments rounded up to 2 MiB (``kRoundLarge``). Reserved memory is
counted without fragmentation, so it is a lower bound of what
``torch.cuda.memory_reserved`` would show.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SEGMENT = 2 << 20


@njit(cache=True)
def _round_up(x, to):
    return (x + to - 1) // to * to


@njit(cache=True)
def storage_bytes(coef, power, itemsize, batch):
    """Bytes of one storage at `batch` (no allocator rounding)."""
    elems = coef
    for _ in range(power):
        elems *= batch
    return np.int64(np.ceil(elems - 1e-9)) * itemsize


@njit(cache=True)
def peak_memory(coef, power, itemsize, cap, alloc, free, n_steps, batches, rounding,
                out_allocated, out_reserved, out_step):
    """Peak bytes alive over the ops, for every batch size.

    coef, power, itemsize, cap, alloc, free: one entry per storage (``free >=
    alloc``; persistent storages span ``0 .. n_steps - 1``; ``cap > 0`` caps its
    bytes, for library workspaces). rounding: 0 counts exact
    tensor bytes (what a CPU tracker sees), 1 applies the caching allocator.
    out_allocated[b]: peak of the live blocks; out_reserved[b]: peak of the
    segments holding them; out_step[b]: the op at which out_allocated peaks.
    """
    n = coef.shape[0]
    n_steps = max(n_steps, 1)
    d_alloc = np.zeros(n_steps + 1, dtype=np.int64)
    d_large = np.zeros(n_steps + 1, dtype=np.int64)
    d_small = np.zeros(n_steps + 1, dtype=np.int64)
    for bi in range(batches.shape[0]):
        d_alloc[:] = 0
        d_large[:] = 0
        d_small[:] = 0
        for i in range(n):
            size = storage_bytes(coef[i], power[i], itemsize[i], batches[bi])
            if cap[i] > 0 and size > cap[i]:
                size = cap[i]
            if rounding == 1 and size > 0:
                block = _round_up(size, MIN_BLOCK)
            else:
                block = size
            # Clamped, so that no index from a damaged profile leaves the arrays.
            a = min(max(alloc[i], 0), n_steps - 1)
            f = min(max(free[i], a), n_steps - 1) + 1
            d_alloc[a] += block
            d_alloc[f] -= block
            if block > SMALL_SIZE:
                seg = _round_up(block, SEGMENT)
                d_large[a] += seg
                d_large[f] -= seg
            else:
                d_small[a] += block
                d_small[f] -= block
        live = np.int64(0)
        large = np.int64(0)
        small = np.int64(0)
        best = np.int64(-1)
        best_step = 0
        best_reserved = np.int64(0)
        for t in range(n_steps):
            live += d_alloc[t]
            large += d_large[t]
            small += d_small[t]
            if live > best:
                best = live
                best_step = t
            if rounding == 1:
                reserved = large + _round_up(small, SEGMENT)
            else:
                reserved = live
            if reserved > best_reserved:
                best_reserved = reserved
        out_allocated[bi] = max(best, 0)
        out_reserved[bi] = best_reserved
        out_step[bi] = best_step
