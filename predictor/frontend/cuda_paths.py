"""Take the CUDA code path while tracing on fake CPU tensors.

A few composite aten ops choose their implementation from the device: on a
GPU they run one fused kernel, on a CPU they decompose into several ops. The
trace runs on fake CPU tensors, so without help it would record the CPU
decomposition and the predictor would price kernels the GPU never runs.

``CudaPaths`` is a ``TorchFunctionMode`` active during the trace that sends
those calls to the aten op the CUDA build dispatches to:

- ``dropout`` (training, 0 < p < 1, not in place): ATen's ``dropout`` calls
  ``native_dropout`` on CUDA (``is_fused_kernel_acceptable``): one fused kernel
  writing the output and a bool mask, and ``native_dropout_backward`` (one
  masked-scale kernel) in the backward. On a CPU it runs ``bernoulli_``,
  ``div_`` and ``mul`` (three float passes) and a ``mul`` backward.
  In-place dropout takes the decomposed path on CUDA too and is left alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_DROPOUTS = (F.dropout, torch.dropout)


def _dropout_args(func, args: tuple, kwargs: dict) -> tuple:
    """(input, p, training, inplace) of an F.dropout / torch.dropout call."""
    names = ("input", "p", "training", "inplace") if func is F.dropout else ("input", "p", "train")
    v = {**dict(zip(names, args)), **kwargs}
    return v.get("input"), v.get("p", 0.5), v.get("training", v.get("train", True)), \
        v.get("inplace", False)


class CudaPaths(TorchFunctionMode):
    """Route device-dependent composite ops to their CUDA implementation."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DROPOUTS:
            x, p, training, inplace = _dropout_args(func, args, kwargs)
            if (isinstance(x, torch.Tensor) and training and not inplace
                    and isinstance(p, (int, float)) and 0.0 < float(p) < 1.0 and x.numel() > 0):
                return torch.ops.aten.native_dropout(x, float(p), True)[0]
        return func(*args, **kwargs)
