"""Ops the trace records for kernels a GPU build of PyTorch runs and a CPU
build lacks, so that the lowering can price them as the GPU runs them.

The frontend sends calls to them while tracing on fake tensors
(``predictor.frontend.cuda_paths``); the op-family registry
(``predictor.families``) prices them. On real tensors each computes what
ATen's CPU build computes.

- `fused_rms_norm` (``predictor::_fused_rms_norm``): ATen's
  ``_fused_rms_norm``, one kernel on a GPU, the composite on a CPU; its
  gradient is ATen's ``_fused_rms_norm_backward`` on fake tensors.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor


@torch.library.custom_op("predictor::_fused_rms_norm", mutates_args=())
def fused_rms_norm(input: Tensor, normalized_shape: list[int], weight: Optional[Tensor],
                   eps: Optional[float]) -> tuple[Tensor, Tensor]:
    """ATen's ``_fused_rms_norm`` as a GPU runs it: the normalised tensor and
    the rows' reciprocal RMS. On real tensors, the composite."""
    out, rstd = torch.ops.aten._fused_rms_norm(input, normalized_shape, weight, eps)
    return out.clone(), rstd.clone()


@fused_rms_norm.register_fake
def _fused_rms_norm_fake(input, normalized_shape, weight, eps):
    n = len(normalized_shape)
    stat = tuple(input.shape[:input.dim() - n]) + (1,) * n
    opmath = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    return torch.empty_like(input), input.new_empty(stat, dtype=opmath)


def _fused_rms_norm_context(ctx, inputs, output):
    input, normalized_shape, weight, _ = inputs
    ctx.save_for_backward(input, weight, output[1])
    ctx.normalized_shape = normalized_shape
    ctx.set_materialize_grads(False)  # the rstd output has no gradient to make


def _fused_rms_norm_backward(ctx, grad_out, _grad_rstd):
    input, weight, rstd = ctx.saved_tensors
    if grad_out is None:
        return None, None, None, None
    mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[2]]
    if isinstance(input, FakeTensor):
        grad_in, grad_w = torch.ops.aten._fused_rms_norm_backward(
            grad_out, input, ctx.normalized_shape, rstd, weight, mask)
        return (grad_in if mask[0] else None), None, (grad_w if mask[1] else None), None
    # real tensors (a CPU build has no _fused_rms_norm_backward): the composite's
    with torch.enable_grad():
        x = input.detach().requires_grad_()
        w = None if weight is None else weight.detach().requires_grad_()
        out = F.rms_norm(x, ctx.normalized_shape, w, None)
        grads = torch.autograd.grad(out, [x] + ([w] if w is not None else []), grad_out)
    return grads[0], None, (grads[1] if w is not None else None), None


fused_rms_norm.register_autograd(_fused_rms_norm_backward, setup_context=_fused_rms_norm_context)
