"""Optimizer steps as the GPU runs them.

PyTorch's Adam/AdamW/SGD default to the multi-tensor (``foreach``) path on CUDA:
a handful of ``_foreach_*`` kernels over all parameters at once. The functional
optimizers in ``torch.optim`` read the step counter with ``.item()``, which a
fake-tensor trace cannot do, so the same kernel sequence is written out here
(bias corrections are host-side Python floats on the GPU path too).
"""

from __future__ import annotations

import torch

from predictor.errors import InvalidArgumentError

OPTIMIZERS = ("adam", "adamw", "sgd", None)


def check(name: str | None) -> str | None:
    if name is not None:
        name = str(name).lower()
        if name == "none":
            return None
    if name not in OPTIMIZERS:
        raise InvalidArgumentError(
            f"unknown optimizer {name!r}; choose one of adam, adamw, sgd, none")
    return name


def state_for(name: str | None, params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Optimizer state tensors (created outside the traced step, like a real
    optimizer's state after its first step)."""
    if name in ("adam", "adamw"):
        return [[torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]]
    return []


def step(name: str | None, params: list[torch.Tensor], grads: list[torch.Tensor],
         state: list[list[torch.Tensor]], lr: float = 1e-3, weight_decay: float = 0.0) -> None:
    """One optimizer step over all parameters, mirroring ``_multi_tensor_*``.

    The hyper-parameters are PyTorch's defaults (torch.optim.Adam, AdamW and
    SGD docs, https://pytorch.org/docs/stable/optim.html): lr=1e-3,
    betas=(0.9, 0.999), eps=1e-8, weight_decay=0 for Adam and 1e-2 for AdamW.
    lr, betas and eps are scalars of the kernels and change no kernel's cost;
    a non-zero weight_decay adds a kernel to Adam's step."""
    if name is None or not params:
        return
    if name == "sgd":
        torch._foreach_add_(params, grads, alpha=-lr)
        return
    exp_avg, exp_avg_sq = state
    beta1, beta2, eps = 0.9, 0.999, 1e-8  # torch.optim.Adam/AdamW defaults
    if name == "adamw":
        torch._foreach_mul_(params, 1 - lr * 0.01)  # AdamW's default weight_decay=1e-2
    elif weight_decay:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sq, beta2)
    torch._foreach_addcmul_(exp_avg_sq, grads, grads, 1 - beta2)
    bias_correction2_sqrt = (1 - beta2) ** 0.5
    step_size = lr / (1 - beta1)
    denom = torch._foreach_sqrt(exp_avg_sq)
    torch._foreach_div_(denom, bias_correction2_sqrt)
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(params, exp_avg, denom, -step_size)
