"""Time the OpTable's rows on the local device.

Each distinct row (family + dims at one batch size + dtype) is materialised as a
real op on tensors of its recorded shapes and timed the way a benchmark should
be: warm-up first (allocator, oneDNN/cuDNN plan caches, clocks), then
repeated samples and their median. On CUDA a sample is bracketed by CUDA
events after a synchronisation; on a CPU by ``time.perf_counter``, with enough
calls per sample that the timer's resolution does not matter.

The OpTable keeps what a row costs, not the exact aten call that produced it,
so each family is mapped back to a torch call with the same work:

    matmul              torch.mm / torch.bmm
    conv / dgrad / wgrad   conv2d, aten.convolution_backward (one output mask each)
    attention (+ bwd)   F.scaled_dot_product_attention, its autograd backward
    lstm (+ bwd)        one nn.LSTM (GRU, RNN by the row's gates) layer, its autograd backward
    batch norm (+ bwd)  F.batch_norm (fp32 weights, the row's memory format), its
                        autograd backward: the backend a real step gets
    softmax, layer norm (+ bwd), embedding (+ bwd), pooling (+ bwd), dropout
                        the op itself on tensors holding the recorded element counts
    optimizer           the torch._foreach_* op over as many tensors as the row names
    elementwise, reduction, loss, copy, fill, unsupported
                        the named op where the name is known, else a kernel moving
                        the same bytes (add, sum, clone, zeros)

A row that cannot be materialised (fp8 on a CPU, a shape too large for the
device, an op that rejects the reconstruction) is left unmeasured with a
reason; the engine then uses the model's prediction for it.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from predictor.kernels import layout as L
from predictor.registry import Registry

aten = torch.ops.aten

TORCH_DTYPES = {
    L.F32: torch.float32, L.F16: torch.float16, L.BF16: torch.bfloat16, L.F64: torch.float64,
    L.I64: torch.int64, L.I32: torch.int32, L.I8: torch.int8, L.BOOL: torch.bool,
}

Runner = Callable[[], object]


class Unrunnable(Exception):
    """This row cannot be materialised on this device (the reason is the message)."""


@dataclass
class RowContext:
    """What a runner builder gets: the row and where to run it."""

    family: int
    dtype: torch.dtype
    kernels: int
    dims: tuple[int, ...]
    op_name: str
    batch: int
    device: torch.device

    def tensor(self, *shape: int, dtype: torch.dtype | None = None,
               requires_grad: bool = False) -> torch.Tensor:
        """A random tensor of `shape` on the device (ints in [0, 2), bools random)."""
        dt = dtype or self.dtype
        shape = tuple(max(int(s), 1) for s in shape) if shape else ()
        if dt.is_floating_point:
            t = torch.randn(shape, dtype=dt, device=self.device)
            return t.requires_grad_(requires_grad)
        if dt == torch.bool:
            return torch.rand(shape, device=self.device) > 0.5
        return torch.randint(0, 2, shape, dtype=dt, device=self.device)

    @property
    def float_dtype(self) -> torch.dtype:
        return self.dtype if self.dtype.is_floating_point else torch.float32


# ------------------------------------------------------------------ registry --

BUILDERS: Registry = Registry("runner builder")  # family -> Callable[[RowContext], Runner]


def builder(*families: int):
    """Register the runner builder of op families. A family that already has
    one is refused at import, so no builder is silently lost."""
    return BUILDERS.register(*families)


# ------------------------------------------------------------ GEMM and conv --

@builder(L.MATMUL)
def _matmul(c: RowContext) -> Runner:
    """A @ B with the operand layouts the row records (dims[GEMM_LAYOUT]): a
    transposed operand is a transposed view, as F.linear's W^T and a weight
    gradient's X^T are, so cuBLAS runs the same `tn` / `nt` kernel."""
    b, m, n, k = c.dims[:4]
    layout = int(c.dims[L.GEMM_LAYOUT]) if len(c.dims) > L.GEMM_LAYOUT else 0
    dt = c.float_dtype

    def operand(rows: int, cols: int, transposed: bool) -> torch.Tensor:
        batch = () if b <= 1 else (b,)
        if transposed:
            return c.tensor(*batch, cols, rows, dtype=dt).transpose(-1, -2)
        return c.tensor(*batch, rows, cols, dtype=dt)

    x = operand(m, k, bool(layout & L.GEMM_A_T))
    w = operand(k, n, bool(layout & L.GEMM_B_T))
    return (lambda: torch.mm(x, w)) if b <= 1 else (lambda: torch.bmm(x, w))


def _padding(size_in: int, kernel: int, size_out: int, stride: int) -> int:
    """The symmetric padding that maps size_in to size_out (dilation 1)."""
    return max(0, math.ceil(((size_out - 1) * stride + kernel - size_in) / 2))


def _conv_setup(c: RowContext):
    n, ch, h, w, k, r, s, p, q, groups, stride = c.dims[:11]
    groups, stride = max(groups, 1), max(stride, 1)
    if ch % groups or k % groups:
        raise Unrunnable(f"channels {ch}->{k} not divisible by groups {groups}")
    stride_w = stride if w > 1 else 1
    pad = (_padding(h, r, p, stride), _padding(w, s, q, stride_w))
    dt = c.float_dtype
    x = c.tensor(n, ch, h, w, dtype=dt)
    wt = c.tensor(k, ch // groups, r, s, dtype=dt)
    if dt in (torch.float16, torch.bfloat16):
        # Channels-last: the tensor-core kernel alone. In NCHW cuDNN would add
        # its layout transposes, which the graph holds as rows of their own
        # (predictor.families._layout_transposes), priced by the model.
        x = x.contiguous(memory_format=torch.channels_last)
        wt = wt.contiguous(memory_format=torch.channels_last)
    args = dict(stride=(stride, stride_w), padding=pad, groups=groups)
    return x, wt, args


@builder(L.CONV)
def _conv(c: RowContext) -> Runner:
    x, wt, a = _conv_setup(c)
    return lambda: F.conv2d(x, wt, None, a["stride"], a["padding"], 1, a["groups"])


def _conv_backward(c: RowContext, mask: list[bool]) -> Runner:
    x, wt, a = _conv_setup(c)
    with torch.no_grad():
        y = F.conv2d(x, wt, None, a["stride"], a["padding"], 1, a["groups"])
    grad = torch.randn_like(y)
    stride, padding, groups = list(a["stride"]), list(a["padding"]), a["groups"]
    return lambda: aten.convolution_backward(grad, x, wt, None, stride, padding, [1, 1], False,
                                             [0, 0], groups, mask)


@builder(L.CONV_DGRAD)
def _conv_dgrad(c: RowContext) -> Runner:
    return _conv_backward(c, [True, False, False])


@builder(L.CONV_WGRAD)
def _conv_wgrad(c: RowContext) -> Runner:
    return _conv_backward(c, [False, True, False])


# -------------------------------------------------------- attention, LSTM --

def _attention_inputs(c: RowContext):
    b, h, sq, sk, d, dv, causal = c.dims[:7]
    dt = c.float_dtype
    q = c.tensor(b, h, sq, d, dtype=dt, requires_grad=True)
    k = c.tensor(b, h, sk, d, dtype=dt, requires_grad=True)
    v = c.tensor(b, h, sk, dv, dtype=dt, requires_grad=True)
    return q, k, v, bool(causal)


@builder(L.ATTENTION)
def _attention(c: RowContext) -> Runner:
    q, k, v, causal = _attention_inputs(c)
    # Inputs that require grad select the training kernel (it saves logsumexp).
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _autograd_backward(out: torch.Tensor, inputs: tuple) -> Runner:
    grad = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True)


@builder(L.ATTENTION_BWD)
def _attention_bwd(c: RowContext) -> Runner:
    q, k, v, causal = _attention_inputs(c)
    return _autograd_backward(F.scaled_dot_product_attention(q, k, v, is_causal=causal), (q, k, v))


# A recurrent row's layer by its gates (dims[4]; 0 is an LSTM's).
_RECURRENT_LAYERS = {0: torch.nn.LSTM, 4: torch.nn.LSTM, 3: torch.nn.GRU, 1: torch.nn.RNN}


def _lstm_setup(c: RowContext):
    steps, batch, inp, hidden = c.dims[:4]
    gates = int(c.dims[4]) if len(c.dims) > 4 else 0
    dt = c.float_dtype
    kind = _RECURRENT_LAYERS.get(gates, torch.nn.LSTM)
    layer = kind(inp, hidden).to(device=c.device, dtype=dt)
    x = c.tensor(steps, batch, inp, dtype=dt, requires_grad=True)
    return layer, x


@builder(L.LSTM)
def _lstm(c: RowContext) -> Runner:
    layer, x = _lstm_setup(c)
    return lambda: layer(x)


@builder(L.LSTM_BWD)
def _lstm_bwd(c: RowContext) -> Runner:
    layer, x = _lstm_setup(c)
    out, _ = layer(x)
    return _autograd_backward(out, (x, *layer.parameters()))


# ----------------------------------------------- normalisation and softmax --

def _mem(c: RowContext) -> tuple[int, int, int, int]:
    d = c.dims
    return (int(d[L.MEM_READ]), int(d[L.MEM_WRITTEN]), max(int(d[L.MEM_INNER]), 1),
            max(int(d[L.MEM_OUTER]), 1))


def _half_to_float(c: RowContext, read: int, written: int, n: int) -> bool:
    """Whether a 16-bit softmax row is fp16 autocast's half_to_float kernel:
    it writes (forward) or reads (backward) fp32, twice its elements in the
    row's units (families._softmax). CUDA only: the CPU has no such kernel."""
    wide = written if c.family == L.SOFTMAX else read // 2
    return c.device.type == "cuda" and c.float_dtype.itemsize == 2 and wide >= 2 * n


@builder(L.SOFTMAX)
def _softmax(c: RowContext) -> Runner:
    read, written, inner, outer = _mem(c)
    x = c.tensor(outer, inner, dtype=c.float_dtype)
    op = aten._log_softmax if "log" in c.op_name else aten._softmax
    half_to_float = _half_to_float(c, read, written, inner * outer)
    return lambda: op(x, -1, half_to_float)


@builder(L.SOFTMAX_BWD)
def _softmax_bwd(c: RowContext) -> Runner:
    read, written, inner, outer = _mem(c)
    dt = c.float_dtype
    # After a half_to_float forward the gradient and output are fp32.
    wide = torch.float32 if _half_to_float(c, read, written, inner * outer) else dt
    g, y = c.tensor(outer, inner, dtype=wide), torch.softmax(c.tensor(outer, inner, dtype=wide), -1)
    op = aten._log_softmax_backward_data if "log" in c.op_name else aten._softmax_backward_data
    return lambda: op(g, y, -1, dt)


def _layer_norm_setup(c: RowContext):
    _, _, inner, outer = _mem(c)
    dt = c.float_dtype
    x = c.tensor(outer, inner, dtype=dt)
    w, b = c.tensor(inner, dtype=dt), c.tensor(inner, dtype=dt)
    return x, w, b, inner


@builder(L.LAYER_NORM)
def _layer_norm(c: RowContext) -> Runner:
    x, w, b, inner = _layer_norm_setup(c)
    return lambda: aten.native_layer_norm(x, [inner], w, b, 1e-5)


@builder(L.LAYER_NORM_BWD)
def _layer_norm_bwd(c: RowContext) -> Runner:
    x, w, b, inner = _layer_norm_setup(c)
    _, mean, rstd = aten.native_layer_norm(x, [inner], w, b, 1e-5)
    g = torch.randn_like(x)
    mask = [True, c.kernels > 1, c.kernels > 1]
    return lambda: aten.native_layer_norm_backward(g, x, [inner], mean, rstd, w, b, mask)


def _batch_norm_setup(c: RowContext, requires_grad: bool = False):
    """The row's input (N, C, H, W) in its memory format, and fp32 weights and
    running statistics as a module keeps them in fp32 training and under
    autocast alike: PyTorch then picks the backend a real step gets (cuDNN for
    fp32 and fp16 inputs, its own kernels for bf16;
    kernels.roofline.per_channel_batch_norm_us)."""
    _, _, inner, channels = _mem(c)
    dt = c.float_dtype
    # inner = N * H * W: split the batch back out when it divides.
    n = c.batch if c.batch > 0 and inner % c.batch == 0 else 1
    hw = inner // n
    w = max(d for d in range(1, math.isqrt(hw) + 1) if hw % d == 0)
    x = c.tensor(n, channels, hw // w, w, dtype=dt)
    if len(c.dims) > L.MEM_LAYOUT and c.dims[L.MEM_LAYOUT] > 0:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(requires_grad)
    f32 = torch.float32
    wt, b = c.tensor(channels, dtype=f32), c.tensor(channels, dtype=f32)
    rm = torch.zeros(channels, dtype=f32, device=c.device)
    rv = torch.ones(channels, dtype=f32, device=c.device)
    return x, wt, b, rm, rv


@builder(L.BATCH_NORM)
def _batch_norm(c: RowContext) -> Runner:
    x, w, b, rm, rv = _batch_norm_setup(c)
    training = c.kernels > 1
    return lambda: F.batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5)


@builder(L.BATCH_NORM_BWD)
def _batch_norm_bwd(c: RowContext) -> Runner:
    x, w, b, rm, rv = _batch_norm_setup(c, requires_grad=True)
    w.requires_grad_(True)
    b.requires_grad_(True)
    return _autograd_backward(F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5), (x, w, b))


# ------------------------------------------------ embedding, pool, dropout --

@builder(L.EMBEDDING)
def _embedding(c: RowContext) -> Runner:
    _, _, d, n = _mem(c)
    vocab = max(n, 1024)
    w = c.tensor(vocab, d, dtype=c.float_dtype)
    idx = torch.randint(0, vocab, (n,), device=c.device)
    return lambda: F.embedding(idx, w)


@builder(L.EMBEDDING_BWD)
def _embedding_bwd(c: RowContext) -> Runner:
    _, written, d, n = _mem(c)
    num_weights = max((written - n * d // 4) // d, 1)
    g = c.tensor(n, d, dtype=c.float_dtype)
    idx = torch.randint(0, num_weights, (n,), device=c.device)
    return lambda: aten.embedding_dense_backward(g, idx, num_weights, -1, False)


def _max_pool_nchw_setup(c: RowContext, requires_grad: bool):
    """An NCHW max pool (layout.MAX_POOL_NCHW) rebuilt from its row: square
    planes, the window's side from the window elements per output, the
    stride from inputs per output, padding that keeps that many outputs
    (ResNet's 3x3 stride-2 pool with padding 1 comes back as itself)."""
    read, written, _, channels = _mem(c)
    if c.family == L.POOL:  # reads x; writes the output and its indices
        inputs, outputs = read, max(written // 2, 1)
    else:  # reads grad, x and the indices; writes x's gradient
        inputs, outputs = written, max((read - written) // 2, 1)
    k = max(int(round(math.sqrt(int(c.dims[L.MEM_WINDOW_ELEMS]) / outputs))), 1)
    s = max(int(round(math.sqrt(inputs / outputs))), 1)
    n = c.batch if c.batch > 0 and inputs % (c.batch * channels) == 0 else 1
    side = max(int(round(math.sqrt(inputs / (n * channels)))), 1)
    out_side = max(int(round(math.sqrt(outputs / (n * channels)))), 1)
    pad = next((p for p in range(0, k // 2 + 1) if (side + 2 * p - k) // s + 1 == out_side), 0)
    x = c.tensor(n, channels, side, side, dtype=c.float_dtype, requires_grad=requires_grad)
    return x, lambda t: F.max_pool2d(t, k, s, pad)


def _pool_setup(c: RowContext, requires_grad: bool):
    read, written, window, channels = _mem(c)
    if len(c.dims) > L.MEM_WINDOW_ELEMS and int(c.dims[L.MEM_GENERIC]) == L.MAX_POOL_NCHW:
        return _max_pool_nchw_setup(c, requires_grad)
    # The row keeps element counts only: pool `channels` square planes by the
    # recorded read/write ratio (global pools when the output is one per plane).
    per_plane = max(read // max(channels, 1), 1)
    side = max(int(round(math.sqrt(per_plane))), 1)
    x = c.tensor(1, channels, side, side, dtype=c.float_dtype, requires_grad=requires_grad)
    if written <= channels:
        return x, lambda t: F.adaptive_avg_pool2d(t, 1)
    k = max(int(round(math.sqrt(max(read / max(written, 1), 1)))), 1)
    if "max" in c.op_name:
        return x, lambda t: F.max_pool2d(t, k, k)
    return x, lambda t: F.avg_pool2d(t, k, k)


@builder(L.POOL)
def _pool(c: RowContext) -> Runner:
    x, fn = _pool_setup(c, False)
    return lambda: fn(x)


@builder(L.POOL_BWD)
def _pool_bwd(c: RowContext) -> Runner:
    x, fn = _pool_setup(c, True)
    return _autograd_backward(fn(x), (x,))


@builder(L.DROPOUT)
def _dropout(c: RowContext) -> Runner:
    read, written, _, _ = _mem(c)
    if read == 0:  # random number generation (bernoulli_, rand_like)
        out = torch.empty(max(written, 1), dtype=c.float_dtype, device=c.device)
        return lambda: out.uniform_()
    x = c.tensor(read, dtype=c.float_dtype)
    return lambda: aten.native_dropout(x, 0.1, True)


# ---------------------------------------------------------------- optimizer --

# Scalars the optimizer's foreach ops take besides their tensor lists.
_FOREACH_LISTS = {"_foreach_add_": 2, "_foreach_add": 2, "_foreach_lerp_": 2,
                  "_foreach_addcmul_": 3, "_foreach_addcdiv_": 3, "_foreach_mul_": 1,
                  "_foreach_mul": 1, "_foreach_div_": 1, "_foreach_sqrt": 1,
                  "_foreach_sqrt_": 1, "_foreach_neg": 1, "_foreach_copy_": 2,
                  "_foreach_zero_": 1, "_foreach_sub_": 2, "_foreach_maximum_": 2}


@builder(L.OPTIMIZER)
def _optimizer(c: RowContext) -> Runner:
    read, written, _, n_tensors = _mem(c)
    # In-place ops write their first list, out-of-place ones a new list of that size.
    per_list = max(written, 1)
    lists = _FOREACH_LISTS.get(c.op_name, max(int(round(read / per_list)), 1))
    n = max(min(n_tensors, per_list), 1)
    sizes = [per_list // n + (1 if i < per_list % n else 0) for i in range(n)]
    dt = c.float_dtype
    tl = [[torch.rand(s, dtype=dt, device=c.device) + 0.5 for s in sizes] for _ in range(lists)]
    name = c.op_name
    if name == "_foreach_lerp_":
        return lambda: torch._foreach_lerp_(tl[0], tl[1], 0.1)
    if name in ("_foreach_addcmul_", "_foreach_addcdiv_"):
        op = getattr(torch, name)
        return lambda: op(tl[0], tl[1], tl[2], 1e-3)
    if name in ("_foreach_sqrt", "_foreach_sqrt_", "_foreach_neg", "_foreach_zero_"):
        op = getattr(torch, name)
        return lambda: op(tl[0])
    if name in ("_foreach_mul_", "_foreach_mul", "_foreach_div_"):
        op = getattr(torch, name)
        return lambda: op(tl[0], 1.0001)
    if lists >= 3:
        return lambda: torch._foreach_addcmul_(tl[0], tl[1], tl[2], 1e-3)
    if lists == 2:
        return lambda: torch._foreach_add_(tl[0], tl[1], alpha=1e-3)
    return lambda: torch._foreach_mul_(tl[0], 1.0001)


# ------------------------------------------- elementwise and memory movers --

_UNARY = {"relu", "gelu", "tanh", "sigmoid", "silu", "exp", "log", "neg", "abs", "sqrt", "rsqrt",
          "erf", "sin", "cos", "reciprocal", "square", "hardtanh", "elu", "softplus", "mish",
          "leaky_relu", "sign", "floor", "ceil", "round", "logical_not", "bitwise_not"}
_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "rsub": torch.rsub, "pow": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
    "ge": torch.ge,
    "threshold_backward": lambda g, x: aten.threshold_backward(g, x, 0.0),
    "gelu_backward": lambda g, x: aten.gelu_backward(g, x),
    "tanh_backward": lambda g, y: aten.tanh_backward(g, y),
    "sigmoid_backward": lambda g, y: aten.sigmoid_backward(g, y),
    "silu_backward": lambda g, x: aten.silu_backward(g, x),
}


def _base_name(op_name: str) -> str:
    return op_name.rstrip("_")


def _elementwise_inputs(c: RowContext, read: int, written: int):
    """Tensors reading `read` elements in total that broadcast to `written`."""
    full = max(int(read // max(written, 1)), 0)
    extra = read - full * written
    ins = [c.tensor(written) for _ in range(full)]
    if extra > 0 and written % extra == 0:
        ins.append(c.tensor(extra))  # broadcast along the last dim
        ins = [t.view(-1, extra) if t.numel() == written else t for t in ins]
    return ins


def _generic_mover(c: RowContext, read: int, written: int) -> Runner:
    """A kernel reading `read` and writing `written` elements."""
    if read == 0:
        return lambda: torch.zeros(max(written, 1), dtype=c.dtype, device=c.device)
    if written * 4 <= read:  # a reduction
        cols = max(read // max(written, 1), 1)
        x = c.tensor(max(written, 1), cols)
        if x.dtype == torch.bool:
            return lambda: x.any(-1)
        return lambda: x.sum(-1)
    ins = _elementwise_inputs(c, read, written)
    if not ins:
        x = c.tensor(max(written, 1))
        return lambda: x.clone()
    if len(ins) == 1:
        x = ins[0]
        return lambda: x.clone()
    if len(ins) == 2:
        a, b = ins
        return lambda: torch.add(a, b) if a.dtype != torch.bool else torch.logical_or(a, b)
    a, b, d = ins[:3]
    if a.dtype.is_floating_point:
        return lambda: torch.addcmul(a, b, d)
    return lambda: a + b + d


@builder(L.ELEMENTWISE)
def _elementwise(c: RowContext) -> Runner:
    read, written, inner, outer = _mem(c)
    name = _base_name(c.op_name)
    if read == 0 or written == 0:
        return _generic_mover(c, read, written)
    if len(c.dims) > L.MEM_GENERIC and int(c.dims[L.MEM_GENERIC]) == L.CAST_BINARY:
        # Inputs of two dtypes (an fp32 + bf16 add under autocast): one in the
        # row's dtype, one in fp32, as the unrolled kernel with casting loads
        # runs them.
        a, b = c.tensor(inner * outer), c.tensor(inner * outer, dtype=torch.float32)
        fn = _BINARY.get(name, torch.add)
        return lambda: fn(a, b)
    ins = _elementwise_inputs(c, read, written)
    if len(ins) == 1 and name in _UNARY and hasattr(torch, name):
        fn, x = getattr(torch, name, None), ins[0]
        if name in ("gelu", "silu", "elu", "softplus", "mish", "hardtanh", "leaky_relu"):
            fn = getattr(F, name)
        return lambda: fn(x)
    if len(ins) == 1:  # tensor-with-scalar arithmetic (mul by a constant, ...)
        x = ins[0]
        op = _BINARY.get(name)
        if op is not None and name in ("add", "sub", "mul", "div", "pow", "rsub"):
            return lambda: op(x, 2)
    if len(ins) == 2 and name in _BINARY:
        fn, (a, b) = _BINARY[name], ins
        return lambda: fn(a, b)
    if len(ins) == 3 and name == "where":
        cond = ins[0] > 0 if ins[0].dtype != torch.bool else ins[0]
        a, b = ins[1], ins[2]
        return lambda: torch.where(cond, a, b)
    return _generic_mover(c, read, written)


@builder(L.REDUCTION, L.LOSS, L.UNSUPPORTED)
def _reduction(c: RowContext) -> Runner:
    read, written, inner, outer = _mem(c)
    if c.family == L.REDUCTION and read > 0 and inner * max(written, 1) <= read:
        x = c.tensor(max(written, 1), max(read // max(written, 1), 1))
        if x.dtype == torch.bool:
            return lambda: x.any(-1)
        name = _base_name(c.op_name)
        if name in ("amax", "max"):
            return lambda: x.amax(-1)
        if name == "mean" and x.dtype.is_floating_point:
            return lambda: x.mean(-1)
        return lambda: x.sum(-1)
    return _generic_mover(c, read, written)


@builder(L.COPY)
def _copy(c: RowContext) -> Runner:
    read, written, inner, outer = _mem(c)
    kind = int(c.dims[L.MEM_GENERIC]) if len(c.dims) > L.MEM_GENERIC else 0
    if kind == L.COPY_STRIDED:
        # A permuted view made contiguous, its innermost dim kept (attention's
        # head split): ATen's generic strided kernel.
        p = max(d for d in range(1, math.isqrt(outer) + 1) if outer % d == 0)
        x = c.tensor(p, outer // p, inner).transpose(0, 1)
        return lambda: x.contiguous()
    if kind == L.COPY_CAST:
        # The row counts elements in its narrowest dtype: a widening cast to
        # fp32 (autocast's), or from an integer or bool tensor to fp32.
        x = c.tensor(inner * outer)
        return lambda: x.to(torch.float32)
    if read == 0:
        return _generic_mover(c, read, written)
    if read > written:  # gathers, index_select: read a larger source
        src = c.tensor(read)
        idx = torch.randint(0, max(read, 1), (max(written, 1),), device=c.device)
        return lambda: src.index_select(0, idx)
    if read < written:  # cat of pieces, repeat, pad: write more than read
        x = c.tensor(read)
        reps = max(written // max(read, 1), 1)
        return lambda: x.repeat(reps)
    x = c.tensor(read)
    return lambda: x.clone()


@builder(L.FILL)
def _fill(c: RowContext) -> Runner:
    _, written, _, _ = _mem(c)
    dt, dev = c.dtype, c.device
    return lambda: torch.zeros(max(written, 1), dtype=dt, device=dev)


# ------------------------------------------------------------------ timing --

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def host_clock(name: str) -> Callable[[], float]:
    """`wall`: elapsed time (what a user waits for). `cpu`: CPU time of this
    process, which on a single-threaded run equals the uncontended wall time
    even while other processes share the cores (a shared CI box)."""
    if name not in CLOCKS:
        raise ValueError(f"unknown clock {name!r}; choose wall or cpu")
    return CLOCKS[name]


def sample_runner(fn: Runner, device: torch.device, samples: int = 1, min_sample_s: float = 2e-3,
                  warmup_s: float = 0.02, clock: str = "wall", min_warmup_calls: int = 2
                  ) -> list[float]:
    """`samples` timings of one call of `fn`, microseconds each.

    Warm-up calls run until `warmup_s` has passed (at least
    `min_warmup_calls`); each sample then runs enough calls to last
    `min_sample_s`, so that timer resolution and per-sample jitter do not
    dominate short ops. On CUDA the samples are CUDA-event intervals after a
    synchronisation (`clock` is ignored).
    """
    now = host_clock(clock)
    _sync(device)
    start = now()
    calls = 0
    while calls < min_warmup_calls or now() - start < warmup_s:
        fn()
        _sync(device)
        calls += 1
        if calls >= 1000:
            break
    single = (now() - start) / max(calls, 1)
    inner = max(1, min(10000, int(math.ceil(min_sample_s / max(single, 1e-7)))))
    out = []
    for _ in range(max(int(samples), 1)):
        if device.type == "cuda":
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            out.append(begin.elapsed_time(end) * 1e3 / inner)
        else:
            t0 = now()
            for _ in range(inner):
                fn()
            out.append((now() - t0) * 1e6 / inner)
    return out


# ---------------------------------------------------------------- the table --

@dataclass
class RowTimes:
    """Measured time of one execution of every OpTable row (0: not measured)."""

    us: np.ndarray
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows

    @property
    def measured(self) -> int:
        return int((self.us > 0).sum())


def row_bytes(family: int, dims: np.ndarray, elem_bytes: int) -> float:
    """Rough memory footprint of a materialised row (to skip what cannot fit)."""
    from predictor.kernels.work import flops_and_elems

    d = np.zeros(L.MAX_DIMS, dtype=np.int64)
    d[:len(dims)] = dims
    _, elems = flops_and_elems(int(family), d)
    return float(elems) * elem_bytes * 2


def device_memory_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return float(free)
    try:
        import os

        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 8e9


def build_runner(ctx: RowContext) -> Runner:
    make = BUILDERS.get(ctx.family)
    if make is None:
        raise Unrunnable(f"no runner for family {L.FAMILY_NAMES[ctx.family]}")
    return make(ctx)


def measure_table(ops, batch: int, device: torch.device, *, repeats: int = 7,
                  min_sample_s: float = 2e-3, progress: bool = True,
                  description: str = "", clock: str = "wall",
                  between_passes: Callable[[int], None] | None = None,
                  bar: Callable | None = None, weights: np.ndarray | None = None) -> RowTimes:
    """Time every row of the OpTable `ops` at batch size `batch` on `device`.

    Rows with the same family, dtype, dims and op name are timed once. The
    `repeats` samples of a row are taken in `repeats` passes over the whole
    table (each pass materialises the row afresh, warms it up and takes one
    sample), and a row's time is the median over the passes: a burst of
    interference from other work on the machine then spoils one pass of
    every row instead of every sample of a few rows. `between_passes(p)` runs
    after pass p (the caller times its real iterations there, interleaved
    with the same interference). `bar`: a progress callback the caller owns
    (``calibrate``'s one bar over every batch size), advanced by `weights[i]`
    (the expected seconds of a sample of row i) per row timed, so that its
    ETA follows time rather than a count of rows of very different cost.
    """
    dims = ops.dims(batch)
    n = len(ops)
    repeats = max(int(repeats), 1)
    keys: list[tuple] = []
    rows: dict[tuple, int] = {}  # distinct row -> first OpTable row
    for i in range(n):
        name = ops.op_names[int(ops.op[i])] if ops.op_names else ""
        key = (int(ops.family[i]), int(ops.dtype[i]), int(ops.kernels[i]),
               tuple(int(x) for x in dims[i]), name)
        keys.append(key)
        rows.setdefault(key, i)
    samples: dict[tuple, list[float]] = {k: [] for k in rows}
    failed: dict[tuple, str] = {}
    free = device_memory_bytes(device)
    own = bar is None
    if own:
        bar = _progress(len(rows) * repeats, description or f"timing ops at batch {batch}",
                        progress)
    try:
        for p in range(repeats):
            for key, i in rows.items():
                if key not in failed:
                    # The first pass warms each row fully (plan caches, allocator);
                    # later passes rebuild it and need one call to be warm again.
                    got = measure_row(*key[:4], key[4], batch, device, min_sample_s, free, clock,
                                      min_warmup_calls=2 if p == 0 else 1,
                                      warmup_s=0.02 if p == 0 else 0.0)
                    if isinstance(got, str):
                        failed[key] = got
                    else:
                        samples[key].append(got)
                bar(1 if weights is None else float(weights[i]))
            if between_passes is not None:
                between_passes(p)
    finally:
        if own:
            bar(None)
    us = np.zeros(n)
    skipped: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key in failed:
            skipped[failed[key]] = skipped.get(failed[key], 0) + 1
        else:
            us[i] = float(statistics.median(samples[key]))
    return RowTimes(us, skipped)


def measure_row(fam: int, code: int, kernels: int, dims: tuple, name: str, batch: int,
                device: torch.device, min_sample_s: float, free_bytes: float,
                clock: str = "wall", min_warmup_calls: int = 2,
                warmup_s: float = 0.02, samples: int = 1) -> float | str:
    """The median of `samples` samples (us) of one row, or a short reason why
    it cannot be measured."""
    family_name = L.FAMILY_NAMES[fam]
    dtype = TORCH_DTYPES.get(code)
    if fam == L.COPY and len(dims) > L.MEM_LAYOUT and dims[L.MEM_LAYOUT] > 0:
        # Runs inside cuDNN's convolution call on tensor-core GPUs only: the
        # model prices it on each GPU (nothing where the conv is not on tensor cores).
        return "copy: a convolution's layout transpose, priced by the model"
    if dtype is None:
        return f"{family_name}: dtype {L.DTYPE_NAMES[code]} not runnable"
    if row_bytes(fam, np.asarray(dims), L.DTYPE_BYTES[code]) > 0.5 * free_bytes:
        return f"{family_name}: too large for the device's free memory"
    ctx = RowContext(fam, dtype, kernels, tuple(dims), name, batch, device)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            fn = build_runner(ctx)
            t = statistics.median(sample_runner(fn, device, samples, min_sample_s,
                                                warmup_s=warmup_s, clock=clock,
                                                min_warmup_calls=min_warmup_calls))
        del fn
    except Unrunnable as exc:
        return f"{family_name}: {exc}"
    except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError) as exc:
        if device.type == "cuda" and isinstance(exc, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
            return f"{family_name}: out of device memory"
        return f"{family_name}: {type(exc).__name__} ({_short(exc)})"
    if not math.isfinite(t) or t <= 0:
        return f"{family_name}: non-positive time"
    return t


def _short(exc: BaseException, limit: int = 80) -> str:
    msg = " ".join(str(exc).split())
    return msg if len(msg) <= limit else msg[:limit - 3] + "..."


def time_progress(total_s: float, description: str, enabled: bool):
    """A tqdm bar on stderr over work measured in expected seconds: it shows
    the share done, the time spent and the time left (no op counts, whose
    costs differ by orders of magnitude); call with None to close."""
    if not enabled:
        return lambda step: None
    from tqdm.auto import tqdm

    bar = tqdm(total=max(total_s, 1e-9), desc=description, leave=False, dynamic_ncols=True,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed} spent, about {remaining} "
                          "left")

    def update(step):
        if step is None:
            bar.close()
        else:
            bar.update(min(step, bar.total - bar.n))

    return update


def _progress(total: int, description: str, enabled: bool):
    """A tqdm bar on stderr (a no-op when disabled); call with None to close."""
    if not enabled:
        return lambda step: None
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=description, unit="op", leave=False, dynamic_ncols=True)

    def update(step):
        if step is None:
            bar.close()
        else:
            bar.update(step)

    return update
