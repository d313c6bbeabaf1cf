"""Features of one (op, GPU) pair for the learned efficiency models.

The same function builds the training features (from measured ops) and the
prediction features (from OpTable rows), so the models see identical inputs.
Features describe how an op meets a GPU rather than which GPU it is: the op's
arithmetic intensity against the GPU's ridge point, how many waves its thread
blocks take and how full the last one is, plus log-scaled dims. That is what
lets a model trained on five GPUs say something about a sixth.

Leave-one-GPU-out validation (train on four GPUs, score the fifth's training
shapes; `python -m benchmarks.feature_selection`, MAPE % mean over held-out
GPUs except P4, seed 0) chose what is left out: the working set against the
L2 cache, which let the networks tell the five GPUs apart (added back: bmm /
linear 25.0 / 21.2 -> 28.7 / 27.0 together with board power, conv 23.0 ->
26.6 likewise, softmax 23.4 -> 24.9, layer norm 15.2 -> 15.5, elementwise
11.4 -> 12.6), and board power for GEMMs and convolutions. Board power stays for
the memory-bound groups (elementwise without it: 11.4 -> 19.2).

The softmax and layer-norm networks also see whether the GPU's SM predates
Volta (feature 13, ``layout.G_PRE_VOLTA``: the P100 and P4 among the
training GPUs; no L1 caching of global loads, no INT32 pipe beside the FP32
one), a row reduction's kernel reading its row more than once. Chosen the
same way (`--drop 13` is the set without it; the shipped recipe, seed 0):
softmax 22.7 -> 20.9, layer norm 14.8 -> 13.4; single networks, seeds 0-2:
softmax 23.4 / 22.6 / 23.2 -> 21.4 / 20.8 / 20.6, layer norm 15.2 / 14.2 /
15.7 -> 13.0 / 13.2 / 13.2. Elementwise kernels read once, and the flag cost
them (11.4 -> 13.5): not for them.

The wave features (3-5) count the thread blocks the op's kernel really
launches (`kernels.work.thread_blocks`). For softmax that is PyTorch's own
dispatch (`softmax_launch`: several rows a block up to rows of 1,024, then
one block of up to 512 threads a row), which matches every softmax launch
in the training files; one 128-thread block per row before it (the
layer-norm kernel's launch, still right for layer norm). Chosen the same
way: softmax 20.9 -> 18.9 (the shipped recipe, seed 0), single networks,
seeds 0-2: 22.4 / 20.8 / 21.7 -> 19.7 / 20.7 / 18.5.

Batched GEMMs have a group of their own (G_BMM) with NeuSight's inputs
instead: the GEMM as waves of thread-block tiles seen from one SM
(`bmm_features`); the tile comes from the GEMM tile rule the weights carry
(``kernels.mlp.group_aux``).

The wave features still carry the SM count, and five GPUs' worth of it acts
as an identity that a network extrapolates along. So a GEMM or convolution
on a GPU whose SM count lies outside the training GPUs' (the range the
matmul and conv groups carry as their auxiliary numbers) is described as on
that GPU with its SM count clamped into the range, every SM keeping its own
FLOP/s and bandwidth (`sm_clamped`), and priced at that efficiency over its
own ideal time: a GEMM of many waves runs wave after wave at one wave's
time whatever the SM count. Memory-bound rows keep their own GPU (DRAM
bandwidth is the chip's, not the SMs' share: fewer SMs can use all of it).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from predictor.kernels import layout as L
from predictor.kernels.mlp import group_aux, has_group
from predictor.kernels.roofline import (block_slots, column_or, is_gemm, peak_flops,
                                       wave_utilisation)
from predictor.kernels.tiles import CANDIDATES, choose_tile, tile_count
from predictor.kernels.work import (fewer_multiplies_possible, flops_and_elems, gemm_shape, is_conv,
                                    row_elem_bytes, thread_blocks)

# Model groups: one small network each.
G_NONE = -1
G_MATMUL = 0
G_CONV = 1
G_ELEMENTWISE = 2
G_SOFTMAX = 3
G_LAYER_NORM = 4
# Batched GEMMs (torch.bmm, attention's Q K^T and P V): their own network on
# NeuSight's per-SM inputs (`bmm_features`). Unbatched GEMMs stay with
# G_MATMUL, whose network is trained on batched ones too (the data's only
# `x @ W` kernels), so that it prices an unbatched `x @ W` from measured ones.
G_BMM = 5
N_GROUPS = 6
GROUP_NAMES = ("matmul", "conv", "elementwise", "softmax", "layer_norm", "bmm")

N_FEATURES = 22

# Output tiles cuBLAS/cuDNN choose between (rows, cols, blocks resident per SM).
TILES = ((32, 32, 4), (64, 64, 2), (128, 64, 2), (128, 128, 1), (256, 128, 1))


@njit(cache=True)
def group_of(family):
    """Which learned model serves a family (G_NONE: analytical only)."""
    if family == L.MATMUL:
        return G_MATMUL
    if family == L.CONV or family == L.CONV_DGRAD or family == L.CONV_WGRAD:
        return G_CONV
    if family == L.SOFTMAX or family == L.SOFTMAX_BWD:
        return G_SOFTMAX
    if family == L.LAYER_NORM or family == L.LAYER_NORM_BWD:
        return G_LAYER_NORM
    if family == L.ELEMENTWISE or family == L.DROPOUT or family == L.COPY \
            or family == L.FILL or family == L.LOSS or family == L.OPTIMIZER \
            or family == L.UNSUPPORTED:
        return G_ELEMENTWISE
    return G_NONE


@njit(cache=True)
def row_group(family, d):
    """The group a row belongs to: `group_of` its family, G_BMM for a
    batched GEMM."""
    if family == L.MATMUL and d[0] > 1:
        return G_BMM
    return group_of(family)


@njit(cache=True)
def serving_group(family, d, mlp):
    """The group whose network prices a row under weights `mlp`: its
    `row_group`, or G_MATMUL for a batched GEMM where `mlp` has no batched-GEMM
    network (weights trained without one)."""
    g = row_group(family, d)
    if g == G_BMM and not has_group(mlp, G_BMM):
        return G_MATMUL
    return g


@njit(cache=True)
def _lg(x):
    return math.log2(max(x, 1e-30))


@njit(cache=True)
def _pow2(x):
    """How many times 2 divides x, capped at 7 (128): alignment decides whether
    a GEMM or elementwise kernel gets its vectorised, full-tile path."""
    x = max(int(x), 1)
    n = 0
    while n < 7 and x % 2 == 0:
        x //= 2
        n += 1
    return n / 7.0


@njit(cache=True)
def conv_alignment_dims(family, d, m, k):
    """The GEMM dims M and K whose alignment (`_pow2`) the features give. A
    convolution's implicit GEMM carries the batch in its pixel dim (M = N*P*Q
    of a forward, N*H*W of a dgrad, the reduction N*P*Q of a wgrad), but the
    batch is the outermost dim of an NCHW tensor and no load is vectorised
    along it: its alignment is one image's (P*Q or H*W). With the batch in,
    an even batch looked aligned and an odd one not, and a sweep's
    convolutions ran 10 % faster at batch 64 than at 63. Leave-one-GPU-out on
    the training shapes (`python -m benchmarks.feature_selection --group conv
    --seed N`, mean over held-out GPUs except P4), seeds 0-2: 23.0 / 23.1 /
    23.7 with the batch in, 22.9 / 23.0 / 23.6 with one image's alignment;
    the held-out P4 39.0 / 38.0 / 36.1 -> 38.9 / 38.0 / 36.4. The batch's
    alignment carried nothing that held on another GPU. (The old columns
    stay in the harness as candidates: `--drop 11,13 --add
    conv11batch,conv13batch`.)"""
    if family == L.CONV or family == L.CONV_DGRAD:
        return m // max(d[0], 1), k
    if family == L.CONV_WGRAD:
        return m, k // max(d[0], 1)
    return m, k


@njit(cache=True)
def gemm_b_transposed(d):
    """1 when a GEMM's B operand is a transposed view (F.linear's x @ W^T: the
    cuBLAS `*_tn` kernels), else 0 (x @ W, torch.bmm: `*_nn`). The two kernel
    families run the same shape at different speeds (up to 2x on Pascal).
    Only B's layout is a feature: the training data has `tn` (linear) and `nn`
    (bmm) kernels and nothing with A transposed, so a weight gradient
    dY^T @ X is priced by its B operand like the rest. Batched GEMMs are all
    `nn` in the data (torch.bmm), so the flag is only set for unbatched ones
    (see row_features)."""
    return 1.0 if (int(d[L.GEMM_LAYOUT]) & L.GEMM_B_T) != 0 else 0.0


@njit(cache=True)
def roofline_us(family, dtype_code, d, gpu, params):
    """(compute, memory) time of a row at the spec sheet's peaks (us)."""
    flops, elems = flops_and_elems(family, d)
    nbytes = elems * row_elem_bytes(dtype_code)
    t_c = flops / peak_flops(gpu, family, dtype_code, params) * 1e6
    t_m = nbytes / (gpu[L.G_MEM_BW_GBS] * 1e9) * 1e6
    return t_c, t_m


@njit(cache=True)
def ideal_us(family, dtype_code, d, gpu, params):
    """Roofline time with perfect efficiency and no quantization (us)."""
    t_c, t_m = roofline_us(family, dtype_code, d, gpu, params)
    return max(t_c, t_m, 1e-6)


# The highest sustained DRAM bandwidth any kernel of the training data reaches,
# as a fraction of the spec sheet's: 0.910 (V100 elementwise; the A100 0.861,
# the GDDR and Pascal cards 0.75-0.77; `python -m benchmarks.accuracy --data
# ../shared/data/neusight --bandwidth` prints the table). Refresh, bank
# conflicts and read/write turnaround keep every DRAM below its theoretical
# rate, so no learned prediction may move bytes faster than this: a network
# extrapolating to a GPU with more bandwidth than any it saw (3.35 TB/s) must
# not get there by running a softmax at 97 % of it.
ACHIEVABLE_DRAM = 0.91


@njit(cache=True)
def learned_us(family, dtype_code, d, gpu, params, eta):
    """An op's time at learned efficiency `eta`: its ideal roofline time over
    eta, but never faster than its bytes at ACHIEVABLE_DRAM of the bandwidth."""
    t_c, t_m = roofline_us(family, dtype_code, d, gpu, params)
    return max(max(t_c, t_m, 1e-6) / eta, t_m / ACHIEVABLE_DRAM)


@njit(cache=True)
def bmm_features(dtype_code, d, gpu, params, tiles, out):
    """Fill `out[:N_FEATURES]` for a batched GEMM (G_BMM) on one GPU; returns
    its ideal time (us): NeuSight's description of a GEMM as waves of
    thread-block tiles, seen from one SM.

    The tile is the one the GEMM tile rule `tiles` (``kernels.tiles``) picks
    for this GPU's architecture and SM count; ``waves = ceil(tiles / SMs)``.
    The inputs are log2 us: waves x one tile's FLOPs over the per-SM peak
    (0), waves x its bytes (A and B panels, C tile) over the per-SM DRAM
    bandwidth (1), the tile's intensity against the ridge point (2, clipped
    at 0 as `row_features` clips it), and log2 waves (5); every other input
    is 0. Nothing else of the shape or the GPU: with five training GPUs, the
    whole-GPU and shape inputs let a network tell the GPUs apart, and SM by
    SM a held-out GPU looks like the ones trained on (leave-one-GPU-out,
    benchmarks/README.md, "NeuSight's GEMM method under this protocol").
    The ideal time is waves x the tile's roofline time."""
    for j in range(N_FEATURES):
        out[j] = 0.0
    bt, m, n, k = max(d[0], 1), max(d[1], 1), max(d[2], 1), max(d[3], 1)
    sms = max(gpu[L.G_SMS], 1.0)
    b_t = (int(d[L.GEMM_LAYOUT]) & L.GEMM_B_T) != 0
    c = choose_tile(tiles, int(gpu[L.G_CC_MAJOR]), int(sms), bt, m, n, k, b_t, True)
    tm, tn = CANDIDATES[c, 0], CANDIDATES[c, 1]
    waves = math.ceil(tile_count(bt, m, n, tm, tn) / sms)
    tile_flops = 2.0 * tm * tn * k
    tile_bytes = (tm * k + tn * k + tm * tn) * row_elem_bytes(dtype_code)
    t_c = waves * tile_flops / (peak_flops(gpu, L.MATMUL, dtype_code, params) / sms) * 1e6
    t_m = waves * tile_bytes / (gpu[L.G_MEM_BW_GBS] * 1e9 / sms) * 1e6
    out[0] = _lg(t_c)
    out[1] = _lg(t_m)
    out[2] = min(out[0] - out[1], 0.0)
    out[5] = _lg(waves)
    return max(t_c, t_m, 1e-6)


# What a GPU's SMs each have a share of (`sm_clamped`).
PER_SM_FIELDS = (L.G_SMS, L.G_MEM_BW_GBS, L.G_L2_MB, L.G_FP32_TFLOPS, L.G_TF32_TFLOPS,
                 L.G_FP16_TFLOPS, L.G_BF16_TFLOPS, L.G_FP64_TFLOPS, L.G_FP8_TFLOPS, L.G_TDP_W)


@njit(cache=True)
def sm_clamped(gpu, lo, hi):
    """`gpu` with its SM count clamped to [lo, hi], each SM keeping its own
    share of the FLOP/s, DRAM bandwidth, L2 and board power."""
    out = gpu.copy()
    sms = gpu[L.G_SMS]
    c = min(max(sms, lo), hi)
    if c != sms and sms > 0:
        for j in PER_SM_FIELDS:
            out[j] = gpu[j] * (c / sms)
    return out


# The matmul and conv groups' auxiliary numbers: the SM range (fewest, most),
# then board records of kernels.clocks of BOARD_FIELDS numbers each.
SM_RANGE_FIELDS = 2
BOARD_FIELDS = 4


@njit(cache=True)
def has_sm_range(n_aux):
    """Whether `n_aux` auxiliary numbers are an SM range and whole board records."""
    return n_aux >= SM_RANGE_FIELDS and (n_aux - SM_RANGE_FIELDS) % BOARD_FIELDS == 0


@njit(cache=True)
def sm_range(mlp, group):
    """(lo, hi): the SM counts of the GPUs `group`'s network was trained on
    (the batched-GEMM group's are the matmul group's, fitted on every GEMM);
    (0, inf) for weights without them."""
    aux = group_aux(mlp, G_MATMUL if group == G_BMM else group)
    if (group == G_MATMUL or group == G_CONV or group == G_BMM) and has_sm_range(aux.shape[0]):
        return aux[0], aux[1]
    return 0.0, math.inf


# The longest reduction (K) of any GEMM the matmul network was trained on:
# 65,371 in the training files (65,536 in the test split). A GEMM that reduces
# over more (a weight gradient over a batch of a million rows) is described at
# this K, as a GPU outside the training SM counts is described at the nearest
# one: its tiles and waves are those of the shorter GEMM, each tile's loop
# just runs longer, and a longer loop amortises its start no worse, so the
# efficiency at this K is a lower bound, and the time grows in proportion to
# K from there. Left free, the network extrapolated along log K, in either
# direction (benchmarks/README.md, "Embedding-heavy training against
# published NCF throughput").
MAX_REDUCTION = 65536


@njit(cache=True)
def group_features(group, family, dtype_code, d, gpu, params, mlp, out):
    """Fill `out[:N_FEATURES]` for a row priced by `group`'s network of
    weights `mlp` (`serving_group`); returns the row's ideal time (us), the
    time `learned_time_us` divides by the efficiency. A GEMM or convolution
    on a GPU of more or fewer SMs than the network was trained on is
    described on the GPU's `sm_clamped` self (module docstring), an unbatched
    GEMM reducing over more than MAX_REDUCTION at that K; its ideal time
    stays its own."""
    lo, hi = sm_range(mlp, group)
    outside = gpu[L.G_SMS] < lo or gpu[L.G_SMS] > hi
    if group == G_BMM:
        ideal = bmm_features(dtype_code, d, gpu, params, group_aux(mlp, G_BMM), out)
        if outside:
            bmm_features(dtype_code, d, sm_clamped(gpu, lo, hi), params,
                         group_aux(mlp, G_BMM), out)
        return ideal
    described = d
    if family == L.MATMUL and d[3] > MAX_REDUCTION:
        described = d.copy()
        described[3] = MAX_REDUCTION
    row_features(family, dtype_code, described, sm_clamped(gpu, lo, hi) if outside else gpu,
                 params, out)
    return ideal_us(family, dtype_code, d, gpu, params)


@njit(cache=True)
def learned_time_us(family, dtype_code, d, gpu, params, ideal, eta):
    """`learned_us` with the row's ideal time `ideal` from `group_features`
    (for a batched GEMM, the waves of its tiles; else `ideal_us`, so that it
    is `learned_us` itself). A convolution that can run no reduced-arithmetic
    algorithm (`work.fewer_multiplies_possible`) never beats its direct FLOPs
    at the peak rate: the network's Winograd-trained ceiling (eta_max 2.5)
    is not its own."""
    t_m = roofline_us(family, dtype_code, d, gpu, params)[1]
    if is_conv(family) and not fewer_multiplies_possible(family, d):
        eta = min(eta, 1.0)
    return max(ideal / eta, t_m / ACHIEVABLE_DRAM)


# The most elements `forward_equivalent` gives a row (8 x this is 2**61,
# predictor.limits.MAX_COUNT): far beyond any real tensor.
FORWARD_EQUIVALENT_CAP = 2.0 ** 58


@njit(cache=True)
def is_write_stream(family, d):
    """A memory-bound row of the elementwise group that writes more than
    twice what it reads (`forward_equivalent`)."""
    return group_of(family) == G_ELEMENTWISE and 2 * d[L.MEM_READ] < d[L.MEM_WRITTEN]


@njit(cache=True)
def forward_equivalent(family, d):
    """(family, dims) whose features a row is priced by. The data has no
    softmax or layer-norm backward kernel, and a network asked about one
    meets inputs it never saw (three reads per write, 12 flops an element):
    a shipped ensemble put the layer-norm backward of BERT-large at 0.08 of
    the DRAM roofline against 0.5 for its forward. So such a row takes the
    learned efficiency of the forward kernel over the same rows (the same
    inner and outer dims: one block a row, the same reduction) and pays its
    own bytes at it (``learned_us``).

    A row that writes more than twice what it reads (`is_write_stream`: a
    fill, random numbers, a broadcast operand expanded into a full tensor)
    has a read-to-write ratio (feature 10) below anything measured, where
    every elementwise kernel reads one or two elements a write: log2 0 is a
    hundred units outside it. The network priced fills at 0.3-0.4 of the
    DRAM bandwidth at every size, slower than a copy of twice the bytes,
    where the H200 ran the 250 M element fill of BERT-large's loss gradient
    at 0.87 of it (240 us in `benchmarks/data/h200/profile`). Such a row is
    a stream of writes, so it is described as the contiguous copy that
    moves its bytes (half of its elements read and half written, at least
    one). Other rows are their own."""
    if is_write_stream(family, d):
        m = max((d[L.MEM_READ] + d[L.MEM_WRITTEN] + 1) // 2, 1)
        f = np.zeros_like(d)
        f[L.MEM_READ] = m
        f[L.MEM_WRITTEN] = m
        f[L.MEM_INNER] = m
        f[L.MEM_OUTER] = 1
        return L.COPY, f
    if family != L.SOFTMAX_BWD and family != L.LAYER_NORM_BWD:
        return family, d
    inner = max(d[L.MEM_INNER], 1)
    outer = max(d[L.MEM_OUTER], 1)
    # In float and capped: a row's inner and outer dims are each checked
    # (Graph.check_extent), their product is not, and 8 n must stay an int64.
    n = int(min(float(inner) * float(outer), FORWARD_EQUIVALENT_CAP))
    f = np.zeros_like(d)
    f[L.MEM_INNER] = inner
    f[L.MEM_OUTER] = outer
    if family == L.SOFTMAX_BWD:  # as families._softmax lowers the forward
        f[L.MEM_READ] = n
        f[L.MEM_WRITTEN] = n
        f[L.MEM_FLOPS] = 5 * n
        return L.SOFTMAX, f
    f[L.MEM_READ] = n + 2 * inner  # as families._layer_norm (with weight and bias)
    f[L.MEM_WRITTEN] = n + 2 * outer
    f[L.MEM_FLOPS] = 8 * n
    return L.LAYER_NORM, f


@njit(cache=True)
def row_features(family, dtype_code, d, gpu, params, out):
    """Fill `out[:N_FEATURES]` for one row on one GPU; returns its model group.

    No feature names the GPU itself (SM count, clock, per-SM throughput, L2
    size): with five training GPUs such features act as an identity and do not
    transfer (leave-one-GPU-out validation chose this set; see the module
    docstring). Softmax and layer-norm backward rows are described as their
    forward kernels (`forward_equivalent`).
    """
    family, d = forward_equivalent(family, d)
    flops, elems = flops_and_elems(family, d)
    nbytes = elems * row_elem_bytes(dtype_code)
    peak = peak_flops(gpu, family, dtype_code, params)
    bw = gpu[L.G_MEM_BW_GBS] * 1e9
    sms = gpu[L.G_SMS]
    blocks, per_sm, threads = thread_blocks(family, d)
    slots = block_slots(gpu, per_sm, threads)
    waves = (blocks + slots - 1) // slots
    for j in range(N_FEATURES):
        out[j] = 0.0
    # How the op meets the GPU.
    out[0] = _lg((flops + 1.0) / peak * 1e6)                # log2 ideal compute time, us
    out[1] = _lg((nbytes + 1.0) / bw * 1e6)                 # log2 ideal memory time, us
    # How far below the ridge point the op's intensity is (0 when compute-bound):
    # above the ridge, bandwidth must not matter, and a GPU with more of it must
    # not look different to the model.
    out[2] = min(_lg((flops + 1.0) / (nbytes + 1.0)) - _lg(peak / bw), 0.0)
    out[3] = _lg(blocks / sms)
    out[4] = wave_utilisation(blocks, slots)
    out[5] = _lg(waves)
    group = group_of(family)
    if group == G_ELEMENTWISE or group == G_SOFTMAX or group == G_LAYER_NORM:
        # Board power: 70-75 W cards (T4, P4, L4) cannot hold their boost clock.
        # Clamped so that 250 W and 700 W boards look alike.
        out[6] = _lg(min(max(gpu[L.G_TDP_W], 50.0), 250.0) / 250.0)
    # The op's own shape.
    if is_gemm(family):
        bt, m, n, k = gemm_shape(family, d)
        out[7] = _lg(bt)
        out[8] = _lg(m)
        out[9] = _lg(n)
        out[10] = _lg(k)
        am, ak = conv_alignment_dims(family, d, m, k)
        out[11] = _pow2(am)
        out[12] = _pow2(n)
        out[13] = _pow2(ak)
        out[14] = _lg(2.0 * m * n * k / max(m * n + n * k + m * k, 1))  # GEMM intensity (flop/elem)
        if family != L.MATMUL:
            out[15] = _lg(d[5])            # kernel size
            out[16] = _lg(d[10])           # stride
        elif bt == 1:
            out[15] = gemm_b_transposed(d)
        # Wave quantization under each candidate tile: the library picks one of
        # these, and which one leaves the GPU emptiest is what costs time.
        for t in range(len(TILES)):
            tm, tn, per = TILES[t]
            tiles = bt * ((m + tm - 1) // tm) * ((n + tn - 1) // tn)
            out[17 + t] = wave_utilisation(tiles, int(sms) * per)
    else:
        inner = max(d[L.MEM_INNER], 1)
        outer = max(d[L.MEM_OUTER], 1)
        out[7] = _lg(elems)
        out[8] = _lg(inner)
        out[9] = _lg(outer)
        out[10] = _lg(d[L.MEM_READ] / max(d[L.MEM_WRITTEN], 1))
        out[11] = _pow2(inner)
        out[12] = _lg(flops / max(elems, 1.0) + 1.0)
        if group == G_SOFTMAX or group == G_LAYER_NORM:
            # A row-reduction kernel reads its row more than once; whether the
            # SM predates Volta (no L1 caching of global loads, no INT32 pipe)
            # moved held-out softmax 23.4 -> 21.4 % and layer norm 15.2 -> 13.0
            # (module docstring). Elementwise kernels read once: not for them.
            out[13] = column_or(gpu, L.G_PRE_VOLTA, 0.0)
    return group


def improvement_directions() -> list[tuple[np.ndarray, float, float]]:
    """How the features move when a GPU gets better: (feature step, factor on
    the compute time, factor on the memory time) for doubling (a) FLOP/s and
    bandwidth together, (b) bandwidth alone, (c) FLOP/s alone. Training
    penalises predictions that get slower along any of them, which keeps "the
    same op on a strictly better GPU is never slower" true. Feature 2 is
    clipped at 0, so apply a step as ``shift_features``."""
    out = []
    for dc, dm, scale_c, scale_m in ((-1.0, -1.0, 0.5, 0.5),
                                    (0.0, -1.0, 1.0, 0.5),
                                    (-1.0, 0.0, 0.5, 1.0)):
        v = np.zeros(N_FEATURES)
        v[0], v[1] = dc, dm
        v[2] = dc - dm  # intensity against the ridge point (clipped at 0 by the caller)
        out.append((v, scale_c, scale_m))
    return out


def shift_features(x: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Features after an improvement step, keeping feature 2's clip at 0."""
    out = x + step
    out[:, 2] = np.minimum(out[:, 2], 0.0)
    return out


@njit(cache=True)
def feature_table(family, dtype, dims, gpus, gpu_index, params, tiles, bmm):
    """Features, ideal times and groups of many (row, GPU) pairs (training,
    accuracy). `bmm`: batched GEMMs are G_BMM rows (`bmm_features` under the
    tile rule `tiles`); else G_MATMUL rows, as the matmul network is trained
    on them."""
    n = family.shape[0]
    x = np.zeros((n, N_FEATURES))
    ideal = np.empty(n)
    group = np.empty(n, dtype=np.int64)
    for i in range(n):
        gpu = gpus[gpu_index[i]]
        g = row_group(family[i], dims[i])
        if g == G_BMM and bmm:
            ideal[i] = bmm_features(dtype[i], dims[i], gpu, params, tiles, x[i])
        else:
            g = row_features(family[i], dtype[i], dims[i], gpu, params, x[i])
            ideal[i] = ideal_us(family[i], dtype[i], dims[i], gpu, params)
        group[i] = g
    return x, ideal, group
