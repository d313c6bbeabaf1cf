"""Evaluate an OpTable over configurations: every (GPU, batch size) at once, or
every op of one configuration (the per-op breakdown). Both call the same
per-row model, so a sweep and a single prediction give the same numbers."""

from __future__ import annotations

import numpy as np
from numba import njit

from predictor.kernels import layout as L
from predictor.kernels.roofline import op_time_us
from predictor.kernels.work import dims_at


@njit(cache=True)
def evaluate_grid(family, phase, dtype, count, kernels, dbase, dslope, batches, gpus, params,
                  out_ms):
    """out_ms[g, b, phase] += time of every row at batches[b] on gpus[g] (ms)."""
    n = family.shape[0]
    d = np.empty(dbase.shape[1], dtype=np.int64)
    for bi in range(batches.shape[0]):
        for i in range(n):
            dims_at(dbase, dslope, i, batches[bi], d)
            for g in range(gpus.shape[0]):
                t = op_time_us(family[i], dtype[i], kernels[i], d, gpus[g], params)
                out_ms[g, bi, phase[i]] += t * count[i] * 1e-3


@njit(cache=True)
def evaluate_ops(family, dtype, kernels, dbase, dslope, batch, gpu, params, out_us):
    """out_us[i] = time of one execution of row i at `batch` on `gpu` (us)."""
    d = np.empty(dbase.shape[1], dtype=np.int64)
    for i in range(family.shape[0]):
        dims_at(dbase, dslope, i, batch, d)
        out_us[i] = op_time_us(family[i], dtype[i], kernels[i], d, gpu, params)


def n_phases() -> int:
    return len(L.PHASE_NAMES)
