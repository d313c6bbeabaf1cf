"""Float8 training of ``nn.Linear`` layers, as ``amp="fp8"`` traces it.

The recipe is torchao's ``convert_to_float8_training`` with its default
(and fastest) "tensorwise" scaling, the one torchtitan's float8 runs use:
every ``nn.Linear`` whose weight has both dims divisible by 16 runs its three
GEMMs in float8 on the tensor cores (``torch._scaled_mm``), everything else as
bf16 autocast runs it. One layer's step, as the trace records it:

- forward: the input (bf16, autocast's cast) and the fp32 master weight are
  each scaled by their own absolute maximum (one reduction over the tensor)
  and cast to e4m3 (one kernel reading the tensor, writing one byte an
  element); ``_scaled_mm`` multiplies them and writes bf16.
- backward: the output gradient gets the same amax and cast, to e5m2; the
  input gradient is the float8 GEMM of it with the float8 weight, the weight
  gradient the float8 GEMM of its transpose with the float8 input.
  ``_scaled_mm`` takes its first operand row-major and its second
  column-major, so three float8 tensors are copied once into the other
  layout (weight, input and output gradient; one byte read and written an
  element each).
- memory: the float8 input and weight are what the layer keeps for backward
  (one byte an element, where bf16 autocast keeps two).
- inference: the weights are stored in float8 (``stored_weights``), as
  torchao's float8 inference quantization (``quantize_(model,
  Float8DynamicActivationFloat8WeightConfig())``) stores them, one byte a
  parameter; each call scales and casts its input only.

What this leaves out, and which way it errs: torch.compile, which torchao
asks for, fuses each amax into its cast and each layout copy into the cast
that feeds it, so the trace's casts cost a little more than the compiled
step's (about 5 bytes an element moved for the tensor, 4 fused), while
eager bf16 steps are priced eagerly too; the scales' own scalar kernels (a
few microseconds a layer) are not priced; rowwise scaling (per-row scales,
slower), delayed scaling, float8 all-gather of FSDP and float8 attention
(Transformer Engine's) are not modelled. ``torch._scaled_mm`` needs float8
tensor cores (compute capability 8.9 and newer: Ada, Hopper, Blackwell; AMD
CDNA3): predicting the step on other GPUs is refused
(predictor.hardware.float8_gpus).
"""

from __future__ import annotations

import torch

# torch._scaled_mm's rule for its operands: the reduction dim and the
# output's columns a multiple of 16 (torchao's and torchtitan's filter skips
# every Linear with a weight dim that is not).
ALIGN = 16
FORWARD = torch.float8_e4m3fn
BACKWARD = torch.float8_e5m2


def eligible(weight: object) -> bool:
    """Whether a linear layer's weight is one torchao converts to float8."""
    return (isinstance(weight, torch.Tensor) and weight.dim() == 2
            and weight.shape[0] % ALIGN == 0 and weight.shape[1] % ALIGN == 0)


def _to_float8(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensorwise dynamic scaling: the absolute maximum (one reduction, to an
    fp32 scalar) and the cast (one kernel). The scale (the float8 maximum
    over the amax) is one scalar operation that torch.compile folds into the
    reduction; the amax stands in for it (same shape and dtype, no kernel)."""
    amax = torch.linalg.vector_norm(x, float("inf"), dtype=torch.float32)
    return x.to(dtype), amax


def _column_major(x: torch.Tensor) -> torch.Tensor:
    """`x` as the column-major second operand of ``_scaled_mm`` (one copy)."""
    return x.t().contiguous().t()


class _Float8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k)
        x8, sx = _to_float8(x2, FORWARD)
        # A stored float8 weight (inference) has its scale beside it, no cast.
        w8, sw = (weight, sx) if weight.dtype == FORWARD else _to_float8(weight, FORWARD)
        # The bias is added in the GEMM's epilogue (cuBLASLt's, as torch
        # .compile's fusion of torchao's separate add would leave it: free).
        y = torch._scaled_mm(x8, w8.t(), sx, sw,
                             bias=None if bias is None else bias.to(x.dtype), out_dtype=x.dtype)
        ctx.save_for_backward(x8, w8, sx, sw)
        ctx.shapes = (lead, k, x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return y.reshape(*lead, weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x8, w8, sx, sw = ctx.saved_tensors
        lead, k, x_dtype, w_dtype, bias_dtype = ctx.shapes
        g2 = grad.reshape(-1, grad.shape[-1])
        g8, sg = _to_float8(g2, BACKWARD)
        dx = torch._scaled_mm(g8, _column_major(w8), sg, sw, out_dtype=x_dtype)
        dw = torch._scaled_mm(g8.t().contiguous(), _column_major(x8), sg, sx,
                              out_dtype=w_dtype)
        db = None if bias_dtype is None else g2.sum(0).to(bias_dtype)
        return dx.reshape(*lead, k), dw, db


def stored_weights(module: torch.nn.Module, params: dict) -> dict:
    """`params` (the module's fake parameters by name) with the weight of each
    eligible ``nn.Linear`` in float8, for inference. A weight tied to
    anything but such layers (an embedding shared with the output layer)
    stays as it is: the embedding lookup reads it in its own dtype."""
    holders: dict[int, list] = {}
    for m in module.modules():
        for pname, p in m.named_parameters(recurse=False):
            holders.setdefault(id(p), []).append((m, pname))
    out = dict(params)
    for name, p in module.named_parameters():
        held = holders.get(id(p), [])
        if held and eligible(p) and all(isinstance(m, torch.nn.Linear) and pname == "weight"
                                        for m, pname in held):
            out[name] = torch.empty(tuple(p.shape), dtype=FORWARD)
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` as a float8 layer: `x` in the autocast
    dtype (bf16), `weight` the fp32 master weight, or in inference the
    float8 one `stored_weights` gave the layer."""
    return _Float8Linear.apply(x, weight, bias)
