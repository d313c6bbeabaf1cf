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

- **how far to trust the ratio**: the ratio carries the model's error on the
  origin over whole, which helps only as far as that error recurs on the
  target. On another chip the ratio is blended with the pure prediction,
  ``log t = w log(cal_us f_t / f_o) + (1 - w) log f_t``, i.e.
  ``t = f_t (cal_us / f_o) ** w``, with one ``w`` in [0, 1] per learned model
  group fitted leave-one-GPU-out on measured kernels
  (``predictor.calibration.blend``; shipped in
  ``weights/calibration_blend.json``). GPUs of one SM design (same
  architecture and compute capability, the origin itself included; see
  `alike`) and rows of the analytical-only families keep the plain ratio
  (w = 1). The kernels compute
  ``cal * f_t / f_o``; a blended row passes them ``cal ** w * f_o ** (1 - w)``
  in place of ``cal``, which gives exactly the blend and stays positive.

All of it is numpy over rows, once per batch size; nothing per configuration.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

import numpy as np

from predictor import hardware
from predictor import overhead as host
from predictor.errors import InvalidArgumentError, WeightsError
from predictor.hardware import GPU
from predictor.kernels import layout as L
from predictor.kernels.features import GROUP_NAMES, group_of
from predictor.kernels.grid import calibration_denominators
from predictor.kernels.grid import evaluate_grid as grid
from predictor.kernels.grid import evaluate_ops as per_op
from predictor.kernels.roofline import P_LAUNCH_US

MIB = 2.0 ** 20
BLEND_FILE = "calibration_blend.json"
BLEND_FORMAT = 1


# ------------------------------------------------------------------ blend --

def alike(a, b) -> bool:
    """Whether two GPUs (ids or records) share one SM design: the same
    architecture and compute capability (AMD: gfx target), e.g. boards of one
    chip, an A100 and an A30, an H100 PCIe and SXM, an L4 and an RTX 4090.
    The same kernels then run with the same tiles, and only SM count, clocks
    and bandwidth differ, which is what Habitat's wave scaling (the plain
    ratio of model predictions) accounts for; so their ratio is the plain
    one. Two Pascal chips of different SMs (P100: 6.0, P4: 6.1) are not."""
    if str(getattr(a, "id", a)) == str(getattr(b, "id", b)):
        return True
    try:
        ga, gb = hardware.get(a), hardware.get(b)
    except Exception:  # noqa: BLE001 - an unknown device is like no other
        return False
    arch_a, arch_b = ga.spec.get("architecture"), gb.spec.get("architecture")
    cc_a, cc_b = ga.spec.get("compute_capability"), gb.spec.get("compute_capability")
    return bool(arch_a) and arch_a == arch_b and bool(cc_a) and str(cc_a) == str(cc_b)


def read_blend(path) -> np.ndarray:
    """Blend weight per row family [N_FAMILIES] from a ``calibration_blend.json``
    (written by ``predictor train-models``); families of no fitted group: 1."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode())
        fitted = doc["weights"]
        if doc.get("format") != BLEND_FORMAT or not isinstance(fitted, dict):
            raise ValueError(f"expected format {BLEND_FORMAT} with a 'weights' object")
        w = {str(k): float(v) for k, v in fitted.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WeightsError(f"{path}: not a readable calibration blend file ({exc})") from exc
    bad = [k for k, v in w.items() if k not in GROUP_NAMES or not (0.0 <= v <= 1.0)]
    if bad:
        raise WeightsError(f"{path}: damaged calibration blend file (unknown group or weight "
                           f"outside [0, 1]: {', '.join(map(str, bad))})")
    return family_weights(w)


def family_weights(by_group: dict) -> np.ndarray:
    """Blend weight per row family [N_FAMILIES] from weights per learned
    model group (a group left out, and analytical-only families: 1, the plain
    ratio)."""
    out = np.ones(L.N_FAMILIES)
    for fam in range(L.N_FAMILIES):
        g = group_of(fam)
        if g >= 0:
            out[fam] = by_group.get(GROUP_NAMES[g], 1.0)
    return out


@functools.lru_cache(maxsize=1)
def blend_weights() -> np.ndarray:
    """The shipped blend weight per row family (all 1, the plain ratio, when
    the package ships none)."""
    ref = resources.files("predictor").joinpath("weights", BLEND_FILE)
    if not ref.is_file():
        return np.ones(L.N_FAMILIES)
    with resources.as_file(ref) as path:
        return read_blend(path)


def blend(cal_us: np.ndarray, f_origin: np.ndarray, w: np.ndarray) -> np.ndarray:
    """What the kernels' ``cal * f_t / f_o`` needs in place of `cal_us` to give
    the blend ``f_t * (cal / f_o) ** w``: ``cal ** w * f_o ** (1 - w)``, per row
    (rows without a measurement, or no model time, are left as they are)."""
    cal_us = np.asarray(cal_us, dtype=np.float64)
    f_origin = np.asarray(f_origin, dtype=np.float64)
    w = np.broadcast_to(np.asarray(w, dtype=np.float64), cal_us.shape)
    ok = (cal_us > 0) & (f_origin > 0) & (w < 1.0)
    out = cal_us.copy()
    out[ok] = np.exp(w[ok] * np.log(cal_us[ok]) + (1.0 - w[ok]) * np.log(f_origin[ok]))
    return out


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
        self._blended = None
        self._args = (ops, cal.device, info.is_cpu)

    def used_whole(self, gpu_id: str | None, same_chip: bool | None = None) -> bool:
        """Whether the measurements are scaled whole to `gpu_id` (a CPU's, or
        on the origin's chip; `same_chip`: `alike(origin, gpu_id)` if the
        caller knows it) rather than blended with the pure model."""
        _, device, is_cpu = self._args
        return is_cpu or (alike(device, gpu_id) if same_chip is None else same_chip)

    def cal_us_for(self, gpu_id: str | None, mlp: np.ndarray,
                   same_chip: bool | None = None) -> np.ndarray:
        """The measurements the kernels scale for a target GPU: as measured on
        the origin's chip, blended with the pure model elsewhere (see `blend`
        and `used_whole`)."""
        if self.used_whole(gpu_id, same_chip) or not self.measured.any():
            return self.cal_us
        if self._blended is None:
            ops = self._args[0]
            w = blend_weights()[ops.family]
            if (w >= 1.0).all():
                self._blended = self.cal_us
            else:
                f_o = calibration_denominators(ops.family, ops.dtype, ops.kernels, ops.dbase,
                                               ops.dslope, self.params, mlp, self.cal_us,
                                               self.cal_batch, self.origin)
                self._blended = blend(self.cal_us, f_o, w)
        return self._blended

    def basis(self, default: np.ndarray, gpu_id: str | None) -> np.ndarray:
        """Per-row basis codes on `gpu_id`: calibrated where a measurement
        shapes the time (measured, and used whole or of a group whose blend
        weight is above 0, as `cal_us_for` uses it), else `default`."""
        used = self.measured
        if not self.used_whole(gpu_id):
            used = used & (blend_weights()[self._args[0].family] > 0.0)
        return np.where(used, L.BASIS_CALIBRATED, default).astype(np.int64)


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


# A batch size more than this factor beyond the calibrated ones is extrapolated.
EXTRAPOLATION_FACTOR = 2


def extrapolation_note(calibration, batch_sizes) -> str | None:
    """One line when a calibration is used far outside the batch sizes it
    measured (more than EXTRAPOLATION_FACTOR beyond the smallest or the
    largest); None when every batch is within that range."""
    cal_b = sorted(int(b) for b in np.asarray(calibration.batch_sizes).ravel())
    if not cal_b:
        return None
    lo, hi = cal_b[0], cal_b[-1]
    asked = sorted({int(b) for b in np.asarray(batch_sizes).ravel()})
    out = [b for b in asked if b > EXTRAPOLATION_FACTOR * hi or b * EXTRAPOLATION_FACTOR < lo]
    if not out:
        return None
    far = max(out, key=lambda b: max(b / hi, lo / b))
    how = f"{far / hi:,.1f}x the largest" if far > hi else f"1/{lo / far:,.1f} of the smallest"
    shown = ", ".join(str(b) for b in out[:6]) + (", ..." if len(out) > 6 else "")
    return (f"extrapolating the calibration: batch {shown} "
            f"{'is' if len(out) == 1 else 'are'} outside the measured batches "
            f"({', '.join(str(b) for b in cal_b)}; batch {far} is {how}); measured times are "
            "scaled by the model there, so expect larger errors (calibrate at nearer batches "
            "with --calibrate-at)")


# Model groups as `transfer_note` names them.
_GROUP_WORDS = {"matmul": "GEMM", "bmm": "batched GEMM", "layer_norm": "layer norm"}


def transfer_note(calibration, ops, gpu_ids) -> str | None:
    """One line when some of `gpu_ids` lie on another chip than the
    calibrated GPU and some measured rows' groups have a blend weight below 1
    there: which measurements are not used (weight 0) and which are blended
    (see `blend`). None for a CPU calibration or when every target is the
    origin's chip."""
    if calibration.is_cpu:
        return None
    others = [g for g in gpu_ids if not alike(calibration.device, g)]
    measured = np.asarray(calibration.measured_us).max(axis=0) > 0
    if not others or not measured.any():
        return None
    w = blend_weights()
    groups: dict[str, float] = {}
    for fam in np.unique(np.asarray(ops.family)[measured]):
        g = group_of(int(fam))
        if g >= 0 and w[fam] < 1.0:
            groups[_GROUP_WORDS.get(GROUP_NAMES[g], GROUP_NAMES[g])] = float(w[fam])
    if not groups:
        return None
    shown = ", ".join(str(getattr(g, "id", g)) for g in others[:3]) + (
        ", ..." if len(others) > 3 else "")
    unused = sorted(k for k, v in groups.items() if v <= 0.0)
    blended = sorted(f"{k} (weight {v:.2f})" for k, v in groups.items() if v > 0.0)
    parts = []
    if unused:
        parts.append(f"{', '.join(unused)} ops get the model's time (their measured error "
                     "does not carry across chips)")
    if blended:
        parts.append(f"{', '.join(blended)} ops blend the measurement with the model")
    return (f"calibrated on {calibration.device}: on another chip ({shown}) "
            + "; ".join(parts) + "; the calibrated chip uses every measurement")


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


def gpu_of(gpu_row: np.ndarray, calibration) -> str | None:
    """The id of the GPU whose feature row is `gpu_row`: the calibrated device
    if it is its row, else the one database GPU with that row (None: none or
    several, which `alike` treats as another chip)."""
    row = np.asarray(gpu_row, dtype=np.float64)
    if np.array_equal(row, calibration.origin):
        return calibration.device
    found = [g.id for g in hardware.database() if np.array_equal(g.features, row)]
    return found[0] if len(found) == 1 else None


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
    same_chip = [info.is_cpu or alike(calibration.device, gid) for gid in gpu_ids]
    for bi, b in enumerate(batches):
        s = Scaling(calibration, ops, int(b), params)
        # GPUs that scale the same measurements (the plain ratio on the
        # origin's chip, the blend elsewhere) run as one grid.
        sets: dict[int, tuple[np.ndarray, list[int]]] = {}
        for gi, gid in enumerate(gpu_ids):
            cal_us = s.cal_us_for(gid, mlp, same_chip[gi])
            sets.setdefault(id(cal_us), (cal_us, []))[1].append(gi)
        for cal_us, idx in sets.values():
            cell = np.zeros((len(idx), 1, len(L.PHASE_NAMES)))
            grid(ops.family, ops.phase, ops.dtype, ops.count, ops.kernels, ops.dbase,
                 ops.dslope, np.asarray([b], dtype=np.int64), np.ascontiguousarray(feats[idx]),
                 s.params, mlp, cal_us, s.cal_batch, s.origin, cell)
            out[idx, bi, :] = cell[:, 0, :] + _phase_sum(s.extra_us, ops)[None, :]
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
                 mlp: np.ndarray, default_basis: np.ndarray | None = None,
                 gpu_id: str | None = None):
    """(per-row us of one execution, per-row basis codes) at `batch` on one GPU
    (`gpu_id`: its id, which decides the blend; None: the GPU whose feature
    row is `gpu_row`; `default_basis`: the basis of a row no measurement
    shapes)."""
    if calibration.is_cpu:
        mlp = np.zeros(0)
    s = Scaling(calibration, ops, int(batch), params)
    if gpu_id is None:
        gpu_id = gpu_of(gpu_row, calibration)
    cal_us = s.cal_us_for(gpu_id, mlp)
    out = np.zeros(len(ops))
    per_op(ops.family, ops.dtype, ops.kernels, ops.dbase, ops.dslope, np.int64(batch), gpu_row,
           s.params, mlp, cal_us, s.cal_batch, s.origin, out)
    out += s.extra_us
    if default_basis is None or calibration.is_cpu:  # a CPU's rows: no learned model
        default_basis = np.full(len(ops), L.BASIS_ANALYTICAL, dtype=np.int64)
    return out, s.basis(default_basis, gpu_id)
