"""Peak GPU memory of one training iteration, from the traced step.

The memory pass walks the same aten graph the time model is lowered from, in
execution order, and records every *storage* (views and in-place ops share
their input's storage and allocate nothing): when it is allocated, when it is
last used, how big it is as a function of the batch size, and what it holds.
Liveness follows eager PyTorch:

- parameters, buffers, optimizer state and the input batch live through the
  whole step (the optimizer state is the steady state after the first step);
- an op's outputs are allocated while its inputs are still alive, and a
  storage is freed after the last op that reads it — so a forward tensor that
  autograd saved for backward lives until its backward op has run;
- gradients of parameters live from the backward op that makes them to the end
  of the step (``param.grad`` holds them until ``zero_grad``);
- transient library workspaces live during one op: cuDNN convolutions
  (``min(largest operand, 256 MiB)``: an assumption, not measured) and the
  fp32 ``dq`` accumulator of flash-attention backward.

Sizes come from the fake tensors of the trace at the sentinel batch (1009):
a dim the lowering's ``_Scaler`` recognises as ``k * batch`` contributes one
power of the batch, so each storage holds ``coef * b**power`` elements at
batch ``b`` — exact at every batch size, without retracing. The sweep over
batch sizes is a numba kernel (``predictor.kernels.memory``).

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
import operator
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from predictor.errors import InvalidArgumentError
from predictor.kernels import layout as L
from predictor.kernels.memory import peak_memory

GiB = float(1 << 30)
MiB = 1 << 20

CUDA_CONTEXT_BYTES = 500 * MiB
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8      # pre-Hopper NVIDIA
CUBLAS_WORKSPACE_BYTES_LARGE = 4096 * 8 * 1024                 # sm 9.x, 10.x, 12.x; ROCm
CUBLAS_WORKSPACE_BYTES_MI300 = 128 * MiB                       # gfx94x / gfx95x
CUDNN_WORKSPACE_CAP = 256 * MiB
# DDP's default bucket size (torch.nn.parallel.DistributedDataParallel bucket_cap_mb).
DDP_BUCKET_BYTES = 25 * MiB
DEFAULT_MAX_MEMORY_FRACTION = 0.9

# What a storage holds.
PARAMETERS = 0
BUFFERS = 1
OPTIMIZER_STATE = 2
INPUTS = 3
ACTIVATIONS = 4   # forward tensors kept for backward
GRADIENTS = 5     # parameter gradients
TEMPORARIES = 6   # everything else: forward temporaries, gradients of activations, optimizer temporaries
WORKSPACE = 7     # library workspaces inside one op (cuDNN, flash-attention backward)
CATEGORY_NAMES = ("parameters", "buffers", "optimizer_state", "inputs", "activations",
                  "gradients", "temporaries", "workspace")

# make_fx names placeholders after the traced step's arguments
# (predictor.frontend.fx: train_step(params, buffers, opt_state, inputs)).
_PLACEHOLDER_ROLES = (("params", PARAMETERS), ("buffers", BUFFERS),
                      ("opt_state", OPTIMIZER_STATE), ("inputs", INPUTS))

_FLOATING = (L.F32, L.F16, L.BF16, L.F64, L.F8)


@dataclass
class MemoryProfile:
    """Every storage of one traced step: size ``coef * b**power`` elements of
    dtype ``dtype``, alive from op ``alloc`` to op ``free`` (inclusive)."""

    coef: np.ndarray       # float64[n]
    power: np.ndarray      # int64[n]
    dtype: np.ndarray      # int64[n] layout dtype code
    alloc: np.ndarray      # int64[n]
    free: np.ndarray       # int64[n]
    category: np.ndarray   # int64[n]
    cap: np.ndarray        # int64[n] size cap in bytes (0: none), for workspaces
    n_steps: int
    phase_marks: tuple[int, ...] = ()
    training: bool = True

    def __len__(self) -> int:
        return int(self.coef.shape[0])

    def _itemsize(self, dtype_code: int | None) -> np.ndarray:
        codes = self.dtype
        if dtype_code is not None:
            floating = np.isin(codes, _FLOATING) & (self.category != WORKSPACE)
            codes = np.where(floating, dtype_code, codes)
        return np.asarray(L.DTYPE_BYTES, dtype=np.int64)[codes]

    def bytes_at(self, batch: int, dtype_code: int | None = None) -> np.ndarray:
        """Exact bytes of every storage at `batch` (no allocator rounding)."""
        elems = np.ceil(self.coef * float(batch) ** self.power - 1e-9)
        size = elems.astype(np.int64) * self._itemsize(dtype_code)
        return np.where(self.cap > 0, np.minimum(size, self.cap), size)

    def peak(self, batches: Iterable[int] | int, *, dtype_code: int | None = None,
             rounding: bool = True, workspaces: bool = True):
        """(allocated, reserved, step): peak tensor bytes per batch size, the
        segments holding them (``rounding``: caching allocator; else both are
        exact tensor bytes) and the op index at which the peak occurs."""
        b = np.atleast_1d(np.asarray(batches, dtype=np.int64))
        keep = slice(None) if workspaces else self.category != WORKSPACE
        out_a = np.zeros(len(b), np.int64)
        out_r = np.zeros(len(b), np.int64)
        out_s = np.zeros(len(b), np.int64)
        itemsize = self._itemsize(dtype_code)
        coef, power, alloc, free = self.coef[keep], self.power[keep], self.alloc[keep], self.free[keep]
        itemsize, cap = itemsize[keep], self.cap[keep]
        peak_memory(coef, power, itemsize, cap, alloc, free, self.n_steps, b, int(rounding),
                    out_a, out_r, out_s)
        return out_a, out_r, out_s

    def breakdown(self, batch: int, dtype_code: int | None = None) -> dict[str, float | str]:
        """Bytes by category alive at the peak of `batch` (allocator-rounded),
        and the phase (forward, backward, optimizer) the peak falls in."""
        _, _, step = self.peak([batch], dtype_code=dtype_code)
        t = int(step[0])
        size = self.bytes_at(batch, dtype_code)
        size = np.where(size > 0, (size + 511) // 512 * 512, 0)
        live = (self.alloc <= t) & (self.free >= t)
        out = {name: float(size[live & (self.category == c)].sum())
               for c, name in enumerate(CATEGORY_NAMES)}
        out["peak_phase"] = self.phase_at(t)
        return out

    def phase_at(self, step: int) -> str:
        phase = 0
        for i, mark in enumerate(self.phase_marks):
            if step >= mark:
                phase = i + 1
        return L.PHASE_NAMES[min(phase, len(L.PHASE_NAMES) - 1)]

    def category_bytes(self, category: int, batch: int = 1, dtype_code: int | None = None) -> int:
        """Total bytes of one category's storages at `batch` (not a peak: a sum)."""
        return int(self.bytes_at(batch, dtype_code)[self.category == category].sum())


# ------------------------------------------------------------------ the fx pass --

def _tensors(val: Any) -> list:
    import torch

    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        out = []
        for v in val:
            out.extend(_tensors(v))
        return out
    return []


def _storage_key(t) -> int | None:
    try:
        from torch.multiprocessing.reductions import StorageWeakRef

        return StorageWeakRef(t.untyped_storage()).cdata
    except Exception:  # noqa: BLE001 — tensors without a storage (sparse, nested)
        return None


def _size_of(t, scale2, sentinel: int | None) -> tuple[float, int]:
    """(coef, power): the storage of `t` holds ``coef * b**power`` elements at
    batch b. A dim that the lowering's scaler maps to a multiple of the batch
    contributes one power."""
    power = sum(1 for d in t.shape if scale2.dim(int(d)) != int(d))
    try:
        elems = t.untyped_storage().nbytes() // max(t.element_size(), 1)
    except Exception:  # noqa: BLE001
        elems = t.numel()
    elems = max(int(elems), int(t.numel()))
    if sentinel is None or power == 0:
        return float(elems), 0
    return elems / float(sentinel) ** power, power


_CONV_OPS: set = set()
_ATTN_BWD_OPS: set = set()


def _op_sets():
    if not _CONV_OPS:
        import torch

        aten = torch.ops.aten
        for name in ("convolution", "_convolution", "convolution_backward", "cudnn_convolution",
                     "mkldnn_convolution", "cudnn_convolution_transpose"):
            if hasattr(aten, name):
                _CONV_OPS.add(getattr(aten, name))
        for name in ("_scaled_dot_product_flash_attention_for_cpu_backward",
                     "_scaled_dot_product_flash_attention_backward",
                     "_scaled_dot_product_efficient_attention_backward",
                     "_scaled_dot_product_cudnn_attention_backward",
                     "_flash_attention_backward", "_efficient_attention_backward"):
            if hasattr(aten, name):
                _ATTN_BWD_OPS.add(getattr(aten, name))
    return _CONV_OPS, _ATTN_BWD_OPS


def profile(gm, phase_marks: Sequence[int], sentinel: int | None) -> MemoryProfile:
    """The memory pass over a traced step (see the module docstring).

    `phase_marks` are the node indices where backward and the optimizer start
    (as for the lowering); `sentinel` is the batch size the trace ran at (None:
    sizes are taken as traced)."""
    import torch

    from predictor.lowering import _Scaler, dtype_code

    scale2 = _Scaler(sentinel, 2)
    conv_ops, attn_bwd_ops = _op_sets()
    nodes = list(gm.graph.nodes)
    n_steps = max(len(nodes), 1)
    last = n_steps - 1
    marks = tuple(phase_marks)
    training = len(marks) >= 1

    def phase_of(idx: int) -> int:
        p = 0
        for i, m in enumerate(marks):
            if idx >= m:
                p = i + 1
        return p

    coef: list[float] = []
    power: list[int] = []
    dtype: list[int] = []
    alloc: list[int] = []
    free: list[int] = []
    cat: list[int] = []
    cap: list[int] = []
    last_phase: list[int] = []   # the latest phase that reads each storage
    index: dict[int, int] = {}   # storage key -> entry
    of_node: dict[Any, list[int]] = {}

    def add(c: float, p: int, dt: int, a: int, f: int, category: int, cp: int = 0) -> int:
        coef.append(c), power.append(p), dtype.append(dt), alloc.append(a), free.append(f)
        cat.append(category), cap.append(cp), last_phase.append(phase_of(a))
        return len(coef) - 1

    for idx, node in enumerate(nodes):
        if node.op == "output":
            for arg in node.all_input_nodes:
                for e in of_node.get(arg, ()):
                    free[e] = last
            continue
        val = node.meta.get("val")
        entries: list[int] = []
        role = None
        if node.op == "placeholder":
            role = INPUTS
            for prefix, r in _PLACEHOLDER_ROLES:
                if node.name.startswith(prefix):
                    role = r
                    break
        elif node.op == "get_attr":
            role = BUFFERS
        for t in _tensors(val):
            key = _storage_key(t)
            if key is None:
                continue
            e = index.get(key)
            if e is None:
                c, p = _size_of(t, scale2, sentinel)
                if role is not None:
                    e = add(c, p, dtype_code(t.dtype), 0, last, role)
                else:
                    e = add(c, p, dtype_code(t.dtype), idx, idx, TEMPORARIES)
                index[key] = e
            entries.append(e)
        of_node[node] = entries
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            continue  # an element of a multi-output op: an alias, not a read
        ph = phase_of(idx)
        for arg in node.all_input_nodes:
            for e in of_node.get(arg, ()):
                if free[e] < idx:
                    free[e] = idx
                if ph > last_phase[e]:
                    last_phase[e] = ph
        for e in entries:  # an op writing in place into a storage also uses it
            if free[e] < idx:
                free[e] = idx
        target = node.target
        if target in conv_ops:
            biggest = max((t for a in node.all_input_nodes for t in _tensors(a.meta.get("val")))
                          , key=lambda t: t.numel(), default=None)
            if biggest is not None:
                c, p = _size_of(biggest, scale2, sentinel)
                add(c, p, dtype_code(biggest.dtype), idx, idx, WORKSPACE, CUDNN_WORKSPACE_CAP)
        elif target in attn_bwd_ops:
            q = node.args[1] if len(node.args) > 1 else None   # (grad_out, q, k, v, ...)
            qv = q.meta.get("val") if isinstance(q, torch.fx.Node) else None
            if isinstance(qv, torch.Tensor):
                c, p = _size_of(qv, scale2, sentinel)
                add(c, p, L.F32, idx, idx, WORKSPACE)

    coef_a = np.asarray(coef, np.float64)
    cat_a = np.asarray(cat, np.int64)
    alloc_a = np.asarray(alloc, np.int64)
    free_a = np.asarray(free, np.int64)
    if training and len(marks) >= 1:
        born = np.asarray([phase_of(a) for a in alloc], np.int64)
        read = np.asarray(last_phase, np.int64)
        made = cat_a == TEMPORARIES
        cat_a[made & (born == L.FORWARD) & (read >= L.BACKWARD)] = ACTIVATIONS
        grads = made & (born == L.BACKWARD) & (read == L.OPTIMIZER_PHASE)
        cat_a[grads] = GRADIENTS
        free_a[grads] = last
    return MemoryProfile(coef=coef_a, power=np.asarray(power, np.int64),
                         dtype=np.asarray(dtype, np.int64), alloc=alloc_a, free=free_a,
                         category=cat_a, cap=np.asarray(cap, np.int64), n_steps=n_steps,
                         phase_marks=marks, training=training)


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
    from predictor import hardware

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
    from predictor import hardware
    from predictor.engine import _dtype_code

    chosen = [g if isinstance(g, hardware.GPU) else hardware.get(g) for g in gpus]
    prof = getattr(graph, "memory", None)
    if prof is None or not graph.batch_scalable:
        return {g.id: None for g in chosen}
    fraction = check_fraction(max_memory_fraction)
    code = _dtype_code(dtype)
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
