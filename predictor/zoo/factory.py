"""User models: wrap a factory function (``file.py:fn`` or ``pkg.module:fn``) as a ZooModel.

The factory takes no arguments (or only an optional ``batch_size``) and
returns ``(model, example_inputs)`` or a bare model. ``load_factory`` calls it
exactly once, under a ``FakeTensorMode`` (so nothing real is allocated: layers
built in it hold fake parameters), records the shapes and dtypes of the example
inputs, and keeps the fake model with its fake mode (``ZooModel.prebuilt``): the
tracer traces that model inside the same mode and never calls the factory again.
``build()`` calls the factory for a real model; only ``predictor calibrate``
does, to time the real training step. ``make_inputs(b, _)`` makes new tensors
of the recorded dtypes with the batch dimension set to ``b``. Example inputs
are a tensor or a tuple of them (``model(*inputs)``), or a dict of them by
keyword (``model(**inputs)``, as Hugging Face models are called:
``{"input_ids": ..., "labels": ...}``); values that are not tensors pass
through as they are.

A bare model needs its inputs from somewhere: if it has an ``example_inputs``
attribute (a tensor, a tuple or dict of tensors, or a method returning one)
that is used; otherwise ``make_inputs`` raises UnknownModelError explaining what to
return.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn

from predictor.errors import TraceError, UnknownModelError

from .base import ZooModel, check_batch

_FACTORY_BATCH = 8  # batch size passed to a factory whose batch_size has no default


@dataclass(frozen=True)
class _InputSpec:
    """Shape/dtype of one example input, or a non-tensor value passed through."""

    shape: "tuple[int, ...] | None"
    dtype: "torch.dtype | None"
    value: Any = None


def _one_line(exc: BaseException) -> str:
    msg = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def _import_target(spec: str) -> "tuple[Callable, str]":
    """Split ``spec`` and import the factory object. Raises UnknownModelError."""
    if ":" not in spec:
        raise UnknownModelError(
            f"'{spec}' is not a factory spec: use path/to/file.py:factory or package.module:factory"
        )
    left, attr = spec.rsplit(":", 1)
    left, attr = left.strip(), attr.strip()
    if not left or not attr:
        raise UnknownModelError(
            f"'{spec}' is not a factory spec: use path/to/file.py:factory or package.module:factory"
        )
    is_path = left.endswith(".py") or "/" in left or os.sep in left or os.path.isfile(left)
    if is_path:
        path = os.path.abspath(os.path.expanduser(left))
        if not os.path.isfile(path):
            raise UnknownModelError(f"factory file not found: {left} (from '{spec}')")
        mod_name = "_predictor_factory_" + hashlib.sha1(path.encode()).hexdigest()[:12]
        folder = os.path.dirname(path)
        if folder not in sys.path:  # like `python file.py`: siblings are importable
            sys.path.insert(0, folder)
        try:
            mspec = importlib.util.spec_from_file_location(mod_name, path)
            if mspec is None or mspec.loader is None:
                raise ImportError(f"cannot load {path} as a Python module")
            module = importlib.util.module_from_spec(mspec)
            sys.modules[mod_name] = module
            mspec.loader.exec_module(module)
        except Exception as exc:  # noqa: BLE001 - any error in user code
            sys.modules.pop(mod_name, None)
            raise UnknownModelError(f"could not import factory file {left}: {_one_line(exc)}") from exc
        where = left
    else:
        try:
            module = importlib.import_module(left)
        except ModuleNotFoundError as exc:
            cwd = os.getcwd()
            top = left.split(".")[0]
            if exc.name == top and cwd not in sys.path and "" not in sys.path:
                sys.path.insert(0, cwd)
                try:
                    module = importlib.import_module(left)
                except Exception as exc2:  # noqa: BLE001
                    raise UnknownModelError(
                        f"could not import factory module '{left}': {_one_line(exc2)}"
                    ) from exc2
            else:
                raise UnknownModelError(f"could not import factory module '{left}': {_one_line(exc)}") from exc
        except Exception as exc:  # noqa: BLE001
            raise UnknownModelError(f"could not import factory module '{left}': {_one_line(exc)}") from exc
        where = f"module '{left}'"
    if not hasattr(module, attr):
        raise UnknownModelError(f"{where} has no attribute '{attr}' (from '{spec}')")
    factory = getattr(module, attr)
    if not callable(factory):
        raise UnknownModelError(f"'{attr}' in {where} is not callable (from '{spec}')")
    return factory, attr


def _call_factory(factory: Callable) -> Any:
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return factory()
    p = sig.parameters.get("batch_size")
    if p is not None and p.default is inspect.Parameter.empty:
        return factory(batch_size=_FACTORY_BATCH)
    return factory()


def _split_result(result: Any, spec: str) -> "tuple[nn.Module, Any]":
    """(model, example_inputs or None) from what a factory returned."""
    if isinstance(result, nn.Module):
        inputs = getattr(result, "example_inputs", None)
        if callable(inputs) and not isinstance(inputs, torch.Tensor):
            inputs = inputs()
        return result, inputs
    if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], nn.Module):
        return result[0], result[1]
    raise UnknownModelError(
        f"factory '{spec}' returned {type(result).__name__}; it must return a torch.nn.Module "
        "or (model, example_inputs)"
    )


def _as_items(inputs: Any, spec: str) -> "tuple[tuple[str, ...] | None, tuple]":
    """(keyword names or None, values) of example inputs: a dict's keys and
    values (``model(**inputs)``), or None and the positional arguments."""
    if isinstance(inputs, torch.Tensor):
        return None, (inputs,)
    if isinstance(inputs, (tuple, list)):
        return None, tuple(inputs)
    if isinstance(inputs, dict) and all(isinstance(k, str) for k in inputs):
        return tuple(inputs), tuple(inputs.values())
    raise UnknownModelError(
        f"factory '{spec}' gave example inputs of type {type(inputs).__name__}; "
        "use a tensor, a tuple of tensors (positional arguments of model.forward) or a dict "
        "of them by name (keyword arguments)"
    )


def load_factory(spec: str) -> ZooModel:
    """Wrap a user factory (``path/to/file.py:fn`` or ``package.module:fn``) as a ZooModel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from predictor.frontend.construction import build_model

    factory, attr = _import_target(spec)

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with fake:
            result = build_model(lambda: _call_factory(factory))
            model, raw_inputs = _split_result(result, spec)
    except UnknownModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - any error in user code
        raise UnknownModelError(f"factory '{spec}' raised {_one_line(exc)}") from exc

    batch_dim = 0
    specs: "tuple[_InputSpec, ...] | None" = None
    keys: "tuple[str, ...] | None" = None
    default_batch = _FACTORY_BATCH
    if raw_inputs is not None:
        keys, values = _as_items(raw_inputs, spec)
        specs = tuple(
            _InputSpec(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else _InputSpec(None, None, x)
            for x in values
        )
        batched = [s for s in specs if s.shape is not None and len(s.shape) > batch_dim]
        if not batched:
            raise UnknownModelError(
                f"factory '{spec}' gave no example input tensor with a batch dimension {batch_dim}"
            )
        default_batch = batched[0].shape[batch_dim]
    n_params = sum(p.numel() for p in model.parameters())
    del result, raw_inputs

    def build() -> nn.Module:
        return _split_result(_call_factory(factory), spec)[0]

    def make_inputs(batch_size: int, seq_len: "int | None" = None) -> "tuple | dict":
        b = check_batch(batch_size)
        if specs is None:
            raise UnknownModelError(
                f"factory '{spec}' returned a model without example inputs: return "
                "(model, example_inputs) or give the model an example_inputs attribute"
            )
        out = []
        for s in specs:
            if s.shape is None:
                out.append(s.value)
                continue
            shape = list(s.shape)
            if len(shape) > batch_dim:
                shape[batch_dim] = b
            if s.dtype.is_floating_point:
                out.append(torch.randn(shape, dtype=s.dtype))
            else:
                out.append(torch.zeros(shape, dtype=s.dtype))
        return dict(zip(keys, out)) if keys is not None else tuple(out)

    return ZooModel(
        name=spec,
        description=f"user factory {attr}() from {spec.rsplit(':', 1)[0]}, {n_params / 1e6:.1f} M params",
        family="custom",
        build=build,
        make_inputs=make_inputs,
        loss_fn=default_loss,
        default_batch_size=default_batch,
        default_seq_len=None,
        batch_dim=batch_dim,
        prebuilt=(fake, model),
    )


def _float_tensors(out: Any) -> "list[torch.Tensor]":
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, dict) or (hasattr(out, "keys") and hasattr(out, "values")):
        vals = list(out.values())
    elif isinstance(out, (tuple, list)):
        vals = list(out)
    else:
        return []
    found: list[torch.Tensor] = []
    for v in vals:
        found += _float_tensors(v)
    return found


def default_loss(out: Any) -> torch.Tensor:
    """Loss for a user model: its ``loss`` output if it has one, else the sum of
    the means of every floating-point output tensor (so every output gets a gradient)."""
    loss = None
    if hasattr(out, "keys") and "loss" in out.keys():
        loss = out["loss"]
    if isinstance(loss, torch.Tensor):
        return loss
    tensors = _float_tensors(out)
    if not tensors:
        raise TraceError("the user model returned no floating-point tensor to build a training loss from")
    total = tensors[0].float().mean()
    for t in tensors[1:]:
        total = total + t.float().mean()
    return total
