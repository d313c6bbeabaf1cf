"""The per-op time the engine uses: a learned efficiency applied to the ideal
roofline time where a model for the op's group exists, else the analytical
roofline with wave quantization.

    t = ideal / eta(features) + kernels * launch            (learned)
    t = analytical roofline (predictor.kernels.roofline)     (otherwise)

(eta with the chip's correction and, for GEMMs and convolutions on another
board of a training chip, that board's sustained clock: kernels.clocks.)

A recurrent layer is the sum of the kernels cuDNN runs for it
(kernels.recurrent), each priced as above.

eta is bounded in (0, eta_max], so a GPU with more bandwidth or FLOP/s can
never be predicted absurdly: the ideal time shrinks and eta stays bounded.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from predictor.kernels import layout as L
from predictor.kernels.features import (G_BMM, G_MATMUL, N_FEATURES, group_features, group_of,
                                        learned_time_us, serving_group)
from predictor.kernels.mlp import chip_efficiency, floor_us, has_group
from predictor.kernels import precision
from predictor.kernels.clocks import power_limit_share, with_board_clock
from predictor.kernels.depthwise import depthwise_us, is_depthwise
from predictor.kernels.recurrent import MAX_KERNELS, is_recurrent, lstm_kernels
from predictor.kernels.work import as_implicit_gemm, implicit_gemm_dims
from predictor.kernels.roofline import (P_LAUNCH_US, P_TF32_CONV, P_TF32_MATMUL,
                                       generic_kernel_us, per_channel_batch_norm_us,
                                       runs_generic_kernel)
from predictor.kernels.roofline import op_time_us as analytical_time_us

MAX_HIDDEN = 128


@njit(cache=True)
def is_learned(family, mlp):
    """Whether a learned model serves rows of `family` (a batched GEMM: the
    batched-GEMM network, or the matmul one where the weights have none; a
    recurrent layer: the matmul network, which prices its GEMMs)."""
    if is_recurrent(family):
        return has_group(mlp, G_MATMUL)
    return has_group(mlp, group_of(family))


@njit(cache=True)
def learned_rows(family, mlp):
    """Which rows a learned model serves (vector form of is_learned)."""
    out = np.zeros(family.shape[0], dtype=np.bool_)
    for i in range(family.shape[0]):
        out[i] = is_learned(family[i], mlp)
    return out


@njit(cache=True)
def recurrent_params(dtype_code, params):
    """The parameters cuDNN's GEMMs are priced under (a recurrent layer's, a
    convolution's implicit GEMM): cuDNN runs fp32 GEMMs in TF32 when cuDNN
    may (torch.backends.cudnn.allow_tf32, P_TF32_CONV), whatever the matmul
    flag says."""
    if dtype_code != L.F32 or params[P_TF32_MATMUL] == params[P_TF32_CONV]:
        return params
    p = params.copy()
    p[P_TF32_MATMUL] = params[P_TF32_CONV]
    return p


@njit(cache=True)
def recurrent_us(family, dtype_code, d, gpu, params, mlp):
    """Time of one recurrent row (us): its kernels (kernels.recurrent), each
    priced as a row of its own family with one launch, one after another."""
    fam = np.empty(MAX_KERNELS, dtype=np.int64)
    dims = np.zeros((MAX_KERNELS, d.shape[0]), dtype=np.int64)
    counts = np.empty(MAX_KERNELS, dtype=np.int64)
    n = lstm_kernels(family, d, fam, dims, counts)
    p = recurrent_params(dtype_code, params)
    t = 0.0
    for j in range(n):
        t += counts[j] * _row_us(fam[j], dtype_code, 1, dims[j], gpu, p, mlp)
    return max(t, params[P_LAUNCH_US])


@njit(cache=True)
def learned_row_us(group, family, dtype_code, d, gpu, params, mlp, isolated):
    """A row's time at the efficiency of `group`'s network (no launch cost;
    `isolated`: with the network's fixed per-measurement floor, as a per-op
    benchmark measures it).

    A batched GEMM is never faster than one of its GEMMs alone as the matmul
    network prices it: two networks meet at batch 1 -> 2, and without the
    floor twice the work could come out faster (a 28 x 308 x 419 GEMM on an
    H100: 42.5 us alone, 37.5 us for a batch of two)."""
    x = np.empty(N_FEATURES)
    hidden = np.empty(MAX_HIDDEN)
    ideal = group_features(group, family, dtype_code, d, gpu, params, mlp, x)
    eta = chip_efficiency(mlp, group, x, hidden, gpu[L.G_CHIP])
    eta = with_board_clock(mlp, group, eta, family, dtype_code, d, gpu, params)
    t = learned_time_us(family, dtype_code, d, gpu, params, ideal, eta)
    if isolated:
        t += floor_us(mlp, group)
    if group == G_BMM and has_group(mlp, G_MATMUL):
        one = d.copy()
        one[0] = 1
        ideal = group_features(G_MATMUL, family, dtype_code, one, gpu, params, mlp, x)
        eta = chip_efficiency(mlp, G_MATMUL, x, hidden, gpu[L.G_CHIP])
        eta = with_board_clock(mlp, G_MATMUL, eta, family, dtype_code, one, gpu, params)
        alone = learned_time_us(family, dtype_code, one, gpu, params, ideal, eta)
        t = max(t, alone + floor_us(mlp, G_MATMUL) if isolated else alone)
    return t


@njit(cache=True)
def op_time_us(family, dtype_code, kernels, d, gpu, params, mlp):
    """Time of one execution of a row on one GPU, microseconds. Rows in half
    precision or TF32 are priced as predictor.kernels.precision says; a
    convolution's layout transpose costs nothing where the convolution is not
    on tensor cores; a training batch norm in NCHW is never faster than its
    per-channel passes (roofline.per_channel_batch_norm_us, on the row's own
    dims and dtype)."""
    t = _op_time_us(family, dtype_code, kernels, d, gpu, params, mlp)
    if family == L.BATCH_NORM or family == L.BATCH_NORM_BWD:
        launches = kernels * params[P_LAUNCH_US]
        t = per_channel_batch_norm_us(family, dtype_code, d, gpu, t - launches) + launches
    elif runs_generic_kernel(family) and t > 0.0:
        launches = kernels * params[P_LAUNCH_US]
        t = generic_kernel_us(family, d, gpu, t - launches,
                              power_limit_share(mlp, gpu)) + launches
    return t


@njit(cache=True)
def _op_time_us(family, dtype_code, kernels, d, gpu, params, mlp):
    if is_recurrent(family):
        return recurrent_us(family, dtype_code, d, gpu, params, mlp)
    if is_depthwise(family, d):  # PyTorch's direct kernels, not a GEMM (kernels.depthwise)
        return depthwise_us(family, dtype_code, kernels, d, gpu, params,
                            power_limit_share(mlp, gpu))
    if implicit_gemm_priced(family, dtype_code, d, gpu, params):
        return implicit_gemm_us(family, dtype_code, kernels, d, gpu, params, mlp)
    return _row_us(family, dtype_code, kernels, d, gpu, params, mlp)


@njit(cache=True)
def implicit_gemm_priced(family, dtype_code, d, gpu, params):
    """Whether a row is priced as its implicit GEMM (`work.as_implicit_gemm`)
    on this GPU: where the convolution network would price it. A
    convolution on tensor cores is priced as its GEMM by the tensor-core
    model already (kernels.precision)."""
    return as_implicit_gemm(family, d) \
        and precision.mode_of(family, dtype_code, gpu, params) != precision.TENSOR_CORE


@njit(cache=True)
def implicit_gemm_us(family, dtype_code, kernels, d, gpu, params, mlp):
    """A convolution row priced as its implicit GEMM (`work.as_implicit_gemm`):
    a matmul row of `work.implicit_gemm_dims`, in TF32 where cuDNN may use it
    (`recurrent_params`) unless its FMA kernels are faster
    (`cudnn_searches_ffma`), with the convolution's launches. Its layout
    transposes, where it has any, are rows of their own."""
    g, p = implicit_gemm_row(family, dtype_code, d, params)
    t = _row_us(L.MATMUL, dtype_code, kernels, g, gpu, p, mlp)
    if cudnn_searches_ffma(dtype_code, p):
        t = min(t, _row_us(L.MATMUL, dtype_code, kernels, g, gpu, precision.without_tf32(p), mlp))
    return t


@njit(cache=True)
def implicit_gemm_row(family, dtype_code, d, params):
    """(matmul dims, parameters) a convolution row's implicit GEMM is priced
    with: `work.implicit_gemm_dims`, in TF32 where cuDNN may use it
    (`recurrent_params`)."""
    g = np.zeros_like(d)
    implicit_gemm_dims(family, d, g)
    return g, recurrent_params(dtype_code, params)


@njit(cache=True)
def cudnn_searches_ffma(dtype_code, params):
    """Whether a convolution's implicit GEMM in fp32 with TF32 allowed also
    has cuDNN's FMA kernels to choose from: its algorithm search times the
    engines it has for the convolution and keeps the fastest, tensor-core or
    not (cuBLAS picks TF32 kernels by the math mode, `precision.has_tf32`).
    So it costs the lesser of the two prices, never more when a dim's
    alignment (here one that grows with the batch) takes the tensor-core
    kernels away."""
    return dtype_code == L.F32 and params[P_TF32_MATMUL] > 0.5


@njit(cache=True)
def _row_us(family, dtype_code, kernels, d, gpu, params, mlp):
    if not precision.layout_transpose_runs(family, dtype_code, d, gpu, params):
        return 0.0
    mode = precision.mode_of(family, dtype_code, gpu, params)
    if mode == precision.TENSOR_CORE:
        t = precision.tensor_core_us(family, dtype_code, kernels, d, gpu, params, mlp)
        if precision.cuda_cores_compete(family, dtype_code, d):
            t = min(t, _cuda_core_us(family, dtype_code, kernels, d, gpu,
                                     precision.without_tf32(params), mlp, False))
        return t
    if mode == precision.AS_FP32:
        d32 = np.empty_like(d)
        precision.fp32_dims(family, dtype_code, d, d32)
        d, dtype_code = d32, L.F32
    return _cuda_core_us(family, dtype_code, kernels, d, gpu, params, mlp, False)


@njit(cache=True)
def on_cuda_cores(family, dtype_code, kernels, d, gpu, params, mlp):
    """Whether a tensor-core row is priced as its CUDA-core kernels: an
    unaligned TF32 GEMM whose fp32 price is the lower
    (`precision.cuda_cores_compete`), or a convolution's TF32 implicit GEMM
    whose FMA kernels are faster (`cudnn_searches_ffma`)."""
    if implicit_gemm_priced(family, dtype_code, d, gpu, params):
        g, p = implicit_gemm_row(family, dtype_code, d, params)
        if not cudnn_searches_ffma(dtype_code, p):
            return False
        return _row_us(L.MATMUL, dtype_code, kernels, g, gpu, precision.without_tf32(p), mlp) \
            < _row_us(L.MATMUL, dtype_code, kernels, g, gpu, p, mlp)
    if precision.mode_of(family, dtype_code, gpu, params) != precision.TENSOR_CORE \
            or not precision.cuda_cores_compete(family, dtype_code, d):
        return False
    tc = precision.tensor_core_us(family, dtype_code, kernels, d, gpu, params, mlp)
    return _cuda_core_us(family, dtype_code, kernels, d, gpu, precision.without_tf32(params),
                         mlp, False) < tc


@njit(cache=True)
def _cuda_core_us(family, dtype_code, kernels, d, gpu, params, mlp, isolated):
    """A row on CUDA cores: its group's learned model, else the analytical one
    (`isolated`: as a per-op benchmark measures it, with the learned model's
    per-measurement floor; its callers pass one launch)."""
    group = serving_group(family, d, mlp)
    if not has_group(mlp, group):
        return analytical_time_us(family, dtype_code, kernels, d, gpu, params)
    if isolated:
        return learned_row_us(group, family, dtype_code, d, gpu, params, mlp, True)
    return learned_row_us(group, family, dtype_code, d, gpu, params, mlp, False) \
        + kernels * params[P_LAUNCH_US]


@njit(cache=True)
def isolated_time_us(family, dtype_code, d, gpu, params, mlp):
    """Time of one op measured on its own (as in a per-op benchmark): the
    learned model plus the group's fixed per-measurement floor; the analytical
    model with one launch otherwise (tensor-core and half-precision rows as
    in op_time_us)."""
    t = _isolated_time_us(family, dtype_code, d, gpu, params, mlp)
    if family == L.BATCH_NORM or family == L.BATCH_NORM_BWD:
        t = per_channel_batch_norm_us(family, dtype_code, d, gpu, t - params[P_LAUNCH_US]) \
            + params[P_LAUNCH_US]
    elif runs_generic_kernel(family) and t > 0.0:
        t = generic_kernel_us(family, d, gpu, t - params[P_LAUNCH_US],
                              power_limit_share(mlp, gpu)) + params[P_LAUNCH_US]
    return t


@njit(cache=True)
def _isolated_time_us(family, dtype_code, d, gpu, params, mlp):
    if is_recurrent(family):  # one cuDNN call: its kernels as in a step
        return recurrent_us(family, dtype_code, d, gpu, params, mlp)
    if is_depthwise(family, d):
        return depthwise_us(family, dtype_code, 1, d, gpu, params, power_limit_share(mlp, gpu))
    if implicit_gemm_priced(family, dtype_code, d, gpu, params):  # its implicit GEMM alone
        g, p = implicit_gemm_row(family, dtype_code, d, params)
        t = _isolated_row_us(L.MATMUL, dtype_code, g, gpu, p, mlp)
        if cudnn_searches_ffma(dtype_code, p):
            t = min(t, _isolated_row_us(L.MATMUL, dtype_code, g, gpu, precision.without_tf32(p),
                                        mlp))
        return t
    return _isolated_row_us(family, dtype_code, d, gpu, params, mlp)


@njit(cache=True)
def _isolated_row_us(family, dtype_code, d, gpu, params, mlp):
    if not precision.layout_transpose_runs(family, dtype_code, d, gpu, params):
        return 0.0
    mode = precision.mode_of(family, dtype_code, gpu, params)
    if mode == precision.TENSOR_CORE:
        t = precision.tensor_core_us(family, dtype_code, 1, d, gpu, params, mlp)
        if precision.cuda_cores_compete(family, dtype_code, d):
            t = min(t, _cuda_core_us(family, dtype_code, 1, d, gpu,
                                     precision.without_tf32(params), mlp, True))
        return t
    if mode == precision.AS_FP32:
        d32 = np.empty_like(d)
        precision.fp32_dims(family, dtype_code, d, d32)
        d, dtype_code = d32, L.F32
    return _cuda_core_us(family, dtype_code, 1, d, gpu, params, mlp, True)


@njit(cache=True)
def isolated_times_us(family, dtype, dims, gpus, gpu_index, params, mlp):
    """Vectorised isolated_time_us over rows (each with its own GPU)."""
    out = np.empty(family.shape[0])
    for i in range(family.shape[0]):
        out[i] = isolated_time_us(family[i], dtype[i], dims[i], gpus[gpu_index[i]], params, mlp)
    return out


@njit(cache=True)
def step_times_us(family, dtype, kernels, dims, gpus, gpu_index, params, mlp):
    """Vectorised op_time_us over rows (each with its own GPU): each row's
    time inside a step, as the engine sums it (its kernels' launches, no
    per-measurement floor)."""
    out = np.empty(family.shape[0])
    for i in range(family.shape[0]):
        out[i] = op_time_us(family[i], dtype[i], kernels[i], dims[i], gpus[gpu_index[i]],
                            params, mlp)
    return out
