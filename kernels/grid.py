"""Evaluate an OpTable over configurations: every (GPU, batch size) at once, or
every op of one configuration (the per-op breakdown). Both call the same
per-row model, so a sweep and a single prediction give the same numbers.

Calibrated rows (``cal_us[i] > 0``: measured on the `origin` device at batch
``cal_batch[i]``) are scaled Habitat-style: the model's bias cancels in the
ratio, ``t = measured * f(row at b, gpu) / f(row at cal_batch, origin)``.

The sweep is the hot path of design-space search, so `evaluate_grid` is laid
out for it:

- the configurations are split into tasks of one batch size x a block of
  GPUs, run in parallel (``prange``); each task writes only its own
  ``out_ms[g0:g1, b, :]`` slice, so no two threads touch the same cell;
- inside a task a row's dims are computed once per batch size and reused for
  every GPU of the block (GPU innermost);
- rows whose dims do not change with the batch size (optimizer steps, fills)
  are evaluated once per GPU and added to every batch size;
- a row served by a learned model runs one forward pass for the whole block
  of GPUs (``mlp_block``: GPUs innermost, vectorised) instead of one per GPU;
- the calibration denominators ``f(row at cal_batch, origin)`` depend on the
  row alone and are computed once per call, not once per configuration.

Scratch memory is O(rows + GPUs) plus, per task, one dims vector and the
learned models' activations for its block of GPUs: it does not grow with the
number of configurations.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from predictor.kernels import layout as L
from predictor.kernels.features import (G_BMM, G_MATMUL, N_FEATURES, group_features,
                                        learned_time_us, learned_us, serving_group)
from predictor.kernels.mlp import has_group, with_chip
from predictor.kernels.mlp_block import block_scratch, efficiency_block
from predictor.kernels.depthwise import is_depthwise
from predictor.kernels.optime import op_time_us
from predictor.kernels.clocks import power_limit_share, with_board_clock
from predictor.kernels.precision import is_layout_transpose, rewrites
from predictor.kernels.roofline import P_LAUNCH_US, generic_kernel_us, runs_generic_kernel
from predictor.kernels.work import as_implicit_gemm, dims_at

# Fewest tasks a sweep is split into when the batch sizes alone are too few to
# keep the threads busy (a one-batch sweep over many GPUs): enough for 8
# threads at 2 tasks each. A constant, not numba.get_num_threads(): reading the
# thread count inside a kernel makes it uncacheable.
_MIN_TASKS = 16
# GPUs a task's block holds at least (when there are that many): the learned
# models' forward pass runs across the block, and short loops waste the
# vector units; blocks are padded to a multiple of _LANES.
_MIN_BLOCK = 8
_LANES = 8
# Row evaluations (rows x configurations) below which a grid runs on the
# calling thread alone: 1-10 ms of work (analytical-learned).
_MIN_PARALLEL_WORK = 10_000


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
def calibration_denominators(family, dtype, kernels, dbase, dslope, params, mlp, cal_us,
                             cal_batch, origin):
    """t0[i] = model time of row i at its calibration batch on the origin device
    (0 for rows without a measurement, which are not scaled)."""
    n = family.shape[0]
    t0 = np.zeros(n)
    if cal_us.shape[0] == 0:
        return t0
    d0 = np.empty(dbase.shape[1], dtype=np.int64)
    for i in range(n):
        if cal_us[i] > 0.0:
            dims_at(dbase, dslope, i, cal_batch[i], d0)
            t0[i] = op_time_us(family[i], dtype[i], kernels[i], d0, origin, params, mlp)
    return t0


@njit(cache=True)
def split_rows(dslope):
    """(rows whose dims change with the batch size, rows whose dims do not)."""
    n = dslope.shape[0]
    scaling = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        for j in range(dslope.shape[1]):
            if dslope[i, j] != 0:
                scaling[i] = True
                break
    return np.nonzero(scaling)[0], np.nonzero(~scaling)[0]


@njit(cache=True)
def _add_row(i, d, g0, g1, family, phase, dtype, count, kernels, gpus, params, mlp, cal_us, t0,
             out, bi, scratch):
    """out[g, bi, phase[i]] += row i with dims `d` on each of gpus[g0:g1] (ms)."""
    fam, dt, kern, ph = family[i], dtype[i], kernels[i], phase[i]
    ms_per_us = count[i] * 1e-3
    scaled = cal_us.shape[0] > 0 and cal_us[i] > 0.0
    group = serving_group(fam, d, mlp)
    if has_group(mlp, group) and not rewrites(fam, dt, params) \
            and not is_layout_transpose(fam, d) and not as_implicit_gemm(fam, d) \
            and not is_depthwise(fam, d):
        # The learned model, for the whole block of GPUs in one forward pass:
        # the block form of optime.op_time_us (the tests hold the two equal).
        x, eta, zbuf, hbuf, acc, ideal, eta_one, one = scratch
        for g in range(g0, g1):
            ideal[g - g0] = group_features(group, fam, dt, d, gpus[g], params, mlp, x[g - g0])
        # All lanes of the scratch: the rows past g1 - g0 hold finite values
        # that are ignored, and full vectors run faster than a scalar remainder.
        efficiency_block(mlp, group, x, x.shape[0], eta, zbuf, hbuf, acc)
        # A batched GEMM: never below one of its GEMMs alone under the matmul
        # network (optime.learned_row_us), a second pass over the block.
        floor = group == G_BMM and has_group(mlp, G_MATMUL)
        if floor:
            for j in range(min(one.shape[0], d.shape[0])):
                one[j] = d[j]
            one[0] = 1
            for g in range(g0, g1):
                group_features(G_MATMUL, fam, dt, one, gpus[g], params, mlp, x[g - g0])
            efficiency_block(mlp, G_MATMUL, x, x.shape[0], eta_one, zbuf, hbuf, acc)
        for g in range(g0, g1):
            e = with_chip(mlp, group, eta[g - g0], gpus[g, L.G_CHIP])
            e = with_board_clock(mlp, group, e, fam, dt, d, gpus[g], params)
            t = learned_time_us(fam, dt, d, gpus[g], params, ideal[g - g0], e)
            if floor:
                e = with_chip(mlp, G_MATMUL, eta_one[g - g0], gpus[g, L.G_CHIP])
                e = with_board_clock(mlp, G_MATMUL, e, fam, dt, one, gpus[g], params)
                t = max(t, learned_us(fam, dt, one, gpus[g], params, e))
            if runs_generic_kernel(fam):
                t = generic_kernel_us(fam, d, gpus[g], t, power_limit_share(mlp, gpus[g]))
            t += kern * params[P_LAUNCH_US]
            if scaled:
                t = cal_us[i] * t / t0[i]
            out[g, bi, ph] += t * ms_per_us
        return
    for g in range(g0, g1):
        t = op_time_us(fam, dt, kern, d, gpus[g], params, mlp)
        if scaled:
            t = cal_us[i] * t / t0[i]
        out[g, bi, ph] += t * ms_per_us


@njit(cache=True)
def _scratch(mlp, n):
    """Per-task scratch of the learned models for blocks of up to n GPUs,
    rounded up to whole vectors (_LANES)."""
    lanes = (n + _LANES - 1) // _LANES * _LANES
    zbuf, hbuf, acc = block_scratch(mlp, lanes)
    return (np.zeros((lanes, N_FEATURES)), np.empty(lanes), zbuf, hbuf, acc, np.empty(lanes),
            np.empty(lanes), np.zeros(L.MAX_DIMS, dtype=np.int64))


@njit(cache=True)
def _fixed_rows_ms(rows, family, phase, dtype, count, kernels, dbase, dslope, gpus, params, mlp,
                   cal_us, t0, n_phases):
    """[gpu, 1, phase] time of the rows whose dims do not change with the batch
    size (optimizer steps, fills): the same at every batch size, so evaluated
    once per GPU instead of once per configuration."""
    out = np.zeros((gpus.shape[0], 1, n_phases))
    d = np.empty(dbase.shape[1], dtype=np.int64)
    scratch = _scratch(mlp, gpus.shape[0])
    for i in rows:
        dims_at(dbase, dslope, i, 0, d)
        _add_row(i, d, 0, gpus.shape[0], family, phase, dtype, count, kernels, gpus, params, mlp,
                 cal_us, t0, out, 0, scratch)
    return out


@njit(cache=True)
def _evaluate_block(bi, g0, g1, rows, fixed_ms, family, phase, dtype, count, kernels, dbase,
                    dslope, batches, gpus, params, mlp, cal_us, t0, out_ms):
    """out_ms[g0:g1, bi, :] += the fixed rows' time + every row of `rows` at
    batches[bi], on gpus[g0:g1]."""
    for g in range(g0, g1):
        for ph in range(out_ms.shape[2]):
            out_ms[g, bi, ph] += fixed_ms[g, 0, ph]
    d = np.empty(dbase.shape[1], dtype=np.int64)
    scratch = _scratch(mlp, g1 - g0)
    batch = batches[bi]
    for i in rows:
        dims_at(dbase, dslope, i, batch, d)  # once per batch size, for every GPU
        _add_row(i, d, g0, g1, family, phase, dtype, count, kernels, gpus, params, mlp, cal_us,
                 t0, out_ms, bi, scratch)


@njit(cache=True, parallel=True)
def evaluate_grid(family, phase, dtype, count, kernels, dbase, dslope, batches, gpus, params,
                  mlp, cal_us, cal_batch, origin, out_ms):
    """out_ms[g, b, phase] += time of every row at batches[b] on gpus[g] (ms)."""
    ng = gpus.shape[0]
    nb = batches.shape[0]
    if family.shape[0] == 0 or ng == 0 or nb == 0:
        return
    t0 = calibration_denominators(family, dtype, kernels, dbase, dslope, params, mlp, cal_us,
                                  cal_batch, origin)
    scaling, fixed = split_rows(dslope)
    fixed_ms = _fixed_rows_ms(fixed, family, phase, dtype, count, kernels, dbase, dslope, gpus,
                              params, mlp, cal_us, t0, out_ms.shape[2])
    if scaling.shape[0] * ng * nb < _MIN_PARALLEL_WORK:
        # Waking the worker threads costs more than a small grid takes.
        for bi in range(nb):
            _evaluate_block(bi, 0, ng, scaling, fixed_ms, family, phase, dtype, count, kernels,
                            dbase, dslope, batches, gpus, params, mlp, cal_us, t0, out_ms)
        return
    # GPU blocks per batch size: one when the batch sizes alone fill the threads.
    blocks = min(max(1, ng // _MIN_BLOCK), max(1, (_MIN_TASKS + nb - 1) // nb))
    for task in prange(nb * blocks):
        bi = task // blocks
        k = task - bi * blocks
        g0 = k * ng // blocks
        g1 = (k + 1) * ng // blocks
        _evaluate_block(bi, g0, g1, scaling, fixed_ms, family, phase, dtype, count, kernels,
                        dbase, dslope, batches, gpus, params, mlp, cal_us, t0, out_ms)


@njit(cache=True)
def evaluate_ops(family, dtype, kernels, dbase, dslope, batch, gpu, params, mlp, cal_us,
                 cal_batch, origin, out_us):
    """out_us[i] = time of one execution of row i at `batch` on `gpu` (us)."""
    d = np.empty(dbase.shape[1], dtype=np.int64)
    d0 = np.empty(dbase.shape[1], dtype=np.int64)
    for i in range(family.shape[0]):
        out_us[i] = row_time_us(i, family, dtype, kernels, dbase, dslope, batch, d, d0, gpu,
                                params, mlp, cal_us, cal_batch, origin)
