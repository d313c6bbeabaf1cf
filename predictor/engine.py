"""The engine: an OpTable x (GPU, batch size) configurations -> times.

`predict` is a one-configuration call of `sweep`: one code path, one set of
numbers. The per-op breakdown re-evaluates the same kernel row by row.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterable, Sequence

import numpy as np

from predictor import calibrated, dtypes, expected_error, hardware, opmodel, overhead
from predictor import memory as memmodel
from predictor.errors import InvalidArgumentError, NotApplicableWarning
from predictor.kernels import layout as L
from predictor.kernels import precision
from predictor.kernels.clocks import power_limit_share
from predictor.kernels.depthwise import is_depthwise
from predictor.kernels.grid import evaluate_grid, evaluate_ops
from predictor.kernels.optime import learned_rows, on_cuda_cores, recurrent_params
from predictor.kernels.recurrent import is_recurrent
from predictor.kernels.work import as_implicit_gemm
from predictor.kernels.roofline import (GENERIC_KERNEL_FAMILIES, P_LAUNCH_US, P_TF32_CONV,
                                       P_TF32_MATMUL, default_params, generic_kernel_us)
from predictor.optable import Graph
from predictor.results import Prediction, SweepResult


# No calibration: every row is predicted.
_NO_CALIBRATION = (np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(L.N_GPU_FEATURES))


_WEIGHTS_OVERRIDE: list[np.ndarray] = []


def _mlp() -> np.ndarray:
    """The learned per-op weights in use: the shipped ones (empty: analytical
    model only) unless a validation harness swapped others in."""
    if _WEIGHTS_OVERRIDE:
        return _WEIGHTS_OVERRIDE[-1]
    return opmodel.weights()


@contextlib.contextmanager
def using_weights(mlp: np.ndarray):
    """Predict with other op-model weights inside the block (e.g. models
    trained without the GPU being evaluated: leave-one-GPU-out). `mlp` is a
    packed weight array as `predictor.calibration.train.train` returns it
    (empty: the analytical model alone)."""
    w = np.ascontiguousarray(mlp, dtype=np.float64)
    problem = opmodel.layout_problem(w)
    if problem:
        raise InvalidArgumentError(f"not a packed op-model weight array: {problem}")
    _WEIGHTS_OVERRIDE.append(w)
    try:
        yield
    finally:
        _WEIGHTS_OVERRIDE.pop()


def predicted_basis(ops, gpu=None, params: np.ndarray | None = None,
                    batch: int | None = None) -> np.ndarray:
    """Per-row basis of a prediction without calibration: learned where a
    learned model serves the row's family, analytical elsewhere. With `gpu`
    (a feature row): GEMMs and convolutions on its tensor cores (half
    precision, TF32 matmuls) are analytical (predictor.kernels.precision),
    but for an unaligned TF32 GEMM priced as its CUDA-core kernels at
    `batch` (`_on_cuda_cores`); memory-bound rows in half precision stay
    learned: the fp32 model prices them by the bytes they move. A recurrent
    layer is priced as its GEMMs and pointwise kernels (kernels.recurrent):
    learned unless the GEMMs run on tensor cores; so is a convolution priced
    as its implicit GEMM (kernels.work.as_implicit_gemm)."""
    basis = np.where(learned_rows(ops.family, _mlp()), L.BASIS_LEARNED, L.BASIS_ANALYTICAL)
    if gpu is not None:
        p = default_params() if params is None else params
        for i, (fam, dt) in enumerate(zip(ops.family, ops.dtype)):
            if is_recurrent(fam) or as_implicit_gemm(fam, ops.dbase[i]):
                # its GEMMs decide (kernels.recurrent, optime.implicit_gemm_us)
                fam, row_p = L.MATMUL, recurrent_params(dt, p)
            else:
                row_p = p
            if precision.mode_of(fam, dt, gpu, row_p) == precision.TENSOR_CORE:
                basis[i] = L.BASIS_ANALYTICAL
        if batch is not None:
            basis[_on_cuda_cores(ops, batch, gpu, p)] = L.BASIS_LEARNED
    for i, fam in enumerate(ops.family):
        if is_depthwise(fam, ops.dbase[i]):  # kernels.depthwise, by its own formula
            basis[i] = L.BASIS_ANALYTICAL
    return basis


def _element_bound(ops, batch: int, gpu: np.ndarray, per_op_us: np.ndarray,
                   params: np.ndarray) -> np.ndarray:
    """Rows whose time is their elements at the rate of PyTorch's
    non-vectorised kernels or an NCHW max pool's window walk
    (kernels.roofline.generic_kernel_us), not the learned model's price of
    their bytes: their basis is analytical."""
    out = np.zeros(len(ops), dtype=bool)
    d = ops.dims(batch)
    if d.shape[1] <= L.MEM_GENERIC:
        return out
    generic = np.isin(ops.family, GENERIC_KERNEL_FAMILIES)
    share = power_limit_share(_mlp(), gpu)
    for i in np.nonzero(generic & (d[:, L.MEM_GENERIC] > 0))[0]:
        bound = generic_kernel_us(ops.family[i], d[i], gpu, 0.0, share)
        if bound > 0.0:
            launches = ops.kernels[i] * params[P_LAUNCH_US]
            out[i] = per_op_us[i] <= (bound + launches) * (1.0 + 1e-9)
    return out


def _on_cuda_cores(ops, batch: int, gpu: np.ndarray, params: np.ndarray) -> np.ndarray:
    """Rows on tensor cores by their dtype that are priced as their CUDA-core
    kernels at this batch (an unaligned TF32 GEMM whose fp32 price is the
    lower, a convolution's implicit GEMM whose FMA kernels are faster:
    kernels.optime.on_cuda_cores): their basis is the learned fp32 model's
    where one serves them."""
    out = np.zeros(len(ops), dtype=bool)
    mlp = _mlp()
    d = ops.dims(batch)
    convs = np.isin(ops.family, (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD))
    for i in np.flatnonzero(((ops.family == L.MATMUL) | convs) & (ops.dtype == L.F32)):
        out[i] = on_cuda_cores(ops.family[i], L.F32, ops.kernels[i], d[i], gpu, params, mlp)
    return out & learned_rows(ops.family, mlp)


def model_params(tf32_matmul: bool | None = None, tf32_conv: bool | None = None) -> np.ndarray:
    """The per-op model's parameter vector with PyTorch's TF32 switches applied
    (defaults: matmul off, cuDNN conv on, as in PyTorch)."""
    p = default_params()
    if tf32_matmul is not None:
        p[P_TF32_MATMUL] = float(bool(tf32_matmul))
    if tf32_conv is not None:
        p[P_TF32_CONV] = float(bool(tf32_conv))
    return p


def _batches(graph: Graph, batch_sizes: Iterable[int] | int | None) -> np.ndarray:
    if batch_sizes is None:
        batch_sizes = [graph.batch_size]
    elif isinstance(batch_sizes, (int, np.integer)):
        batch_sizes = [int(batch_sizes)]
    out = [graph.check_batch(b, extent=False) for b in batch_sizes]
    if not out:
        raise InvalidArgumentError("no batch size given")
    # Counts grow with the batch (dims are affine in it): the ends bound them all.
    graph.check_extent(min(out))
    graph.check_extent(max(out))
    return np.asarray(out, dtype=np.int64)


def sweep(graph: Graph, gpus: str | Sequence[str] | None = "all",
          batch_sizes: Iterable[int] | int | None = None, *, dtype=None,
          tf32_matmul: bool | None = None, tf32_conv: bool | None = None,
          calibration=None,
          max_memory_fraction: float = memmodel.DEFAULT_MAX_MEMORY_FRACTION) -> SweepResult:
    """Times (and peak memory) of the traced step for every (GPU, batch size).

    calibration: a calibration of this graph (``predictor.calibrate``, or
        ``predictor.load_calibration``): measured op times are scaled to each
        GPU and batch size (measured x model ratio) instead of predicted
        (``predictor.calibrated``).
    max_memory_fraction: a configuration fits when its predicted peak memory is
        at most this fraction of the GPU's memory (see predictor.memory).
    """
    db = hardware.database()
    if calibration is not None:
        chosen = calibrated.resolve_targets(calibration, gpus, db)
    else:
        chosen = db.resolve(gpus)
    batches = _batches(graph, batch_sizes)
    code = dtypes.parse(dtype)
    chosen = _check_amp(graph, code, chosen, gpus)
    if tf32_matmul:
        note = tf32_note(graph, chosen, code)
        if note:
            warnings.warn(note, NotApplicableWarning, stacklevel=2)
    ops = graph.ops.with_dtype(code) if code is not None else graph.ops
    feats = db.features(chosen)
    params = model_params(tf32_matmul, tf32_conv)
    out = np.zeros((len(chosen), len(batches), len(L.PHASE_NAMES)))
    if calibration is not None:
        calibrated.check_compatible(calibration, graph, ops, tf32_matmul, tf32_conv)
        out, exposed = calibrated.evaluate_grid(calibration, graph, ops, batches,
                                             [g.id for g in chosen], feats, params, _mlp())
    else:
        evaluate_grid(ops.family, ops.phase, ops.dtype, ops.count, ops.kernels, ops.dbase,
                      ops.dslope, batches, feats, params, _mlp(), *_NO_CALIBRATION, out)
        # A phase lasts as long as the GPU's kernels or the host's dispatch, whichever is longer.
        out, exposed = overhead.combine(out, overhead.host_ms(graph, ops))
    mem = _memory(graph, chosen, batches, code, max_memory_fraction)
    gemm = expected_error.gemm_dtype(graph, dtype, tf32_matmul)
    standing = [expected_error.standing(g, gemm, params, calibrated=calibration is not None)
                for g in chosen]
    return SweepResult(model=graph.name, gpus=[g.id for g in chosen], batch_sizes=batches,
                       phase_ms=out, mode=graph.mode, prices=[g.price_per_hour for g in chosen],
                       overhead_phase_ms=exposed, memory_bytes=mem,
                       memory_capacity_gb=[g.memory_gb for g in chosen],
                       max_memory_fraction=max_memory_fraction, seq_len=graph.seq_len,
                       standing=standing,
                       error_p90_pct=[expected_error.p90_pct(s) for s in standing])


def tf32_note(graph: Graph, gpus, code: int | None = None) -> str | None:
    """What TF32 matmuls change nothing for, in one sentence (None where they
    apply to every GPU of `gpus`): a step whose matmuls run in half precision
    (autocast, or a 16-bit `code`), or GPUs without TF32 tensor cores that
    PyTorch uses (``precision.has_tf32``: NVIDIA compute capability 8.0 on),
    whose fp32 matmuls stay plain fp32."""
    amp = getattr(graph, "amp", None)
    half = amp is not None or code in (L.F16, L.BF16) or code is None and \
        dtypes.mostly(graph, (L.F16, L.BF16))
    if half:
        how = f"amp {amp}" if amp is not None else dtypes.name(code) if code is not None \
            else "as traced"
        return ("TF32 matmuls (--tf32, tf32_matmul=True) change nothing here: the step's "
                f"matmuls run in half precision ({how})")
    lacking = [g.id for g in gpus if not precision.has_tf32(g.features)]
    if not lacking:
        return None
    return (f"TF32 matmuls (--tf32, tf32_matmul=True) do not apply on {', '.join(lacking)}: "
            "no TF32 tensor cores that PyTorch uses (NVIDIA compute capability 8.0 on; ROCm "
            "keeps fp32), so their fp32 matmuls are predicted as plain fp32")


def _check_amp(graph: Graph, code: int | None, chosen, asked=None) -> list:
    """The GPUs to predict `graph` on, of `chosen` (`asked` as given). A
    graph traced under autocast keeps autocast's dtypes (dtype= would recast
    every op, undoing it); bf16 autocast on a GPU without bf16 tensor cores
    runs emulated at the fp32 rate: a warning naming the GPUs; an fp8 step
    runs only where float8 tensor cores are (``hardware.float8_gpus``)."""
    amp = getattr(graph, "amp", None)
    if amp is None:
        return chosen
    if code is not None:
        raise InvalidArgumentError(
            f"{graph.name} was traced with amp={amp!r}: its ops already have autocast's dtypes; "
            "drop dtype= (or trace without amp)")
    if amp == "bf16":
        lacking = [g.id for g in chosen if g.spec.get("bf16_supported", True) is False]
        if lacking:
            warnings.warn(f"no bf16 tensor cores on {', '.join(lacking)}: amp='bf16' matmuls and "
                          "convolutions are predicted emulated at the fp32 rate there; use "
                          "amp='fp16' on these GPUs", stacklevel=3)
    if amp == "fp8":
        return hardware.float8_gpus(chosen, asked, warn=True)
    return chosen


def _memory(graph: Graph, chosen, batches: np.ndarray, code: int | None,
            fraction: float) -> np.ndarray | None:
    """Peak device memory [gpu, batch] in bytes, kept apart from the time
    kernels (None when the graph has no memory profile)."""
    memmodel.check_fraction(fraction)
    return memmodel.evaluate(graph, chosen, batches, code)


def predict(graph: Graph, gpu: str = "H100-SXM5-80GB", *, batch_size: int | None = None,
            dtype=None, tf32_matmul: bool | None = None,
            tf32_conv: bool | None = None, calibration=None,
            max_memory_fraction: float = memmodel.DEFAULT_MAX_MEMORY_FRACTION,
            parallel=None, checkpoint: str | None = None) -> Prediction:
    """Predicted time of one iteration of `graph` on `gpu` at `batch_size`
    (with `calibration`: measured op times scaled to `gpu`; see `sweep`).

    parallel: a ``predictor.Parallel`` layout (tensor / pipeline / data
        parallelism, ZeRO) and checkpoint: None, "full" or "selective"
        activation recomputation; `batch_size` is then the micro-batch per GPU
        and the result a ``ParallelPrediction`` (``predictor.layouts``). With
        neither, the single-GPU prediction, unchanged."""
    if parallel is not None or checkpoint is not None:
        from predictor import layouts
        layouts.check_checkpoint(checkpoint)
        par = parallel if parallel is not None else layouts.Parallel()
        if not isinstance(par, layouts.Parallel):
            raise InvalidArgumentError(
                f"parallel must be a predictor.Parallel, got {type(par).__name__}")
        if not (par.trivial and checkpoint is None):
            if calibration is not None:
                raise InvalidArgumentError("parallel layouts and recomputation are predicted "
                                           "in pure mode only (no calibration=)")
            return layouts.predict_parallel(
                graph, hardware.get(gpu), graph.check_batch(batch_size), par, checkpoint,
                dtype=dtype, tf32=(tf32_matmul, tf32_conv), mlp=_mlp(),
                max_memory_fraction=memmodel.check_fraction(max_memory_fraction))
    if calibration is not None:
        g = calibrated.resolve_targets(calibration, [gpu], hardware.database())[0]
    else:
        g = hardware.get(gpu)
    b = graph.check_batch(batch_size)
    res = sweep(graph, [g.id], [b], dtype=dtype, tf32_matmul=tf32_matmul, tf32_conv=tf32_conv,
                calibration=calibration, max_memory_fraction=max_memory_fraction)
    code = dtypes.parse(dtype)
    ops = graph.ops.with_dtype(code) if code is not None else graph.ops
    per_op = np.zeros(len(ops))
    basis = None
    if calibration is not None:
        params = model_params(tf32_matmul, tf32_conv)
        per_op, basis = calibrated.evaluate_ops(calibration, ops, b, g.features, params,
                                                _mlp(), predicted_basis(ops, g.features, params, b),
                                                gpu_id=g.id)
    else:
        evaluate_ops(ops.family, ops.dtype, ops.kernels, ops.dbase, ops.dslope, np.int64(b),
                     g.features, model_params(tf32_matmul, tf32_conv), _mlp(),
                     *_NO_CALIBRATION, per_op)
        params = model_params(tf32_matmul, tf32_conv)
        basis = predicted_basis(ops, g.features, params, b)
        basis[_element_bound(ops, b, g.features, per_op, params)] = L.BASIS_ANALYTICAL
    fwd, bwd, opt = (float(x) for x in res.phase_ms[0, 0])
    return Prediction(model=graph.name, gpu=g.id, batch_size=b, forward_ms=fwd,
                      backward_ms=bwd, optimizer_ms=opt, graph=graph, op_table=ops,
                      op_us=per_op, unsupported=dict(graph.unsupported), op_basis=basis,
                      overhead_ms=float(res.overhead_ms[0, 0]),
                      memory_gb=None if res.memory_bytes is None else float(res.memory_gb[0, 0]),
                      memory_capacity_gb=g.memory_gb, max_memory_fraction=max_memory_fraction,
                      standing=res.standing[0], error_p90_pct=res.error_p90_pct[0])
