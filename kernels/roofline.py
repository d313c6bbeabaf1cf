"""The analytical per-op time model: roofline with wave quantization.

    t = max(FLOPs / (peak * eta_c * util), bytes / (bw * eta_m * util_m)) + kernels * launch

`util` is the fraction of the GPU's thread-block slots the last wave keeps busy
(Habitat's wave quantization): a kernel of N blocks on a GPU with W slots runs
ceil(N / W) waves, so util = N / (ceil(N / W) * W). A memory-bound kernel too
small to fill the GPU cannot reach full bandwidth either, but a few blocks per
SM already saturate it, so its utilisation is that of `MEM_SATURATION` x the
slots.

All functions take a GPU as one row of the feature matrix (columns in
``layout``) and the model parameters as a flat array (``P_*`` indices), so that
fitting them (``predictor.calibration``) needs no recompilation.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from predictor.kernels import layout as L
from predictor.kernels.work import flops_and_elems, gemm_shape, row_elem_bytes, thread_blocks

# Smallest slice of the reduction dim one split-K block takes.
SPLIT_K_MIN = 256

# ---- parameter vector layout ---------------------------------------------------
# eta_c per family, then eta_m per family, then scalars.
P_ETA_C = 0
P_ETA_M = L.N_FAMILIES
P_LAUNCH_US = 2 * L.N_FAMILIES          # GPU-side cost of one kernel launch
P_TF32_MATMUL = P_LAUNCH_US + 1         # 1.0: fp32 matmuls use TF32 tensor cores
P_TF32_CONV = P_LAUNCH_US + 2           # 1.0: fp32 convolutions use TF32 (cuDNN default)
P_MEM_SATURATION = P_LAUNCH_US + 3      # fraction of block slots that saturates DRAM
N_PARAMS = P_LAUNCH_US + 4

# GPU-side cost of one kernel launch (us), the default of params[P_LAUNCH_US]:
# chosen by hand in 7a15b7e (the first commit), not fitted. A CPU calibration
# replaces it with the CPU's measured per-op cost (predictor.calibrated);
# benchmarks/e2e.py --fit-overhead subtracts it as the GPU's share when it
# fits the host's launch cost.
LAUNCH_US = 2.5


def default_params() -> np.ndarray:
    """Efficiencies and overheads of the analytical baseline.

    Every value here was chosen by hand in 7a15b7e (the first commit), not
    fitted to measurements: the efficiencies are round figures for the rule
    of thumb that cuBLAS/cuDNN reach 60-80 % of peak on large problems and
    elementwise kernels 70-85 % of DRAM bandwidth, lowered for kernels known
    to run further from peak (attention, weight gradients, embedding
    backward's scattered adds). Recurrent layers are priced as the kernels
    cuDNN runs for them (kernels.recurrent), not here. For the families a learned model
    serves (``predictor.kernels.features.group_of``) the shipped weights'
    efficiencies replace these. The TF32 switches are PyTorch's defaults
    (cited below)."""
    p = np.empty(N_PARAMS)
    p[P_ETA_C:P_ETA_C + L.N_FAMILIES] = 0.7
    p[P_ETA_M:P_ETA_M + L.N_FAMILIES] = 0.75
    for fam, eta in ((L.ATTENTION, 0.45), (L.ATTENTION_BWD, 0.35), (L.CONV_WGRAD, 0.6)):
        p[P_ETA_C + fam] = eta
    for fam, eta in ((L.EMBEDDING_BWD, 0.3), (L.OPTIMIZER, 0.8), (L.COPY, 0.7),
                     (L.REDUCTION, 0.65), (L.SOFTMAX_BWD, 0.7), (L.LAYER_NORM_BWD, 0.6)):
        p[P_ETA_M + fam] = eta
    p[P_LAUNCH_US] = LAUNCH_US
    p[P_TF32_MATMUL] = 0.0  # torch.backends.cuda.matmul.allow_tf32 is False by default
    p[P_TF32_CONV] = 1.0    # torch.backends.cudnn.allow_tf32 is True by default
    p[P_MEM_SATURATION] = 0.25  # by hand in 7a15b7e, not fitted
    return p


# The share of issue slots a register-blocked SGEMM inner loop gives its
# FFMAs, where nothing but the FFMAs is left to co-issue with. cuBLAS's fp32
# GEMMs keep an 8 x 8 accumulator tile per thread: per k-step 64 FFMA and 4
# LDS.128 (8 values of A, 8 of B), and per 8-deep k-tile 2 LDG.128 and 2
# STS.128 (the next tile, 2,048 values over 256 threads), a BAR.SYNC and
# about 8 integer and branch instructions of address and loop control: 512
# FFMA in 557 instructions. An SM partition whose scheduler feeds 32 FP32
# lanes from one issue slot a cycle (GA10x, AD10x, Hopper, Blackwell: 128
# FP32 lanes per SM, compute capability 8.6 and later) completes a warp's
# FFMA every cycle, so every other instruction takes an FFMA's slot: at most
# 512 / 557 of the peak. Where it feeds 16 lanes (Volta, Turing, GA100: 64
# lanes per SM) an FFMA holds the lanes two cycles and the rest issue in
# between; Maxwell and Pascal dual-issue a memory instruction beside an FFMA.
# Derived from the instruction count, not fitted: none of the five GPUs of
# the per-kernel training data is of that kind (predictor.hardware sets it).
FFMA_ISSUE_SHARE = 512.0 / 557.0


@njit(cache=True)
def column_or(gpu, col, default):
    """A GPU row's column `col`, or `default` where the row predates the
    column (an old calibration file's) or holds 0 there (a CPU's row)."""
    f = gpu[col] if gpu.shape[0] > col else 0.0
    return f if f > 0.0 else default


@njit(cache=True)
def ffma_issue(gpu):
    """The GPU's G_FFMA_ISSUE (1 where the row has none)."""
    return column_or(gpu, L.G_FFMA_ISSUE, 1.0)


@njit(cache=True)
def peak_flops(gpu, family, dtype_code, params):
    """Peak FLOP/s this row can use on this GPU (TF32 per PyTorch's defaults)."""
    tc_family = family == L.MATMUL or family == L.CONV or family == L.CONV_DGRAD \
        or family == L.CONV_WGRAD or family == L.ATTENTION or family == L.ATTENTION_BWD \
        or family == L.LSTM or family == L.LSTM_BWD
    if not tc_family:
        if dtype_code == L.F64:
            return gpu[L.G_FP64_TFLOPS] * 1e12
        return gpu[L.G_FP32_TFLOPS] * 1e12
    # Half-precision GEMMs on GPUs without fast fp16 (P4) run with fp32 math.
    if dtype_code == L.F16:
        return max(gpu[L.G_FP16_TFLOPS], gpu[L.G_FP32_TFLOPS]) * 1e12
    if dtype_code == L.BF16:
        return max(gpu[L.G_BF16_TFLOPS], gpu[L.G_FP32_TFLOPS]) * 1e12
    if dtype_code == L.F8:
        return gpu[L.G_FP8_TFLOPS] * 1e12
    if dtype_code == L.F64:
        return gpu[L.G_FP64_TFLOPS] * 1e12
    conv = family == L.CONV or family == L.CONV_DGRAD or family == L.CONV_WGRAD \
        or family == L.LSTM or family == L.LSTM_BWD
    use_tf32 = params[P_TF32_CONV] > 0.5 if conv else params[P_TF32_MATMUL] > 0.5
    if use_tf32:
        return max(gpu[L.G_TF32_TFLOPS], gpu[L.G_FP32_TFLOPS]) * 1e12
    # fp32 on the CUDA cores: an FFMA loop, at most the share it can issue.
    return gpu[L.G_FP32_TFLOPS] * 1e12 * ffma_issue(gpu)


@njit(cache=True)
def is_gemm(family):
    return family == L.MATMUL or family == L.CONV or family == L.CONV_DGRAD \
        or family == L.CONV_WGRAD


@njit(cache=True)
def wave_utilisation(blocks, slots):
    """Fraction of `slots` busy averaged over ceil(blocks / slots) waves (1 when
    there is nothing to schedule: an empty GEMM, e.g. a grouped conv row whose
    channels per group round down to 0, would otherwise divide 0 by 0)."""
    if slots <= 0 or blocks <= 0:
        return 1.0
    waves = (blocks + slots - 1) // slots
    return blocks / (waves * slots)


@njit(cache=True)
def block_slots(gpu, per_sm_cap, threads):
    """Thread blocks resident at once on the whole GPU."""
    by_threads = gpu[L.G_MAX_THREADS_SM] // threads
    per_sm = min(per_sm_cap, by_threads, gpu[L.G_MAX_BLOCKS_SM])
    return max(int(per_sm), 1) * int(gpu[L.G_SMS])


# Batch norm in training, channels-first (NCHW): the per-channel statistics
# run one thread block per channel. PyTorch's kernels
# (aten/src/ATen/native/cuda/Normalization.cuh: batch_norm_collect_statistics
# and batch_norm_backward, MAX_BLOCK_SIZE = 512 threads) and cuDNN's NCHW
# kernels (bn_fw_tr_1C11 / bn_bw_1C11) both walk a channel's N x H x W
# elements with one block, each thread issuing one load and waiting for it
# before the next step of its running sum. With C blocks on the GPU, a pass
# over the tensor lasts ceil(C / resident blocks) x ceil(N H W / 512) such
# steps, whatever the GPU's bandwidth: ResNet-50's first layer (C = 64, 1.6 M
# elements per channel at batch 128) keeps under half of an H200's SMs busy
# for 3,136 dependent steps. Channels-last tensors are reduced across many
# blocks per channel and are not bound this way.
BN_CHANNEL_THREADS = 512
# One dependent step of a channel's pass (a DRAM round trip and the running
# sum's update), us. Set from the H200's measured kernels of a ResNet-50
# training step at batch 128 (benchmarks/data/h200/profile: the summed time of
# each kernel kind over the steps its 53 layers take): PyTorch's statistics
# kernel 0.50, its backward 0.57 per pass, cuDNN's forward 0.45, its backward
# 0.46 per pass. One round figure for all four; the same on every GPU (DRAM
# latency is a few hundred ns on all of them), an assumption the published
# ResNet-50 figures of other GPUs check (benchmarks/README.md).
BN_STEP_US = 0.5


@njit(cache=True)
def per_channel_batch_norm_us(family, dtype_code, d, gpu, t_stream):
    """A batch-norm row's time without its launches, given `t_stream`, its time
    at the bandwidth its bytes get (the roofline): where its per-channel passes
    take longer, they set it (see BN_CHANNEL_THREADS).

    - Forward in bf16: PyTorch's own kernels (cuDNN's are not used for bf16):
      the statistics kernel (one read of the tensor, a third of the row's
      bytes) is one per-channel pass; the normalising kernel streams.
    - Forward in fp32 or fp16 (cuDNN, the autocast case): one kernel that
      computes and applies the statistics, one per-channel pass.
    - Backward: one kernel per channel for the reduction and the input
      gradient, two per-channel passes.

    Unchanged: inference (the forward reads its input once), channels-last
    rows (dims[MEM_LAYOUT] = 1), and devices other than NVIDIA GPUs (no
    compute capability: a CPU's row, an AMD GPU's, whose MIOpen and ROCm
    kernels the measurements above do not describe)."""
    if family != L.BATCH_NORM and family != L.BATCH_NORM_BWD:
        return t_stream
    if d.shape[0] > L.MEM_LAYOUT and d[L.MEM_LAYOUT] > 0:
        return t_stream
    if family == L.BATCH_NORM and d[L.MEM_READ] < 2 * d[L.MEM_WRITTEN]:
        return t_stream
    if column_or(gpu, L.G_CC_MAJOR, 0.0) <= 0.0:
        return t_stream
    slots = block_slots(gpu, 32, BN_CHANNEL_THREADS)
    channels = max(d[L.MEM_OUTER], 1)
    steps = ((channels + slots - 1) // slots) \
        * ((max(d[L.MEM_INNER], 1) + BN_CHANNEL_THREADS - 1) // BN_CHANNEL_THREADS)
    t_pass = steps * BN_STEP_US
    if family == L.BATCH_NORM_BWD:
        return max(t_stream, 2.0 * t_pass)
    if dtype_code == L.BF16:
        return t_stream + max(0.0, t_pass - t_stream / 3.0)
    return max(t_stream, t_pass)


# PyTorch's non-vectorised elementwise kernels (layout.MEM_GENERIC) handle one
# element per thread per step, and the work per element (a stride walk over
# every dim for both tensors, or a switch on both dtypes) is what bounds them
# on a GPU whose DRAM outruns its SMs, not the bytes. Elements per SM per
# clock cycle (boost clock), from the H200's measured kernels of a BERT-large
# bf16 autocast training step at batch 16 (benchmarks/data/h200/profile:
# each kernel kind's summed time against the elements of the traced rows it
# runs): the strided copies of the attention heads
# (`elementwise_kernel<128, 4>` over `direct_copy_kernel_cuda`, 192 of them,
# 1.61 G elements in 6.18 ms) 1.00; the bf16 -> fp32 casts
# (`unrolled_elementwise_kernel` with `LoadWithCast`, 446, 4.64 G elements in
# 14.29 ms) 1.24. The bytes alone would have them at 0.11 and 0.40 of the
# H200's DRAM bandwidth. On another architecture the same bound shows: the
# A100's fp32 `contiguous()` copies of the attention heads in the dataset's
# per-node files reach 0.98-1.00 elements per SM per clock at their largest
# (GPT-3 XL and OPT-1.3B at batch 8). On boards with fewer bytes of DRAM
# bandwidth per SM cycle (GDDR boards, the V100) the bytes bind first.
STRIDED_COPY_ELEMS_PER_SM_CLOCK = 1.0
CAST_COPY_ELEMS_PER_SM_CLOCK = 1.24
# The same unrolled kernel for a binary op with both inputs loaded through
# `LoadWithCast` (an fp32 + bf16 add): the same profile's 48 residual adds of
# BERT-large's layers (`CUDAFunctor_add<float>` with `LoadWithCast<2>`,
# 403 M elements in 1.66 ms) 0.93.
CAST_BINARY_ELEMS_PER_SM_CLOCK = 0.93


# ATen's NCHW max-pool kernels walk the pooling windows element by element,
# so their time follows the window elements visited (outputs x kernel area,
# layout.MEM_WINDOW_ELEMS), not the bytes. From the H200's measured kernels of
# ResNet-50 training steps at batch 128 (benchmarks/data/h200/profile: one
# 3x3 stride-2 pool over 128 x 64 x 112 x 112, 231 M window elements; the
# same in bf16 and fp32, as neither direction is bound by its bytes):
# - forward, one thread per output (`max_pool_forward_nchw`, 0.418 / 0.406 ms
#   bf16 / fp32): 2.15 window elements per SM per clock cycle (boost clock),
#   where the bytes alone would take 0.10-0.15 ms.
# - backward, one thread per input element checking the saved indices of
#   every window that covers it (`max_pool_backward_nchw`, 1.140 / 1.152 ms):
#   23.8 bytes per window element at the board's DRAM bandwidth. Scaled by
#   the bandwidth and not by the SMs because two other boards agree so:
#   an A100's 32 x 64 x 112 x 112 pool takes 852 us backward (the PyTorch
#   column of Oneflow-Inc/oneflow pull 7426; 884 priced this way, 492 by the
#   H200's rate per SM clock), a Titan V's 3 x 3 stride-3 pools about 2.9 ms
#   in fp32 and fp16 alike (pytorch/pytorch pull 42182's benchmark, less the
#   gradient accumulation it also timed; 3.7 this way, 1.1 per SM clock).
MAX_POOL_FWD_WINDOW_ELEMS_PER_SM_CLOCK = 2.15
MAX_POOL_BWD_BYTES_PER_WINDOW_ELEM = 23.8


# The families whose rows can carry a kernel kind in dims[MEM_GENERIC]
# (layout.py): copies, elementwise ops and pooling.
GENERIC_KERNEL_FAMILIES = (L.COPY, L.ELEMENTWISE, L.POOL, L.POOL_BWD)


@njit(cache=True)
def runs_generic_kernel(family):
    """Whether rows of `family` can carry a kernel kind (GENERIC_KERNEL_FAMILIES)."""
    return family in GENERIC_KERNEL_FAMILIES


@njit(cache=True)
def generic_kernel_us(family, d, gpu, t_stream, clock_share):
    """A copy, elementwise or pooling row's time without its launches, given
    `t_stream`, its time at the bandwidth its bytes get: where PyTorch runs it
    with a non-vectorised kernel (dims[MEM_GENERIC]), never faster than its
    elements at that kernel's rate per SM clock (a max pool's backward: its
    window elements' bytes at the DRAM bandwidth), the clock being the boost
    clock times `clock_share` (what a power limit leaves of it: kernels.
    clocks.power_limit_share; 1 without one). Unchanged: every other
    row, and devices other than NVIDIA GPUs (no compute capability), whose
    kernels the measurements above do not describe."""
    if not runs_generic_kernel(family) or d.shape[0] <= L.MEM_GENERIC:
        return t_stream
    kind = d[L.MEM_GENERIC]
    if kind <= 0.0 or column_or(gpu, L.G_CC_MAJOR, 0.0) <= 0.0:
        return t_stream
    if family == L.POOL or family == L.POOL_BWD:
        if kind != L.MAX_POOL_NCHW or d.shape[0] <= L.MEM_WINDOW_ELEMS:
            return t_stream
        window = max(d[L.MEM_WINDOW_ELEMS], 1.0)
        if family == L.POOL:
            t_walk = window / (MAX_POOL_FWD_WINDOW_ELEMS_PER_SM_CLOCK * gpu[L.G_SMS]
                               * gpu[L.G_CLOCK_MHZ] * clock_share)
        else:  # GB/s x 1e3 = bytes per us
            t_walk = window * MAX_POOL_BWD_BYTES_PER_WINDOW_ELEM / (gpu[L.G_MEM_BW_GBS] * 1e3)
        return max(t_stream, t_walk)
    rate = CAST_COPY_ELEMS_PER_SM_CLOCK
    if kind == L.COPY_STRIDED:
        rate = STRIDED_COPY_ELEMS_PER_SM_CLOCK
    elif kind == L.CAST_BINARY:
        rate = CAST_BINARY_ELEMS_PER_SM_CLOCK
    elems = max(d[L.MEM_INNER], 1.0) * max(d[L.MEM_OUTER], 1.0)
    t_elems = elems / (rate * gpu[L.G_SMS] * gpu[L.G_CLOCK_MHZ] * clock_share)  # MHz: per us
    return max(t_stream, t_elems)


@njit(cache=True)
def op_time_us(family, dtype_code, kernels, d, gpu, params):
    """Time of one execution of a row, microseconds (the analytical model)."""
    flops, elems = flops_and_elems(family, d)
    nbytes = elems * row_elem_bytes(dtype_code)
    blocks, per_sm, threads = thread_blocks(family, d)
    slots = block_slots(gpu, per_sm, threads)
    if is_gemm(family) and blocks < slots:
        # cuBLAS/cuDNN split a long reduction across blocks (split-K) when the
        # output tiles alone cannot fill the GPU (weight gradients, skinny GEMMs).
        k = gemm_shape(family, d)[3]
        blocks *= max(min(slots // blocks, k // SPLIT_K_MIN), 1)
    util = wave_utilisation(blocks, slots)
    util_m = min(1.0, blocks / max(params[P_MEM_SATURATION] * slots, 1.0))
    t_c = 0.0
    if flops > 0.0:
        t_c = flops / (peak_flops(gpu, family, dtype_code, params)
                       * params[P_ETA_C + family] * util) * 1e6
    t_m = nbytes / (gpu[L.G_MEM_BW_GBS] * 1e9 * params[P_ETA_M + family] * util_m) * 1e6
    return max(t_c, t_m) + kernels * params[P_LAUNCH_US]
