"""Half-precision and TF32 rows: how they compose with the fp32 op models.

The learned op models were trained on fp32 kernels only. A row in another
precision is priced in one of three ways (``mode``):

- ``TENSOR_CORE``: a GEMM or convolution that runs on tensor cores (fp16 /
  bf16 on a GPU with tensor cores for that dtype, or an fp32 matmul with TF32
  switched on) is priced from physics: the dtype's tensor-core peak per SM,
  128 x 128 output tiles run one per SM per wave (tile and wave quantisation,
  the reduction split where that fills the waves (``split_k``), K padded to
  the MMA k-step), the GPU's achievable fraction of peak (``tc_fraction``),
  slower fallback kernels when a dim breaks the alignment rule
  (``UNALIGNED_SLOWDOWN``; for a 16-bit GEMM with an odd dim, the align1
  kernels' own rate per SM clock, ``ALIGN1_FLOP_PER_SM_CLOCK``), and the
  bytes moved at the dtype's width against DRAM bandwidth, whichever is
  longer.
- ``AS_FP32``: a row the fp32 models price with rewritten dims and dtype fp32:
  a memory-bound kernel in a 2-byte dtype is priced as the fp32 kernel moving
  the same number of bytes (half the elements: read, written, FLOPs and the
  outer count halved, the row length kept); a bf16 GEMM on a GPU without bf16
  tensor cores (V100, T4, P100) is priced as the fp32 GEMM it is emulated by.
- ``AS_IS``: everything else, unchanged.

The achievable fraction of the tensor-core peak is the GPU's own where a
public measurement of its best matmul throughput exists (specs field
``tensor_core_matmul_fraction``, its source beside it): Stas Bekman's
"Maximum Achievable Matmul FLOPS" table (a search over shapes; A100 SXM
86.9 %, A100 PCIe 81.1 %, H100 SXM 80.3 %, B200 77.6 %, and AMD's MI300X
51.4 %, with ROCm's TunableOp) and the community
table github.com/zzc0721/torch-performance-test-data (best of square
``torch.mm``; H200 79.9 %, RTX A6000 79.7 %, L40S 74.3 %, T4 65.1 %, and
GeForce RTX 4090 100.8 % / RTX 3090 107.9 % of their rated peaks: GeForce
boards run above their rated boost clock, and their fp32-accumulate tensor
rate is half of the fp16-accumulate one, so the tensor cores are not what
limits their power). It is a property of the board (clock under a power
cap, tensor-core generation, the vendor's libraries), which no spec field
predicts well: over the ten NVIDIA boards, leaving each out, the median of
the others misses it by 10.4 % mean and a log-linear fit on board power per
tensor TFLOP/s by 10.4 % too, so a GPU without a measurement gets
``TC_FRACTION``, the median of the measured boards that are not GeForce
(0.80: sixteen values, the 5 Dec 2026 additions included: the same
script's runs posted in that repository's issues give the L4 58.6 %, a
72 W board under its power cap, the A10G 99.2 % of its half-rate rated
peak, the V100 SXM2 77.9 %, the A40 81.7 %, the RTX A4000 81.9 %; and
github.com/chsasank/device-benchmarks the 150 W A10 44.8 %, a cruder
method, single timed calls; a
GeForce board's fraction, 1.0-1.15 for the RTX 3080 Ti, 3090, 4070 SUPER,
4090 and 5090, is of its half-rate fp32-accumulate peak, another quantity),
unless a board of its chip (same architecture and SM count) was measured:
then it takes that twin's at the clock its own board power sustains, by the
cube-root rule of kernels.clocks (``predictor.hardware``: the RTX 6000 Ada
and the L40, 300 W, 0.710 and 0.714 from the 350 W L40S's 0.743; the V100
PCIe boards the V100 SXM2's). Tile and wave quantisation take shapes below it.
``UNALIGNED_SLOWDOWN`` is chosen by hand (not fitted to any label), and no
published figure gives it. What is published: the rule itself (NVIDIA, "Matrix
Multiplication Background User's Guide", section "Tensor Core Requirements",
and "Linear/Fully-Connected Layers User's Guide": dims divisible by 8 for
fp16/bf16 and 4 for TF32, i.e. 16-byte rows, run efficiently on tensor cores;
cuBLAS and cuDNN need 16-byte-aligned rows for their fastest kernels, cuBLAS
docs "Tensor Core Usage"); before cuBLAS 11.0 / cuDNN 7.6.3 other dims ran on
CUDA cores (4-16x below the tensor-core rate), from cuBLAS 11.0 on they run on
tensor cores with narrower loads, the gap shown only in figures (a V100
projection layer, vocabulary 33708 against 33712). One measured point the
other way: on an H100, an unaligned bf16 GEMM 8193x2501x5008 ran at 509
TFLOP/s against 502 padded (pytorch-labs/float8_experimental pull 145), no
penalty at that size. So the factor lies between 1 (recent libraries, large
GEMMs) and the tensor-core/CUDA-core ratio (old libraries); 2x is a round
value inside that range, kept until a per-GPU measurement replaces it. One did
for Hopper (``UNALIGNED_SLOWDOWN_HOPPER``, 3.1: an H200's unaligned vocabulary
GEMMs, torch 2.11 with CUDA 13), against the example above (an older torch
on an H100, an unaligned reduction of 2,501, no penalty): the newer
libraries' measurement, on the shapes models have, is the one kept.
"""

from __future__ import annotations

import math

from numba import njit

from predictor.kernels import layout as L
from predictor.kernels.clocks import power_limit_share
from predictor.kernels.roofline import (P_ETA_M, P_LAUNCH_US, P_TF32_CONV, P_TF32_MATMUL,
                                       SPLIT_K_MIN, column_or)
from predictor.kernels.work import flops_and_elems, gemm_shape, row_elem_bytes

AS_IS = 0
TENSOR_CORE = 1
AS_FP32 = 2

TC_FRACTION = 0.80
# A GeForce board's rated fp32-accumulate tensor peak is half of what its
# tensor cores do with fp16 accumulate, and the board boosts above its rated
# clock: its measured fraction is of another quantity, 1.0-1.15 (RTX 4090
# 1.008, 4070 SUPER 1.059, 3090 1.079, 3080 Ti 1.121, 5090 1.141; an RTX
# 2080 in the same table 0.97, Turing). A GeForce board without a
# measurement takes their median.
GEFORCE_TC_FRACTION = 1.079
# Float8 GEMMs reach a smaller fraction of their (twice as high) peak than
# 16-bit ones: the same table's FP8 (e4m3fn) rows against its BF16 rows give
# H100 SXM 70.9 / 80.3 % (0.88) and GH200 77.6 / 83.6 % (0.93), the only
# boards measured both ways; their mean, on every GPU's own 16-bit fraction.
FP8_FRACTION_RATIO = 0.9
UNALIGNED_SLOWDOWN = 2.0
# Hopper (compute capability 9.x) measured: on the H200, BERT-large's three
# masked-LM decoder GEMMs (8192 x 30522 x 1024 and its two gradients: 30,522
# is no multiple of 8), each timed alone in bf16 and fp16
# (benchmarks/data/h200/rows), ran 2.95-3.18x the aligned price (median
# 3.09), its aligned GEMMs of the same step within 0-10 % of theirs; the
# TF32 ones about as much. Hopper's aligned kernels load and store by TMA,
# which needs 16-byte rows, so an unaligned GEMM loses more there. Data-centre
# Blackwell (compute capability 10.x; 11.x is the same line's embedded part)
# feeds its tensor cores (tcgen05) the same way: CUTLASS's SM100 kernels are
# TMA-fed, and those for operands under 16-byte alignment use cp.async
# (NVIDIA/cutlass issue 2491, kernels added in CUTLASS 4.2), so it takes
# Hopper's factor. GeForce and workstation Blackwell (12.x) run warp-level
# MMA as Ampere and Ada do, and keep UNALIGNED_SLOWDOWN.
UNALIGNED_SLOWDOWN_HOPPER = 3.1
# A 16-bit GEMM with an odd dim in the rows the library reads (2-byte rows:
# a 50,257- or 267,735-word vocabulary) leaves no kernel that copies its
# operands asynchronously (cp.async moves 4, 8 or 16 bytes, TMA 16), and
# cuBLAS runs CUTLASS's Turing-generation kernel for such rows
# (`cutlass_75_tensorop_*_s1688gemm_*_align1`: mma.m16n8k8 fed by 2-byte
# loads through registers) on whatever GPU it is. Its throughput is its
# load path's, not the tensor cores': on an RTX 4090, bf16 torch.mm of
# squares of 2,055, 2,057, 2,071 and 2,073 ran that kernel at 115.6, 106.8,
# 110.9 and 112.0 TFLOP/s against 155.9 at 2,040 (pytorch/pytorch issue
# 181718), a median of 111.45 TFLOP/s over 128 SMs at the 2,520 MHz rated
# boost: 345.5 FLOP per SM per clock. Such a GEMM runs at the lesser of its
# aligned rate and that, so the slowdown grows with the tensor cores' rate
# per SM: 1.5x on the RTX 4090, about 5x on an A100, 9x on an H100.
ALIGN1_FLOP_PER_SM_CLOCK = 345.5
# Output tile of the tensor-core GEMM and convolution kernels, one resident per
# SM (cuBLAS/CUTLASS 128x128 and 128x256 tiles on Ampere and Hopper fill an
# SM's shared memory with their pipeline stages).
TC_TILE_M = 128
TC_TILE_N = 128
# Reduction step of one tile iteration: 32 elements of a 2-byte dtype, 16 of TF32,
# 64 of float8 (all 64 bytes).
K_STEP_16 = 32
K_STEP_TF32 = 16
K_STEP_8 = 64


@njit(cache=True)
def _is_gemm(family):
    return family == L.MATMUL or family == L.CONV or family == L.CONV_DGRAD \
        or family == L.CONV_WGRAD


@njit(cache=True)
def _memory_learned_family(family):
    return family == L.ELEMENTWISE or family == L.DROPOUT or family == L.COPY \
        or family == L.FILL or family == L.LOSS or family == L.OPTIMIZER \
        or family == L.UNSUPPORTED or family == L.SOFTMAX or family == L.SOFTMAX_BWD \
        or family == L.LAYER_NORM or family == L.LAYER_NORM_BWD


@njit(cache=True)
def rewrites(family, dtype_code, params):
    """Whether a row may be priced other than as it stands (on some GPU)."""
    if dtype_code == L.F16 or dtype_code == L.BF16 or dtype_code == L.F8:
        return _is_gemm(family) or _memory_learned_family(family)
    return dtype_code == L.F32 and family == L.MATMUL and params[P_TF32_MATMUL] > 0.5


@njit(cache=True)
def has_tf32(gpu):
    """Whether an fp32 matmul with TF32 allowed runs on tensor cores: NVIDIA
    compute capability 8.0 or newer. cuBLAS picks its TF32 tensor-core
    kernels by the math mode, not by comparing rates, so this holds on the
    boards whose TF32 rate only equals their fp32 one (GA10x and AD10x
    GeForce, A10G: the fp32-accumulate tensor rate is halved there, the
    FP32 lanes doubled). There the tensor cores still win: torch.mm of
    8000 x 8000 on an RTX 3090 Ti ran at 21 TFLOP/s in fp32, 33 in TF32 and
    66 in fp16 (github.com/bewantbe/busy-gemm-benchmark, README; 3070
    Laptop: 9.1 / 15.6 / 32.0), so TF32 reaches the same fraction of its
    rated peak as fp16 (0.83 and 0.82 of 40 and 80), where the FFMA loop
    reaches 0.52. (AMD rows have no compute capability: ROCm runs fp32 on
    its matrix cores whatever the switch, predictor.hardware.)"""
    tf32 = gpu[L.G_TF32_TFLOPS]
    return gpu[L.G_CC_MAJOR] >= 8.0 and tf32 > 0.0 and tf32 >= 0.95 * gpu[L.G_FP32_TFLOPS]


@njit(cache=True)
def tensor_core_peak(family, dtype_code, gpu, params):
    """Tensor-core FLOP/s of this row on this GPU; 0 when it does not run on
    tensor cores. A dtype has tensor cores when its peak is well above the
    CUDA cores' fp32 rate: fp16 at 4x or more (Volta on), or at 2x with bf16
    at 2x too (GA10x boards, whose fp32 rate is doubled); bf16 at 2x or more;
    TF32 on every NVIDIA GPU of compute capability 8.0 or newer
    (`has_tf32`); float8 at 2x or more (compute capability 8.9 on). P100's
    packed fp16 (2x, no bf16) is not a tensor core."""
    if not _is_gemm(family):
        return 0.0
    # Datasheets round their peaks (RTX 3090: fp16 71 against fp32 35.6), so
    # "2x" means at least 1.9x.
    fp32 = gpu[L.G_FP32_TFLOPS]
    twice = 1.9 * fp32
    if dtype_code == L.F16:
        p = gpu[L.G_FP16_TFLOPS]
        ok = p >= 4.0 * fp32 or (p >= twice and gpu[L.G_BF16_TFLOPS] >= twice)
    elif dtype_code == L.BF16:
        p = gpu[L.G_BF16_TFLOPS]
        ok = p >= twice
    elif dtype_code == L.F32 and family == L.MATMUL and params[P_TF32_MATMUL] > 0.5:
        p = gpu[L.G_TF32_TFLOPS]
        ok = p >= twice or has_tf32(gpu)
    elif dtype_code == L.F8:
        # A GPU without float8 has its fp32 rate there (predictor.hardware).
        p = gpu[L.G_FP8_TFLOPS]
        ok = p >= twice
    else:
        return 0.0
    return p * 1e12 if ok else 0.0


@njit(cache=True)
def is_layout_transpose(family, d):
    """A COPY row that is cuDNN's NCHW<->NHWC transpose around a convolution
    (dims[MEM_LAYOUT] set by predictor.families._layout_transposes)."""
    return family == L.COPY and d.shape[0] > L.MEM_LAYOUT and d[L.MEM_LAYOUT] > 0


@njit(cache=True)
def layout_transpose_runs(family, dtype_code, d, gpu, params):
    """Whether a row runs a kernel on this GPU: every row but a layout
    transpose of a convolution that does not run on tensor cores here (fp32
    and TF32 convolutions, which the fp32 models price from measured NCHW
    convolutions; half precision on a GPU without tensor cores for it). A
    transpose around a convolution priced as its implicit GEMM
    (L.LAYOUT_IMPLICIT_GEMM) runs in fp32 too where TF32 convolutions run
    on tensor cores: the H200's fp32 ResNet-50 step, TF32 convolutions by
    PyTorch's default, ran 151 nchwToNhwcKernel<float> and 65
    nhwcToNchwKernel<float> launches, 6.3 of its 60.7 ms
    (benchmarks/data/h200/profile)."""
    if not is_layout_transpose(family, d):
        return True
    if d[L.MEM_LAYOUT] == L.LAYOUT_IMPLICIT_GEMM and dtype_code == L.F32:
        return params[P_TF32_CONV] > 0.5 and has_tf32(gpu)
    return tensor_core_peak(L.CONV, dtype_code, gpu, params) > 0.0


@njit(cache=True)
def mode_of(family, dtype_code, gpu, params):
    """How a row is priced on a GPU (AS_IS, TENSOR_CORE, AS_FP32)."""
    if not rewrites(family, dtype_code, params):
        return AS_IS
    if _is_gemm(family):
        if tensor_core_peak(family, dtype_code, gpu, params) > 0.0:
            return TENSOR_CORE
        if dtype_code == L.BF16:
            return AS_FP32  # emulated through fp32 arithmetic
        return AS_IS
    if dtype_code == L.F16 or dtype_code == L.BF16 or dtype_code == L.F8:
        return AS_FP32
    return AS_IS


@njit(cache=True)
def fp32_dims(family, dtype_code, d, out):
    """Dims of the fp32 row the fp32 models price in place of `d` (AS_FP32)."""
    for j in range(d.shape[0]):
        out[j] = d[j]
    if _is_gemm(family):
        return
    width = row_elem_bytes(dtype_code)
    for j in (L.MEM_READ, L.MEM_WRITTEN, L.MEM_FLOPS, L.MEM_OUTER):
        out[j] = (d[j] * int(width) + 3) // 4


@njit(cache=True)
def tc_fraction(gpu):
    """The GPU's achievable fraction of its tensor-core peak: its measured
    one where the spec has it, else TC_FRACTION (a CPU's or an old
    calibration file's row has 0 there)."""
    return column_or(gpu, L.G_TC_FRACTION, TC_FRACTION)


@njit(cache=True)
def _cdiv(a, b):
    return (a + b - 1) // b


@njit(cache=True)
def unaligned_slowdown(gpu):
    """The factor on a tensor-core GEMM's time when a dim breaks the
    alignment rule: Hopper's measured one on the TMA-fed tensor cores
    (compute capability 9.x to 11.x), elsewhere UNALIGNED_SLOWDOWN."""
    return UNALIGNED_SLOWDOWN_HOPPER if tma_fed(gpu) else UNALIGNED_SLOWDOWN


@njit(cache=True)
def tma_fed(gpu):
    """Whether the GPU's tensor-core GEMMs take their operands by TMA, which
    needs 16-byte rows: Hopper (9.x) and data-centre Blackwell (10.x, 11.x)."""
    return 9.0 <= gpu[L.G_CC_MAJOR] < 12.0


@njit(cache=True)
def aligned(family, dtype_code, d):
    """Whether a GEMM's dims meet the tensor-core alignment rule: multiples of
    8 elements for fp16/bf16, 4 for TF32, 16 for float8 (16 bytes), in the leading dims the
    library reads: K and N (and M when A is a transposed view) for a matmul,
    the input and output channels per group for a convolution."""
    a = 4 if dtype_code == L.F32 else (16 if dtype_code == L.F8 else 8)
    if family == L.MATMUL:
        ok = d[3] % a == 0 and d[2] % a == 0
        if (int(d[L.GEMM_LAYOUT]) & L.GEMM_A_T) != 0:
            ok = ok and d[1] % a == 0
        return ok
    g = max(d[9], 1)
    return (d[1] // g) % a == 0 and (d[4] // g) % a == 0


@njit(cache=True)
def odd_dims(family, dtype_code, d):
    """(N, K, M) of a 16-bit GEMM where odd among the dims `aligned` checks
    (M only where A is a transposed view), else 0 each: its rows are aligned
    to 2 bytes only, which the align1 kernels of ALIGN1_FLOP_PER_SM_CLOCK
    serve. Matmuls only (cuDNN pads a convolution's odd channel counts
    itself), and not a matrix-vector product (M or N of 1), which cuBLAS
    runs as a GEMV, no tensor-core tiles, bound by its bytes."""
    if family != L.MATMUL or not (dtype_code == L.F16 or dtype_code == L.BF16) \
            or d[1] == 1 or d[2] == 1:
        return 0, 0, 0
    a_t = (int(d[L.GEMM_LAYOUT]) & L.GEMM_A_T) != 0
    return (d[2] if d[2] % 2 != 0 else 0, d[3] if d[3] % 2 != 0 else 0,
            d[1] if a_t and d[1] % 2 != 0 else 0)


@njit(cache=True)
def two_byte_rows(family, dtype_code, d):
    """Whether a 16-bit GEMM has an odd dim among those `aligned` checks
    (`odd_dims`)."""
    n, k, m = odd_dims(family, dtype_code, d)
    return n != 0 or k != 0 or m != 0


@njit(cache=True)
def cuda_cores_compete(family, dtype_code, d):
    """Whether the library's CUDA-core kernels stay candidates for a
    tensor-core row: an fp32 GEMM on TF32 tensor cores whose dims break the
    alignment rule (the row then costs the cheaper of the two prices). TF32
    is a permission, not an order (cuBLAS's CUBLAS_TF32_TENSOR_OP_MATH): the
    fp32 kernels remain in the heuristics' choice, and where the tensor cores
    lose their fast kernels they need not be the faster one. Two cases
    decide: on a GA102 or AD102 board the TF32 peak is the fp32 one, so the
    slowed tensor-core price of a large GEMM exceeds the fp32 kernels'; and a
    GEMV (N = 1) would otherwise be priced as 128 x 128 tensor-core tiles."""
    return dtype_code == L.F32 and not aligned(family, dtype_code, d)


@njit(cache=True)
def without_tf32(params):
    """`params` with fp32 matmuls on the CUDA cores (the FFMA kernels)."""
    p = params.copy()
    p[P_TF32_MATMUL] = 0.0
    return p


# Most slices split-K cuts one reduction into: of the NeuSight training
# files' split fp32 GEMMs (cuBLAS launches, grid z), 90 % take 7-23 slices
# and 99 % 25-72, per GPU.
SPLIT_K_MAX = 64


@njit(cache=True)
def split_k(tiles, sms, k, step, per_k, partial):
    """How many slices the library cuts a GEMM's reduction into: the count,
    up to SPLIT_K_MAX and at least SPLIT_K_MIN elements a slice, that
    finishes soonest when every slice of every output tile is a block, blocks
    run `sms` at a time, and a block costs `per_k` per reduction element
    (padded to the MMA k-step `step`) plus `partial` when the reduction is
    split (its fp32 partial sums written and read back).

    cuBLAS balances its waves so: in the NeuSight training files' fp32 GEMMs
    (their launch grids: output tiles and split-K), a GEMM of fewer output
    tiles than SMs and a reduction of 2,048 or more is split on 69-100 % of
    the rows per GPU, to a median 2-3 waves, and the last wave is 0.93-1.00
    full (median per GPU; P100 0.80) where one slice per tile would leave it
    0.40-0.56 full. This rule gives 0.99-1.00 on the same rows."""
    best = 1
    best_t = math.inf
    top = max(min(k // SPLIT_K_MIN, SPLIT_K_MAX), 1)
    for s in range(1, top + 1):
        t = sliced_us(tiles, sms, k, step, per_k, partial, s)
        if t < best_t * (1.0 - 1e-9):
            best = s
            best_t = t
    return best


@njit(cache=True)
def sliced_us(tiles, sms, k, step, per_k, partial, s):
    """The compute time of a GEMM's reduction cut into `s` slices, under
    `split_k`'s cost model."""
    k_slice = _cdiv(_cdiv(k, s), step) * step
    return _cdiv(tiles * s, sms) * (k_slice * per_k + (partial if s > 1 else 0.0))


@njit(cache=True)
def tf32_operand_copies_us(family, dtype_code, d, gpu, params):
    """The layout copies a TF32 GEMM pays for operands that are not K-major.

    The tensor cores' TF32 instructions read both operands K-major only
    (PTX ISA: `mma` with .tf32 takes A row-major and B column-major, and
    `ldmatrix`, which can transpose a tile on its way to the registers, moves
    16-bit elements only; Hopper's `wgmma` transposes in shared memory for
    .f16/.bf16 only), so a TF32 GEMM whose A is a transposed view (a weight
    gradient dY^T @ X, layout.GEMM_A_T) or whose B is row-major (x @ W,
    torch.bmm, layout GEMM_B_T unset) first copies that operand into K-major
    order: a read and a write of it in fp32 at the DRAM bandwidth, each.
    16-bit GEMMs transpose on the way and pay nothing. On the H200 (BERT-large
    b16 with TF32 matmuls, each row timed alone: benchmarks/data/h200/rows)
    the weight gradients, both operands not K-major, ran at 0.53-0.68 of the
    price without these copies and 0.95-1.05 with them. Batched GEMMs do not
    pay them: the same step's attention GEMMs, 256 of 512 x 512 x 64 in every
    layout, all took 90-101 us."""
    if family != L.MATMUL or dtype_code != L.F32:
        return 0.0
    bt, m, n, k = gemm_shape(family, d)
    if bt != 1 or m <= 0 or n <= 0 or k <= 0 or d.shape[0] <= L.GEMM_LAYOUT:
        return 0.0
    layout = int(d[L.GEMM_LAYOUT])
    nbytes = 0.0
    if layout & L.GEMM_A_T:
        nbytes += 2.0 * bt * m * k * 4.0
    if not layout & L.GEMM_B_T:
        nbytes += 2.0 * bt * k * n * 4.0
    return nbytes / (gpu[L.G_MEM_BW_GBS] * 1e9 * params[P_ETA_M + L.COPY]) * 1e6


@njit(cache=True)
def tensor_core_us(family, dtype_code, kernels, d, gpu, params, mlp):
    """Time of one execution of a tensor-core row (us); under a power limit
    at the clock it leaves (`mlp`: the weights whose clock records say it,
    kernels.clocks.power_limit_share)."""
    peak = tensor_core_peak(family, dtype_code, gpu, params)
    bt, m, n, k = gemm_shape(family, d)
    launch = kernels * params[P_LAUNCH_US]
    if bt <= 0 or m <= 0 or n <= 0 or k <= 0 or peak <= 0.0:
        return launch + 1e-3
    sms = max(int(gpu[L.G_SMS]), 1)
    tiles = bt * _cdiv(m, TC_TILE_M) * _cdiv(n, TC_TILE_N)
    step = K_STEP_TF32 if dtype_code == L.F32 else (K_STEP_8 if dtype_code == L.F8 else K_STEP_16)
    flops, elems = flops_and_elems(family, d)
    # The implicit GEMM of a strided convolution's dgrad counts more
    # multiply-adds than it does (predictor.kernels.work): scale to the op's own.
    gemm_flops = 2.0 * bt * m * n * k
    ratio = min(flops / gemm_flops, 1.0) if gemm_flops > 0.0 else 1.0
    share = power_limit_share(mlp, gpu)
    eff = tc_fraction(gpu) * (FP8_FRACTION_RATIO if dtype_code == L.F8 else 1.0) * share
    rate = peak / sms * eff  # FLOP/s of one SM
    if two_byte_rows(family, dtype_code, d):
        rate = min(rate, ALIGN1_FLOP_PER_SM_CLOCK * gpu[L.G_CLOCK_MHZ] * 1e6 * share)
    elif not aligned(family, dtype_code, d):
        rate /= unaligned_slowdown(gpu)
    # One tile's time per reduction element on one SM, and the time to write
    # its fp32 partial sums and read them back when the reduction is split.
    per_k = 2.0 * TC_TILE_M * TC_TILE_N * ratio / rate * 1e6
    partial = 2.0 * TC_TILE_M * TC_TILE_N * 4.0 / (gpu[L.G_MEM_BW_GBS] * 1e9 / sms) * 1e6
    t_c = sliced_us(tiles, sms, k, step, per_k, partial,
                    split_k(tiles, sms, k, step, per_k, partial))
    width = 4.0 if dtype_code == L.F32 else row_elem_bytes(dtype_code)
    t_m = elems * width / (gpu[L.G_MEM_BW_GBS] * 1e9 * params[P_ETA_M + family]) * 1e6
    return max(t_c, t_m) + tf32_operand_copies_us(family, dtype_code, d, gpu, params) + launch
