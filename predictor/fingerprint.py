"""A fingerprint of a model's structure and input shapes, so that candidates of
a design space that build the same network share one trace.

Two models with the same fingerprint trace to the same Graph: the same module
tree (each module's class, the source file that defines it, its plain
attributes such as ``in_features`` or ``eps``), the same parameter and buffer
shapes, dtypes and ``requires_grad``, and the same example-input shapes and
dtypes. Nothing real is computed: the module may hold fake or meta tensors.

The fingerprint is conservative: where a module holds something whose value
cannot be described deterministically (an object printed with its memory
address, a class defined inside a function whose closure may differ), it is
None and the candidate is traced on its own, never matched to another.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
from typing import Any

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_MAX_REPR = 4096


class _Opaque(Exception):
    """Something in the model cannot be fingerprinted deterministically."""


@functools.lru_cache(maxsize=512)
def _file_hash(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return "<unreadable>"


def _class_id(cls: type) -> list:
    if "<locals>" in cls.__qualname__:
        raise _Opaque(f"class {cls.__qualname__} is defined inside a function")
    try:
        src = inspect.getsourcefile(cls)
    except TypeError:  # a built-in
        src = None
    return [cls.__module__, cls.__qualname__, _file_hash(src) if src else None]


def _value(x: Any, depth: int = 0) -> Any:
    """A JSON-able description of an attribute value, or _Opaque."""
    import torch

    if depth > 6:
        raise _Opaque("nested too deeply")
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return repr(x)  # nan and inf too
    if isinstance(x, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(x)
    if isinstance(x, torch.Size):
        return ["Size", list(x)]
    if isinstance(x, torch.Tensor):
        out = ["Tensor", list(x.shape), str(x.dtype), bool(x.requires_grad)]
        from predictor.lowering import is_channels_last
        if is_channels_last(x):
            # The trace reads the memory format (half-precision convolutions in
            # NCHW pay layout transposes): channels-last tensors differ.
            out.append("channels_last")
        return out
    if isinstance(x, (list, tuple)):
        return [type(x).__name__] + [_value(v, depth + 1) for v in x]
    if isinstance(x, dict):
        return ["dict"] + sorted([str(k), _value(v, depth + 1)] for k, v in x.items())
    if isinstance(x, (set, frozenset)):
        return ["set"] + sorted(json.dumps(_value(v, depth + 1), sort_keys=True) for v in x)
    if isinstance(x, torch.nn.Module):
        return ["module"]  # a submodule: described on its own
    if inspect.isfunction(x) or inspect.isbuiltin(x) or inspect.isclass(x):
        if "<locals>" in getattr(x, "__qualname__", "") or getattr(x, "__closure__", None):
            raise _Opaque(f"{getattr(x, '__qualname__', x)} is a closure")
        return ["callable", getattr(x, "__module__", None), getattr(x, "__qualname__", repr(x))]
    if isinstance(x, functools.partial):
        return ["partial", _value(x.func, depth + 1), _value(list(x.args), depth + 1),
                _value(dict(x.keywords), depth + 1)]
    text = repr(x)
    if _ADDRESS.search(text) or len(text) > _MAX_REPR:
        raise _Opaque(f"an attribute of type {type(x).__name__} has no stable description")
    return ["repr", type(x).__module__, type(x).__qualname__, text]


def _module(m) -> list:
    attrs = []
    for k, v in sorted(vars(m).items()):
        if k in ("_parameters", "_buffers", "_modules") or k.startswith("_") and k.endswith("hooks"):
            continue
        if k in ("_non_persistent_buffers_set",):
            attrs.append([k, sorted(v)])
            continue
        attrs.append([k, _value(v)])
    params = [[k, _value(p)] for k, p in m._parameters.items()]
    buffers = [[k, _value(b)] for k, b in m._buffers.items()]
    hooks = [k for k in vars(m) if k.startswith("_") and k.endswith("hooks") and getattr(m, k)]
    if hooks:
        raise _Opaque(f"{type(m).__name__} has hooks ({', '.join(hooks)})")
    return [_class_id(type(m)), attrs, params, buffers]


def structure(model, example_inputs, **trace_options) -> str | None:
    """sha256 (hex) of `model`'s structure, `example_inputs`' shapes and dtypes
    and `trace_options` (mode, optimizer, ...), or None when the model holds
    something that cannot be described deterministically."""
    import torch

    try:
        parts = [[name, _module(m)] for name, m in model.named_modules()]
        leaves, spec = torch.utils._pytree.tree_flatten(example_inputs)
        inputs = [str(spec), [_value(x) for x in leaves]]
        text = json.dumps({"modules": parts, "inputs": inputs,
                           "options": {k: _value(v) for k, v in sorted(trace_options.items())}},
                          sort_keys=True)
    except (_Opaque, TypeError, ValueError, RecursionError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()
