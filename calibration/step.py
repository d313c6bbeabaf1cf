"""The real training step, run with real tensors on the local device.

The per-op times of a calibration add up to less (or more) than a real
iteration: between ops the host runs Python, the autograd engine and the
allocator, and on a GPU the launch queue can run dry. To model that
difference the calibration times the whole step as a user would run it —
forward, loss, ``loss.backward()``, the optimizer's multi-tensor step,
``zero_grad`` — warm, median of several iterations.

The model is rebuilt from the source the frontend traced (a zoo entry or the
user's factory; a user's module object is deep-copied first, so calibrating
never trains the user's weights).
"""

from __future__ import annotations

import contextlib
import copy
import statistics
from typing import Any, Callable

import torch

from predictor.calibration.measure import host_clock
from predictor.frontend import optimizers
from predictor.frontend.autocast import AMP_DTYPES
from predictor.frontend.fx import in_format, inputs_in_format


class StepUnavailable(Exception):
    """The real step cannot be run (the reason is the message)."""


def _to_device(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_device(i, device) for i in x)
    if isinstance(x, dict):
        return {k: _to_device(v, device) for k, v in x.items()}
    return x


def _call(module: torch.nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, dict):
        return module(**inputs)
    if not isinstance(inputs, (list, tuple)):
        inputs = (inputs,)
    return module(*inputs)


def build_module(source: Any, mode: str) -> torch.nn.Module:
    if mode == "inference" and getattr(source, "build_inference", None) is not None:
        built = source.build_inference()
    else:
        built = source.build()
    module = built[0] if isinstance(built, tuple) else built
    if not isinstance(module, torch.nn.Module):
        raise StepUnavailable(f"the factory returned {type(module).__name__}, not an nn.Module")
    if any(p.is_meta for p in module.parameters()) or any(b.is_meta for b in module.buffers()):
        raise StepUnavailable("the model's parameters are on the meta device (no real weights)")
    return module


def build_step(source: Any, mode: str, optimizer: str | None, batch: int,
               device: torch.device, amp: str | None = None) -> Callable[[], None]:
    """A zero-argument callable running one real iteration at `batch`; with
    `amp` ("bf16", "fp16") as the trace ran it: forward and loss under
    ``torch.autocast`` on the device, fp16 with a ``GradScaler`` (without it
    the per-op times, taken in the traced dtypes, and the real step would be
    two different programs and the overhead fit between them meaningless)."""
    if source is None:
        raise StepUnavailable("the graph does not say how to build its model "
                              "(loaded from a file, or traced by another frontend)")
    module = build_module(source, mode)
    module = copy.deepcopy(module).to(device)
    inputs = _to_device(source.inputs(batch), device)
    # A trace with memory_format= priced its tensors in that format: store
    # the real model's weights and inputs so too, as the trace assumed.
    fmt = getattr(source, "memory_format", None)
    if fmt is not None:
        for t in list(module.parameters()) + list(module.buffers()):
            t.data = in_format(t.data, fmt)
        inputs = inputs_in_format(inputs, fmt)
    autocast = _autocast(device, amp)
    if mode == "inference":
        module.eval()

        def infer() -> None:
            with torch.no_grad(), autocast():
                _call(module, inputs)

        return infer
    module.train()
    loss_fn = source.loss_fn
    if loss_fn is None:
        from predictor.frontend.fx import default_loss

        loss_fn = default_loss
    params = [p for p in module.parameters() if p.requires_grad]
    opt = optimizers.torch_optimizer(optimizer, params)
    clip = optimizers.parse(optimizer)[2] and opt is not None
    scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None

    def train() -> None:
        with autocast():
            loss = loss_fn(_call(module, inputs))
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if opt is not None:
            if clip:
                if scaler is not None:
                    scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(params, 1.0)
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            for p in params:
                p.grad = None

    return train


def _autocast(device: torch.device, amp: str | None) -> Callable[[], Any]:
    """A new ``torch.autocast`` context for the device per call (nothing for
    `amp` None)."""
    if amp is None:
        return contextlib.nullcontext
    dtype = AMP_DTYPES[amp]
    return lambda: torch.autocast(device.type, dtype=dtype)


def time_step(step: Callable[[], None], device: torch.device, *, iterations: int = 5,
              warmup: int = 2, clock: str = "wall") -> float:
    """Median milliseconds of one warm iteration (synchronised on CUDA)."""
    return float(statistics.median(step_samples(step, device, iterations=iterations,
                                                warmup=warmup, clock=clock)))


def step_samples(step: Callable[[], None], device: torch.device, *, iterations: int = 5,
                 warmup: int = 2, clock: str = "wall") -> list[float]:
    """Milliseconds of each of `iterations` iterations after `warmup` untimed
    ones; on CUDA each is bracketed by synchronisations (host time included,
    as a user's training loop sees it)."""
    now = host_clock(clock) if device.type == "cpu" else host_clock("wall")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(max(warmup, 0)):
        step()
    sync()
    samples = []
    for _ in range(max(iterations, 1)):
        t0 = now()
        step()
        sync()
        samples.append((now() - t0) * 1e3)
    return samples
