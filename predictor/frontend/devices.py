"""Tracing a model written for a GPU on a machine without one.

Code written to run on a GPU names the device: ``Model().cuda().half()`` in
a factory, ``x.cuda()`` or ``x.to("cuda")`` in a forward, ``torch.zeros(n,
device="cuda")`` for a mask or a position table. The trace runs on fake CPU
tensors, often under a PyTorch built without CUDA, where such a call fails
("PyTorch is not linked with support for cuda devices") or mixes a CUDA
tensor with the trace's CPU ones.

``OnTraceDevice`` is a ``TorchFunctionMode``, active while the model is
built and traced, under which asking for an accelerator means asking for
the device the trace's tensors are on: a ``device=`` argument naming one is
dropped (a factory makes its tensor where the trace's are, or on the meta
device while a model is built there), ``Tensor.cuda()`` returns the tensor,
and ``Tensor.to`` keeps its dtype and memory format and leaves the device.
``Module.cuda()`` and ``Module.to("cuda", torch.float16)`` go through those.
Nothing of the step changes: its shapes and dtypes are the GPU's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

ACCELERATORS = frozenset({"cuda", "xpu", "mps", "hpu", "mtia", "privateuseone"})


def is_accelerator(device: Any) -> bool:
    """Whether `device` (a string, a torch.device or a CUDA index) names an
    accelerator."""
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True                      # .cuda(0), .to(0): a CUDA device's index
    if isinstance(device, (str, torch.device)):
        try:
            return torch.device(device).type in ACCELERATORS
        except (RuntimeError, TypeError):
            return False
    return False


def is_device(device: Any) -> bool:
    """Whether `device` names a device (any, the CPU included)."""
    if isinstance(device, torch.device) or is_accelerator(device):
        return True
    if isinstance(device, str):
        try:
            torch.device(device)
        except (RuntimeError, TypeError):
            return False
        return True
    return False


class OnTraceDevice(TorchFunctionMode):
    """Requests for an accelerator go to the trace's device (module
    docstring). `every_device`: requests for any device, the CPU's too, stay
    where the tensors are: a model built on the meta device cannot be moved
    off it (``construction.build_model``)."""

    def __init__(self, every_device: bool = False):
        super().__init__()
        self.moved = is_device if every_device else is_accelerator

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda or (func is torch.Tensor.cpu and self.moved is is_device):
            return args[0]
        if func is torch.Tensor.to:
            # The device as None: the overload ``to(device=None, dtype=None,
            # non_blocking=False, ...)`` keeps the tensor's (``Module.to``
            # passes the device, the dtype and non_blocking positionally).
            args = (args[0], *(None if self.moved(a) else a for a in args[1:]))
            if "device" in kwargs and self.moved(kwargs["device"]):
                kwargs = {**kwargs, "device": None}
        elif "device" in kwargs and self.moved(kwargs["device"]):
            kwargs = {k: v for k, v in kwargs.items() if k != "device"}
        return func(*args, **kwargs)
