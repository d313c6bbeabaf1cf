"""Peak GPU memory of one training iteration: the memory *model*.

The traced step's storages and their liveness are a
:class:`~predictor.optable.MemoryProfile` (built by the frontend's memory
pass, ``predictor.frontend.memory_pass``): each storage holds ``coef *
b**power`` elements at batch ``b``, so the tensor peak at any batch size is
exact without retracing. The sweep over batch sizes is a numba kernel
(``predictor.kernels.memory``). This module prices a profile on a GPU.

On top of the tensors, the device holds what PyTorch never shows as tensors:

- the caching allocator's rounding (512-byte blocks, 2 MiB segments);
- the CUDA context: ``CUDA_CONTEXT_BYTES`` = 500 MiB. With CUDA >= 11.7's lazy
  module loading (PyTorch's default) a bare context takes ~300-430 MiB: "around
  400MB" (pytorch/pytorch#109888), 426 MiB measured on an RTX 6000 Ada with
  torch 2.10 / CUDA 13 (unslothai/unsloth-zoo#1053); the remaining ~75 MiB is an
  allowance for the cuBLAS/cuDNN kernels a training step loads lazily;
- cuBLAS workspaces: PyTorch's default per (handle, stream) is 4096 KiB x 2 +
  16 KiB x 8 = 8.125 MiB, 32 MiB on compute capability 9.x / 10.x / 12.x
  (``parseChosenWorkspaceSize`` in ATen's CublasHandlePool.cpp); ROCm 32 MiB,
  128 MiB on gfx94x/gfx95x. A training step holds two: the forward runs on the
  Python thread, the backward on autograd's device thread, each with its own
  handle.

Memory is reported in GiB (2**30 bytes); a GPU's ``memory_gb`` is read the
same way (GPU memory is marketed in binary units: an "80GB" A100 reports
81920 MiB). What the driver keeps for itself (ECC, reserved pages) and the
allocator's fragmentation are why a configuration must stay below a fraction
of the memory (``max_memory_fraction``, 0.9 by default) to count as fitting.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from predictor import dtypes, hardware
from predictor.errors import InvalidArgumentError
# The profile and its categories live beside the Graph that carries them; they
# are named here too because the memory model speaks of them (and graphs saved
# before they moved name predictor.memory:MemoryProfile).
from predictor.optable import (  # noqa: F401
    ACTIVATIONS, BUFFERS, CATEGORY_NAMES, GRADIENTS, INPUTS, OPTIMIZER_STATE, PARAMETERS,
    TEMPORARIES, WORKSPACE, MemoryProfile,
)

GiB = float(1 << 30)
MiB = 1 << 20

CUDA_CONTEXT_BYTES = 500 * MiB
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8      # pre-Hopper NVIDIA
CUBLAS_WORKSPACE_BYTES_LARGE = 4096 * 8 * 1024                 # sm 9.x, 10.x, 12.x; ROCm
CUBLAS_WORKSPACE_BYTES_MI300 = 128 * MiB                       # gfx94x / gfx95x
# cuDNN convolution workspace: min(largest operand, this) (an assumption, not measured).
CUDNN_WORKSPACE_CAP = 256 * MiB
# DDP's default bucket size (torch.nn.parallel.DistributedDataParallel bucket_cap_mb).
DDP_BUCKET_BYTES = 25 * MiB
DEFAULT_MAX_MEMORY_FRACTION = 0.9


# ------------------------------------------------------ device-level memory --

def cublas_workspace_bytes(gpu) -> int:
    """PyTorch's default cuBLAS (hipBLAS) workspace per handle on `gpu`."""
    spec = getattr(gpu, "spec", {}) or {}
    cc = str(spec.get("compute_capability", ""))
    if getattr(gpu, "vendor", "nvidia") == "amd":
        return CUBLAS_WORKSPACE_BYTES_MI300 if cc.startswith(("gfx94", "gfx95")) \
            else CUBLAS_WORKSPACE_BYTES_LARGE
    try:
        major = int(cc.split(".")[0])
    except ValueError:
        major = 0
    return CUBLAS_WORKSPACE_BYTES_LARGE if major in (9, 10, 12) else CUBLAS_WORKSPACE_BYTES


def capacity_bytes(gpu) -> float:
    """Memory of one device of `gpu` (a multi-die package counts per die)."""
    return float(gpu.memory_gb) * GiB


def check_fraction(fraction: float) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
            or not math.isfinite(fraction) or not 0 < fraction <= 1:
        raise InvalidArgumentError(
            f"max_memory_fraction must be in (0, 1], got {fraction!r}")
    return float(fraction)


def device_bytes(profile: MemoryProfile, gpus: Sequence, batches: np.ndarray,
                 dtype_code: int | None = None, data_parallel: int = 1) -> np.ndarray:
    """Predicted peak device memory (bytes) for every (GPU, batch): reserved
    tensor memory + CUDA context + cuBLAS workspaces (+ DDP gradient buckets
    when data-parallel over more than one GPU)."""
    _, reserved, _ = profile.peak(batches, dtype_code=dtype_code)
    fixed = np.asarray([_fixed_bytes(profile, g) for g in gpus], dtype=np.float64)
    total = reserved[None, :].astype(np.float64) + fixed[:, None]
    if data_parallel > 1:
        # DistributedDataParallel copies gradients into flat buckets that live
        # as long as the model (gradient_as_bucket_view=False, the default).
        total += _round_segments(profile.category_bytes(GRADIENTS, 1, dtype_code))
    return total


def _round_segments(nbytes: int) -> float:
    seg = 2 * MiB
    return float((nbytes + seg - 1) // seg * seg)


def has_profile(graph) -> bool:
    """Whether `graph` carries a memory profile (traced models and ONNX files
    do; a graph saved without one, or whose memory pass failed, does not):
    without one, peak memory is not predicted and whether a configuration
    fits is not checked."""
    return getattr(graph, "memory", None) is not None


def evaluate(graph, gpus: Sequence, batches: np.ndarray, dtype_code: int | None = None,
             data_parallel: int = 1) -> np.ndarray | None:
    """Peak device memory (bytes) of `graph` for every (GPU, batch); None when
    the graph carries no memory profile. The engine's sweep calls this."""
    prof = getattr(graph, "memory", None)
    if prof is None:
        return None
    return device_bytes(prof, gpus, np.asarray(batches, dtype=np.int64), dtype_code, data_parallel)


def max_batch_size(graph, gpu, *, max_memory_fraction: float = DEFAULT_MAX_MEMORY_FRACTION,
                   dtype=None, data_parallel: int = 1, limit: int = 1 << 24) -> int | None:
    """The largest batch size whose predicted peak fits in `max_memory_fraction`
    of `gpu`'s memory (0: not even batch 1 fits; None: no memory profile, or a
    graph that cannot be rescaled)."""
    g = gpu if isinstance(gpu, hardware.GPU) else hardware.get(gpu)
    return max_batch_sizes(graph, [g], max_memory_fraction=max_memory_fraction, dtype=dtype,
                           data_parallel=data_parallel, limit=limit)[g.id]


def max_batch_sizes(graph, gpus: Sequence, *,
                    max_memory_fraction: float = DEFAULT_MAX_MEMORY_FRACTION, dtype=None,
                    data_parallel: int = 1, limit: int = 1 << 24) -> dict[str, int | None]:
    """:func:`max_batch_size` for several GPUs (GPU objects or names). Peak
    memory never decreases with the batch, so a doubling search then a
    bisection finds each; the tensor peak does not depend on the GPU, so its
    evaluations are shared."""
    chosen = [g if isinstance(g, hardware.GPU) else hardware.get(g) for g in gpus]
    prof = getattr(graph, "memory", None)
    if prof is None or not graph.batch_scalable:
        return {g.id: None for g in chosen}
    fraction = check_fraction(max_memory_fraction)
    code = dtypes.parse(dtype)
    cache: dict[int, float] = {}

    def need(b: int, g) -> float:
        if b not in cache:
            cache[b] = float(device_bytes(prof, [g], np.asarray([b]), code, data_parallel)[0, 0]
                             - _fixed_bytes(prof, g))
        return cache[b] + _fixed_bytes(prof, g)

    out: dict[str, int | None] = {}
    for g in chosen:
        budget = fraction * capacity_bytes(g)

        def fits(b: int) -> bool:
            return need(b, g) <= budget

        if not fits(1):
            out[g.id] = 0
            continue
        lo, hi = 1, 2
        while hi <= limit and fits(hi):
            lo, hi = hi, hi * 2
        if hi > limit:
            out[g.id] = limit
            continue
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        out[g.id] = lo
    return out


def _fixed_bytes(profile: MemoryProfile, gpu) -> float:
    """The part of device_bytes that depends on the GPU, not on the batch."""
    handles = 2 if profile.training else 1
    return float(CUDA_CONTEXT_BYTES + handles * cublas_workspace_bytes(gpu))
