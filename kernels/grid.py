"""Evaluate an OpTable over configurations: every (GPU, batch size) at once, or
every op of one configuration (the per-op breakdown). Both call the same
per-row model, so a sweep and a single prediction give the same numbers.

Calibrated rows (``cal_us[i] > 0``: measured on the `origin` device at batch
``cal_batch[i]``) are scaled Habitat-style: the model's bias cancels in the
ratio, ``t = measured * f(row at b, gpu) / f(row at cal_batch, origin)``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from predictor.kernels.roofline import op_time_us
from predictor.kernels.work import dims_at


@njit(cache=True)
def row_time_us(i, family, dtype, kernels, dbase, dslope, batch, d, d0, gpu, params, mlp,
                cal_us, cal_batch, origin):
    """Time of one execution of row i at `batch` on `gpu` (us); `d`, `d0` are scratch."""
    dims_at(dbase, dslope, i, batch, d)
    t = op_time_us(family[i], dtype[i], kernels[i], d, gpu, params, mlp)
    if cal_us.shape[0] > 0 and cal_us[i] > 0.0:
        dims_at(dbase, dslope, i, cal_batch[i], d0)
        t0 = op_time_us(family[i], dtype[i], kernels[i], d0, origin, params, mlp)
        t = cal_us[i] * t / t0
    return t


@njit(cache=True)
def evaluate_grid(family, phase, dtype, count, kernels, dbase, dslope, batches, gpus, params,
                  mlp, cal_us, cal_batch, origin, out_ms):
    """out_ms[g, b, phase] += time of every row at batches[b] on gpus[g] (ms)."""
    n = family.shape[0]
    d = np.empty(dbase.shape[1], dtype=np.int64)
    d0 = np.empty(dbase.shape[1], dtype=np.int64)
    for g in range(gpus.shape[0]):
        for bi in range(batches.shape[0]):
            for i in range(n):
                t = row_time_us(i, family, dtype, kernels, dbase, dslope, batches[bi], d, d0,
                                gpus[g], params, mlp, cal_us, cal_batch, origin)
                out_ms[g, bi, phase[i]] += t * count[i] * 1e-3


@njit(cache=True)
def evaluate_ops(family, dtype, kernels, dbase, dslope, batch, gpu, params, mlp, cal_us,
                 cal_batch, origin, out_us):
    """out_us[i] = time of one execution of row i at `batch` on `gpu` (us)."""
    d = np.empty(dbase.shape[1], dtype=np.int64)
    d0 = np.empty(dbase.shape[1], dtype=np.int64)
    for i in range(family.shape[0]):
        out_us[i] = row_time_us(i, family, dtype, kernels, dbase, dslope, batch, d, d0, gpu,
                                params, mlp, cal_us, cal_batch, origin)
