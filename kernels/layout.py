"""Integer codes shared by the Python side and the numba kernels.

Numba freezes module-level integers at compile time, so the kernels can switch on
these codes as cheaply as on literals. The Python side (the op-family registry,
the spec loader) uses the same names, so a code is defined exactly once.
"""

# ---- op families -----------------------------------------------------------
# Each family fixes what the columns of an OpTable row's `dims` mean.
#   GEMM-like:   matmul      dims = [B, M, N, K, layout]  (C[M,N] = A[M,K] @ B[K,N];
#                layout = GEMM_A_T | GEMM_B_T: which operands are transposed views)
#   convolution: conv*       dims = [N, C, H, W, K, R, S, P, Q, groups, stride, dilation]
#                (dilation: the filter's largest dilation where above 1, else 0)
#   attention:   attention*  dims = [B, heads, Sq, Sk, D, Dv, causal, 0...]
#   recurrent:   lstm*       dims = [T, B, I, H, gates, 0...] (one layer, one
#                direction; gates: 4 LSTM, 3 GRU, 1 plain RNN; 0 reads as 4)
#   memory-bound families    dims = [read, written, flops, inner, outer, layout]
#       (element counts; `inner` is the length of the reduced/normalised row)
MATMUL = 0
CONV = 1
CONV_DGRAD = 2
CONV_WGRAD = 3
ATTENTION = 4
ATTENTION_BWD = 5
LSTM = 6
LSTM_BWD = 7
ELEMENTWISE = 8
REDUCTION = 9
SOFTMAX = 10
SOFTMAX_BWD = 11
LAYER_NORM = 12
LAYER_NORM_BWD = 13
BATCH_NORM = 14
BATCH_NORM_BWD = 15
EMBEDDING = 16
EMBEDDING_BWD = 17
POOL = 18
POOL_BWD = 19
DROPOUT = 20
LOSS = 21
OPTIMIZER = 22
COPY = 23
FILL = 24
UNSUPPORTED = 25
N_FAMILIES = 26

FAMILY_NAMES = (
    "matmul", "conv", "conv_dgrad", "conv_wgrad", "attention", "attention_bwd",
    "lstm", "lstm_bwd", "elementwise", "reduction", "softmax", "softmax_bwd",
    "layer_norm", "layer_norm_bwd", "batch_norm", "batch_norm_bwd", "embedding",
    "embedding_bwd", "pool", "pool_bwd", "dropout", "loss", "optimizer", "copy",
    "fill", "unsupported",
)
assert len(FAMILY_NAMES) == N_FAMILIES

# GEMM operand layout flags (dims[4] of a matmul row). cuBLAS picks different
# kernels per layout: F.linear's x @ W^T is GEMM_B_T, torch.bmm / addmm of
# contiguous operands is 0 (both row-major), a weight gradient dY^T @ X GEMM_A_T.
GEMM_A_T = 1
GEMM_B_T = 2
GEMM_LAYOUT = 4

# Memory-bound dims layout (families ELEMENTWISE and later).
MEM_READ = 0
MEM_WRITTEN = 1
MEM_FLOPS = 2
MEM_INNER = 3
MEM_OUTER = 4
# dims[5] of a COPY row: 1 when the row is a layout transpose cuDNN runs around
# a convolution whose tensors are NCHW (PyTorch's default memory format): its
# tensor-core kernels are NHWC, so it converts the input and filter
# (nchwToNhwc) and the output back (nhwcToNchw). Priced only on a GPU where
# the convolution runs on tensor cores (predictor.kernels.precision). 2
# (LAYOUT_IMPLICIT_GEMM): the same around an fp32 convolution priced as its
# implicit GEMM (kernels.work.as_implicit_gemm), which also runs on TF32
# tensor cores where cuDNN may use them.
# dims[5] of a BATCH_NORM / BATCH_NORM_BWD row: 1 when its input is
# channels-last (kernels.roofline.per_channel_batch_norm_us prices an NCHW
# one's per-channel passes).
MEM_LAYOUT = 5
LAYOUT_IMPLICIT_GEMM = 2
# dims[6] of a COPY or ELEMENTWISE row: which of PyTorch's elementwise
# kernels runs it, where that is not the vectorised one
# (kernels.roofline.generic_kernel_us prices them by elements, not bytes):
# - COPY_STRIDED: a copy between two layouts (`x.permute(...).contiguous()`,
#   an ONNX Transpose that moves more than the last two axes). TensorIterator
#   cannot coalesce it into one contiguous run, so ATen launches its generic
#   kernel (`elementwise_kernel<128, 4>`), which computes every element's
#   input and output offsets from the strides, one element a thread at a time.
# - COPY_CAST: a contiguous dtype conversion other than fp32 -> fp16/bf16
#   (those two have vectorised kernels of their own): the unrolled kernel
#   with `LoadWithCast` / `StoreWithCast`, one element at a time through a
#   switch on the dtypes.
# - CAST_BINARY: an elementwise op whose floating operands differ in dtype
#   (an fp32 + bf16 add under autocast): the same unrolled kernel, each
#   input loaded through `LoadWithCast`.
MEM_GENERIC = 6
COPY_STRIDED = 1
COPY_CAST = 2
CAST_BINARY = 3
# dims[6] of a POOL / POOL_BWD row: MAX_POOL_NCHW when ATen's NCHW max-pool
# kernels run it (`max_pool_forward_nchw`, `max_pool_backward_nchw`: one
# thread per output, or per input, walking the pooling windows; a
# channels-last input runs the NHWC kernels and is not flagged), and
# dims[MEM_WINDOW_ELEMS] the window elements they visit (outputs x kernel
# area, the same count in both directions). Priced by that count, not the
# bytes (kernels.roofline.generic_kernel_us).
MAX_POOL_NCHW = 4
MEM_WINDOW_ELEMS = 7

MAX_DIMS = 12
# The convolution dims' dilation column (0: undilated).
CONV_DILATION = 11

# ---- phases ------------------------------------------------------------------
FORWARD = 0
BACKWARD = 1
OPTIMIZER_PHASE = 2
PHASE_NAMES = ("forward", "backward", "optimizer")

# ---- dtypes ------------------------------------------------------------------
F32 = 0
F16 = 1
BF16 = 2
F64 = 3
I64 = 4
I32 = 5
I8 = 6
BOOL = 7
F8 = 8
DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "bool", "float8")
DTYPE_BYTES = (4, 2, 2, 8, 8, 4, 1, 1, 1)

# ---- GPU feature columns (one row per GPU, float64) --------------------------
G_SMS = 0
G_CLOCK_MHZ = 1
G_MEM_BW_GBS = 2
G_L2_MB = 3
G_FP32_TFLOPS = 4
G_TF32_TFLOPS = 5
G_FP16_TFLOPS = 6
G_BF16_TFLOPS = 7
G_FP64_TFLOPS = 8
G_MAX_THREADS_SM = 9
G_MAX_BLOCKS_SM = 10
G_REGS_SM = 11
G_SMEM_SM_KB = 12
G_MEMORY_GB = 13
G_FP8_TFLOPS = 14
G_TDP_W = 15
# Which chip the GPU is (architecture and SM count, hashed to an exact integer;
# 0: none known). Boards of one chip share the op models' per-chip corrections
# (see predictor.kernels.mlp.chip_correction); no model reads it as a feature.
G_CHIP = 16
# Best measured tensor-core matmul throughput over the dense fp16/bf16 peak
# (specs field tensor_core_matmul_fraction); 0: not measured, the kernels use
# precision.TC_FRACTION.
G_TC_FRACTION = 17
# The share of the FP32 peak a GEMM's FFMA inner loop can issue on this SM
# (roofline.FFMA_ISSUE_SHARE where one scheduler feeds 32 FP32 lanes, else 1;
# set by predictor.hardware; 0 in an old row: read as 1).
G_FFMA_ISSUE = 18
# Compute capability major (6 Pascal, 7 Volta/Turing, 8 Ampere/Ada, 9 Hopper;
# 0: none, e.g. AMD or a CPU): the GEMM tile rule (kernels.tiles) keys its
# per-architecture choices on it.
G_CC_MAJOR = 19
# 1 where the SM predates Volta (NVIDIA compute capability below 7.0: Pascal
# and older): global loads bypass the L1 by default and integer address
# arithmetic takes the FP32 pipe's issue slots; from Volta on the L1 is one
# array with shared memory and caches global loads, and an INT32 pipe sits
# beside the FP32 one. 0 for Volta and later, AMD, a CPU, and a row without
# the column. The softmax and layer-norm networks read it (kernels.features).
G_PRE_VOLTA = 20
# The power limit the board runs under, watts (`nvidia-smi -pl`; set by
# predictor.hardware.power_limited for a name such as "H100-SXM5-80GB@500W");
# 0: none, the board at its rated power (G_TDP_W). The SM clock falls under a
# limit, and compute with it (kernels.clocks.power_limit_share).
G_POWER_LIMIT_W = 21
N_GPU_FEATURES = 22

# ---- basis of a per-op time ----------------------------------------------------
BASIS_ANALYTICAL = 0
BASIS_LEARNED = 1
BASIS_CALIBRATED = 2
BASIS_NAMES = ("analytical", "learned", "calibrated")
