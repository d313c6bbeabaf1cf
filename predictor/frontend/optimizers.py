"""Optimizer steps as the GPU runs them.

PyTorch's Adam/AdamW/SGD default to the multi-tensor (``foreach``) path on CUDA:
a handful of ``_foreach_*`` kernels over all parameters at once. The functional
optimizers in ``torch.optim`` read the step counter with ``.item()``, which a
fake-tensor trace cannot do, so the same kernel sequence is written out here
(bias corrections are host-side Python floats on the GPU path too).

An optimizer name is a base name with optional variants, ``BASE[-loop][+clip]``:

- ``adam``, ``adamw``, ``sgd``: the base step (``none``: no step);
- ``-loop``: the for-loop implementation (``foreach=False``, PyTorch's
  ``_single_tensor_*``), a kernel per parameter per operation, as custom
  per-parameter optimizers run too (the original BERT's ``BertAdam``);
- ``-fused`` (Adam, AdamW): ``fused=True``, PyTorch's ``_fused_adam_`` /
  ``_fused_adamw_``, one multi-tensor kernel that reads parameters,
  gradients and both moments once and writes parameters and moments (apex's
  FusedAdam, Hugging Face's ``adamw_torch_fused``), after a multi-tensor
  increment of the step counters;
- ``+clip``: ``torch.nn.utils.clip_grad_norm_`` before the step (the default
  of Hugging Face's Trainer, ``max_grad_norm=1.0``): a multi-tensor norm of
  every gradient, the total, and a multi-tensor scale of every gradient. The
  maximum norm changes no kernel's cost, so it is not part of the name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from predictor.errors import InvalidArgumentError

if TYPE_CHECKING:
    import torch

# The names are checked without torch (a graph loaded from disk is validated
# by predictor.optable, which never imports it); the steps import it.

BASES = ("adam", "adamw", "sgd")
OPTIMIZERS = BASES + (None,)
LOOP, FUSED, CLIP = "-loop", "-fused", "+clip"
FORMS = ("adam, adamw, sgd or none, with -loop (foreach=False) or -fused (adam, adamw: "
         "fused=True), and/or +clip (clip_grad_norm_)")


def _strip(name: str) -> tuple[str, bool, bool, bool]:
    clip = name.endswith(CLIP)
    if clip:
        name = name[: -len(CLIP)]
    loop = name.endswith(LOOP)
    if loop:
        name = name[: -len(LOOP)]
    fused = not loop and name.endswith(FUSED)
    if fused:
        name = name[: -len(FUSED)]
    return name, loop, fused, clip


def parse(name: str | None) -> tuple[str | None, bool, bool]:
    """(base, loop, clip) of a checked name (`fused` says whether it is -fused)."""
    if name is None:
        return None, False, False
    base, loop, _, clip = _strip(name)
    return base, loop, clip


def fused(name: str | None) -> bool:
    """Whether a checked name is a -fused step."""
    return name is not None and _strip(name)[2]


def check(name: str | None) -> str | None:
    """The canonical form of an optimizer name (None for none); anything else
    is an InvalidArgumentError listing the forms."""
    if name is None:
        return None
    text = str(name).strip().lower().replace("_", "-")
    if text == "none":
        return None
    base, loop, fuse, clip = _strip(text)
    if base not in BASES:
        raise InvalidArgumentError(f"unknown optimizer {name!r}; choose one of {FORMS} "
                                   "(e.g. adamw, adamw+clip, adam-loop, adamw-fused)")
    if fuse and base == "sgd":
        raise InvalidArgumentError(f"unknown optimizer {name!r}: -fused is for adam and adamw "
                                   "(PyTorch's fused Adam and AdamW)")
    return base + (LOOP if loop else FUSED if fuse else "") + (CLIP if clip else "")


def state_for(name: str | None, params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Optimizer state tensors (created outside the traced step, like a real
    optimizer's state after its first step)."""
    import torch

    if parse(name)[0] in ("adam", "adamw"):
        state = [[torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]]
        if fused(name):  # the fused kernels keep each step counter as a tensor
            state.append([torch.zeros((), dtype=torch.float32, device=p.device)
                          for p in params])
        return state
    return []


def torch_optimizer(name: str | None, params: list[torch.Tensor]):
    """The torch.optim optimizer a checked name stands for (multi-tensor, or
    ``foreach=False`` for ``-loop``), None for no step or no parameters; the
    caller clips first where ``parse(name)[2]`` (``+clip``)."""
    import torch

    base, loop, _ = parse(name)
    if base is None or not params:
        return None
    make = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[base]
    if fused(name):
        return make(params, lr=1e-3, fused=True)
    return make(params, lr=1e-3, foreach=not loop)


def clip_grad_norm(grads: list[torch.Tensor], max_norm: float = 1.0) -> None:
    """``torch.nn.utils.clip_grad_norm_`` on CUDA (its foreach path): the norm
    of each gradient in one multi-tensor kernel, their norm, the clip
    coefficient clamped at 1, and one multi-tensor scale of every gradient."""
    import torch

    if not grads:
        return
    norms = torch._foreach_norm(grads, 2.0)
    total = torch.linalg.vector_norm(torch.stack(list(norms)), 2.0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_mul_(grads, coef)


def step(name: str | None, params: list[torch.Tensor], grads: list[torch.Tensor],
         state: list[list[torch.Tensor]], lr: float = 1e-3, weight_decay: float = 0.0) -> None:
    """One optimizer step over all parameters, mirroring ``_multi_tensor_*``
    (``-loop``: ``_single_tensor_*``; ``-fused``: ``_fused_adam(w)``),
    gradients clipped first for ``+clip``.

    The hyper-parameters are PyTorch's defaults (torch.optim.Adam, AdamW and
    SGD docs, https://pytorch.org/docs/stable/optim.html): lr=1e-3,
    betas=(0.9, 0.999), eps=1e-8, weight_decay=0 for Adam and 1e-2 for AdamW.
    lr, betas and eps are scalars of the kernels and change no kernel's cost;
    a non-zero weight_decay adds a kernel to Adam's step."""
    import torch

    base, loop, clip = parse(name)
    if base is None or not params:
        return
    if clip:
        clip_grad_norm(grads)
    if loop:
        _loop_step(base, params, grads, state, lr, weight_decay)
        return
    if fused(name):
        exp_avg, exp_avg_sq, steps = state
        torch._foreach_add_(steps, 1)
        kernel = torch._fused_adamw_ if base == "adamw" else torch._fused_adam_
        kernel(params, grads, exp_avg, exp_avg_sq, [], steps, lr=lr, beta1=0.9, beta2=0.999,
               weight_decay=0.01 if base == "adamw" else weight_decay, eps=1e-8,
               amsgrad=False, maximize=False)
        return
    if base == "sgd":
        torch._foreach_add_(params, grads, alpha=-lr)
        return
    exp_avg, exp_avg_sq = state
    beta1, beta2, eps = 0.9, 0.999, 1e-8  # torch.optim.Adam/AdamW defaults
    if base == "adamw":
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


def _loop_step(base: str, params: list[torch.Tensor], grads: list[torch.Tensor],
               state: list[list[torch.Tensor]], lr: float, weight_decay: float) -> None:
    """PyTorch's ``_single_tensor_adam`` / ``_single_tensor_sgd`` (no momentum,
    not capturable): the same operations as the foreach step, one parameter
    at a time, each a kernel of its own."""
    if base == "sgd":
        for p, g in zip(params, grads):
            p.add_(g, alpha=-lr)
        return
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    bias_correction2_sqrt = (1 - beta2) ** 0.5
    step_size = lr / (1 - beta1)
    for p, g, m, v in zip(params, grads, *state):
        if base == "adamw":
            p.mul_(1 - lr * 0.01)
        elif weight_decay:
            g = g.add(p, alpha=weight_decay)
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v.sqrt() / bias_correction2_sqrt).add_(eps)
        p.addcdiv_(m, denom, value=-step_size)
