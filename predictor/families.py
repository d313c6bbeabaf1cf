"""The op-family registry: which aten ops run which GPU kernel family, and the
dims each one contributes to the OpTable.

In the spirit of ``torch/utils/flop_counter.py``: one small function per aten op
(or group of ops), registered by decorator. A function receives the op's
arguments with every tensor replaced by a :class:`T` (shape + dtype) and
returns a list of rows ``(family, dims, kernels)``: one aten op can run several
GPU kernels of different families (``convolution_backward`` = dgrad + wgrad +
a bias reduction).

FLOPs and bytes are *not* computed here: they are functions of the dims that
live in the numba kernels (``predictor.kernels.work``), so that a graph traced
once can be re-evaluated at any batch size without Python in the loop.

Ops that the registry does not name are classified from their schema and tags:
views and aliases cost nothing, ``Tag.pointwise`` ops are elementwise,
``Tag.reduction`` ops are reductions, and anything else is *unsupported*: it
gets a bytes-based estimate (read every input, write every output) and is
listed on the Graph, never dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from predictor.kernels import layout as L

aten = torch.ops.aten

Row = tuple[int, tuple[int, ...], int]  # (family, dims, kernel launches)


@dataclass(frozen=True)
class T:
    """A tensor as the registry sees it: shape and dtype, no data; and whether
    its last two dims are stored column-major (a transposed view, as the
    weight of F.linear is): GEMM libraries pick different kernels for it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    transposed: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


Extractor = Callable[..., list[Row]]
REGISTRY: dict[Any, Extractor] = {}

# Ops that are free on a GPU: metadata, views, allocation without a kernel, or
# host-side scalars. Listed explicitly where the schema alone does not say so.
FREE_OPS = {
    aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
    aten.new_empty_strided, aten._unsafe_view, aten.lift_fresh_copy, aten.lift_fresh,
    aten.sym_size, aten.sym_stride, aten.sym_numel, aten.scalar_tensor,
    aten._local_scalar_dense, aten.detach, aten.alias, aten._assert_async,
    aten.resize_, aten.set_, aten.sym_storage_offset,
}


def register(*ops: Any) -> Callable[[Extractor], Extractor]:
    """Register an extractor for aten op packets or overloads."""

    def wrap(fn: Extractor) -> Extractor:
        for op in ops:
            REGISTRY[op] = fn
        return fn

    return wrap


def lookup(op: Any) -> Extractor | None:
    """The extractor for an OpOverload: exact overload first, then its packet."""
    fn = REGISTRY.get(op)
    if fn is None:
        fn = REGISTRY.get(getattr(op, "overloadpacket", None))
    if fn is None and _is_multi_tensor(op):
        fn = _foreach
    return fn


def is_free(op: Any) -> bool:
    """Views, aliases and allocations: no kernel runs."""
    packet = getattr(op, "overloadpacket", op)
    if packet in FREE_OPS or op in FREE_OPS:
        return True
    schema = getattr(op, "_schema", None)
    if schema is None:
        return False
    rets = schema.returns
    # A return that aliases an input without writing to it is a view.
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


def tags(op: Any) -> set:
    return set(getattr(op, "tags", ()))


# ---------------------------------------------------------------- helpers ----

def tensors(x: Any) -> list[T]:
    """All T objects in a (possibly nested) argument structure."""
    out: list[T] = []
    if isinstance(x, T):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for item in x:
            out.extend(tensors(item))
    elif isinstance(x, dict):
        for item in x.values():
            out.extend(tensors(item))
    return out


def memory_row(family: int, read: int, written: int, flops: int = 0,
               inner: int = 1, outer: int = 1, kernels: int = 1) -> Row:
    return (family, (read, written, flops, inner, outer), kernels)


def generic_memory(family: int, args: tuple, kwargs: dict, out: Any,
                   flops_per_elem: int = 0, kernels: int = 1) -> list[Row]:
    ins = tensors(args) + tensors(kwargs)
    outs = tensors(out)
    read = sum(t.numel for t in ins)
    written = sum(t.numel for t in outs)
    ref = outs[0] if outs else (ins[0] if ins else T((1,), torch.float32))
    inner = ref.shape[-1] if ref.shape else 1
    n = max(ref.numel, 1)
    return [memory_row(family, read, written, flops_per_elem * n, inner, n // max(inner, 1), kernels)]


# -------------------------------------------------------------- GEMM family --

def gemm_layout(a: T, b: T) -> int:
    """Operand layout of C = A @ B (layout.GEMM_*): which operands are
    transposed views. F.linear's x @ W^T is GEMM_B_T; a weight stored [in, out]
    (GPT-2's Conv1D) and torch.bmm of contiguous tensors are GEMM_NN."""
    return (L.GEMM_A_T if a.transposed else 0) + (L.GEMM_B_T if b.transposed else 0)


@register(aten.mm)
def _mm(a: T, b: T, *_, out=None, **__) -> list[Row]:
    (m, k), (_, n) = a.shape, b.shape
    return [(L.MATMUL, (1, m, n, k, gemm_layout(a, b)), 1)]


@register(aten.addmm)
def _addmm(bias: T, a: T, b: T, *_, out=None, **__) -> list[Row]:
    return _mm(a, b)


@register(aten.bmm)
def _bmm(a: T, b: T, *_, out=None, **__) -> list[Row]:
    (bs, m, k), (_, _, n) = a.shape, b.shape
    return [(L.MATMUL, (bs, m, n, k, gemm_layout(a, b)), 1)]


@register(aten.baddbmm)
def _baddbmm(bias: T, a: T, b: T, *_, out=None, **__) -> list[Row]:
    return _bmm(a, b)


# -------------------------------------------------------------- convolution --

def _conv_dims(x: T, w: T, y: T, groups: int, stride: Any) -> tuple[int, ...]:
    """Dims of a forward convolution x -> y (2-D; 1-D and 3-D fold into it)."""
    n, c = x.shape[0], x.shape[1]
    k = w.shape[0]
    sp_in = x.shape[2:] or (1,)
    sp_k = w.shape[2:] or (1,)
    sp_out = y.shape[2:] or (1,)
    h, wd = sp_in[0], math.prod(sp_in[1:]) if len(sp_in) > 1 else 1
    r, s = sp_k[0], math.prod(sp_k[1:]) if len(sp_k) > 1 else 1
    p, q = sp_out[0], math.prod(sp_out[1:]) if len(sp_out) > 1 else 1
    st = stride[0] if isinstance(stride, (list, tuple)) and stride else (stride or 1)
    return (n, c, h, wd, k, r, s, p, q, groups, int(st), 0)


@register(aten.convolution, aten._convolution)
def _convolution(x: T, w: T, bias, stride, padding, dilation, transposed, output_padding,
                 groups, *_, out=None, **__) -> list[Row]:
    y = out
    if transposed:
        # A transposed conv is the data-gradient of the conv that maps y -> x.
        # Its weight is [C_in, C_out/g, ...]; the equivalent conv's is [C_in, ...] too.
        w_eq = T((w.shape[0], w.shape[1] * groups) + w.shape[2:], w.dtype)
        return [(L.CONV_DGRAD, _conv_dims(y, w_eq, x, groups, stride), 1)]
    return [(L.CONV, _conv_dims(x, w, y, groups, stride), 1)]


@register(aten.convolution_backward)
def _convolution_backward(grad_out: T, x: T, w: T, bias_sizes, stride, padding, dilation,
                          transposed, output_padding, groups, output_mask, *_, out=None,
                          **__) -> list[Row]:
    rows: list[Row] = []
    if transposed:
        w_eq = T((w.shape[0], w.shape[1] * groups) + w.shape[2:], w.dtype)
        dims = _conv_dims(grad_out, w_eq, x, groups, stride)
        if output_mask[0]:  # grad of a dgrad is a forward conv
            rows.append((L.CONV, dims, 1))
    else:
        dims = _conv_dims(x, w, grad_out, groups, stride)
        if output_mask[0]:
            rows.append((L.CONV_DGRAD, dims, 1))
    if output_mask[1]:
        rows.append((L.CONV_WGRAD, dims, 1))
    if len(output_mask) > 2 and output_mask[2]:
        cout = grad_out.shape[1]
        rows.append(memory_row(L.REDUCTION, grad_out.numel, cout, grad_out.numel,
                               grad_out.numel // max(cout, 1), cout))
    return rows


# ---------------------------------------------------------------- attention --

def _attention_dims(q: T, k: T, v: T, causal: bool) -> tuple[int, ...]:
    *lead, sq, d = q.shape
    sk, dv = k.shape[-2], v.shape[-1]
    b = lead[0] if lead else 1
    h = math.prod(lead[1:]) if len(lead) > 1 else 1
    return (b, h, sq, sk, d, dv, int(bool(causal)))


def _attention_fwd(q: T, k: T, v: T, *rest, out=None, is_causal: bool = False, **kw) -> list[Row]:
    causal = bool(kw.get("is_causal", is_causal))
    # Positional layout of the flash / efficient / cpu variants: (q, k, v, dropout_p, is_causal, ...)
    if len(rest) >= 2 and isinstance(rest[1], bool):
        causal = rest[1]
    return [(L.ATTENTION, _attention_dims(q, k, v, causal), 1)]


def _attention_bwd(grad: T, q: T, k: T, v: T, *rest, out=None, **kw) -> list[Row]:
    causal = bool(kw.get("is_causal", False))
    for item in rest:
        if isinstance(item, bool):
            causal = item
            break
    return [(L.ATTENTION_BWD, _attention_dims(q, k, v, causal), 1)]


register(aten._scaled_dot_product_flash_attention_for_cpu,
         aten._scaled_dot_product_flash_attention,
         aten._scaled_dot_product_efficient_attention,
         aten._scaled_dot_product_cudnn_attention)(_attention_fwd)
register(aten._scaled_dot_product_flash_attention_for_cpu_backward,
         aten._scaled_dot_product_flash_attention_backward,
         aten._scaled_dot_product_efficient_attention_backward,
         aten._scaled_dot_product_cudnn_attention_backward)(_attention_bwd)


@register(aten._scaled_dot_product_attention_math)
def _attention_math(q: T, k: T, v: T, *rest, out=None, **kw) -> list[Row]:
    return _attention_fwd(q, k, v, *rest, out=out, **kw)


# --------------------------------------------------------------------- LSTM --

@register(aten.mkldnn_rnn_layer)
def _mkldnn_rnn_layer(x: T, w_ih: T, w_hh: T, *_, out=None, **__) -> list[Row]:
    # CPU trace of one LSTM layer, one direction: x [T, B, I] (or [B, T, I]),
    # w_ih [4H, I]. On a GPU the same layer runs as a cuDNN LSTM.
    steps, batch = x.shape[0], x.shape[1]
    hidden = w_hh.shape[1]
    return [(L.LSTM, (steps, batch, w_ih.shape[1], hidden), 1)]


@register(aten.mkldnn_rnn_layer_backward)
def _mkldnn_rnn_layer_backward(x: T, w_ih: T, w_hh: T, *_, out=None, **__) -> list[Row]:
    steps, batch = x.shape[0], x.shape[1]
    return [(L.LSTM_BWD, (steps, batch, w_ih.shape[1], w_hh.shape[1]), 1)]


def _cudnn_rows(family: int, x: T, weights: list, hidden: int, num_layers: int,
                batch_first: bool, bidirectional: bool) -> list[Row]:
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    dirs = 2 if bidirectional else 1
    rows = []
    for layer in range(num_layers):
        inp = x.shape[-1] if layer == 0 else hidden * dirs
        rows.extend([(family, (steps, batch, inp, hidden), 1)] * dirs)
    return rows


@register(aten._cudnn_rnn)
def _cudnn_rnn(x, weights, stride0, weight_buf, hx, cx, mode, hidden, proj, num_layers,
               batch_first, dropout, train, bidirectional, *_, out=None, **__) -> list[Row]:
    return _cudnn_rows(L.LSTM, x, weights, hidden, num_layers, batch_first, bidirectional)


@register(aten._cudnn_rnn_backward)
def _cudnn_rnn_backward(x, weights, stride0, weight_buf, hx, cx, output, grad_output,
                        grad_hy, grad_cy, mode, hidden, proj, num_layers, batch_first,
                        dropout, train, bidirectional, *_, out=None, **__) -> list[Row]:
    return _cudnn_rows(L.LSTM_BWD, x, weights, hidden, num_layers, batch_first, bidirectional)


# ------------------------------------------------------ normalisation, softmax --

@register(aten._softmax, aten._log_softmax)
def _softmax(x: T, dim: int, *_, out=None, **__) -> list[Row]:
    inner = x.shape[dim] if x.shape else 1
    return [memory_row(L.SOFTMAX, x.numel, x.numel, 5 * x.numel, inner, x.numel // max(inner, 1))]


@register(aten._softmax_backward_data, aten._log_softmax_backward_data)
def _softmax_bwd(grad: T, y: T, dim: int, *_, out=None, **__) -> list[Row]:
    inner = y.shape[dim] if y.shape else 1
    return [memory_row(L.SOFTMAX_BWD, 2 * y.numel, y.numel, 3 * y.numel, inner,
                       y.numel // max(inner, 1))]


@register(aten.native_layer_norm)
def _layer_norm(x: T, normalized_shape, w, b, *_, out=None, **__) -> list[Row]:
    inner = math.prod(normalized_shape)
    outer = x.numel // max(inner, 1)
    params = 2 * inner if w is not None else 0
    return [memory_row(L.LAYER_NORM, x.numel + params, x.numel + 2 * outer, 8 * x.numel, inner, outer)]


@register(aten.native_layer_norm_backward)
def _layer_norm_bwd(grad: T, x: T, normalized_shape, mean, rstd, w, b, mask, *_, out=None,
                    **__) -> list[Row]:
    inner = math.prod(normalized_shape)
    outer = x.numel // max(inner, 1)
    # CUDA: one kernel for the input gradient, one column reduction for
    # gamma/beta (GammaBetaBackward), as in layer_norm_backward_cuda.
    kernels = 1 + (1 if (len(mask) > 1 and (mask[1] or mask[2])) else 0)
    return [memory_row(L.LAYER_NORM_BWD, 3 * x.numel + 2 * outer, x.numel + 2 * inner,
                       12 * x.numel, inner, outer, kernels)]


@register(aten.native_group_norm)
def _group_norm(x: T, w, b, n, c, hw, groups, *_, out=None, **__) -> list[Row]:
    inner = x.numel // max(n * groups, 1)
    return [memory_row(L.LAYER_NORM, 2 * x.numel, x.numel, 8 * x.numel, inner, n * groups, 2)]


@register(aten.native_group_norm_backward)
def _group_norm_bwd(grad: T, x: T, mean, rstd, w, n, c, hw, groups, *_, out=None, **__) -> list[Row]:
    inner = x.numel // max(n * groups, 1)
    return [memory_row(L.LAYER_NORM_BWD, 3 * x.numel, x.numel, 12 * x.numel, inner, n * groups, 3)]


def _bn_rows(family: int, x: T, training: bool, reads: int, kernels: int) -> list[Row]:
    c = x.shape[1] if len(x.shape) > 1 else 1
    inner = x.numel // max(c, 1)
    return [memory_row(family, reads * x.numel, x.numel, 6 * x.numel, inner, c,
                       kernels if training else 1)]


@register(aten.native_batch_norm, aten._native_batch_norm_legit,
          aten._native_batch_norm_legit_functional, aten.cudnn_batch_norm)
def _batch_norm(x: T, w, b, running_mean, running_var, *rest, out=None, **__) -> list[Row]:
    training = bool(rest[0]) if rest and isinstance(rest[0], bool) else True
    # Training: one pass for the statistics, one to normalise.
    return _bn_rows(L.BATCH_NORM, x, training, 2 if training else 1, 2)


@register(aten._native_batch_norm_legit_no_training)
def _batch_norm_eval(x: T, *_, out=None, **__) -> list[Row]:
    return _bn_rows(L.BATCH_NORM, x, False, 1, 1)


@register(aten.native_batch_norm_backward, aten.cudnn_batch_norm_backward)
def _batch_norm_bwd(grad: T, x: T, *_, out=None, **__) -> list[Row]:
    # Reduce (grad, x) for dgamma/dbeta, then an elementwise pass for dx.
    return _bn_rows(L.BATCH_NORM_BWD, x, True, 4, 2)


# ------------------------------------------------------- embedding, pooling --

@register(aten.embedding)
def _embedding(weight: T, indices: T, *_, out=None, **__) -> list[Row]:
    d = weight.shape[-1]
    n = indices.numel
    return [memory_row(L.EMBEDDING, n * d + n, n * d, 0, d, n)]


# embedding_dense_backward_cuda: up to this many indices it zeroes the weight
# gradient and accumulates with one atomic kernel; above it, it sorts the indices
# and reduces segments: arange, a cub radix sort, zeros, unique_by_key (2),
# partials per segment, an exclusive sum (2), partial-segment offsets (2),
# compute_grad_weight and sum_and_scatter.
EMBEDDING_BWD_ATOMIC_MAX_INDICES = 3072
EMBEDDING_BWD_SORT_KERNELS = 13


@register(aten.embedding_dense_backward)
def _embedding_bwd(grad: T, indices: T, num_weights: int, *_, out=None, **__) -> list[Row]:
    d = grad.shape[-1]
    n = indices.numel
    kernels = 2 if n <= EMBEDDING_BWD_ATOMIC_MAX_INDICES else EMBEDDING_BWD_SORT_KERNELS
    return [memory_row(L.EMBEDDING_BWD, n * d + 2 * n, num_weights * d + n * d // 4, n * d, d, n,
                       kernels)]


def _pool(family: int) -> Extractor:
    def extract(*args, out=None, **kwargs) -> list[Row]:
        ins = tensors(args)
        outs = tensors(out)
        read = sum(t.numel for t in ins)
        written = sum(t.numel for t in outs)
        ref = ins[0]
        c = ref.shape[1] if len(ref.shape) > 1 else 1
        window = max(read // max(written, 1), 1)
        return [memory_row(family, read, written, read, window, c)]

    return extract


register(aten.max_pool2d_with_indices, aten.avg_pool2d, aten._adaptive_avg_pool2d,
         aten.max_pool3d_with_indices, aten.avg_pool3d, aten._adaptive_avg_pool3d,
         aten.adaptive_max_pool2d, aten.max_pool1d, aten.avg_pool1d)(_pool(L.POOL))
register(aten.max_pool2d_with_indices_backward, aten.avg_pool2d_backward,
         aten._adaptive_avg_pool2d_backward, aten.max_pool3d_with_indices_backward,
         aten.avg_pool3d_backward, aten._adaptive_avg_pool3d_backward,
         aten.adaptive_max_pool2d_backward)(_pool(L.POOL_BWD))


# ---------------------------------------------------------- dropout, losses --

def _bool_elems(t: T, like: T) -> int:
    """A bool tensor's size in elements of `like`'s dtype (the row's unit)."""
    width = max(like.dtype.itemsize, 1)
    return -(-t.numel // width)


@register(aten.native_dropout)
def _native_dropout(x: T, p, train, *_, out=None, **__) -> list[Row]:
    # Fused on CUDA (one kernel, RNG inside): read x, write the output and a bool mask.
    mask = _bool_elems(x, x)
    inner = x.shape[-1] if x.shape else 1
    return [memory_row(L.DROPOUT, x.numel, x.numel + mask, 4 * x.numel, inner,
                       x.numel // max(inner, 1))]


@register(aten.native_dropout_backward)
def _native_dropout_bwd(grad: T, mask: T, scale, *_, out=None, **__) -> list[Row]:
    # One masked-scale kernel: read the gradient and the bool mask, write the gradient.
    inner = grad.shape[-1] if grad.shape else 1
    return [memory_row(L.ELEMENTWISE, grad.numel + _bool_elems(mask, grad), grad.numel,
                       grad.numel, inner, grad.numel // max(inner, 1))]


@register(aten.bernoulli_, aten.bernoulli, aten.rand, aten.rand_like, aten.randn, aten.randn_like,
          aten.uniform_, aten.normal_)
def _rng(*args, out=None, **kwargs) -> list[Row]:
    outs = tensors(out) or tensors(args[:1])
    n = sum(t.numel for t in outs)
    return [memory_row(L.DROPOUT, 0, n, 4 * n, 1, n)]


def _loss(*args, out=None, **kwargs) -> list[Row]:
    return generic_memory(L.LOSS, args, kwargs, out, flops_per_elem=2)


@register(aten.nll_loss_backward, aten.nll_loss2d_backward)
def _nll_loss_bwd(grad: T, x: T, target: T, *_, out=None, **__) -> list[Row]:
    # CUDA zeroes the whole input gradient, then one kernel writes -w/N at each
    # target: the input itself is never read.
    return [memory_row(L.FILL, 0, x.numel, 0, 1, x.numel),
            memory_row(L.LOSS, target.numel + grad.numel, target.numel, target.numel, 1,
                       target.numel)]


register(aten.nll_loss_forward, aten.nll_loss2d_forward,
         aten.binary_cross_entropy_with_logits,
         aten.binary_cross_entropy, aten.binary_cross_entropy_backward, aten.mse_loss,
         aten.mse_loss_backward, aten.smooth_l1_loss, aten.smooth_l1_loss_backward,
         aten.huber_loss, aten.huber_loss_backward)(_loss)


# ---------------------------------------------------------------- optimizer --

# multi_tensor_apply launches one kernel per chunk of at most this many tensors,
# by the number of tensor lists the op touches (PyTorch's depth_to_max_tensors).
_MAX_TENSORS_BY_DEPTH = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
_MTA_ELEMS_PER_LAUNCH = 65536 * 320  # chunk size x max blocks per launch


def _foreach(*args, out=None, **kwargs) -> list[Row]:
    lists = [a for a in list(args) + list(kwargs.values())
             if isinstance(a, (list, tuple)) and a and isinstance(a[0], T)]
    if not lists:
        return generic_memory(L.OPTIMIZER, args, kwargs, out)
    n_tensors = len(lists[0])
    read = sum(t.numel for lst in lists for t in lst)
    outs = tensors(out)
    # In-place variants write the first list; out-of-place ones return new tensors.
    written = sum(t.numel for t in outs) if outs else sum(t.numel for t in lists[0])
    depth = min(len(lists) + (1 if outs else 0), 5)
    per_launch = _MAX_TENSORS_BY_DEPTH[max(depth, 1)]
    total = sum(t.numel for t in lists[0])
    kernels = max(math.ceil(n_tensors / per_launch), math.ceil(total / _MTA_ELEMS_PER_LAUNCH), 1)
    # One "row" per tensor, of the mean tensor size: inner x outer = elements,
    # as in every other memory-bound row.
    inner = max(total // max(n_tensors, 1), 1)
    return [memory_row(L.OPTIMIZER, read, written, read, inner, n_tensors, kernels)]


def _is_multi_tensor(op: Any) -> bool:
    name = getattr(getattr(op, "overloadpacket", op), "__name__", "")
    return name.startswith("_foreach_") or name.startswith("_fused_")


# ------------------------------------------------------ copies, fills, misc --

def _copy(*args, out=None, **kwargs) -> list[Row]:
    return generic_memory(L.COPY, args, kwargs, out)


register(aten.cat, aten.stack, aten._to_copy, aten.copy_, aten.copy, aten.index_select,
         aten.gather, aten.index, aten.scatter, aten.scatter_add, aten.index_put,
         aten.index_put_, aten.masked_scatter, aten.constant_pad_nd, aten.reflection_pad2d,
         aten.upsample_nearest2d, aten.upsample_bilinear2d, aten.slice_scatter,
         aten.select_scatter, aten.roll, aten.flip, aten.repeat, aten.tril, aten.triu,
         aten.index_add, aten.narrow_copy, aten.slice_backward, aten.select_backward,
         aten.embedding_renorm_, aten.col2im, aten.im2col)(_copy)
# Scans read and write every element once: memory-bound like a copy.
register(aten.cumsum, aten.cumprod, aten.logcumsumexp)(_copy)


@register(aten.clone, aten.contiguous)
def _clone(x: T, *_, out=None, **__) -> list[Row]:
    inner = x.shape[-1] if x.shape else 1
    return [memory_row(L.COPY, x.numel, x.numel, 0, inner, x.numel // max(inner, 1))]


@register(aten.zeros, aten.ones, aten.full, aten.zeros_like, aten.ones_like, aten.full_like,
          aten.new_zeros, aten.new_ones, aten.new_full, aten.fill_, aten.zero_, aten.fill,
          aten.arange, aten.linspace)
def _fill(*args, out=None, **kwargs) -> list[Row]:
    outs = tensors(out) or tensors(args[:1])
    n = sum(t.numel for t in outs)
    return [memory_row(L.FILL, 0, n, 0, 1, n)]


# Relative arithmetic cost of elementwise ops (FLOPs per output element). The
# learned models use the op identity; the roofline only needs an order of size.
_TRANSCENDENTAL = {"gelu", "gelu_backward", "tanh", "tanh_backward", "sigmoid",
                   "sigmoid_backward", "exp", "log", "erf", "pow", "silu", "silu_backward",
                   "softplus", "mish", "sin", "cos", "rsqrt", "sqrt", "elu"}


def elementwise(op: Any, args: tuple, kwargs: dict, out: Any) -> list[Row]:
    name = op.__name__.split(".")[0].rstrip("_")
    fpe = 8 if name in _TRANSCENDENTAL else 1
    return generic_memory(L.ELEMENTWISE, args, kwargs, out, flops_per_elem=fpe)


def reduction(op: Any, args: tuple, kwargs: dict, out: Any) -> list[Row]:
    ins = tensors(args)
    outs = tensors(out)
    read = sum(t.numel for t in ins)
    written = max(sum(t.numel for t in outs), 1)
    inner = max(ins[0].numel // written, 1) if ins else 1
    return [memory_row(L.REDUCTION, read, written, read, inner, written)]


def unsupported(op: Any, args: tuple, kwargs: dict, out: Any) -> list[Row]:
    return generic_memory(L.UNSUPPORTED, args, kwargs, out)


def extract(op: Any, args: tuple, kwargs: dict, out: Any) -> tuple[list[Row], bool]:
    """Rows for one aten op call; the flag says the op was not recognised."""
    fn = lookup(op)
    if fn is not None:
        return fn(*args, out=out, **kwargs), False
    op_tags = tags(op)
    if torch.Tag.pointwise in op_tags:
        return elementwise(op, args, kwargs, out), False
    if torch.Tag.reduction in op_tags:
        return reduction(op, args, kwargs, out), False
    return unsupported(op, args, kwargs, out), True


# ====================================================== training synthesis ==
# A frontend whose graph is the forward pass alone (an ONNX file) gets its
# backward pass and optimizer step synthesised here, one forward op at a time,
# the way autograd would run them (torch's derivatives.yaml): each rule turns a
# forward aten call into the backward aten calls autograd would make, and their
# rows then come from the registry above. So both frontends price a kernel with
# the same extractor, and a change to an extractor reaches both.
#
# A rule sees the forward call and which of its tensor arguments need a
# gradient (`needs`, aligned with `call.args`); the gradient of the call's
# first output has that output's shape. Gradient accumulation at tensors read
# by several ops, and the order of the walk, belong to the frontend (they need
# the graph); the loss and the optimizer step are synthesised here too.


@dataclass(frozen=True)
class Call:
    """One aten op call as the registry sees it: tensors are :class:`T`.

    `kind` forces a classification for ops the registry and the op tags do not
    cover ("elementwise", "reduction", "copy"; "unsupported" with `name` for
    an op no rule knows, priced from bytes moved). `tag` carries a frontend
    hint a rule needs ("linear": the second matmul operand is a weight stored
    transposed, as nn.Linear keeps it)."""

    op: Any
    args: tuple = ()
    kwargs: tuple = ()   # (name, value) pairs: a Call is hashable
    out: Any = None
    kind: str | None = None
    name: str | None = None
    tag: str | None = None

    @property
    def op_name(self) -> str:
        if self.name:
            return self.name
        return str(getattr(getattr(self.op, "overloadpacket", self.op), "__name__", self.op))


def call_rows(call: Call) -> tuple[list[Row], bool]:
    """Rows of one Call; the flag says it was priced as unsupported."""
    kwargs = dict(call.kwargs)
    if call.kind == "elementwise":
        return elementwise(call.op, call.args, kwargs, call.out), False
    if call.kind == "reduction":
        return reduction(call.op, call.args, kwargs, call.out), False
    if call.kind == "copy":
        return generic_memory(L.COPY, call.args, kwargs, call.out), False
    if call.kind == "unsupported":
        return unsupported(call.op, call.args, kwargs, call.out), True
    return extract(call.op, call.args, kwargs, call.out)


BackwardRule = Callable[[Call, tuple], list[Call]]
BACKWARD_RULES: dict[Any, BackwardRule] = {}


def backward_rule(*ops: Any) -> Callable[[BackwardRule], BackwardRule]:
    def wrap(fn: BackwardRule) -> BackwardRule:
        for op in ops:
            BACKWARD_RULES[op] = fn
        return fn

    return wrap


def _first(x: Any) -> T:
    return tensors(x)[0]


def _t(shape, like: T) -> T:
    return T(tuple(int(d) for d in shape), like.dtype)


def _sum_to(grad: T, target: T) -> list[Call]:
    """The gradient of a broadcast operand: reduce `grad` to `target`'s shape."""
    if grad.shape == target.shape or target.numel == grad.numel:
        return []
    return [Call(aten.sum.dim_IntList, (grad, [0], True), out=target)]


def backward_calls(call: Call, needs: tuple) -> list[Call]:
    """The backward aten calls of one forward call (empty when nothing needs a gradient)."""
    if not any(needs):
        return []
    rule = BACKWARD_RULES.get(call.op)
    if rule is None:
        rule = BACKWARD_RULES.get(getattr(call.op, "overloadpacket", None))
    if rule is None:
        if call.kind == "unsupported":
            rule = _unsupported_bwd
        elif call.kind == "elementwise" or (call.kind is None
                                            and torch.Tag.pointwise in tags(call.op)):
            rule = _pointwise_bwd
        elif call.kind == "reduction" or (call.kind is None
                                          and torch.Tag.reduction in tags(call.op)):
            rule = _reduction_bwd
        elif call.kind == "copy":
            rule = _copy_bwd
        else:
            rule = _unsupported_bwd
    return rule(call, needs)


def _inputs_needing(call: Call, needs: tuple) -> list[T]:
    return [a for a, n in zip(call.args, needs) if n and isinstance(a, T)]


def _pointwise_bwd(call: Call, needs: tuple) -> list[Call]:
    # Default: one kernel per input needing a gradient, reading the output
    # gradient and the saved inputs (the *_backward kernels of activations).
    y = _first(call.out)
    saved = [a for a in call.args if isinstance(a, T)]
    out = []
    for x in _inputs_needing(call, needs):
        out.append(Call(call.op, (y, *saved), out=_t(y.shape, x), kind="elementwise",
                        name=f"{call.op_name}_backward"))
        out.extend(_sum_to(y, x))
    return out


def _reduction_bwd(call: Call, needs: tuple) -> list[Call]:
    # A sum's gradient is an expand (a view); other reductions scale or mask it.
    x = _first(call.args)
    return [Call(aten.div.Scalar, (x, 1), out=x, name=f"{call.op_name}_backward")]


def _copy_bwd(call: Call, needs: tuple) -> list[Call]:
    y = _first(call.out)
    return [Call(aten.clone.default, (y,), out=_t(x.shape, x), kind="copy",
                 name=f"{call.op_name}_backward") for x in _inputs_needing(call, needs)]


def _unsupported_bwd(call: Call, needs: tuple) -> list[Call]:
    y = tensors(call.out)
    saved = [a for a in call.args if isinstance(a, T)]
    grads = _inputs_needing(call, needs)
    if not grads:
        return []
    return [Call(call.op, tuple(y) + tuple(saved), out=tuple(grads), kind="unsupported",
                 name=f"{call.op_name}_backward")]


# ---- GEMMs: two matmuls (and a bias reduction) --------------------------------

def _transpose(t: T) -> T:
    """t.mT: a view, so its storage order flips (what GEMM kernels see)."""
    return T(t.shape[:-2] + (t.shape[-1], t.shape[-2]), t.dtype, not t.transposed)


@backward_rule(aten.mm, aten.addmm)
def _mm_bwd(call: Call, needs: tuple) -> list[Call]:
    off = 1 if getattr(call.op, "overloadpacket", call.op) is aten.addmm else 0
    a, b = call.args[off], call.args[off + 1]
    y = _first(call.out)
    out = []
    if needs[off]:
        out.append(Call(aten.mm.default, (y, _transpose(b)), out=_t(a.shape, a)))
    if needs[off + 1]:
        if call.tag == "linear":
            # nn.Linear's weight is a transposed view: autograd computes the
            # weight gradient as grad^T @ x (mm_mat2_backward's column-major path).
            out.append(Call(aten.mm.default, (_transpose(y), a), out=_transpose(b)))
        else:
            out.append(Call(aten.mm.default, (_transpose(a), y), out=_t(b.shape, b)))
    if off and needs[0]:
        bias = call.args[0]
        out.append(Call(aten.sum.dim_IntList, (y, [0], True), out=_t(bias.shape, bias)))
    return out


@backward_rule(aten.bmm)
def _bmm_bwd(call: Call, needs: tuple) -> list[Call]:
    a, b = call.args[0], call.args[1]
    y = _first(call.out)
    out = []
    if needs[0]:
        out.append(Call(aten.bmm.default, (y, _transpose(b)), out=_t(a.shape, a)))
    if needs[1]:
        out.append(Call(aten.bmm.default, (_transpose(a), y), out=_t(b.shape, b)))
    return out


# ---- convolution: dgrad (unless the input needs none) + wgrad + bias -----------

@backward_rule(aten.convolution)
def _conv_bwd(call: Call, needs: tuple) -> list[Call]:
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups = call.args[:9]
    y = _first(call.out)
    mask = [bool(needs[0]), bool(needs[1]), bool(len(needs) > 2 and needs[2])]
    bias_sizes = list(bias.shape) if isinstance(bias, T) else None
    outs = (x, w, bias if isinstance(bias, T) else None)
    return [Call(aten.convolution_backward.default,
                 (y, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding,
                  groups, mask), out=outs)]


# ---- normalisation, softmax, attention, LSTM ------------------------------------

@backward_rule(aten._softmax, aten._log_softmax)
def _softmax_bwd_rule(call: Call, needs: tuple) -> list[Call]:
    x, dim = call.args[0], call.args[1]
    y = _first(call.out)
    op = aten._log_softmax_backward_data.default \
        if getattr(call.op, "overloadpacket", call.op) is aten._log_softmax \
        else aten._softmax_backward_data.default
    return [Call(op, (y, y, dim, y.dtype), out=_t(x.shape, x))]


@backward_rule(aten.native_layer_norm)
def _layer_norm_bwd_rule(call: Call, needs: tuple) -> list[Call]:
    x, shape, w, b = call.args[:4]
    outs = tensors(call.out)
    y = outs[0]
    mean = outs[1] if len(outs) > 1 else T((1,), x.dtype)
    mask = [bool(needs[0]), bool(len(needs) > 2 and needs[2]), bool(len(needs) > 3 and needs[3])]
    return [Call(aten.native_layer_norm_backward.default, (y, x, shape, mean, mean, w, b, mask),
                 out=(x, w, b))]


@backward_rule(aten.native_batch_norm, aten._native_batch_norm_legit_functional,
               aten._native_batch_norm_legit)
def _batch_norm_bwd_rule(call: Call, needs: tuple) -> list[Call]:
    x, w = call.args[0], call.args[1]
    y = _first(call.out)
    mask = [bool(needs[0]), bool(len(needs) > 1 and needs[1]), bool(len(needs) > 2 and needs[2])]
    return [Call(aten.native_batch_norm_backward.default,
                 (y, x, w, None, None, None, None, True, 1e-5, mask), out=(x, w, w))]


@backward_rule(aten.native_group_norm)
def _group_norm_bwd_rule(call: Call, needs: tuple) -> list[Call]:
    x, w, b, n, c, hw, groups = call.args[:7]
    y = _first(call.out)
    return [Call(aten.native_group_norm_backward.default, (y, x, None, None, w, n, c, hw, groups,
                                                           [True, True, True]), out=(x, w, b))]


@backward_rule(aten._scaled_dot_product_flash_attention,
               aten._scaled_dot_product_efficient_attention,
               aten._scaled_dot_product_flash_attention_for_cpu)
def _attention_bwd_rule(call: Call, needs: tuple) -> list[Call]:
    q, k, v = call.args[:3]
    y = _first(call.out)
    causal = bool(dict(call.kwargs).get("is_causal", False))
    return [Call(aten._scaled_dot_product_flash_attention_backward.default, (y, q, k, v),
                 kwargs=(("is_causal", causal),), out=(q, k, v))]


@backward_rule(aten._cudnn_rnn)
def _cudnn_rnn_bwd_rule(call: Call, needs: tuple) -> list[Call]:
    a = call.args
    # _cudnn_rnn(x, weights, stride0, weight_buf, hx, cx, mode, hidden, proj, layers,
    #            batch_first, dropout, train, bidirectional, ...)
    y = _first(call.out)
    return [Call(aten._cudnn_rnn_backward.default,
                 (a[0], a[1], a[2], a[3], a[4], a[5], y, y, None, None, *a[6:14]),
                 out=(a[0],))]


# ---- lookups, pooling, dropout ---------------------------------------------------

@backward_rule(aten.embedding)
def _embedding_bwd_rule(call: Call, needs: tuple) -> list[Call]:
    weight, indices = call.args[0], call.args[1]
    if not needs[0]:
        return []
    y = _first(call.out)
    return [Call(aten.embedding_dense_backward.default, (y, indices, weight.shape[0], -1, False),
                 out=_t(weight.shape, weight))]


_POOL_BWD = {
    aten.max_pool2d_with_indices: aten.max_pool2d_with_indices_backward.default,
    aten.max_pool3d_with_indices: aten.max_pool3d_with_indices_backward.default,
    aten.avg_pool2d: aten.avg_pool2d_backward.default,
    aten.avg_pool3d: aten.avg_pool3d_backward.default,
    aten._adaptive_avg_pool2d: aten._adaptive_avg_pool2d_backward.default,
    aten._adaptive_avg_pool3d: aten._adaptive_avg_pool3d_backward.default,
}


@backward_rule(*_POOL_BWD)
def _pool_bwd_rule(call: Call, needs: tuple) -> list[Call]:
    packet = getattr(call.op, "overloadpacket", call.op)
    x = call.args[0]
    outs = tensors(call.out)
    extra = tuple(outs[1:2])  # max pooling reads its saved indices
    return [Call(_POOL_BWD[packet], (outs[0], x, *extra), out=_t(x.shape, x))]


@backward_rule(aten.native_dropout)
def _dropout_bwd_rule(call: Call, needs: tuple) -> list[Call]:
    outs = tensors(call.out)
    mask = outs[1] if len(outs) > 1 else T(outs[0].shape, torch.bool)
    return [Call(aten.native_dropout_backward.default, (outs[0], mask, 2.0), out=outs[0])]


# ---- reductions --------------------------------------------------------------------

@backward_rule(aten.mean)
def _mean_bwd(call: Call, needs: tuple) -> list[Call]:
    # expand (a view) then divide by the reduced count: one elementwise kernel.
    x = _first(call.args)
    return [Call(aten.div.Scalar, (x, 1), out=_t(x.shape, x))]


@backward_rule(aten.sum)
def _sum_bwd(call: Call, needs: tuple) -> list[Call]:
    return []  # an expand: a view


# ---- elementwise: the kernels autograd's formulas launch -----------------------------

def _unary_bwd(*ops: Any, saved: str = "out") -> BackwardRule:
    """A chain of elementwise kernels over the gradient's shape; `saved` says
    what the first one reads besides the gradient ("out", "in" or "none")."""

    def rule(call: Call, needs: tuple) -> list[Call]:
        y = _first(call.out)
        x = _first(call.args)
        first = {"out": (y, y), "in": (y, x), "none": (y,)}[saved]
        out = [Call(ops[0], first, out=_t(y.shape, x), kind="elementwise")]
        out += [Call(op, (y, y), out=_t(y.shape, x), kind="elementwise") for op in ops[1:]]
        return out + _sum_to(y, x)

    return rule


backward_rule(aten.relu)(_unary_bwd(aten.threshold_backward.default))
backward_rule(aten.gelu)(_unary_bwd(aten.gelu_backward.default, saved="in"))
backward_rule(aten.silu)(_unary_bwd(aten.silu_backward.default, saved="in"))
backward_rule(aten.tanh)(_unary_bwd(aten.tanh_backward.default))
backward_rule(aten.sigmoid)(_unary_bwd(aten.sigmoid_backward.default))
backward_rule(aten.hardswish)(_unary_bwd(aten.hardswish_backward.default, saved="in"))
backward_rule(aten.hardsigmoid)(_unary_bwd(aten.hardsigmoid_backward.default, saved="in"))
backward_rule(aten.leaky_relu)(_unary_bwd(aten.leaky_relu_backward.default, saved="in"))
backward_rule(aten.elu)(_unary_bwd(aten.elu_backward.default, saved="out"))
backward_rule(aten.softplus)(_unary_bwd(aten.softplus_backward.default, saved="in"))
backward_rule(aten.mish)(_unary_bwd(aten.mish_backward.default, saved="in"))
backward_rule(aten.exp)(_unary_bwd(aten.mul.Tensor))
backward_rule(aten.log)(_unary_bwd(aten.div.Tensor, saved="in"))
backward_rule(aten.neg)(_unary_bwd(aten.neg.default, saved="none"))
backward_rule(aten.sqrt)(_unary_bwd(aten.mul.Tensor, aten.div.Tensor))
backward_rule(aten.rsqrt)(_unary_bwd(aten.pow.Tensor_Scalar, aten.mul.Tensor, aten.mul.Tensor))
backward_rule(aten.reciprocal)(_unary_bwd(aten.mul.Tensor, aten.mul.Tensor, aten.neg.default))
backward_rule(aten.pow)(_unary_bwd(aten.pow.Tensor_Scalar, aten.mul.Tensor, aten.mul.Tensor,
                                   saved="in"))
backward_rule(aten.erf)(_unary_bwd(aten.pow.Tensor_Scalar, aten.neg.default, aten.exp.default,
                                   aten.mul.Tensor, aten.mul.Tensor, saved="in"))
backward_rule(aten.sin)(_unary_bwd(aten.cos.default, aten.mul.Tensor, saved="in"))
backward_rule(aten.cos)(_unary_bwd(aten.sin.default, aten.neg.default, aten.mul.Tensor,
                                   saved="in"))
backward_rule(aten.abs)(_unary_bwd(aten.sgn.default, aten.mul.Tensor, saved="in"))
backward_rule(aten.clamp)(_unary_bwd(aten.ge.Scalar, aten.le.Scalar, aten.logical_and.default,
                                     aten.where.self, saved="in"))


@backward_rule(aten.add, aten.sub)
def _add_bwd(call: Call, needs: tuple) -> list[Call]:
    # The gradient passes through; a broadcast operand reduces it, and sub negates.
    y = _first(call.out)
    out = []
    is_sub = getattr(call.op, "overloadpacket", call.op) is aten.sub
    for i, (a, n) in enumerate(zip(call.args, needs)):
        if not (n and isinstance(a, T)):
            continue
        out.extend(_sum_to(y, a))
        if is_sub and i == 1:
            out.append(Call(aten.neg.default, (a,), out=a))
    return out


@backward_rule(aten.mul)
def _mul_bwd(call: Call, needs: tuple) -> list[Call]:
    y = _first(call.out)
    out = []
    for i, (a, n) in enumerate(zip(call.args[:2], needs)):
        if not (n and isinstance(a, T)):
            continue
        other = call.args[1 - i]
        args = (y, other) if isinstance(other, T) else (y,)
        out.append(Call(aten.mul.Tensor, args, out=_t(y.shape, a)))
        out.extend(_sum_to(y, a))
    return out


@backward_rule(aten.div)
def _div_bwd(call: Call, needs: tuple) -> list[Call]:
    y = _first(call.out)
    a, b = call.args[0], call.args[1] if len(call.args) > 1 else None
    out = []
    if needs[0] and isinstance(a, T):
        args = (y, b) if isinstance(b, T) else (y,)
        out.append(Call(aten.div.Tensor, args, out=_t(y.shape, a)))
        out.extend(_sum_to(y, a))
    if len(needs) > 1 and needs[1] and isinstance(b, T):
        # -grad * a / b / b
        out += [Call(op, (y, y), out=_t(y.shape, b)) for op in
                (aten.neg.default, aten.div.Tensor, aten.div.Tensor, aten.mul.Tensor)]
        out.extend(_sum_to(y, b))
    return out


@backward_rule(aten.where)
def _where_bwd(call: Call, needs: tuple) -> list[Call]:
    y = _first(call.out)
    cond = call.args[0]
    out = []
    for a, n in zip(call.args[1:], needs[1:]):
        if n and isinstance(a, T):
            out.append(Call(aten.where.self, (cond, y), out=_t(y.shape, a)))
            out.extend(_sum_to(y, a))
    return out


@backward_rule(aten.maximum, aten.minimum)
def _minmax_bwd(call: Call, needs: tuple) -> list[Call]:
    y = _first(call.out)
    out = []
    for a, n in zip(call.args[:2], needs):
        if n and isinstance(a, T):
            out += [Call(aten.eq.Tensor, (y, y), out=T(y.shape, torch.bool)),
                    Call(aten.where.self, (y, y), out=_t(y.shape, a))]
            out.extend(_sum_to(y, a))
    return out


# ---- copies and data movement ------------------------------------------------------------

@backward_rule(aten.clone, aten._to_copy, aten.constant_pad_nd, aten.reflection_pad2d)
def _copy_like_bwd(call: Call, needs: tuple) -> list[Call]:
    # A permuting copy, a cast or a pad: the gradient is copied back.
    x = call.args[0]
    y = _first(call.out)
    return [Call(aten.clone.default, (y,), out=_t(x.shape, x), kind="copy",
                 name=f"{call.op_name}_backward")]


@backward_rule(aten.cat)
def _cat_bwd(call: Call, needs: tuple) -> list[Call]:
    return []  # slices of the gradient: views


@backward_rule(aten.slice, aten.select)
def _slice_bwd(call: Call, needs: tuple) -> list[Call]:
    # The forward is a view; its backward writes the gradient into zeros.
    x = call.args[0]
    y = _first(call.out)
    op = aten.slice_backward.default if getattr(call.op, "overloadpacket", None) is aten.slice \
        else aten.select_backward.default
    return [Call(op, (y,), out=_t(x.shape, x))]


@backward_rule(aten.split_with_sizes, aten.split)
def _split_bwd(call: Call, needs: tuple) -> list[Call]:
    x = call.args[0]
    return [Call(aten.cat.default, (tensors(call.out),), out=_t(x.shape, x))]


@backward_rule(aten.gather, aten.index_select, aten.index)
def _gather_bwd(call: Call, needs: tuple) -> list[Call]:
    # Zeros, then a scatter-add of the gradient.
    x = call.args[0]
    y = _first(call.out)
    idx = [a for a in tensors(call.args[1:]) if not a.dtype.is_floating_point]
    return [Call(aten.new_zeros.default, (x,), out=_t(x.shape, x)),
            Call(aten.scatter_add.default, (x, *idx, y), out=_t(x.shape, x))]


@backward_rule(aten.expand, aten.repeat)
def _expand_bwd(call: Call, needs: tuple) -> list[Call]:
    x = call.args[0]
    return _sum_to(_first(call.out), x)


# ---- the loss -----------------------------------------------------------------------

LOSSES = ("mean", "cross_entropy")


def loss_calls(outputs: list[T], loss: str) -> tuple[list[Call], list[Call]]:
    """(forward calls, backward calls) of a scalar loss over a model's outputs,
    as the fx frontend traces them: "mean" is the mean of the first output
    (its default loss); "cross_entropy" sums class-index cross entropies, one
    per floating output, over its last dim (flattened, like token_loss)."""
    if loss not in LOSSES:
        from predictor.errors import InvalidArgumentError
        raise InvalidArgumentError(f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)}")
    floats = [t for t in outputs if t.dtype.is_floating_point] or list(outputs)
    if not floats:
        return [], []
    scalar = T((), floats[0].dtype)
    fwd: list[Call] = []
    bwd: list[Call] = [Call(aten.ones_like.default, (scalar,), out=scalar)]
    if loss == "mean":
        y = floats[0]
        fwd.append(Call(aten.mean.default, (y,), out=scalar))
        bwd.append(Call(aten.div.Scalar, (y, 1), out=y))
        return fwd, bwd
    for y in floats:
        classes = y.shape[-1] if y.shape else 1
        rows = max(y.numel // max(classes, 1), 1)
        flat = T((rows, classes), y.dtype)
        target = T((rows,), torch.int64)
        fwd += [Call(aten.zeros.default, ([rows],), out=target),
                Call(aten._log_softmax.default, (flat, 1, False), out=flat),
                Call(aten.nll_loss_forward.default, (flat, target, None, 1, -100),
                     out=(scalar, scalar))]
        bwd += [Call(aten.nll_loss_backward.default, (scalar, flat, target, None, 1, -100, scalar),
                     out=flat),
                Call(aten._log_softmax_backward_data.default, (flat, flat, 1, y.dtype), out=flat)]
    fwd += [Call(aten.add.Tensor, (scalar, scalar), out=scalar)] * (len(floats) - 1)
    return fwd, bwd


# ---- the optimizer step --------------------------------------------------------------

def optimizer_calls(params: list[T], optimizer: str | None) -> list[Call]:
    """The optimizer step over `params` as the aten calls the fx frontend
    traces: ``predictor.frontend.optimizers.step`` run on meta tensors (no
    memory) and recorded, so both frontends issue the same foreach kernels."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from predictor.frontend import optimizers

    name = optimizers.check(optimizer)
    if name is None or not params:
        return []
    recorded: list[Call] = []

    def as_t(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return T(tuple(int(d) for d in x.shape), x.dtype)
        if isinstance(x, (list, tuple)):
            return type(x)(as_t(i) for i in x) if isinstance(x, list) else tuple(as_t(i) for i in x)
        return x

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            recorded.append(Call(func, as_t(tuple(args)), tuple(sorted(
                (k, as_t(v)) for k, v in kwargs.items())), as_t(out)))
            return out

    ps = [torch.empty(p.shape, dtype=p.dtype, device="meta") for p in params]
    grads = [torch.empty(p.shape, dtype=p.dtype, device="meta") for p in params]
    state = optimizers.state_for(name, ps)
    with Recorder():
        optimizers.step(name, ps, grads, state)
    return recorded


def optimizer_rows(params: list[T], optimizer: str | None) -> list[Row]:
    """Rows of one optimizer step over parameters of these shapes."""
    rows: list[Row] = []
    for call in optimizer_calls(params, optimizer):
        rows.extend(call_rows(call)[0])
    return rows
