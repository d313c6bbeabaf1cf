"""The plain-Python reference of the engine: the test oracle for the kernels.

The same per-op math as ``predictor.kernels`` (``work.py``, ``roofline.py``,
the learned models' ``features.py``, ``mlp.py`` and ``optime.py``, and the
calibration scaling of ``grid.py``), written again in plain Python, one
op and one configuration at a time, the way Habitat evaluates a model: a loop
over GPUs x batch sizes x ops, then the host-overhead rule of
``predictor.overhead``. It shares no code with them beyond constants (the
integer codes of ``layout``, parameter and weight-array indices, tile sizes,
the host-cost constants), so a
mistake in one shows up as a disagreement with the other (the tests hold them
to 1e-6 relative). It is also the baseline the sweep benchmark compares against.

Each function mirrors the kernel function of the same name. Integers stay
Python ints where the kernel uses int64 and floats stay floats where it uses
float64, so the results agree to rounding as long as no int64 overflows.
When a kernel function changes, change the function of the same name here
(``analytical_time_us`` mirrors ``roofline.op_time_us``).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

from predictor.kernels import depthwise as DW
from predictor.kernels import features
from predictor.kernels import layout as L
from predictor.kernels import mlp as M
from predictor.kernels import precision as P
from predictor.kernels import roofline as R
from predictor.kernels import tiles as T
from predictor.kernels import work as W
from predictor.overhead import HOST_DISPATCH_US, HOST_LAUNCH_US

_FLOATING = (L.F32, L.F16, L.BF16, L.F64)

# ---- kernels/work.py -------------------------------------------------------------


def dims_at(dbase, dslope, row: int, batch: int) -> list[int]:
    return [int(b) + int(s) * int(batch) for b, s in zip(dbase[row], dslope[row])]


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _is_gemm(family: int) -> bool:
    return family in (L.MATMUL, L.CONV, L.CONV_DGRAD, L.CONV_WGRAD)


def gemm_shape(family: int, d: Sequence[int]) -> tuple[int, int, int, int]:
    if family == L.MATMUL:
        return d[0], d[1], d[2], d[3]
    n, c, h, w, k, r, s, p, q, g = d[:10]
    g = max(g, 1)
    if family == L.CONV:
        return g, n * p * q, k // g, (c // g) * r * s
    if family == L.CONV_DGRAD:
        return g, n * h * w, c // g, (k // g) * r * s
    return g, k // g, (c // g) * r * s, n * p * q


def _is_conv(family: int) -> bool:
    return family in (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD)


def fewer_multiplies_possible(family: int, d: Sequence[int]) -> bool:
    """Winograd or FFT may run: a square filter of 3x3 or more, stride 1, undilated."""
    return _is_conv(family) and d[5] == d[6] and d[5] >= 3 and d[10] <= 1 \
        and d[L.CONV_DILATION] <= 1


def as_implicit_gemm(family: int, d: Sequence[int]) -> bool:
    """An ungrouped stride-1 convolution with a non-square or dilated filter."""
    return _is_conv(family) and d[9] <= 1 and d[10] <= 1 \
        and (d[5] != d[6] or d[L.CONV_DILATION] > 1)


def implicit_gemm_dims(family: int, d: Sequence[int]) -> list[int]:
    """The pixel dim rounded up to work.PIXEL_ALIGN."""
    out = [0] * len(d)
    bt, m, n, k = gemm_shape(family, d)
    if family == L.CONV_WGRAD:
        k = _cdiv(k, W.PIXEL_ALIGN) * W.PIXEL_ALIGN
    else:
        m = _cdiv(m, W.PIXEL_ALIGN) * W.PIXEL_ALIGN
    out[0], out[1], out[2], out[3] = bt, m, n, k
    out[L.GEMM_LAYOUT] = {L.CONV: L.GEMM_B_T, L.CONV_WGRAD: L.GEMM_A_T}.get(family, 0)
    return out


def flops_and_elems(family: int, d: Sequence[int]) -> tuple[float, float]:
    if family == L.MATMUL:
        bt, m, n, k = d[:4]
        return 2.0 * bt * m * n * k, float(bt * m * k + bt * k * n + bt * m * n)
    if family in (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD):
        n, c, h, w, k, r, s, p, q, g = d[:10]
        cg = c // max(g, 1)
        return 2.0 * n * k * p * q * cg * r * s, float(n * c * h * w + k * cg * r * s + n * k * p * q)
    if family in (L.ATTENTION, L.ATTENTION_BWD):
        b, h, sq, sk, dd, dv, causal = d[:7]
        flops = 2.0 * b * h * sq * sk * (dd + dv)
        if causal:
            flops *= 0.5
        elems = float(b * h * (sq * dd + sk * dd + sk * dv + sq * dv))
        if family == L.ATTENTION_BWD:
            flops *= 2.5
            elems *= 2.0
        return flops, elems
    if family in (L.LSTM, L.LSTM_BWD):
        t, b, i, h = d[:4]
        g = (d[4] if d[4] > 0 else 4) * h  # gates x H (work.rnn_gates)
        flops = 2.0 * t * b * g * (i + h) + 10.0 * t * b * g
        elems = float(t * b * (i + h) + g * (i + h) + 2 * t * b * g)
        if family == L.LSTM_BWD:
            flops *= 2.0
            elems *= 2.0
        return flops, elems
    return float(d[L.MEM_FLOPS]), float(d[L.MEM_READ] + d[L.MEM_WRITTEN])


def thread_blocks(family: int, d: Sequence[int]) -> tuple[int, int, int]:
    if _is_gemm(family):
        bt, m, n, _ = gemm_shape(family, d)
        return max(bt * _cdiv(m, W.TILE_M) * _cdiv(n, W.TILE_N), 1), 1, 256
    if family in (L.ATTENTION, L.ATTENTION_BWD):
        return max(d[0] * d[1] * _cdiv(d[2], W.ATTN_TILE), 1), 1, 128
    if family in (L.SOFTMAX, L.SOFTMAX_BWD):
        inner, outer = max(int(d[L.MEM_INNER]), 1), max(int(d[L.MEM_OUTER]), 1)
        if inner <= W.SOFTMAX_WARP_ROW:
            p2 = 1 << (inner - 1).bit_length()
            rows_per_block = (W.SOFTMAX_WARP_BLOCK // min(p2, 32)) * (2 if p2 <= 128 else 1)
            return _cdiv(outer, rows_per_block), 32, W.SOFTMAX_WARP_BLOCK
        cap = min(inner // W.SOFTMAX_ILP, W.MAX_BLOCK_THREADS) // 2
        threads = 1 << (cap - 1).bit_length() if cap > 1 else 1
        return outer, 32, max(threads, 32)
    if family in (L.LAYER_NORM, L.LAYER_NORM_BWD):
        return max(d[L.MEM_OUTER], 1), 8, 128
    written = max(d[L.MEM_WRITTEN], d[L.MEM_READ] // 2, 1)
    per_block = W.EW_THREADS * W.EW_ELEMS_PER_THREAD
    return max(_cdiv(written, per_block), 1), 16, W.EW_THREADS


def row_elem_bytes(dtype_code: int) -> float:
    return float(L.DTYPE_BYTES[dtype_code])


# ---- kernels/roofline.py ---------------------------------------------------------

_TENSOR_CORE_FAMILIES = (L.MATMUL, L.CONV, L.CONV_DGRAD, L.CONV_WGRAD, L.ATTENTION,
                         L.ATTENTION_BWD, L.LSTM, L.LSTM_BWD)
_TF32_CONV_FAMILIES = (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD, L.LSTM, L.LSTM_BWD)


def _column_or(gpu: Sequence[float], col: int, default: float) -> float:
    f = float(gpu[col]) if len(gpu) > col else 0.0
    return f if f > 0.0 else default


def peak_flops(gpu: Sequence[float], family: int, dtype_code: int, params) -> float:
    fp32 = gpu[L.G_FP32_TFLOPS]
    if family not in _TENSOR_CORE_FAMILIES:
        return (gpu[L.G_FP64_TFLOPS] if dtype_code == L.F64 else fp32) * 1e12
    if dtype_code == L.F16:
        return max(gpu[L.G_FP16_TFLOPS], fp32) * 1e12
    if dtype_code == L.BF16:
        return max(gpu[L.G_BF16_TFLOPS], fp32) * 1e12
    if dtype_code == L.F8:
        return gpu[L.G_FP8_TFLOPS] * 1e12
    if dtype_code == L.F64:
        return gpu[L.G_FP64_TFLOPS] * 1e12
    switch = R.P_TF32_CONV if family in _TF32_CONV_FAMILIES else R.P_TF32_MATMUL
    if params[switch] > 0.5:
        return max(gpu[L.G_TF32_TFLOPS], fp32) * 1e12
    return fp32 * 1e12 * _column_or(gpu, L.G_FFMA_ISSUE, 1.0)


def wave_utilisation(blocks: int, slots: int) -> float:
    if slots <= 0 or blocks <= 0:
        return 1.0
    waves = _cdiv(blocks, slots)
    return blocks / (waves * slots)


def block_slots(gpu: Sequence[float], per_sm_cap: int, threads: int) -> int:
    by_threads = math.floor(gpu[L.G_MAX_THREADS_SM] / threads)
    per_sm = min(per_sm_cap, by_threads, gpu[L.G_MAX_BLOCKS_SM])
    return max(int(per_sm), 1) * int(gpu[L.G_SMS])


def analytical_time_us(family: int, dtype_code: int, kernels: int, d: Sequence[int],
                       gpu: Sequence[float], params, mlp=()) -> float:
    """roofline.op_time_us: roofline with wave quantization (us)."""
    flops, elems = flops_and_elems(family, d)
    nbytes = elems * row_elem_bytes(dtype_code)
    blocks, per_sm, threads = thread_blocks(family, d)
    slots = block_slots(gpu, per_sm, threads)
    if _is_gemm(family) and blocks < slots:  # split-K
        k = gemm_shape(family, d)[3]
        blocks *= max(min(slots // blocks, k // R.SPLIT_K_MIN), 1)
    util = wave_utilisation(blocks, slots)
    util_m = min(1.0, blocks / max(params[R.P_MEM_SATURATION] * slots, 1.0))
    t_c = 0.0
    if flops > 0.0:
        t_c = flops / (peak_flops(gpu, family, dtype_code, params)
                       * params[R.P_ETA_C + family] * util) * 1e6
    t_m = nbytes / (gpu[L.G_MEM_BW_GBS] * 1e9 * params[R.P_ETA_M + family] * util_m) * 1e6
    return max(t_c, t_m) + kernels * params[R.P_LAUNCH_US]


# ---- kernels/recurrent.py ----------------------------------------------------------

def lstm_kernels(family: int, d: Sequence[int]) -> list[tuple[int, list[int], int]]:
    """(family, dims, count) of each kernel cuDNN runs for one recurrent row
    [T, B, I, H, gates]."""
    t, b, i, h = d[0], d[1], d[2], d[3]
    if t <= 0 or b <= 0 or h <= 0:
        return []
    g = (d[4] if d[4] > 0 else 4) * h

    def gemm(m, n, k, layout, count):
        dims = [0] * len(d)
        dims[:4] = [1, m, n, k]
        dims[L.GEMM_LAYOUT] = layout
        return L.MATMUL, dims, count

    dims = [0] * len(d)  # the step's pointwise kernel: reads 2 x [b, g], writes one
    dims[L.MEM_READ], dims[L.MEM_WRITTEN], dims[L.MEM_FLOPS] = 2 * b * g, b * g, b * g
    dims[L.MEM_INNER], dims[L.MEM_OUTER] = g, b
    gates = (L.ELEMENTWISE, dims, t)
    if family == L.LSTM:
        out = [gemm(t * b, g, i, L.GEMM_B_T, 1)] if i > 0 else []
        return out + [gemm(b, g, h, L.GEMM_B_T, t), gates]
    transpose = [0] * len(d)  # W_hh^T, copied once per call
    transpose[L.MEM_READ] = transpose[L.MEM_WRITTEN] = g * h
    transpose[L.MEM_INNER], transpose[L.MEM_OUTER] = h, g
    out = [gates, (L.COPY, transpose, 1), gemm(b, h, g, L.GEMM_B_T, t)]
    if i > 0:
        out += [gemm(t * b, i, g, 0, 1), gemm(g, i, t * b, L.GEMM_A_T, 1)]
    return out + [gemm(g, h, t * b, L.GEMM_A_T, 1)]


# ---- kernels/features.py -----------------------------------------------------------

def group_of(family: int) -> int:
    if family == L.MATMUL:
        return features.G_MATMUL
    if family in (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD):
        return features.G_CONV
    if family in (L.SOFTMAX, L.SOFTMAX_BWD):
        return features.G_SOFTMAX
    if family in (L.LAYER_NORM, L.LAYER_NORM_BWD):
        return features.G_LAYER_NORM
    if family in (L.ELEMENTWISE, L.DROPOUT, L.COPY, L.FILL, L.LOSS, L.OPTIMIZER,
                  L.UNSUPPORTED):
        return features.G_ELEMENTWISE
    return features.G_NONE


def row_group(family: int, d) -> int:
    if family == L.MATMUL and d[0] > 1:
        return features.G_BMM
    return group_of(family)


def serving_group(family: int, d, mlp) -> int:
    g = row_group(family, d)
    if g == features.G_BMM and not has_group(mlp, features.G_BMM):
        return features.G_MATMUL
    return g


def _lg(x: float) -> float:
    return math.log2(max(x, 1e-30))


def _pow2(x) -> float:
    x = max(int(x), 1)
    n = 0
    while n < 7 and x % 2 == 0:
        x //= 2
        n += 1
    return n / 7.0


def learned_us(family: int, dtype_code: int, d, gpu, params, eta: float) -> float:
    """Ideal time over eta, never faster than the bytes at the achievable DRAM rate;
    a convolution that can run no reduced-arithmetic algorithm at eta <= 1."""
    if _is_conv(family) and not fewer_multiplies_possible(family, d):
        eta = min(eta, 1.0)
    _, elems = flops_and_elems(family, d)
    dram = elems * row_elem_bytes(dtype_code) / (gpu[L.G_MEM_BW_GBS] * 1e9) * 1e6
    return max(ideal_us(family, dtype_code, d, gpu, params) / eta,
               dram / features.ACHIEVABLE_DRAM)


def ideal_us(family: int, dtype_code: int, d, gpu, params) -> float:
    flops, elems = flops_and_elems(family, d)
    nbytes = elems * row_elem_bytes(dtype_code)
    t_c = flops / peak_flops(gpu, family, dtype_code, params) * 1e6
    t_m = nbytes / (gpu[L.G_MEM_BW_GBS] * 1e9) * 1e6
    return max(t_c, t_m, 1e-6)


def _tile_features(sms, bt, m, n, k, tm, tn) -> list[float]:
    """kernels/tiles.candidate_features."""
    m, n, k = max(m, 1), max(n, 1), max(k, 1)
    tiles = max(max(bt, 1) * math.ceil(m / tm) * math.ceil(n / tn), 1.0)
    area = tm * tn
    slots = max(int(sms), 1) * (4 if area <= 2048 else 2 if area <= 8192 else 1)
    waves = math.ceil(tiles / slots)
    return [min(tiles / slots, 1.0), tiles / (waves * slots),
            (m / (math.ceil(m / tm) * tm)) * (n / (math.ceil(n / tn) * tn)),
            _lg(area) * _lg(k) / 196.0,
            _lg(tm / tn) * min(max(_lg(m / n), -4.0), 4.0) / 8.0,
            min(_lg(waves), 8.0) / 8.0]


def choose_tile(params, cc_major: int, sms: int, bt, m, n, k, b_transposed: bool) -> int:
    """kernels/tiles.choose_tile with learned_arch_only: the candidate with the
    highest score, or the largest that fills every SM where the rule has no
    biases for the architecture."""
    cands = [tuple(int(v) for v in c) for c in T.CANDIDATES]
    nf, nc = T.N_TILE_FEATURES, len(cands)
    base = nf + 2 * nc
    arch = -1
    if len(params) >= base:
        for a in range((len(params) - base) // T.ARCH_STRIDE):
            if int(params[base + a * T.ARCH_STRIDE]) == cc_major:
                arch = base + a * T.ARCH_STRIDE + 1
    if arch < 0:  # the analytical fallback
        best, best_area = 0, 0
        for c, (tm, tn) in enumerate(cands):
            count = max(max(bt, 1) * math.ceil(max(m, 1) / tm) * math.ceil(max(n, 1) / tn), 1.0)
            if count >= max(int(sms), 1) and tm * tn > best_area:
                best, best_area = c, tm * tn
        return best
    lay = 1 if b_transposed else 0
    scores = []
    for c, (tm, tn) in enumerate(cands):
        f = _tile_features(sms, bt, m, n, k, tm, tn)
        scores.append(params[nf + lay * nc + c] + sum(params[j] * f[j] for j in range(nf))
                      + params[arch + lay * nc + c])
    return int(np.argmax(scores))


def bmm_features(dtype_code: int, d, gpu, params, tiles) -> tuple[list[float], float]:
    """kernels/features.bmm_features: (inputs, ideal us) of a batched GEMM."""
    bt, m, n, k = (max(int(v), 1) for v in d[:4])
    sms = max(gpu[L.G_SMS], 1.0)
    c = choose_tile(tiles, int(gpu[L.G_CC_MAJOR]), int(sms), bt, m, n, k,
                    bool(int(d[L.GEMM_LAYOUT]) & L.GEMM_B_T))
    tm, tn = (int(v) for v in T.CANDIDATES[c])
    waves = math.ceil(max(bt * math.ceil(m / tm) * math.ceil(n / tn), 1.0) / sms)
    t_c = waves * 2.0 * tm * tn * k / (peak_flops(gpu, L.MATMUL, dtype_code, params) / sms) * 1e6
    t_m = waves * (tm * k + tn * k + tm * tn) * row_elem_bytes(dtype_code) \
        / (gpu[L.G_MEM_BW_GBS] * 1e9 / sms) * 1e6
    x = [0.0] * features.N_FEATURES
    x[0], x[1], x[5] = _lg(t_c), _lg(t_m), _lg(waves)
    x[2] = min(x[0] - x[1], 0.0)
    return x, max(t_c, t_m, 1e-6)


def group_aux(mlp, group: int) -> list[float]:
    h = 1 + M.HEADER * group
    off, n = int(mlp[h + 8]), int(mlp[h + 9])
    return mlp[off:off + n]


def forward_equivalent(family: int, d):
    """A softmax or layer-norm backward row as the forward kernel over the
    same rows, whose features price it, and a row that writes more than
    twice what it reads as the contiguous copy that moves its bytes (see
    kernels.features)."""
    read, written = int(d[L.MEM_READ]), int(d[L.MEM_WRITTEN])
    if group_of(family) == features.G_ELEMENTWISE and 2 * read < written:
        m = max((read + written + 1) // 2, 1)
        f = np.zeros_like(np.asarray(d))
        f[L.MEM_READ], f[L.MEM_WRITTEN], f[L.MEM_INNER], f[L.MEM_OUTER] = m, m, m, 1
        return L.COPY, f
    if family not in (L.SOFTMAX_BWD, L.LAYER_NORM_BWD):
        return family, d
    inner, outer = max(int(d[L.MEM_INNER]), 1), max(int(d[L.MEM_OUTER]), 1)
    n = int(min(float(inner) * float(outer), features.FORWARD_EQUIVALENT_CAP))
    f = np.zeros_like(np.asarray(d))
    f[L.MEM_INNER], f[L.MEM_OUTER] = inner, outer
    if family == L.SOFTMAX_BWD:
        f[L.MEM_READ], f[L.MEM_WRITTEN], f[L.MEM_FLOPS] = n, n, 5 * n
        return L.SOFTMAX, f
    f[L.MEM_READ], f[L.MEM_WRITTEN], f[L.MEM_FLOPS] = n + 2 * inner, n + 2 * outer, 8 * n
    return L.LAYER_NORM, f


def sm_clamped(gpu, lo: float, hi: float) -> list[float]:
    """features.sm_clamped."""
    out = [float(x) for x in gpu]
    sms = out[L.G_SMS]
    c = min(max(sms, lo), hi)
    if c != sms and sms > 0:
        for j in features.PER_SM_FIELDS:
            out[j] = gpu[j] * (c / sms)
    return out


def sm_range(mlp, group: int) -> tuple[float, float]:
    """features.sm_range."""
    aux = group_aux(mlp, features.G_MATMUL if group == features.G_BMM else group)
    if group in (features.G_MATMUL, features.G_CONV, features.G_BMM) \
            and len(aux) >= features.SM_RANGE_FIELDS \
            and (len(aux) - features.SM_RANGE_FIELDS) % features.BOARD_FIELDS == 0:
        return aux[0], aux[1]
    return 0.0, math.inf


def described_gpu(mlp, group: int, gpu):
    """The GPU a GEMM or conv row's features describe (features.group_features):
    its sm_clamped self outside the network's SM range."""
    lo, hi = sm_range(mlp, group)
    return sm_clamped(gpu, lo, hi) if not lo <= gpu[L.G_SMS] <= hi else gpu


def described_dims(family: int, d) -> list[int]:
    """The dims a learned GEMM row's features describe (features.group_features):
    its reduction at most features.MAX_REDUCTION."""
    d = list(d)
    if family == L.MATMUL and d[3] > features.MAX_REDUCTION:
        d[3] = features.MAX_REDUCTION
    return d


def row_features(family: int, dtype_code: int, d, gpu, params) -> list[float]:
    """The learned models' input vector for one row on one GPU."""
    family, d = forward_equivalent(family, d)
    flops, elems = flops_and_elems(family, d)
    nbytes = elems * row_elem_bytes(dtype_code)
    peak = peak_flops(gpu, family, dtype_code, params)
    bw = gpu[L.G_MEM_BW_GBS] * 1e9
    sms = gpu[L.G_SMS]
    blocks, per_sm, threads = thread_blocks(family, d)
    slots = block_slots(gpu, per_sm, threads)
    x = [0.0] * features.N_FEATURES
    x[0] = _lg((flops + 1.0) / peak * 1e6)
    x[1] = _lg((nbytes + 1.0) / bw * 1e6)
    x[2] = min(_lg((flops + 1.0) / (nbytes + 1.0)) - _lg(peak / bw), 0.0)
    x[3] = _lg(blocks / sms)
    x[4] = wave_utilisation(blocks, slots)
    x[5] = _lg(_cdiv(blocks, slots))
    if group_of(family) in (features.G_ELEMENTWISE, features.G_SOFTMAX, features.G_LAYER_NORM):
        x[6] = _lg(min(max(gpu[L.G_TDP_W], 50.0), 250.0) / 250.0)
    if _is_gemm(family):
        bt, m, n, k = gemm_shape(family, d)
        # A convolution's alignment is one image's: the batch out of its pixel dim.
        nb = max(int(d[0]), 1)
        am = m // nb if family in (L.CONV, L.CONV_DGRAD) else m
        ak = k // nb if family == L.CONV_WGRAD else k
        x[7:15] = [_lg(bt), _lg(m), _lg(n), _lg(k), _pow2(am), _pow2(n), _pow2(ak),
                   _lg(2.0 * m * n * k / max(m * n + n * k + m * k, 1))]
        if family != L.MATMUL:
            x[15], x[16] = _lg(d[5]), _lg(d[10])
        elif bt == 1:
            x[15] = 1.0 if int(d[L.GEMM_LAYOUT]) & L.GEMM_B_T else 0.0
        for t, (tm, tn, per) in enumerate(features.TILES):
            x[17 + t] = wave_utilisation(bt * _cdiv(m, tm) * _cdiv(n, tn), int(sms) * per)
    else:
        x[7] = _lg(elems)
        x[8] = _lg(max(d[L.MEM_INNER], 1))
        x[9] = _lg(max(d[L.MEM_OUTER], 1))
        x[10] = _lg(d[L.MEM_READ] / max(d[L.MEM_WRITTEN], 1))
        x[11] = _pow2(max(d[L.MEM_INNER], 1))
        x[12] = _lg(flops / max(elems, 1.0) + 1.0)
        if group_of(family) in (features.G_SOFTMAX, features.G_LAYER_NORM):
            x[13] = _column_or(gpu, L.G_PRE_VOLTA, 0.0)
    return x


# ---- kernels/mlp.py --------------------------------------------------------------

def has_group(mlp, group: int) -> bool:
    if len(mlp) == 0 or group < 0 or group >= int(mlp[0]):
        return False
    return mlp[1 + M.HEADER * group] > 0


def efficiency(mlp, group: int, x: Sequence[float]) -> float:
    """The group's network: normalise, two tanh layers, a scaled sigmoid."""
    h = 1 + M.HEADER * group
    off, n_in, h1, h2 = (int(v) for v in mlp[h:h + 4])
    eta_max = mlp[h + 4]
    mean, std = mlp[off:off + n_in], mlp[off + n_in:off + 2 * n_in]
    w1 = off + 2 * n_in
    b1 = w1 + h1 * n_in
    w2 = b1 + h1
    b2 = w2 + h2 * h1
    w3 = b2 + h2
    z_in = [(x[i] - mean[i]) / std[i] for i in range(n_in)]
    hidden = [math.tanh(mlp[b1 + j] + sum(mlp[w1 + j * n_in + i] * z_in[i] for i in range(n_in)))
              for j in range(h1)]
    z = mlp[w3 + h2] + sum(
        mlp[w3 + j] * math.tanh(mlp[b2 + j] + sum(mlp[w2 + j * h1 + i] * hidden[i]
                                                  for i in range(h1)))
        for j in range(h2))
    return eta_max / (1.0 + math.exp(-z))


def with_chip(mlp, group: int, eta: float, chip: float) -> float:
    """The efficiency with the chip's correction (log time offset): the chip's
    own if the weights hold one, else the one for other chips if they hold
    that, else none; capped at eta_max."""
    h = 1 + M.HEADER * group
    off, n = int(mlp[h + 6]), int(mlp[h + 7])
    pairs = {mlp[off + 2 * i]: mlp[off + 2 * i + 1] for i in range(n)}
    c = pairs[chip] if chip != 0.0 and chip in pairs else pairs.get(M.OTHER_CHIPS, 0.0)
    if c == 0.0:
        return eta
    return min(eta * math.exp(-c), mlp[h + 4])


# ---- kernels/clocks.py -------------------------------------------------------------


def _board_record(aux, chip: float):
    """(power per SM, boost MHz, clock fraction) of `chip`'s board record, or None."""
    for j in range(features.SM_RANGE_FIELDS, len(aux) - features.BOARD_FIELDS + 1,
                   features.BOARD_FIELDS):
        if aux[j] == chip:
            return aux[j + 1], aux[j + 2], aux[j + 3]
    return None


def power_limit_share(mlp, gpu) -> float:
    """clocks.power_limit_share."""
    limit = _column_or(gpu, L.G_POWER_LIMIT_W, 0.0)
    rated = gpu[L.G_TDP_W]
    if not (limit > 0.0 and rated > 0.0 and limit < rated):
        return 1.0
    sms, b = gpu[L.G_SMS], gpu[L.G_CLOCK_MHZ]
    ref = None if gpu[L.G_CHIP] == 0.0 or len(mlp) == 0 else \
        _board_record(group_aux(mlp, features.G_MATMUL), gpu[L.G_CHIP])
    if ref is None or min(ref) <= 0.0 or sms <= 0.0 or b <= 0.0:
        return (limit / rated) ** (1.0 / 3.0)
    w_r, b_r, c_r = ref
    f_r = c_r * b_r
    return (min(b, f_r * (limit / sms / w_r) ** (1.0 / 3.0))
            / min(b, f_r * (rated / sms / w_r) ** (1.0 / 3.0)))


def clock_ratio(mlp, group: int, gpu) -> float:
    """clocks.clock_ratio."""
    if group not in (features.G_MATMUL, features.G_BMM, features.G_CONV):
        return 1.0
    return board_ratio(mlp, group, gpu) * power_limit_share(mlp, gpu)


def board_ratio(mlp, group: int, gpu) -> float:
    """clocks.board_ratio."""
    chip = gpu[L.G_CHIP]
    if chip == 0.0 or len(mlp) == 0:
        return 1.0
    ref = _board_record(group_aux(mlp, features.G_MATMUL), chip)
    own = _board_record(group_aux(mlp, features.G_CONV if group == features.G_CONV
                                  else features.G_MATMUL), chip)
    if ref is None or own is None:
        return 1.0
    (w_r, b_r, c_r), (w_o, b_o, _) = ref, own
    sms, b_t, tdp = gpu[L.G_SMS], gpu[L.G_CLOCK_MHZ], gpu[L.G_TDP_W]
    if min(w_r, b_r, c_r, w_o, b_o, sms, b_t, tdp) <= 0.0:
        return 1.0
    f_r = c_r * b_r
    f_t = min(b_t, f_r * (tdp / sms / w_r) ** (1.0 / 3.0))
    f_o = min(b_o, f_r * (w_o / w_r) ** (1.0 / 3.0))
    return (f_t / b_t) / (f_o / b_o)


def with_board_clock(mlp, group: int, eta: float, family: int, dtype_code: int, d, gpu,
                     params) -> float:
    """clocks.with_board_clock."""
    m = clock_ratio(mlp, group, gpu)
    if m == 1.0:
        return eta
    flops, elems = flops_and_elems(family, d)
    t_c = flops / peak_flops(gpu, family, dtype_code, params) * 1e6
    t_m = elems * row_elem_bytes(dtype_code) / (gpu[L.G_MEM_BW_GBS] * 1e9) * 1e6
    share = 1.0 if t_c >= t_m else (t_c / t_m if t_m > 0.0 else 1.0)
    return min(eta * (1.0 + (m - 1.0) * share), mlp[1 + M.HEADER * group + 4])


# ---- kernels/optime.py -------------------------------------------------------------

# ---- kernels/precision.py --------------------------------------------------------

_MEMORY_LEARNED = (L.ELEMENTWISE, L.DROPOUT, L.COPY, L.FILL, L.LOSS, L.OPTIMIZER, L.UNSUPPORTED,
                   L.SOFTMAX, L.SOFTMAX_BWD, L.LAYER_NORM, L.LAYER_NORM_BWD)


def _has_tf32(gpu) -> bool:
    """precision.has_tf32: NVIDIA compute capability 8.0 on."""
    p = gpu[L.G_TF32_TFLOPS]
    return gpu[L.G_CC_MAJOR] >= 8.0 and p > 0.0 and p >= 0.95 * gpu[L.G_FP32_TFLOPS]


def tensor_core_peak(family: int, dtype_code: int, gpu, params) -> float:
    """precision.tensor_core_peak: tensor-core FLOP/s of a row (0: none)."""
    if not _is_gemm(family):
        return 0.0
    fp32 = gpu[L.G_FP32_TFLOPS]
    if dtype_code == L.F16:
        p = gpu[L.G_FP16_TFLOPS]
        ok = p >= 4.0 * fp32 or (p >= 1.9 * fp32 and gpu[L.G_BF16_TFLOPS] >= 1.9 * fp32)
    elif dtype_code == L.BF16:
        p = gpu[L.G_BF16_TFLOPS]
        ok = p >= 1.9 * fp32
    elif dtype_code == L.F32 and family == L.MATMUL and params[R.P_TF32_MATMUL] > 0.5:
        p = gpu[L.G_TF32_TFLOPS]
        ok = p >= 1.9 * fp32 or _has_tf32(gpu)
    elif dtype_code == L.F8:
        p = gpu[L.G_FP8_TFLOPS]
        ok = p >= 1.9 * fp32
    else:
        return 0.0
    return p * 1e12 if ok else 0.0


def precision_mode(family: int, dtype_code: int, gpu, params) -> int:
    """precision.mode_of: 0 as is, 1 tensor core, 2 as an fp32 row."""
    half = dtype_code in (L.F16, L.BF16, L.F8)
    if _is_gemm(family):
        if tensor_core_peak(family, dtype_code, gpu, params) > 0.0:
            return 1
        return 2 if dtype_code == L.BF16 else 0
    return 2 if half and family in _MEMORY_LEARNED else 0


def fp32_dims(family: int, dtype_code: int, d) -> list[int]:
    """precision.fp32_dims: the fp32 row at the same bytes."""
    out = [int(x) for x in d]
    if not _is_gemm(family):
        width = int(row_elem_bytes(dtype_code))
        for j in (L.MEM_READ, L.MEM_WRITTEN, L.MEM_FLOPS, L.MEM_OUTER):
            out[j] = (out[j] * width + 3) // 4
    return out


def _tc_aligned(family: int, dtype_code: int, d) -> bool:
    """precision.aligned: 16-byte rows in the dims the library reads."""
    a = {L.F32: 4, L.F8: 16}.get(dtype_code, 8)
    if family == L.MATMUL:
        return d[3] % a == 0 and d[2] % a == 0 and (
            not (int(d[L.GEMM_LAYOUT]) & L.GEMM_A_T) or d[1] % a == 0)
    g = max(d[9], 1)
    return (d[1] // g) % a == 0 and (d[4] // g) % a == 0


def _two_byte_rows(family: int, dtype_code: int, d) -> bool:
    """precision.two_byte_rows: a 16-bit matmul with an odd dim the library reads."""
    if family != L.MATMUL or dtype_code not in (L.F16, L.BF16) or d[1] == 1 or d[2] == 1:
        return False
    return d[3] % 2 != 0 or d[2] % 2 != 0 or (
        bool(int(d[L.GEMM_LAYOUT]) & L.GEMM_A_T) and d[1] % 2 != 0)


def tensor_core_us(family: int, dtype_code: int, kernels: int, d, gpu, params, mlp) -> float:
    """precision.tensor_core_us: tiles one per SM per wave, the reduction split
    into the slice count that finishes soonest, k-step, alignment, achievable
    fraction at the clock a power limit leaves; or the bytes against
    bandwidth."""
    peak = tensor_core_peak(family, dtype_code, gpu, params)
    bt, m, n, k = gemm_shape(family, d)
    launch = kernels * params[R.P_LAUNCH_US]
    if bt <= 0 or m <= 0 or n <= 0 or k <= 0 or peak <= 0.0:
        return launch + 1e-3
    sms = max(int(gpu[L.G_SMS]), 1)
    tiles = bt * _cdiv(m, P.TC_TILE_M) * _cdiv(n, P.TC_TILE_N)
    step = {L.F32: P.K_STEP_TF32, L.F8: P.K_STEP_8}.get(dtype_code, P.K_STEP_16)
    flops, elems = flops_and_elems(family, d)
    gemm_flops = 2.0 * bt * m * n * k
    ratio = min(flops / gemm_flops, 1.0)
    slowdown = (P.UNALIGNED_SLOWDOWN_HOPPER if 9.0 <= gpu[L.G_CC_MAJOR] < 12.0  # precision.tma_fed
                else P.UNALIGNED_SLOWDOWN)
    share = power_limit_share(mlp, gpu)
    eff = _column_or(gpu, L.G_TC_FRACTION, P.TC_FRACTION) * share
    if dtype_code == L.F8:
        eff *= P.FP8_FRACTION_RATIO
    rate = peak / sms * eff
    if _two_byte_rows(family, dtype_code, d):  # precision.two_byte_rows: the align1 kernels
        rate = min(rate, P.ALIGN1_FLOP_PER_SM_CLOCK * gpu[L.G_CLOCK_MHZ] * 1e6 * share)
    elif not _tc_aligned(family, dtype_code, d):
        rate /= slowdown
    per_k = 2.0 * P.TC_TILE_M * P.TC_TILE_N * ratio / rate * 1e6
    partial = 2.0 * P.TC_TILE_M * P.TC_TILE_N * 4.0 / (gpu[L.G_MEM_BW_GBS] * 1e9 / sms) * 1e6

    def slices_time(s: int) -> float:
        padded = _cdiv(_cdiv(k, s), step) * step
        return _cdiv(tiles * s, sms) * (padded * per_k + (partial if s > 1 else 0.0))

    # The first of the fastest (ties within 1e-9 go to fewer slices).
    split, best = 1, math.inf
    for s in range(1, max(min(k // R.SPLIT_K_MIN, P.SPLIT_K_MAX), 1) + 1):
        t = slices_time(s)
        if t < best * (1.0 - 1e-9):
            split, best = s, t
    t_c = slices_time(split)
    width = 4.0 if dtype_code == L.F32 else row_elem_bytes(dtype_code)
    t_m = elems * width / (gpu[L.G_MEM_BW_GBS] * 1e9 * params[R.P_ETA_M + family]) * 1e6
    return max(t_c, t_m) + tf32_operand_copies_us(family, dtype_code, d, gpu, params) + launch


def tf32_operand_copies_us(family: int, dtype_code: int, d, gpu, params) -> float:
    """precision.tf32_operand_copies_us: an unbatched TF32 GEMM copies each
    operand that is not K-major (A a transposed view, B row-major) into
    K-major order, a read and a write of it at the DRAM bandwidth."""
    if family != L.MATMUL or dtype_code != L.F32 or len(d) <= L.GEMM_LAYOUT:
        return 0.0
    bt, m, n, k = gemm_shape(family, d)
    if bt != 1 or min(m, n, k) <= 0:  # batched GEMMs pay no copies
        return 0.0
    layout = int(d[L.GEMM_LAYOUT])
    nbytes = (2.0 * bt * m * k * 4.0 if layout & L.GEMM_A_T else 0.0) \
        + (0.0 if layout & L.GEMM_B_T else 2.0 * bt * k * n * 4.0)
    return nbytes / (gpu[L.G_MEM_BW_GBS] * 1e9 * params[R.P_ETA_M + L.COPY]) * 1e6


def per_channel_batch_norm_us(family: int, dtype_code: int, d: Sequence[int],
                              gpu: Sequence[float], t_stream: float) -> float:
    """roofline.per_channel_batch_norm_us: a training NCHW batch norm on an
    NVIDIA GPU lasts at least its per-channel passes of dependent steps."""
    if family not in (L.BATCH_NORM, L.BATCH_NORM_BWD):
        return t_stream
    channels_last = len(d) > L.MEM_LAYOUT and d[L.MEM_LAYOUT] > 0
    inference = family == L.BATCH_NORM and d[L.MEM_READ] < 2 * d[L.MEM_WRITTEN]
    nvidia = len(gpu) > L.G_CC_MAJOR and gpu[L.G_CC_MAJOR] > 0
    if channels_last or inference or not nvidia:
        return t_stream
    threads = R.BN_CHANNEL_THREADS
    slots = block_slots(gpu, 32, threads)
    one_pass = _cdiv(max(d[L.MEM_OUTER], 1), slots) * _cdiv(max(d[L.MEM_INNER], 1), threads) \
        * R.BN_STEP_US
    if family == L.BATCH_NORM_BWD:  # reduction, then the input gradient
        return max(t_stream, 2 * one_pass)
    if dtype_code == L.BF16:  # PyTorch's statistics kernel, then a streaming one
        return t_stream + max(0.0, one_pass - t_stream / 3)
    return max(t_stream, one_pass)  # cuDNN: one kernel


def generic_kernel_us(family: int, d: Sequence[int], gpu: Sequence[float],
                    t_stream: float, clock_share: float) -> float:
    """roofline.generic_kernel_us: a copy PyTorch runs with a non-vectorised
    kernel on an NVIDIA GPU lasts at least its elements at that kernel's rate
    per SM clock (the boost clock times `clock_share`); an NCHW max pool at
    least its window walk (forward: window elements per SM clock; backward:
    bytes per window element at the DRAM bandwidth)."""
    generic = family in R.GENERIC_KERNEL_FAMILIES and len(d) > L.MEM_GENERIC
    kind = d[L.MEM_GENERIC] if generic else 0
    nvidia = len(gpu) > L.G_CC_MAJOR and gpu[L.G_CC_MAJOR] > 0
    if kind <= 0 or not nvidia:
        return t_stream
    if family in (L.POOL, L.POOL_BWD):
        if kind != L.MAX_POOL_NCHW or len(d) <= L.MEM_WINDOW_ELEMS:
            return t_stream
        window = max(d[L.MEM_WINDOW_ELEMS], 1)
        if family == L.POOL:
            walk = window / (R.MAX_POOL_FWD_WINDOW_ELEMS_PER_SM_CLOCK * gpu[L.G_SMS]
                             * gpu[L.G_CLOCK_MHZ] * clock_share)
        else:
            walk = window * R.MAX_POOL_BWD_BYTES_PER_WINDOW_ELEM / (gpu[L.G_MEM_BW_GBS] * 1e3)
        return max(t_stream, walk)
    rate = {L.COPY_STRIDED: R.STRIDED_COPY_ELEMS_PER_SM_CLOCK,
            L.CAST_BINARY: R.CAST_BINARY_ELEMS_PER_SM_CLOCK}.get(
                kind, R.CAST_COPY_ELEMS_PER_SM_CLOCK)
    elems = max(d[L.MEM_INNER], 1) * max(d[L.MEM_OUTER], 1)
    return max(t_stream, elems / (rate * gpu[L.G_SMS] * gpu[L.G_CLOCK_MHZ] * clock_share))


# ---- kernels/depthwise.py ----------------------------------------------------------

def depthwise_us(family: int, dtype_code: int, kernels: int, d: Sequence[int],
                 gpu: Sequence[float], params, clock_share: float) -> float:
    """depthwise.depthwise_us: the larger of the kernel loop's issue time and
    its tensors' memory time, plus its launches."""
    n, c, h, w, k, r, s, p, q = (d[i] for i in range(9))
    instr = {L.CONV_DGRAD: DW.DGRAD_INSTR, L.CONV_WGRAD: DW.WGRAD_INSTR}.get(family,
                                                                          DW.FORWARD_INSTR)
    taps = float(n) * (c * h * w if family == L.CONV_DGRAD else k * p * q) * r * s
    rate = gpu[L.G_SMS] * DW.ISSUE_PER_SM_CLOCK * gpu[L.G_CLOCK_MHZ] * 1e6 * clock_share
    flops, elems = flops_and_elems(family, d)
    if rate > 0.0:
        t_issue = taps * instr / rate * 1e6
    else:
        t_issue = flops / peak_flops(gpu, L.ELEMENTWISE, dtype_code, params) * 1e6
    t_mem = elems * row_elem_bytes(dtype_code) / (gpu[L.G_MEM_BW_GBS] * 1e9
                                                  * DW.MEMORY_EFFICIENCY) * 1e6
    return max(t_issue, t_mem) + kernels * params[R.P_LAUNCH_US]


def op_time_us(family: int, dtype_code: int, kernels: int, d: Sequence[int],
               gpu: Sequence[float], params, mlp) -> float:
    """Time of one execution of a row (us): the ideal roofline time over a
    learned efficiency where the row's group has a model, else the analytical
    roofline; tensor-core and half-precision rows as in kernels/precision.py;
    a convolution's layout transpose (dims[MEM_LAYOUT]) costs nothing where
    the convolution is not on tensor cores; a training NCHW batch norm lasts
    at least its per-channel passes; a copy on PyTorch's non-vectorised
    kernels at least its elements at their rate, an NCHW max pool its
    window walk."""
    t = _op_time_us(family, dtype_code, kernels, d, gpu, params, mlp)
    launches = kernels * params[R.P_LAUNCH_US]
    if family in (L.BATCH_NORM, L.BATCH_NORM_BWD):
        return per_channel_batch_norm_us(family, dtype_code, d, gpu, t - launches) + launches
    if family in R.GENERIC_KERNEL_FAMILIES and t > 0.0:
        return generic_kernel_us(family, d, gpu, t - launches,
                                 power_limit_share(mlp, gpu)) + launches
    return t


def _op_time_us(family: int, dtype_code: int, kernels: int, d: Sequence[int],
                gpu: Sequence[float], params, mlp) -> float:
    if family in (L.LSTM, L.LSTM_BWD):  # optime.recurrent_us: its kernels, one launch each
        p = list(params)
        if dtype_code == L.F32:  # cuDNN's math mode: TF32 where cuDNN may use it
            p[R.P_TF32_MATMUL] = params[R.P_TF32_CONV]
        t = sum(count * _row_us(fam, dtype_code, 1, dims, gpu, p, mlp)
                for fam, dims, count in lstm_kernels(family, d))
        return max(t, params[R.P_LAUNCH_US])
    if _is_conv(family) and d[9] > 1 and d[1] // d[9] == 1:
        return depthwise_us(family, dtype_code, kernels, d, gpu, params,
                            power_limit_share(mlp, gpu))
    if as_implicit_gemm(family, d) and precision_mode(family, dtype_code, gpu, params) != 1:
        # optime.implicit_gemm_us: where the convolution network would price it
        p = list(params)
        if dtype_code == L.F32:
            p[R.P_TF32_MATMUL] = params[R.P_TF32_CONV]
        g = implicit_gemm_dims(family, d)
        t = _row_us(L.MATMUL, dtype_code, kernels, g, gpu, p, mlp)
        if dtype_code == L.F32 and p[R.P_TF32_MATMUL] > 0.5:  # optime.cudnn_searches_ffma
            ffma = list(p)
            ffma[R.P_TF32_MATMUL] = 0.0
            t = min(t, _row_us(L.MATMUL, dtype_code, kernels, g, gpu, ffma, mlp))
        return t
    return _row_us(family, dtype_code, kernels, d, gpu, params, mlp)


def _row_us(family: int, dtype_code: int, kernels: int, d: Sequence[int],
            gpu: Sequence[float], params, mlp) -> float:
    if family == L.COPY and len(d) > L.MEM_LAYOUT and d[L.MEM_LAYOUT] > 0:
        if d[L.MEM_LAYOUT] == L.LAYOUT_IMPLICIT_GEMM and dtype_code == L.F32:
            runs = params[R.P_TF32_CONV] > 0.5 and _has_tf32(gpu)
        else:
            runs = tensor_core_peak(L.CONV, dtype_code, gpu, params) > 0.0
        if not runs:  # precision.layout_transpose_runs
            return 0.0
    mode = precision_mode(family, dtype_code, gpu, params)
    if mode == 1:
        t = tensor_core_us(family, dtype_code, kernels, d, gpu, params, mlp)
        if dtype_code == L.F32 and not _tc_aligned(family, dtype_code, d):
            # precision.cuda_cores_compete: the FFMA kernels stay candidates
            p = list(params)
            p[R.P_TF32_MATMUL] = 0.0
            t = min(t, _row_us(family, dtype_code, kernels, d, gpu, p, mlp))
        return t
    if mode == 2:
        d, dtype_code = fp32_dims(family, dtype_code, d), L.F32
    group = serving_group(family, d, mlp)
    if not has_group(mlp, group):
        return analytical_time_us(family, dtype_code, kernels, d, gpu, params)
    if group == features.G_BMM:
        _, ideal = bmm_features(dtype_code, d, gpu, params, group_aux(mlp, group))
        x, _ = bmm_features(dtype_code, d, described_gpu(mlp, group, gpu), params,
                            group_aux(mlp, group))
        eta = with_chip(mlp, group, efficiency(mlp, group, x), gpu[L.G_CHIP])
        eta = with_board_clock(mlp, group, eta, family, dtype_code, d, gpu, params)
        _, elems = flops_and_elems(family, d)  # features.learned_time_us
        dram = elems * row_elem_bytes(dtype_code) / (gpu[L.G_MEM_BW_GBS] * 1e9) * 1e6
        t = max(ideal / eta, dram / features.ACHIEVABLE_DRAM)
        if has_group(mlp, features.G_MATMUL):  # optime.learned_row_us: never below one GEMM
            one = [1] + list(d[1:])
            eta = with_chip(mlp, features.G_MATMUL,
                            efficiency(mlp, features.G_MATMUL,
                                       row_features(family, dtype_code, described_dims(family, one),
                                                    described_gpu(mlp, features.G_MATMUL, gpu),
                                                    params)),
                            gpu[L.G_CHIP])
            eta = with_board_clock(mlp, features.G_MATMUL, eta, family, dtype_code, one, gpu,
                                   params)
            t = max(t, learned_us(family, dtype_code, one, gpu, params, eta))
    else:
        eta = with_chip(mlp, group, efficiency(mlp, group,
                                               row_features(family, dtype_code,
                                                            described_dims(family, d),
                                                            described_gpu(mlp, group, gpu),
                                                            params)),
                        gpu[L.G_CHIP])
        eta = with_board_clock(mlp, group, eta, family, dtype_code, d, gpu, params)
        t = learned_us(family, dtype_code, d, gpu, params, eta)
    return t + kernels * params[R.P_LAUNCH_US]


# ---- kernels/grid.py -------------------------------------------------------------


def row_time_us(i: int, family, dtype, kernels, dbase, dslope, batch: int, gpu, params, mlp,
                cal_us, cal_batch, origin) -> float:
    """Time of one execution of row i at `batch` on `gpu`; a calibrated row is its
    measured time times the model's ratio (destination / origin)."""
    t = op_time_us(family[i], dtype[i], kernels[i], dims_at(dbase, dslope, i, batch), gpu,
                   params, mlp)
    if len(cal_us) and cal_us[i] > 0.0:
        t0 = op_time_us(family[i], dtype[i], kernels[i],
                        dims_at(dbase, dslope, i, cal_batch[i]), origin, params, mlp)
        t = cal_us[i] * t / t0
    return t


def evaluate_grid(family, phase, dtype, count, kernels, dbase, dslope, batches, gpus, params,
                  mlp, cal_us=(), cal_batch=(), origin=()) -> np.ndarray:
    """ms[g, b, phase]: every row at batches[b] on gpus[g], one op at a time."""
    rows = _plain(family, phase, dtype, count, kernels, dbase, dslope)
    family, phase, dtype, count, kernels, dbase, dslope = rows
    params = [float(x) for x in params]
    mlp = [float(x) for x in mlp]
    cal_us = [float(x) for x in cal_us]
    cal_batch = [int(x) for x in cal_batch]
    origin = [float(x) for x in origin]
    batches = [int(b) for b in batches]
    out = np.zeros((len(gpus), len(batches), len(L.PHASE_NAMES)))
    for g, gpu_row in enumerate(gpus):
        gpu = [float(x) for x in gpu_row]
        for bi, batch in enumerate(batches):
            totals = [0.0] * len(L.PHASE_NAMES)
            for i in range(len(family)):
                t = row_time_us(i, family, dtype, kernels, dbase, dslope, batch, gpu, params,
                                mlp, cal_us, cal_batch, origin)
                totals[phase[i]] += t * count[i] * 1e-3
            out[g, bi] = totals
    return out


def _plain(*arrays):
    """numpy rows -> Python ints (and lists of lists for the dims)."""
    return tuple(np.asarray(a).tolist() for a in arrays)


# ---- predictor/overhead.py -------------------------------------------------------


def host_phase_ms(graph) -> list[float]:
    """Host time of each phase (ms): a dispatch per aten op, a launch per kernel."""
    ops = graph.ops
    phases = range(len(L.PHASE_NAMES))
    recorded = list(getattr(graph, "host_ops", None) or [])
    if len(recorded) == len(L.PHASE_NAMES):
        dispatched = [float(x) for x in recorded]
    else:  # not recorded: every kernel-running op is one dispatch
        dispatched = [float(sum(int(c) for c, p in zip(ops.count, ops.phase) if p == ph))
                      for ph in phases]
    launches = [float(sum(int(c) * int(k) for c, k, p in zip(ops.count, ops.kernels, ops.phase)
                          if p == ph)) for ph in phases]
    return [(HOST_DISPATCH_US * dispatched[ph] + HOST_LAUNCH_US * launches[ph]) * 1e-3
            for ph in phases]


# ---- predictor/engine.py ---------------------------------------------------------


def cast_dtype(dtype, dtype_code: int | None):
    """Every floating-point row in `dtype_code` (None: as traced)."""
    if dtype_code is None:
        return list(dtype)
    return [dtype_code if int(x) in _FLOATING else int(x) for x in dtype]


class ReferenceSweep(NamedTuple):
    phase_ms: np.ndarray      # [gpu, batch, phase] what engine.sweep returns
    gpu_phase_ms: np.ndarray  # [gpu, batch, phase] the GPU's kernels alone (evaluate_grid)


def sweep(graph, gpu_features, batches, params, mlp=(), dtype_code: int | None = None,
          cal_us=(), cal_batch=(), origin=()) -> ReferenceSweep:
    """Reference of ``engine.sweep(graph, ...)``: per-op GPU times summed by
    phase, then each phase lasts as long as the GPU or the host, whichever is
    longer."""
    ops = graph.ops
    gpu = evaluate_grid(ops.family, ops.phase, cast_dtype(ops.dtype, dtype_code), ops.count,
                        ops.kernels, ops.dbase, ops.dslope, batches, gpu_features, params,
                        mlp, cal_us, cal_batch, origin)
    host = host_phase_ms(graph)
    total = np.empty_like(gpu)
    for g in range(gpu.shape[0]):
        for b in range(gpu.shape[1]):
            total[g, b] = [max(gpu[g, b, ph], host[ph]) for ph in range(gpu.shape[2])]
    return ReferenceSweep(total, gpu)
