"""How much work an OpTable row does: FLOPs, bytes and thread blocks, from its
dims. Pure numba functions over scalars and arrays; the only place where the
per-family formulas live (the registry only extracts dims)."""

from __future__ import annotations

import numpy as np
from numba import njit

from predictor.kernels import layout as L

# Output tile of the GEMM kernels assumed for wave counting (cuBLAS/cuDNN pick
# 128x64..256x128; 128x128 is the middle of that range).
TILE_M = 128
TILE_N = 128
# PyTorch's vectorised elementwise kernel: 128 threads x 4 elements per thread.
EW_THREADS = 128
EW_ELEMS_PER_THREAD = 4
# FlashAttention processes 128 query rows per thread block.
ATTN_TILE = 128


@njit(cache=True)
def rnn_gates(d):
    """Gates of a recurrent row (dims[4]): 4 for an LSTM, 3 for a GRU, 1 for a
    plain RNN; 0, a row of a graph saved before the column, reads as 4."""
    return d[4] if d[4] > 0 else 4


@njit(cache=True)
def dims_at(dbase, dslope, row, batch, out):
    """Dims of row `row` at batch size `batch` (dims are affine in the batch)."""
    for j in range(dbase.shape[1]):
        out[j] = dbase[row, j] + dslope[row, j] * batch


@njit(cache=True)
def _cdiv(a, b):
    return (a + b - 1) // b


@njit(cache=True)
def gemm_shape(family, d):
    """(batch, M, N, K) of the GEMM a matmul or convolution row runs as."""
    if family == L.MATMUL:
        return d[0], d[1], d[2], d[3]
    # conv dims: n c h w k r s p q groups stride
    n, c, h, w, k, r, s, p, q, g = d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9]
    g = max(g, 1)
    if family == L.CONV:  # implicit GEMM: (N*P*Q) x K, reduction C/g*R*S
        return g, n * p * q, k // g, (c // g) * r * s
    if family == L.CONV_DGRAD:  # (N*H*W) x C, reduction K/g*R*S
        return g, n * h * w, c // g, (k // g) * r * s
    # CONV_WGRAD: K x (C/g*R*S), reduction N*P*Q
    return g, k // g, (c // g) * r * s, n * p * q


@njit(cache=True)
def is_conv(family):
    return family == L.CONV or family == L.CONV_DGRAD or family == L.CONV_WGRAD


@njit(cache=True)
def fewer_multiplies_possible(family, d):
    """Whether a convolution row may run one of cuDNN's algorithms that do
    fewer multiplies than the direct formula counts, so that its time can
    beat its direct FLOPs at the peak rate: Winograd needs a square 3x3 or
    5x5 filter, stride 1 and no dilation, FFT stride 1 and no dilation, and
    gains over a GEMM only for filters of 3x3 and up (cuDNN Developer Guide,
    the algorithms' support tables). A 1x1, strided, non-square or dilated
    convolution runs GEMM-like kernels only."""
    r, s = d[5], d[6]
    return is_conv(family) and r == s and r >= 3 and d[10] <= 1 \
        and d[L.CONV_DILATION] <= 1


@njit(cache=True)
def as_implicit_gemm(family, d):
    """Whether a convolution row is priced as the implicit GEMM cuDNN runs it
    as (`implicit_gemm_dims`) rather than by the convolution network: an
    ungrouped stride-1 convolution with a non-square filter (a 1-D
    convolution's k x 1, Inception's 1 x 7) or a dilated one. The
    convolution data holds 3x3, stride-1, undilated convolutions only, which
    cuDNN runs as Winograd, FFT or implicit GEMM, the fastest it finds; the
    network cannot tell a filter or a dilation from those (their inputs
    never varied), so it gives such a row a 3x3 convolution's price, reduced
    arithmetic included, where only the implicit GEMM can run. Square
    filters of other sizes and strides stay with the network, capped at the
    direct rate (`fewer_multiplies_possible`): priced as GEMMs, ResNet-50's
    1x1 ones moved its published fp32 figures 6-13 points slower (V100 SXM2
    16GB -5.7 -> -14.0 %, Quadro RTX 8000 +4.7 -> -8.5 %) and WaveGlow's a
    few points either way (benchmarks/README.md, WaveGlow). So do strided ones:
    the data gradient's GEMM (`gemm_shape`) would count a strided
    convolution's multiply-adds stride^2 times."""
    return is_conv(family) and d[9] <= 1 and d[10] <= 1 \
        and (d[5] != d[6] or d[L.CONV_DILATION] > 1)


# The pixel dim of a convolution's implicit GEMM is rounded up to this many
# pixels (`implicit_gemm_dims`): the alignment rule's largest step (8
# elements of a 16-bit dtype).
PIXEL_ALIGN = 8


@njit(cache=True)
def implicit_gemm_dims(family, d, out):
    """Fill `out` with the matmul dims of a convolution row's implicit GEMM
    (`gemm_shape`): the forward X[N*P*Q, C*R*S] @ W^T, the data gradient
    dY[N*H*W, K*R*S] @ W, the weight gradient dY^T @ X. The pixel dim, the
    one the batch multiplies (M of the forward and data gradient, the weight
    gradient's reduction), is rounded up to PIXEL_ALIGN: a convolution
    kernel's rows are its channels, loaded along the channels, and it walks
    the pixels with predicated loads, so no pixel count takes its fast
    kernels away (the alignment rule of a convolution is its channels',
    kernels.precision.aligned), where a GEMM of an odd M or reduction loses
    them. At most 7 pixels of work more."""
    for j in range(out.shape[0]):
        out[j] = 0
    bt, m, n, k = gemm_shape(family, d)
    if family == L.CONV_WGRAD:
        k = _cdiv(k, PIXEL_ALIGN) * PIXEL_ALIGN
    else:
        m = _cdiv(m, PIXEL_ALIGN) * PIXEL_ALIGN
    out[0], out[1], out[2], out[3] = bt, m, n, k
    if family == L.CONV:
        out[L.GEMM_LAYOUT] = L.GEMM_B_T
    elif family == L.CONV_WGRAD:
        out[L.GEMM_LAYOUT] = L.GEMM_A_T


@njit(cache=True)
def flops_and_elems(family, d):
    """(FLOPs, elements moved to/from DRAM) of one execution of a row."""
    if family == L.MATMUL or family == L.CONV or family == L.CONV_DGRAD or family == L.CONV_WGRAD:
        if family == L.MATMUL:
            bt, m, n, k = d[0], d[1], d[2], d[3]
            return 2.0 * bt * m * n * k, float(bt * m * k + bt * k * n + bt * m * n)
        # All three convolution passes do the forward's multiply-adds; the dgrad's
        # implicit GEMM shape would over-count strided convs by stride^2.
        nn_, c, h, w, kk, r, s, p, q, g = d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9]
        cg = c // max(g, 1)
        flops = 2.0 * nn_ * kk * p * q * cg * r * s
        elems = float(nn_ * c * h * w + kk * cg * r * s + nn_ * kk * p * q)
        return flops, elems
    if family == L.ATTENTION or family == L.ATTENTION_BWD:
        b, h, sq, sk, dd, dv, causal = d[0], d[1], d[2], d[3], d[4], d[5], d[6]
        flops = 2.0 * b * h * sq * sk * (dd + dv)
        if causal:
            flops *= 0.5
        elems = float(b * h * (sq * dd + sk * dd + sk * dv + sq * dv))
        if family == L.ATTENTION_BWD:  # recompute S, then dV, dP, dS, dQ, dK
            flops *= 2.5
            elems *= 2.0
        return flops, elems
    if family == L.LSTM or family == L.LSTM_BWD:
        t, b, i, h = d[0], d[1], d[2], d[3]
        g = rnn_gates(d) * h
        flops = 2.0 * t * b * g * (i + h) + 10.0 * t * b * g
        elems = float(t * b * (i + h) + g * (i + h) + 2 * t * b * g)
        if family == L.LSTM_BWD:
            flops *= 2.0
            elems *= 2.0
        return flops, elems
    # memory-bound layout: read, written, flops, inner, outer
    return float(d[L.MEM_FLOPS]), float(d[L.MEM_READ] + d[L.MEM_WRITTEN])


# PyTorch's softmax over the last dim (aten/src/ATen/native/cuda/SoftMax.cu,
# forward and backward alike): rows of up to SOFTMAX_WARP_ROW elements
# (4 KB of fp32) go to the persistent warp kernel, one row per warp (two when
# the row, rounded up to a power of two, is at most 128), a warp narrowed to
# the row's power of two, 128 threads a block; longer rows get one block
# each, of the power of two at or above half of min(row / 4, 1,024) (float4
# loads; so 32 to 512 threads). It matches the launch (grid and block dims)
# of every softmax kernel in the training files. Feeding the networks these
# waves instead of one 128-thread block per row moved held-out softmax 20.9
# -> 18.9 % (the shipped recipe; `benchmarks.feature_selection --group
# softmax --ensemble 4`).
SOFTMAX_WARP_ROW = 1024
SOFTMAX_WARP_BLOCK = 128
SOFTMAX_ILP = 4
MAX_BLOCK_THREADS = 1024


@njit(cache=True)
def _ceil_pow2(x):
    """The smallest power of two at or above `x` (1 for x <= 1)."""
    p = 1
    while p < x:
        p *= 2
    return p


@njit(cache=True)
def softmax_launch(inner, outer):
    """(thread blocks, blocks resident per SM at most, threads per block) of
    a softmax over rows of `inner` elements, `outer` of them."""
    inner = max(inner, 1)
    outer = max(outer, 1)
    if inner <= SOFTMAX_WARP_ROW:
        p2 = _ceil_pow2(inner)
        rows_per_warp = 2 if p2 <= 128 else 1
        rows_per_block = (SOFTMAX_WARP_BLOCK // min(p2, 32)) * rows_per_warp
        return _cdiv(outer, rows_per_block), 32, SOFTMAX_WARP_BLOCK
    threads = _ceil_pow2(min(inner // SOFTMAX_ILP, MAX_BLOCK_THREADS) // 2)
    return outer, 32, max(threads, 32)


@njit(cache=True)
def thread_blocks(family, d):
    """(thread blocks, blocks resident per SM at most, threads per block)."""
    if family == L.MATMUL or family == L.CONV or family == L.CONV_DGRAD or family == L.CONV_WGRAD:
        bt, m, n, k = gemm_shape(family, d)
        return max(bt * _cdiv(m, TILE_M) * _cdiv(n, TILE_N), 1), 1, 256
    if family == L.ATTENTION or family == L.ATTENTION_BWD:
        return max(d[0] * d[1] * _cdiv(d[2], ATTN_TILE), 1), 1, 128
    if family == L.SOFTMAX or family == L.SOFTMAX_BWD:
        return softmax_launch(d[L.MEM_INNER], d[L.MEM_OUTER])
    if family == L.LAYER_NORM or family == L.LAYER_NORM_BWD:
        return max(d[L.MEM_OUTER], 1), 8, 128  # one block of 128 threads per row
    written = max(d[L.MEM_WRITTEN], d[L.MEM_READ] // 2, 1)
    return max(_cdiv(written, EW_THREADS * EW_ELEMS_PER_THREAD), 1), 16, EW_THREADS


@njit(cache=True)
def row_elem_bytes(dtype_code):
    """Bytes per element of a dtype code."""
    if dtype_code == L.F16 or dtype_code == L.BF16:
        return 2.0
    if dtype_code == L.F64 or dtype_code == L.I64:
        return 8.0
    if dtype_code == L.I8 or dtype_code == L.BOOL or dtype_code == L.F8:
        return 1.0
    return 4.0


def work_table(family: np.ndarray, dbase: np.ndarray, dslope: np.ndarray, batch: int):
    """FLOPs and elements moved for every row at one batch size (Python helper
    for summaries; the engine calls the per-row functions inside its kernels)."""
    return _work_table(family, dbase, dslope, np.int64(batch))


@njit(cache=True)
def _work_table(family, dbase, dslope, batch):
    n = family.shape[0]
    flops = np.empty(n)
    elems = np.empty(n)
    d = np.empty(dbase.shape[1], dtype=np.int64)
    for i in range(n):
        dims_at(dbase, dslope, i, batch, d)
        flops[i], elems[i] = flops_and_elems(family[i], d)
    return flops, elems


@njit(cache=True)
def largest_count(family, dbase, dslope, batch):
    """The largest count any row reaches at `batch` (a float): a dim, or the
    elements it moves (which bound its thread blocks and the products of dims
    the other kernels form in int64). Computed in float64, so it cannot wrap
    around where the int64 counts would (predictor.limits.MAX_COUNT)."""
    d = np.empty(dbase.shape[1], dtype=np.float64)
    top = 0.0
    for i in range(family.shape[0]):
        for j in range(dbase.shape[1]):
            d[j] = float(dbase[i, j]) + float(dslope[i, j]) * batch
            top = max(top, abs(d[j]))
        _, elems = flops_and_elems(family[i], d)
        top = max(top, abs(elems))
    return top
