"""Calibrated prediction: a calibration evaluated on a target GPU and batch.

A calibration (``predictor.calibration`` measures one and keeps it in a file)
holds measured op times on one device. Predicting from it is the engine's
business, so it lives in the core; the core reads a calibration through its
interface only (``device_info``, ``kernel_args``, ``check_graph``,
``overhead``, ``settings``, ``batch_sizes``) and never imports the package
that measures and fits.

The kernels scale each measured row by a ratio of model predictions
(``predictor.kernels.grid``): ``t = cal_us * f(row at b, gpu) / f(row at
cal_batch, origin)``. This module prepares their inputs and the one term a
ratio cannot carry:

- **which measurement** scales a row to batch ``b``: the one at the calibrated
  batch size nearest to ``b`` (``Calibration.kernel_args``);
- **which model**: the engine's for a GPU calibration; for a CPU calibration
  the analytical roofline on the CPU's measured peaks, with the CPU's
  measured per-op cost as the launch term (a GPU-trained learned model says
  nothing about a CPU);
- **fresh-memory cost (CPU)**: an op whose output is larger than the C
  allocator's mmap threshold gets freshly mapped pages on every call and pays
  a page fault per page, a cost proportional to bytes that appears only above
  the threshold (on glibc, 32 MiB). A ratio of roofline times cannot know it,
  so it is separated out: the kernels scale ``measured - fresh(b_cal)`` and
  ``fresh(b)`` is added back.

All of it is numpy over rows, once per batch size; nothing per configuration.
"""

from __future__ import annotations

import numpy as np

from predictor import overhead as host
from predictor.errors import InvalidArgumentError
from predictor.hardware import GPU
from predictor.kernels import layout as L
from predictor.kernels.grid import evaluate_grid as grid
from predictor.kernels.grid import evaluate_ops as per_op
from predictor.kernels.roofline import P_LAUNCH_US

MIB = 2.0 ** 20


def model_params_for(device_info, params: np.ndarray) -> np.ndarray:
    """The per-op model's parameters for ratios anchored on `device_info`.

    On a CPU every op pays the dispatcher's fixed cost, which plays the role of
    a GPU's launch overhead in the model: the measured value replaces it, so
    the ratio of a small op at two batch sizes keeps its fixed part."""
    p = np.array(params, dtype=np.float64, copy=True)
    if device_info.is_cpu and device_info.op_overhead_us:
        p[P_LAUNCH_US] = float(device_info.op_overhead_us)
    return p


def check_target(calibration, gpu_id: str) -> None:
    """A CPU calibration predicts that CPU only."""
    if calibration.is_cpu and gpu_id != calibration.device:
        raise InvalidArgumentError(
            f"{calibration.where()} was measured on a CPU; it predicts that CPU at other batch "
            f"sizes (gpu='{calibration.device}'), not {gpu_id}: CPU and GPU kernels differ too "
            "much for a ratio of models to bridge them. Calibrate on a GPU, or predict without "
            "a calibration")


def output_elems(family: np.ndarray, dims: np.ndarray) -> np.ndarray:
    """Elements of each output tensor a row allocates, [rows, 3] (0: none)."""
    n = family.shape[0]
    out = np.zeros((n, 3), dtype=np.float64)
    d = dims.astype(np.float64)
    gemm = family == L.MATMUL
    out[gemm, 0] = d[gemm, 0] * d[gemm, 1] * d[gemm, 2]
    conv = family == L.CONV
    out[conv, 0] = d[conv, 0] * d[conv, 4] * d[conv, 7] * d[conv, 8]
    dgrad = family == L.CONV_DGRAD
    out[dgrad, 0] = d[dgrad, 0] * d[dgrad, 1] * d[dgrad, 2] * d[dgrad, 3]
    wgrad = family == L.CONV_WGRAD
    groups = np.maximum(d[wgrad, 9], 1)
    out[wgrad, 0] = d[wgrad, 4] * (d[wgrad, 1] // groups) * d[wgrad, 5] * d[wgrad, 6]
    att = family == L.ATTENTION  # B H Sq Sk D Dv
    out[att, 0] = d[att, 0] * d[att, 1] * d[att, 2] * d[att, 5]
    att_b = family == L.ATTENTION_BWD
    out[att_b, 0] = d[att_b, 0] * d[att_b, 1] * d[att_b, 2] * d[att_b, 4]
    out[att_b, 1] = d[att_b, 0] * d[att_b, 1] * d[att_b, 3] * d[att_b, 4]
    out[att_b, 2] = d[att_b, 0] * d[att_b, 1] * d[att_b, 3] * d[att_b, 5]
    lstm = family == L.LSTM  # T B I H: outputs and the gates kept for backward
    out[lstm, 0] = d[lstm, 0] * d[lstm, 1] * d[lstm, 3]
    out[lstm, 1] = d[lstm, 0] * d[lstm, 1] * d[lstm, 3] * 4
    lstm_b = family == L.LSTM_BWD
    out[lstm_b, 0] = d[lstm_b, 0] * d[lstm_b, 1] * d[lstm_b, 2]
    mem = family >= L.ELEMENTWISE
    written = d[:, L.MEM_WRITTEN]
    out[mem, 0] = written[mem]
    drop = family == L.DROPOUT  # output and mask
    out[drop, 0] = written[drop] / 2
    out[drop, 1] = written[drop] / 2
    out[family == L.OPTIMIZER] = 0.0  # per-parameter tensors, mostly in place
    return out


def in_place_rows(ops) -> np.ndarray:
    """Rows whose aten op writes into an existing tensor (``add_``, ``_foreach_mul_``)."""
    names = np.array([n.endswith("_") for n in ops.op_names] or [False], dtype=bool)
    return names[ops.op] if len(ops.op_names) else np.zeros(len(ops), dtype=bool)


def fresh_memory_us(ops, batch: int, device_info) -> np.ndarray:
    """Per-row cost of mapping fresh pages for outputs above the allocator's
    threshold on the calibrated CPU (zeros for a GPU or an unknown allocator)."""
    n = len(ops)
    thr, cost = device_info.alloc_threshold_bytes, device_info.alloc_us_per_mib
    if not device_info.is_cpu or not thr or not cost:
        return np.zeros(n)
    elem_bytes = np.asarray(L.DTYPE_BYTES, dtype=np.float64)[ops.dtype]
    nbytes = output_elems(ops.family, ops.dims(batch)) * elem_bytes[:, None]
    drop = ops.family == L.DROPOUT
    nbytes[drop, 1] /= elem_bytes[drop]  # the dropout mask is bool
    big = np.where(nbytes >= thr, nbytes, 0.0).sum(axis=1)
    big[in_place_rows(ops)] = 0.0
    return big / MIB * cost


class Scaling:
    """Everything the kernels and the engine need from a calibration at one
    target batch size."""

    def __init__(self, calibration, ops, batch: int, params: np.ndarray):
        cal = calibration
        self.cal_us, self.cal_batch, self.origin = cal.kernel_args(batch)
        info = cal.device_info
        if info.is_cpu:
            # Take the fresh-memory part out of each measurement before scaling.
            fresh_at = {int(b): fresh_memory_us(ops, int(b), info) for b in cal.batch_sizes}
            base = np.zeros(len(ops))
            for b, fresh in fresh_at.items():
                pick = self.cal_batch == b
                base[pick] = fresh[pick]
            measured = self.cal_us > 0
            self.cal_us = np.where(measured, np.maximum(self.cal_us - base, 0.05 * self.cal_us),
                                   0.0)
            self.extra_us = np.where(measured, fresh_memory_us(ops, batch, info), 0.0)
        else:
            self.extra_us = np.zeros(len(ops))
        self.params = model_params_for(info, params)
        self.measured = self.cal_us > 0

    def basis(self, default: np.ndarray) -> np.ndarray:
        """Per-row basis codes: calibrated where measured, else `default`."""
        return np.where(self.measured, L.BASIS_CALIBRATED, default).astype(np.int64)


# ------------------------------------------------------------ engine glue --

def resolve_targets(calibration, gpus, db) -> list:
    """The devices a calibrated prediction may target, as GPU records.

    A CPU calibration serves its own CPU only (``"cpu"``; ``None`` means it);
    a GPU calibration serves any GPU in the database."""
    info = calibration.device_info
    if info.is_cpu:
        names = ["cpu"] if gpus is None else (
            [n.strip() for n in gpus.split(",") if n.strip()] if isinstance(gpus, str) else list(gpus))
        for name in names:
            name = str(getattr(name, "id", name)).strip()
            check_target(calibration, "cpu" if name.lower() == "cpu" else name)
        return [GPU(id=info.id, name=info.name, vendor="cpu", features=info.features,
                    spec={"name": info.name})]
    return db.resolve(gpus)


def check_compatible(calibration, graph, ops, tf32_matmul=None, tf32_conv=None) -> None:
    """Refuse predictions the measurements cannot anchor."""
    calibration.check_graph(graph)
    if not np.array_equal(ops.dtype, graph.ops.dtype):
        raise InvalidArgumentError(
            f"{calibration.where()} measured the ops in their traced dtypes; a dtype override "
            "changes the kernels: calibrate a graph traced in that dtype instead")
    if calibration.is_cpu:
        return
    settings = calibration.settings
    for flag, given, default in (("tf32_matmul", tf32_matmul, False), ("tf32_conv", tf32_conv, True)):
        measured = settings.get(flag, default)
        wanted = default if given is None else bool(given)
        if measured is not None and bool(measured) != wanted:
            raise InvalidArgumentError(
                f"{calibration.where()} was measured with {flag}={bool(measured)}, the prediction "
                f"asks for {flag}={wanted}: calibrate again with that setting")


def _phase_sum(per_row_us: np.ndarray, ops) -> np.ndarray:
    """Per-phase ms of a per-row time (one execution) times each row's count."""
    return np.bincount(ops.phase, weights=per_row_us * ops.count * 1e-3,
                       minlength=len(L.PHASE_NAMES))


def evaluate_grid(calibration, graph, ops, batches: np.ndarray, gpu_ids: list[str],
                  feats: np.ndarray, params: np.ndarray, mlp: np.ndarray):
    """Calibrated phase times [gpu, batch, phase] and the iteration overhead
    included in them (same shape), for the engine's `sweep`.

    On the calibrated device the overhead is the measured one
    (``Calibration.overhead``, spread over the phases by their share); on
    other GPUs it is the engine's host-dispatch model."""
    info = calibration.device_info
    if info.is_cpu:
        mlp = np.zeros(0)  # the learned models know GPUs, not CPUs
    out = np.zeros((len(gpu_ids), len(batches), len(L.PHASE_NAMES)))
    exposed = np.zeros_like(out)
    for bi, b in enumerate(batches):
        s = Scaling(calibration, ops, int(b), params)
        cell = np.zeros((len(gpu_ids), 1, len(L.PHASE_NAMES)))
        grid(ops.family, ops.phase, ops.dtype, ops.count, ops.kernels, ops.dbase, ops.dslope,
             np.asarray([b], dtype=np.int64), feats, s.params, mlp, s.cal_us, s.cal_batch,
             s.origin, cell)
        out[:, bi, :] = cell[:, 0, :] + _phase_sum(s.extra_us, ops)[None, :]
    on_origin = np.array([g == calibration.device for g in gpu_ids], dtype=bool)
    model = calibration.overhead
    if model.points > 0 and on_origin.any():
        ops_ms = out[on_origin].sum(axis=2, keepdims=True)
        gap = model(ops_ms)
        share = out[on_origin] / np.maximum(ops_ms, 1e-30)
        exposed[on_origin] = gap * share
        out[on_origin] += exposed[on_origin]
    others = ~on_origin if model.points > 0 else np.ones(len(gpu_ids), dtype=bool)
    if others.any() and not info.is_cpu:
        total, extra = host.combine(out[others], host.host_ms(graph, ops))
        out[others], exposed[others] = total, extra
    return out, exposed


def evaluate_ops(calibration, ops, batch: int, gpu_row: np.ndarray, params: np.ndarray,
                 mlp: np.ndarray, default_basis: np.ndarray | None = None):
    """(per-row us of one execution, per-row basis codes) at `batch` on one GPU."""
    if calibration.is_cpu:
        mlp = np.zeros(0)
    s = Scaling(calibration, ops, int(batch), params)
    out = np.zeros(len(ops))
    per_op(ops.family, ops.dtype, ops.kernels, ops.dbase, ops.dslope, np.int64(batch), gpu_row,
           s.params, mlp, s.cal_us, s.cal_batch, s.origin, out)
    out += s.extra_us
    if default_basis is None:
        default_basis = np.full(len(ops), L.BASIS_ANALYTICAL, dtype=np.int64)
    return out, s.basis(default_basis)
