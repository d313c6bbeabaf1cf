"""Building a model under fake tensors, with the constants of its constructor real.

Every model is built inside a ``FakeTensorMode``, so that no parameter is
ever materialised (a 70B model's weights would not fit this machine). Some
constructors, though, compute Python numbers from small tensors: a
stochastic-depth schedule
``[x.tolist() for x in torch.linspace(0, rate, n).split(depths)]`` in
Hugging Face's ConvNeXt, ConvNeXt V2 and a score of other vision models, or
``[x.item() for x in torch.linspace(...)]``. A fake tensor has no values,
so ``tolist`` raises a data-dependent error and the model cannot be traced.

Those values are fixed by the constructor's Python arguments, never by a
weight or an input. ``real_constants`` therefore computes them for real while
a model is built: a range or value factory (``linspace``, ``logspace``,
``arange``, ``tensor``, ``as_tensor``) called on Python numbers or a numpy
array, on the CPU, of at most ``MAX_ELEMENTS`` elements, and then anything
computed from real tensors alone. Parameters and buffers are still created
by ``empty``/``zeros``/``ones`` and initialised in place, so they stay
fake; the trace replaces every parameter and buffer by a fake stand-in in
any case (``fx._fake_params``), so no shape or op of the traced step changes.
What a function mode does not see stays fake: ``torch.from_numpy`` and the
legacy ``torch.Tensor(array)`` constructor (BiT's schedule), whose models
still cannot be traced.

A factory that converts the model it built (``Model().half()``,
``.to(torch.bfloat16)``, ``.to(memory_format=...)``) cannot run under fake
tensors: ``Module._apply`` swaps every fake parameter for its converted copy
(``torch.utils.swap_tensors``), which refuses tensors the fake mode holds
weak references to. ``build_model`` builds such a model again on the meta
device, where conversions are plain tensor ops and nothing is materialised
either. Both builds run under ``devices.OnTraceDevice``: a factory's
``.cuda()`` or ``.to("cuda")`` keeps the model where it is built.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from predictor.frontend.devices import OnTraceDevice

# The largest constant computed for real: a position-id range of a 128k
# context is 131,072 elements; a megabyte-sized constant costs nothing.
MAX_ELEMENTS = 1 << 20

_RANGES = {torch.linspace, torch.logspace}
_VALUES = {torch.tensor, torch.as_tensor}


def _number(x: Any) -> bool:
    return isinstance(x, (int, float, bool))


def _on_cpu(kwargs: dict) -> bool:
    device = kwargs.get("device")
    if device is None:
        return True
    try:
        return torch.device(device).type == "cpu"
    except (RuntimeError, TypeError):  # not a device: the factory itself says so
        return False


def _arange_count(args: tuple, kwargs: dict) -> float:
    """Elements of ``torch.arange(*args, **kwargs)``; inf where not plain numbers."""
    bounds = list(args)
    for k in ("start", "end", "step"):
        if k in kwargs:
            bounds.append(kwargs[k])
    if not bounds or not all(_number(b) for b in bounds):
        return math.inf
    if len(bounds) == 1:
        start, end, step = 0, bounds[0], 1
    else:
        start, end = bounds[0], bounds[1]
        step = bounds[2] if len(bounds) > 2 else 1
    if step == 0:
        return math.inf
    return max(0.0, math.ceil((end - start) / step))


def _factory_is_constant(func: Any, args: tuple, kwargs: dict) -> bool:
    """A factory whose result is fixed by Python numbers (or a numpy array),
    small and on the CPU."""
    if not _on_cpu(kwargs):
        return False
    if func is torch.arange:
        return _arange_count(args, kwargs) <= MAX_ELEMENTS
    if func in _RANGES:
        steps = args[2] if len(args) > 2 else kwargs.get("steps")
        return (all(_number(a) for a in args[:2]) and _number(steps)
                and 0 <= steps <= MAX_ELEMENTS)
    if func in _VALUES:
        # Called with no tensor among its arguments (_RealConstants): data is
        # Python numbers or an array.
        data = args[0] if args else kwargs.get("data")
        try:
            return int(np.asarray(data).size) <= MAX_ELEMENTS
        except Exception:  # noqa: BLE001 - not array-like: leave it to the fake mode
            return False
    return False


class _RealConstants(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Nearly every call while a model is built touches a parameter (a
        # fake tensor), down to each metadata read the fake mode makes: those
        # go straight through, so that building costs what it did.
        if FakeTensor in types or any(isinstance(a, FakeTensor) for a in args):
            return func(*args, **kwargs)
        tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        if tensors:
            real = all(not isinstance(t, FakeTensor) and t.device.type == "cpu"
                       for t in tensors)
        else:
            real = _factory_is_constant(func, args, kwargs)
        if real:
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def build_model(build):
    """``build()`` under the active fake mode, its constants real; on the
    meta device where it converts its own parameters (module docstring)."""
    try:
        with real_constants(), OnTraceDevice():
            return build()
    except RuntimeError as exc:
        if "Couldn't swap" not in str(exc):
            raise
    with unset_fake_temporarily(), torch.device("meta"), OnTraceDevice(every_device=True):
        return build()


@contextlib.contextmanager
def real_constants():
    """While a model is built under a ``FakeTensorMode``: constants its
    constructor computes from Python numbers are real tensors (module
    docstring)."""
    with _RealConstants():
        yield
