"""The op-family registry: which aten ops run which GPU kernel family, and the
dims each one contributes to the OpTable.

In the spirit of ``torch/utils/flop_counter.py``: one small function per aten op
(or group of ops), registered by decorator. A function receives the op's
arguments with every tensor replaced by a :class:`TensorMeta` (shape + dtype) and
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

A frontend whose graph is the forward pass alone (ONNX) synthesises the
backward pass, loss and optimizer step in
:mod:`predictor.frontend.training_synthesis` and prices them through this
registry; nothing here imports a frontend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from predictor import dtypes
from predictor.fused_ops import fused_rms_norm
from predictor.kernels import layout as L
from predictor.kernels.depthwise import is_depthwise
from predictor.kernels.work import as_implicit_gemm
from predictor.registry import Registry

aten = torch.ops.aten

Row = tuple[int, tuple[int, ...], int]  # (family, dims, kernel launches)


@dataclass(frozen=True)
class TensorMeta:
    """A tensor as the registry sees it: shape and dtype, no data; and whether
    its last two dims are stored column-major (a transposed view, as the
    weight of F.linear is): GEMM libraries pick different kernels for it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    transposed: bool = False
    # Stored channels-last (NHWC / NDHWC strides, torch.channels_last): the
    # memory format cuDNN's convolutions see (predictor.lowering.is_channels_last).
    channels_last: bool = False
    # Stored row-major and dense (torch.contiguous_format). With channels_last
    # it says whether a copy between two tensors changes their layout, which
    # decides the kernel PyTorch runs for it (`copy_kernel`).
    contiguous: bool = True

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def layout(self) -> str:
        """'contiguous', 'channels_last' or 'strided' (any other order)."""
        if self.contiguous:
            return "contiguous"
        return "channels_last" if self.channels_last else "strided"


Extractor = Callable[..., list[Row]]
REGISTRY: Registry = Registry("op-family extractor")  # aten op -> Extractor

# Ops that are free on a GPU: metadata, views, allocation without a kernel, or
# host-side scalars. Listed explicitly where neither the schema nor ATen's
# inplace_view tag (resize_, set_, as_strided_, ...) says so (`is_free`).
FREE_OPS = {
    aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
    aten.new_empty_strided, aten._unsafe_view, aten.lift_fresh_copy, aten.lift_fresh,
    aten.sym_size, aten.sym_stride, aten.sym_numel, aten.scalar_tensor,
    aten._local_scalar_dense, aten.detach, aten.alias, aten._assert_async,
    aten.sym_storage_offset,
    # Views whose schema does not mark them as aliases (autograd does not track
    # them as views); the CPU's LSTM, GRU and RNN cells chunk their gates so.
    aten.unsafe_split, aten.unsafe_split_with_sizes, aten.unsafe_chunk,
}


def register(*ops: Any) -> Callable[[Extractor], Extractor]:
    """Register an extractor for aten op packets or overloads. An op that
    already has one is refused at import, so no extractor is silently lost."""
    return REGISTRY.register(*ops)


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
    # In-place views (as_strided_, t_, squeeze_, ...) rewrite the tensor's
    # metadata only; ATen tags them so.
    if torch.Tag.inplace_view in tags(op):
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

def tensors(x: Any) -> list[TensorMeta]:
    """All TensorMeta objects in a (possibly nested) argument structure."""
    out: list[TensorMeta] = []
    if isinstance(x, TensorMeta):
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


def narrowest_float(ts) -> torch.dtype | None:
    """A row's dtype: the narrowest floating-point dtype among its tensors
    (arguments, then outputs; the first of that width), None when none is
    floating. The lowerings (``predictor.lowering``, the ONNX frontend) give
    rows this dtype and `generic_memory` counts elements in it. The narrowest,
    not the first argument's: a cast of an fp32 tensor of b elements to bf16
    then counts 2b read and b written, whole numbers at every batch size,
    where in fp32 units it wrote ceil(b / 2), not affine in the batch, and
    under autocast a GAN's [batch] labels made the whole step untraceable at
    other batch sizes."""
    best = None
    for t in ts:
        if t.dtype.is_floating_point and (best is None or t.dtype.itemsize < best.itemsize):
            best = t.dtype
    return best


def row_dtype_code(ts) -> int:
    """A row's dtype code, as the fx and ONNX lowerings give it: its
    `narrowest_float` dtype, else the first tensor's, else fp32."""
    floating = narrowest_float(ts)
    if floating is not None:
        return dtypes.of_torch(floating)
    return dtypes.of_torch(ts[0].dtype) if ts else L.F32


def row_unit(args: tuple, out: Any) -> torch.dtype | None:
    """The dtype a row's element counts are in (`narrowest_float`)."""
    return narrowest_float(tensors(args) + tensors(out))


def elems_in(t: TensorMeta, unit: torch.dtype | None) -> int:
    """`t`'s size in elements of the row's dtype `unit`, so the row's bytes
    are right when floating dtypes of two widths meet: a cast of an fp32
    tensor to fp16 reads 4 bytes an element and writes 2, and an fp16 + fp32
    add under autocast reads 2 + 4 and writes 4. Integer and bool tensors
    keep their element counts (index tensors are small beside their data)."""
    if unit is None or not t.dtype.is_floating_point or t.dtype.itemsize == unit.itemsize:
        return t.numel
    return -(-t.numel * t.dtype.itemsize // unit.itemsize)


def generic_memory(family: int, args: tuple, kwargs: dict, out: Any,
                   flops_per_elem: int = 0, kernels: int = 1) -> list[Row]:
    ins = tensors(args) + tensors(kwargs)
    outs = tensors(out)
    unit = row_unit(args, out)
    read = sum(elems_in(t, unit) for t in ins)
    written = sum(elems_in(t, unit) for t in outs)
    ref = outs[0] if outs else (ins[0] if ins else TensorMeta((1,), torch.float32))
    inner = ref.shape[-1] if ref.shape else 1
    n = max(ref.numel, 1)
    return [memory_row(family, read, written, flops_per_elem * n, inner, n // max(inner, 1), kernels)]


# -------------------------------------------------------------- GEMM family --

def gemm_layout(a: TensorMeta, b: TensorMeta) -> int:
    """Operand layout of C = A @ B (layout.GEMM_*): which operands are
    transposed views. F.linear's x @ W^T is GEMM_B_T; a weight stored [in, out]
    (GPT-2's Conv1D) and torch.bmm of contiguous tensors are GEMM_NN."""
    return (L.GEMM_A_T if a.transposed else 0) + (L.GEMM_B_T if b.transposed else 0)


@register(aten.mm)
def _mm(a: TensorMeta, b: TensorMeta, *_, out=None, **__) -> list[Row]:
    (m, k), (_, n) = a.shape, b.shape
    return [(L.MATMUL, (1, m, n, k, gemm_layout(a, b)), 1)]


@register(aten.addmm)
def _addmm(bias: TensorMeta, a: TensorMeta, b: TensorMeta, *_, out=None, **__) -> list[Row]:
    return _mm(a, b)


@register(aten._scaled_mm)
def _scaled_mm(a: TensorMeta, b: TensorMeta, *_, out=None, **__) -> list[Row]:
    """A float8 GEMM (predictor.frontend.float8): its row's dtype is its
    operands' one byte (`narrowest_float`), priced on float8 tensor cores."""
    return _mm(a, b)


@register(aten.bmm)
def _bmm(a: TensorMeta, b: TensorMeta, *_, out=None, **__) -> list[Row]:
    (bs, m, k), (_, _, n) = a.shape, b.shape
    return [(L.MATMUL, (bs, m, n, k, gemm_layout(a, b)), 1)]


@register(aten.baddbmm)
def _baddbmm(bias: TensorMeta, a: TensorMeta, b: TensorMeta, *_, out=None, **__) -> list[Row]:
    return _bmm(a, b)


# Matrix-vector products are GEMMs with one output column (in the training
# data cuBLAS runs its sgemm kernels down to one column); a dot product is a
# reduction of the elementwise products.
@register(aten.mv)
def _mv(a: TensorMeta, x: TensorMeta, *_, out=None, **__) -> list[Row]:
    m, k = a.shape
    return [(L.MATMUL, (1, m, 1, k, L.GEMM_A_T if a.transposed else 0), 1)]


@register(aten.addmv)
def _addmv(bias: TensorMeta, a: TensorMeta, x: TensorMeta, *_, out=None, **__) -> list[Row]:
    return _mv(a, x)


@register(aten.dot, aten.vdot)
def _dot(a: TensorMeta, b: TensorMeta, *_, out=None, **__) -> list[Row]:
    n = a.numel
    return [memory_row(L.REDUCTION, 2 * n, 1, 2 * n, n, 1)]


# -------------------------------------------------------------- convolution --

def _conv_dims(x: TensorMeta, w: TensorMeta, y: TensorMeta, groups: int,
               stride: Any, dilation: Any = 1) -> tuple[int, ...]:
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
    dil = max(_per_dim(dilation, max(len(w.shape) - 2, 1)))
    return (n, c, h, wd, k, r, s, p, q, groups, int(st), dil if dil > 1 else 0)


def _layout_transposes(dims: tuple[int, ...], x: TensorMeta, w: TensorMeta,
                       *moved: TensorMeta) -> list[Row]:
    """The layout transposes of one cuDNN convolution call (of `dims`) that
    reads or writes the tensors `moved` (input, filter and output of a forward conv, a dgrad or
    a wgrad), when the convolution runs in NCHW: cuDNN's tensor-core
    convolution kernels are NHWC, and on NCHW tensors cuDNN converts the
    inputs (nchwToNhwc) and the output back (nhwcToNchw) around the kernel,
    a memory-bound pass over each. cuDNN's API reference says so ("the cuDNN
    library may use padding, folding, and NCHW-to-NHWC transformations to call
    the Tensor Core operations", docs.nvidia.com/deeplearning/cudnn, Legacy
    API, "Data and Filter Formats"), and it is why PyTorch's channels-last
    tutorial (pytorch.org/tutorials/intermediate/memory_format_tutorial.html)
    recommends channels_last for mixed-precision training of convolutional
    networks. Not around the forward and data gradient of a 1x1 stride-1
    convolution, which cuDNN runs as GEMMs on NCHW (`_gemm_on_nchw`). A conv
    is channels-last, as PyTorch decides
    (cudnn_conv_suggest_memory_format), when its input or its filter is.

    Each transpose is a COPY row of the tensor's elements, priced by the
    learned memory-bound model like a clone of the same bytes, and flagged
    (dims[MEM_LAYOUT] = 1): it costs time only on a GPU where this conv runs
    on tensor cores (predictor.kernels.precision: fp16 on Volta and newer,
    bf16 on Ampere and newer), nothing elsewhere. Only half-precision
    convolutions get them: fp32 and TF32 convolutions are priced by the fp32
    model learned from measured NCHW convolutions (whatever kernels cuDNN ran
    are in the measured times), so an fp32 trace is unchanged (and
    ``predict(dtype="float16")`` of an fp32 trace adds no transposes: trace
    with ``amp=`` for them). But an fp32 convolution priced as its implicit
    GEMM (`dims`, kernels.work.as_implicit_gemm) is priced as the
    tensor-core GEMM it runs in TF32, so it gets them too, flagged
    L.LAYOUT_IMPLICIT_GEMM: they cost time where TF32 convolutions run on
    tensor cores. A tensor whose channels or spatial extent is 1 has the
    same bytes in both formats and is not moved."""
    if x.channels_last or w.channels_last:
        return []
    if is_depthwise(L.CONV, np.asarray(dims, dtype=np.int64)):
        return []   # PyTorch's own kernels read NCHW as it is (kernels.depthwise)
    flag = 1
    if x.dtype == torch.float32 and as_implicit_gemm(L.CONV, np.asarray(dims, dtype=np.int64)):
        flag = L.LAYOUT_IMPLICIT_GEMM
    elif x.dtype not in (torch.float16, torch.bfloat16):
        return []
    rows: list[Row] = []
    for t in moved:
        if len(t.shape) < 3 or t.shape[1] <= 1 or math.prod(t.shape[2:]) <= 1:
            continue
        n = t.numel
        inner = t.shape[-1]
        rows.append((L.COPY, (n, n, 0, inner, n // max(inner, 1), flag), 1))
    return rows


def layout_copy(t: TensorMeta) -> Row:
    """A copy of `t` into another memory format (NCHW <-> channels-last):
    PyTorch's strided copy kernel (`copy_kernel`)."""
    inner = t.shape[-1] if t.shape else 1
    return _with_kernel([memory_row(L.COPY, t.numel, t.numel, 0, inner,
                                    t.numel // max(inner, 1))], L.COPY_STRIDED)[0]


def _format_copies(runs_channels_last: bool, *ts: TensorMeta) -> list[Row]:
    """The copies ATen makes before a cuDNN convolution whose tensors are of
    two memory formats. The call runs channels-last when its input or its
    filter is (cudnn_conv_suggest_memory_format; `_runs_channels_last`), and
    ATen's convolution makes every tensor it hands cuDNN
    ``contiguous(memory_format)`` first: the input and filter of a forward,
    and the output gradient too in a backward (`ts`). So an NCHW input to a
    convolution with a channels-last filter (a group norm's output in a
    channels-last model: ATen's CUDA group norm writes NCHW) is copied into
    channels-last, a pass of its own in every precision. None when the call
    runs NCHW (cuDNN's own transposes, `_layout_transposes`, price that)."""
    if not runs_channels_last:
        return []
    return [layout_copy(t) for t in ts
            if len(t.shape) in (4, 5) and t.shape[1] > 1 and math.prod(t.shape[2:]) > 1
            and not t.channels_last]


def _runs_channels_last(x: TensorMeta, w: TensorMeta, y: TensorMeta | None) -> bool:
    """Whether a convolution runs channels-last: its input or filter is, or
    (a 1x1 filter's strides fit both formats, and the trace's shape function
    decides as the CUDA build does) the output it wrote."""
    return x.channels_last or w.channels_last or (y is not None and y.channels_last)


def _per_dim(v, n: int) -> list[int]:
    """An int-list argument of ATen (stride, padding, kernel_size) as its
    values, a single value repeated for each of `n` dims as ATen expands it."""
    vals = [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)]
    return vals * n if len(vals) == 1 else vals


def _gemm_on_nchw(w: TensorMeta, stride, padding, groups) -> bool:
    """Whether cuDNN runs this convolution's forward and data gradient as
    GEMMs on the NCHW tensors themselves, with no layout transposes: a 1x1
    convolution of stride 1 without padding is, image by image, the GEMM
    W[K, C] @ X[C, H*W] (its data gradient W^T @ dY), which needs no NHWC
    copy. Its weight gradient sums over the images and keeps the transposes.
    The H200's profile of a ResNet-50 bf16 step in NCHW (torch 2.11, cuDNN 9;
    benchmarks/data/h200/profile) ran 68 of its convolution calls as such
    GEMMs (`nvjet_sm90_*`, `cutlass_80_tensorop_bf16_s16816gemm_*`) and 226
    transposes; this rule leaves 66 calls and 234 transposes of the trace's
    366. cuDNN 8.3 and older transposed around these too (timm's RTX 3090
    runs of 2022: benchmarks/README.md, "timm's published throughput")."""
    n = max(len(w.shape) - 2, 1)
    return groups == 1 and all(k == 1 for k in w.shape[2:]) \
        and all(s == 1 for s in _per_dim(stride, n)) and not any(_per_dim(padding, n))


@register(aten.convolution, aten._convolution)
def _convolution(x: TensorMeta, w: TensorMeta, bias, stride, padding, dilation, transposed,
                 output_padding, groups, *_, out=None, **__) -> list[Row]:
    y = out
    if transposed:
        # A transposed conv is the data-gradient of the conv that maps y -> x.
        # Its weight is [C_in, C_out/g, ...]; the equivalent conv's is [C_in, ...] too.
        w_eq = TensorMeta((w.shape[0], w.shape[1] * groups) + w.shape[2:], w.dtype)
        dims = _conv_dims(y, w_eq, x, groups, stride, dilation)
        return [(L.CONV_DGRAD, dims, 1)] + _layout_transposes(dims, x, w, x, w, y)
    dims = _conv_dims(x, w, y, groups, stride, dilation)
    rows = [(L.CONV, dims, 1)] + _format_copies(_runs_channels_last(x, w, y), x, w)
    if not _gemm_on_nchw(w, stride, padding, groups):
        rows += _layout_transposes(dims, x, w, x, w, y)
    return rows


@register(aten.convolution_backward)
def _convolution_backward(grad_out: TensorMeta, x: TensorMeta, w: TensorMeta, bias_sizes, stride,
                          padding, dilation, transposed, output_padding, groups, output_mask,
                          *_, out=None, **__) -> list[Row]:
    grads = tensors(out)
    rows: list[Row] = _format_copies(
        _runs_channels_last(x, w, grads[0] if grads else None), x, w, grad_out)
    # The data gradient is shaped as the input, the weight gradient as the filter.
    if transposed:
        w_eq = TensorMeta((w.shape[0], w.shape[1] * groups) + w.shape[2:], w.dtype)
        dims = _conv_dims(grad_out, w_eq, x, groups, stride, dilation)
        if output_mask[0]:  # grad of a dgrad is a forward conv
            rows.append((L.CONV, dims, 1))
            rows += _layout_transposes(dims, x, w, grad_out, w, x)
    else:
        dims = _conv_dims(x, w, grad_out, groups, stride, dilation)
        if output_mask[0]:
            rows.append((L.CONV_DGRAD, dims, 1))
            if not _gemm_on_nchw(w, stride, padding, groups):
                rows += _layout_transposes(dims, x, w, grad_out, w, x)
    if output_mask[1]:
        rows.append((L.CONV_WGRAD, dims, 1))
        rows += _layout_transposes(dims, x, w, grad_out, x, w)
    if len(output_mask) > 2 and output_mask[2]:
        cout = grad_out.shape[1]
        rows.append(memory_row(L.REDUCTION, grad_out.numel, cout, grad_out.numel,
                               grad_out.numel // max(cout, 1), cout))
    return rows


# ---------------------------------------------------------------- attention --

def _attention_dims(q: TensorMeta, k: TensorMeta, v: TensorMeta, causal: bool) -> tuple[int, ...]:
    *lead, sq, d = q.shape
    sk, dv = k.shape[-2], v.shape[-1]
    b = lead[0] if lead else 1
    h = math.prod(lead[1:]) if len(lead) > 1 else 1
    return (b, h, sq, sk, d, dv, int(bool(causal)))


def _attention_fwd(q: TensorMeta, k: TensorMeta, v: TensorMeta, *rest, out=None,
                   is_causal: bool = False, **kw) -> list[Row]:
    causal = bool(kw.get("is_causal", is_causal))
    # Positional layout of the flash / efficient / cpu variants: (q, k, v, dropout_p, is_causal, ...)
    if len(rest) >= 2 and isinstance(rest[1], bool):
        causal = rest[1]
    return [(L.ATTENTION, _attention_dims(q, k, v, causal), 1)]


def _attention_bwd(grad: TensorMeta, q: TensorMeta, k: TensorMeta, v: TensorMeta, *rest, out=None,
                   **kw) -> list[Row]:
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
def _attention_math(q: TensorMeta, k: TensorMeta, v: TensorMeta, *rest, out=None,
                    **kw) -> list[Row]:
    return _attention_fwd(q, k, v, *rest, out=out, **kw)


# --------------------------------------------------------------------- LSTM --

def rnn_launches(family: int, steps: int, inp: int) -> int:
    """Kernels cuDNN's standard algorithm launches for one layer and
    direction (kernels.recurrent): forward, the input GEMM over every step,
    then a recurrent GEMM and a pointwise kernel a step; backward, the
    transpose of W_hh, a pointwise kernel and a recurrent GEMM a step, then
    dx, dW_ih and dW_hh. The host pays a launch for each (predictor.overhead)."""
    per_step = 2 * max(int(steps), 0)
    if family == L.LSTM:
        return max(per_step + (1 if inp > 0 else 0), 1)
    return max(per_step + (2 if inp > 0 else 0) + 2, 1)


@register(aten.mkldnn_rnn_layer)
def _mkldnn_rnn_layer(x: TensorMeta, w_ih: TensorMeta, w_hh: TensorMeta, *_, out=None,
                      **__) -> list[Row]:
    # CPU trace of one LSTM layer, one direction: x [T, B, I] (or [B, T, I]),
    # w_ih [4H, I]. On a GPU the same layer runs as a cuDNN LSTM.
    steps, batch = x.shape[0], x.shape[1]
    hidden = w_hh.shape[1]
    return [(L.LSTM, (steps, batch, w_ih.shape[1], hidden),
             rnn_launches(L.LSTM, steps, w_ih.shape[1]))]


@register(aten.mkldnn_rnn_layer_backward)
def _mkldnn_rnn_layer_backward(x: TensorMeta, w_ih: TensorMeta, w_hh: TensorMeta, *_, out=None,
                               **__) -> list[Row]:
    steps, batch = x.shape[0], x.shape[1]
    return [(L.LSTM_BWD, (steps, batch, w_ih.shape[1], w_hh.shape[1]),
             rnn_launches(L.LSTM_BWD, steps, w_ih.shape[1]))]


# cuDNN's RNN modes (cudnnRNNMode_t) and the gates of each: the rows' dims[4]
# (0, as an LSTM's rows keep it, reads as 4: kernels.work.rnn_gates).
CUDNN_RNN_GATES = {0: 1, 1: 1, 2: 0, 3: 3}  # RNN_RELU, RNN_TANH, LSTM, GRU


def _cudnn_rows(family: int, x: TensorMeta, weights: list, hidden: int, num_layers: int,
                batch_first: bool, bidirectional: bool, mode: int = 2) -> list[Row]:
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    dirs = 2 if bidirectional else 1
    gates = CUDNN_RNN_GATES.get(int(mode), 0)
    rows = []
    for layer in range(num_layers):
        inp = x.shape[-1] if layer == 0 else hidden * dirs
        dims = (steps, batch, inp, hidden) + ((gates,) if gates else ())
        rows.extend([(family, dims, rnn_launches(family, steps, inp))] * dirs)
    return rows


@register(aten._cudnn_rnn)
def _cudnn_rnn(x, weights, stride0, weight_buf, hx, cx, mode, hidden, proj, num_layers,
               batch_first, dropout, train, bidirectional, *_, out=None, **__) -> list[Row]:
    return _cudnn_rows(L.LSTM, x, weights, hidden, num_layers, batch_first, bidirectional, mode)


@register(aten._cudnn_rnn_backward)
def _cudnn_rnn_backward(x, weights, stride0, weight_buf, hx, cx, output, grad_output,
                        grad_hy, grad_cy, mode, hidden, proj, num_layers, batch_first,
                        dropout, train, bidirectional, *_, out=None, **__) -> list[Row]:
    return _cudnn_rows(L.LSTM_BWD, x, weights, hidden, num_layers, batch_first, bidirectional,
                       mode)


# An LSTM or GRU cell stepped from Python (nn.LSTMCell, nn.GRUCell) runs on a
# GPU as its two gate GEMMs and one fused pointwise kernel
# (predictor.frontend.cuda_paths): ATen's fused cell kernels read the gates,
# the biases and the cell state and write the new state and the workspace
# the backward reads, each element's gates once. Their backward kernel writes
# the gates' gradient, and the biases' gradient is that gradient summed over
# the batch, one column reduction per bias (an LSTM's two biases share one).
# Memory-bound like every pointwise kernel: their arithmetic is counted as a
# transcendental op's (`elementwise`), not the five sigmoids and tanhs of an
# LSTM element, which would describe them as more compute-bound than any
# kernel the elementwise network was trained on.
_CELL_FLOPS = 8


def _cell_rows(args: tuple, out: list[TensorMeta]) -> list[Row]:
    """One fused cell kernel as an elementwise row over everything it writes
    (the state, and the workspace or the gradients), `inner` x `outer` that
    many elements, as every elementwise row of the training data is
    described: counted over the state alone, the row wrote 5-6 times its
    `inner` x `outer`, a kind of row the network never saw, and was priced
    at 4x a plain add's time on a V100."""
    (family, (read, written, _, _, _), kernels), = generic_memory(L.ELEMENTWISE, args, {}, out)
    # the state's width: every output is a whole number of [batch, hidden] slices
    inner = max(min((t.shape[-1] for t in out if t.shape), default=1), 1)
    outer = max(written // inner, 1)
    return [memory_row(family, read, written, _CELL_FLOPS * inner * outer, inner, outer,
                       kernels)]


@register(aten._thnn_fused_lstm_cell, aten._thnn_fused_gru_cell)
def _fused_cell(*args, out=None, **kwargs) -> list[Row]:
    return _cell_rows(args + tuple(kwargs.values()), tensors(out))


def _bias_sums(gates: list[TensorMeta]) -> list[Row]:
    return [memory_row(L.REDUCTION, g.numel, g.shape[-1], g.numel, g.numel // g.shape[-1],
                       g.shape[-1]) for g in gates if len(g.shape) == 2 and g.shape[-1] > 0]


@register(aten._thnn_fused_lstm_cell_backward_impl)
def _fused_lstm_cell_backward(grad_hy, grad_cy, cx: TensorMeta, cy: TensorMeta,
                              workspace: TensorMeta, has_bias, *_, out=None, **__) -> list[Row]:
    outs = tensors(out)
    return _cell_rows((grad_hy, grad_cy, cx, cy, workspace), outs[:2]) \
        + (_bias_sums(outs[:1]) if has_bias else [])


@register(aten._thnn_fused_gru_cell_backward)
def _fused_gru_cell_backward(grad_hy: TensorMeta, workspace: TensorMeta, has_bias, *_,
                             out=None, **__) -> list[Row]:
    outs = tensors(out)
    return _cell_rows((grad_hy, workspace), outs[:3]) \
        + (_bias_sums(outs[:2]) if has_bias else [])


# ------------------------------------------------------ normalisation, softmax --

def _widths(ins: list[TensorMeta], outs: list[TensorMeta]) -> tuple[int, int]:
    """(read, written) of a row whose tensors may differ in width, in
    elements of its dtype (`elems_in`)."""
    unit = narrowest_float(ins + outs)
    return sum(elems_in(t, unit) for t in ins), sum(elems_in(t, unit) for t in outs)


@register(aten._softmax, aten._log_softmax)
def _softmax(x: TensorMeta, dim: int, *_, out=None, **__) -> list[Row]:
    # Under fp16 autocast softmax runs with half_to_float: it reads fp16 and
    # writes fp32, twice the bytes of its input (the row counts fp16 units).
    inner = x.shape[dim] if x.shape else 1
    read, written = _widths([x], tensors(out) or [x])
    return [memory_row(L.SOFTMAX, read, written, 5 * x.numel, inner, x.numel // max(inner, 1))]


@register(aten._safe_softmax)
def _safe_softmax(x: TensorMeta, dim: int, *_, out=None, **__) -> list[Row]:
    # SDPA's math path with a mask (Hugging Face's default attention): a softmax,
    # then rows that are all -inf set to 0, as ATen runs it on CUDA: softmax,
    # eq(-inf) into a bool mask, all() over `dim`, where().
    inner = x.shape[dim] if x.shape else 1
    outer = x.numel // max(inner, 1)
    mask = _bool_elems(x, x)
    row_mask = _bool_elems(TensorMeta((outer,), torch.bool), x)
    return _softmax(x, dim) + [
        memory_row(L.ELEMENTWISE, x.numel, mask, x.numel, inner, outer),
        memory_row(L.REDUCTION, mask, row_mask, x.numel, inner, outer),
        memory_row(L.ELEMENTWISE, x.numel + row_mask, x.numel, x.numel, inner, outer)]


@register(aten._softmax_backward_data, aten._log_softmax_backward_data)
def _softmax_bwd(grad: TensorMeta, y: TensorMeta, dim: int, *_, out=None, **__) -> list[Row]:
    # After a half_to_float softmax the gradient and output read are fp32 and
    # the input's gradient written is fp16.
    inner = y.shape[dim] if y.shape else 1
    read, written = _widths([grad, y], tensors(out) or [y])
    return [memory_row(L.SOFTMAX_BWD, read, written, 3 * y.numel, inner,
                       y.numel // max(inner, 1))]


@register(aten.native_layer_norm)
def _layer_norm(x: TensorMeta, normalized_shape, w, b, *_, out=None, **__) -> list[Row]:
    inner = math.prod(normalized_shape)
    outer = x.numel // max(inner, 1)
    params = 2 * inner if w is not None else 0
    return [memory_row(L.LAYER_NORM, x.numel + params, x.numel + 2 * outer, 8 * x.numel, inner, outer)]


@register(aten.native_layer_norm_backward)
def _layer_norm_bwd(grad: TensorMeta, x: TensorMeta, normalized_shape, mean, rstd, w, b, mask,
                    *_, out=None, **__) -> list[Row]:
    inner = math.prod(normalized_shape)
    outer = x.numel // max(inner, 1)
    # CUDA: one kernel for the input gradient, one column reduction for
    # gamma/beta (GammaBetaBackward), as in layer_norm_backward_cuda.
    kernels = 1 + (1 if (len(mask) > 1 and (mask[1] or mask[2])) else 0)
    return [memory_row(L.LAYER_NORM_BWD, 3 * x.numel + 2 * outer, x.numel + 2 * inner,
                       12 * x.numel, inner, outer, kernels)]


@register(fused_rms_norm._opoverload)
def _rms_norm(x: TensorMeta, normalized_shape, w, eps=None, *_, out=None, **__) -> list[Row]:
    """RMSNorm as CUDA's fused kernel runs it (predictor.fused_ops):
    layer norm's row reduction without the mean, one kernel; read the rows
    (and the weight), write them and each row's reciprocal RMS."""
    inner = math.prod(normalized_shape)
    outer = x.numel // max(inner, 1)
    params = inner if w is not None else 0
    return [memory_row(L.LAYER_NORM, x.numel + params, x.numel + outer, 6 * x.numel, inner, outer)]


def _rms_norm_bwd(grad: TensorMeta, x: TensorMeta, normalized_shape, rstd, w, mask, *_, out=None,
                  **__) -> list[Row]:
    """Its gradient: one kernel for the input's (reading the gradient, the
    input and the rows' RMS), one column reduction for the weight's, as
    layer norm's backward."""
    inner = math.prod(normalized_shape)
    outer = x.numel // max(inner, 1)
    weight = len(mask) > 1 and bool(mask[1])
    kernels = (1 if mask[0] else 0) + (1 if weight else 0)
    return [memory_row(L.LAYER_NORM_BWD, 2 * x.numel + outer, x.numel + (inner if weight else 0),
                       10 * x.numel, inner, outer, max(kernels, 1))]


if hasattr(aten, "_fused_rms_norm_backward"):  # torch 2.8 on; before, no fused RMSNorm
    register(aten._fused_rms_norm_backward)(_rms_norm_bwd)


def _weight_norm_rows(v: TensorMeta, dim) -> tuple[int, int]:
    """(inner, outer) of weight normalisation's rows: one norm for each slice
    along `dim` (ATen's first- and last-dim kernels: a block a slice)."""
    d = int(dim) % max(len(v.shape), 1) if v.shape else 0
    outer = v.shape[d] if v.shape else 1
    return v.numel // max(outer, 1), outer


@register(aten._weight_norm_interface)
def _weight_norm(v: TensorMeta, g: TensorMeta, dim=0, *_, out=None, **__) -> list[Row]:
    """w = g * v / ||v||, the norm over each slice along `dim`: a row
    reduction and a scaled copy of the row, one kernel (`torch.nn.utils.
    weight_norm` recomputes it from v and g at every forward)."""
    inner, outer = _weight_norm_rows(v, dim)
    return [memory_row(L.LAYER_NORM, v.numel + outer, v.numel + outer, 4 * v.numel, inner, outer)]


@register(aten._weight_norm_interface_backward)
def _weight_norm_bwd(grad_w: TensorMeta, v: TensorMeta, g: TensorMeta, norms, dim=0, *_, out=None,
                     **__) -> list[Row]:
    """grad_v and grad_g from grad_w, v, g and the saved norms: a row
    reduction of grad_w . v and a scaled row, one kernel."""
    inner, outer = _weight_norm_rows(v, dim)
    return [memory_row(L.LAYER_NORM_BWD, 2 * v.numel + 2 * outer, v.numel + outer, 8 * v.numel,
                       inner, outer)]


def _nchw_copies(*ts: TensorMeta) -> list[Row]:
    """ATen's CUDA group norm reads NCHW only (``X.contiguous()`` where a CPU
    keeps the input's format): a copy of each channels-last tensor first.
    The fx trace already routes channels-last inputs through that copy
    (predictor.frontend.cuda_paths), so there the input arrives NCHW."""
    return [layout_copy(t) for t in ts if t.channels_last]


def _group_norm_apply(x: TensorMeta, reads: int, n: int, c: int) -> Row:
    """The elementwise pass of a group norm (forward: y = a x + b; backward:
    dx = c1 dy + c2 x + c3), `reads` tensors of x's size and the per-(sample,
    channel) coefficients in, one out."""
    inner = x.shape[-1] if x.shape else 1
    return memory_row(L.ELEMENTWISE, reads * x.numel + 2 * n * c, x.numel, 2 * reads * x.numel,
                      inner, x.numel // max(inner, 1))


@register(aten.native_group_norm)
def _group_norm(x: TensorMeta, w, b, n, c, hw, groups, *_, out=None, **__) -> list[Row]:
    """ATen's CUDA group norm is not a layer norm's one-pass kernel
    (aten/src/ATen/native/cuda/group_norm_kernel.cu): RowwiseMomentsCUDAKernel
    reduces each (sample, group) row of C/G x HW elements to its mean and
    rstd, one block a row; ComputeFusedParamsCUDAKernel folds them and the
    affine weights into a scale and a shift per (sample, channel); then an
    elementwise pass writes y = a x + b. Priced as that: a reduction row
    (its two kernels) and an elementwise row. Its rows are long, 40,960
    elements at Stable Diffusion's first level, ten times the longest row of
    the layer-norm kernels the layer-norm network learned from (4,100), which
    priced such a row at 20 times a pass over its bytes."""
    rows = max(n * groups, 1)
    return _nchw_copies(x) + [
        memory_row(L.REDUCTION, x.numel, 2 * rows, 2 * x.numel, x.numel // rows, rows, 2),
        _group_norm_apply(x, 1, n, c)]


@register(aten.native_group_norm_backward)
def _group_norm_bwd(grad: TensorMeta, x: TensorMeta, mean, rstd, w, n, c, hw, groups, *_, out=None,
                    **__) -> list[Row]:
    """ATen's CUDA backward: ComputeInternalGradientsCUDAKernel reduces dy and
    dy * x over each (sample, channel)'s HW elements; three small kernels turn
    those into dx's coefficients and the weights' gradients
    (ComputeGradOutputCoeffient, ComputeBackwardFusedParams, GammaBetaBackward);
    an elementwise pass writes dx = c1 dy + c2 x + c3."""
    rows = max(n * c, 1)
    return _nchw_copies(grad, x) + [
        memory_row(L.REDUCTION, 2 * x.numel, 2 * rows, 4 * x.numel, x.numel // rows, rows, 4),
        _group_norm_apply(x, 2, n, c)]


def _bn_rows(family: int, x: TensorMeta, training: bool, reads: int, kernels: int) -> list[Row]:
    """A batch norm's row: `inner` = N x H x W elements per channel, `outer` =
    C. A channels-last input is flagged (dims[MEM_LAYOUT] = 1): its
    statistics are reduced across many blocks per channel, where an NCHW
    one's run one block per channel (kernels.roofline.per_channel_batch_norm_us)."""
    c = x.shape[1] if len(x.shape) > 1 else 1
    inner = x.numel // max(c, 1)
    family, dims, n = memory_row(family, reads * x.numel, x.numel, 6 * x.numel, inner, c,
                                 kernels if training else 1)
    if x.channels_last:
        dims = dims + (1,)
    return [(family, dims, n)]


@register(aten.native_batch_norm, aten._native_batch_norm_legit,
          aten._native_batch_norm_legit_functional, aten.cudnn_batch_norm)
def _batch_norm(x: TensorMeta, w, b, running_mean, running_var, *rest, out=None, **__) -> list[Row]:
    training = bool(rest[0]) if rest and isinstance(rest[0], bool) else True
    # Training: one pass for the statistics, one to normalise.
    return _bn_rows(L.BATCH_NORM, x, training, 2 if training else 1, 2)


@register(aten._native_batch_norm_legit_no_training)
def _batch_norm_eval(x: TensorMeta, *_, out=None, **__) -> list[Row]:
    return _bn_rows(L.BATCH_NORM, x, False, 1, 1)


@register(aten.native_batch_norm_backward, aten.cudnn_batch_norm_backward,
          aten.batch_norm_backward)
def _batch_norm_bwd(grad: TensorMeta, x: TensorMeta, *_, out=None, **__) -> list[Row]:
    # Reduce (grad, x) for dgamma/dbeta, then an elementwise pass for dx.
    return _bn_rows(L.BATCH_NORM_BWD, x, True, 4, 2)


# ------------------------------------------------------- embedding, pooling --

@register(aten.embedding)
def _embedding(weight: TensorMeta, indices: TensorMeta, *_, out=None, **__) -> list[Row]:
    d = weight.shape[-1]
    n = indices.numel
    return [memory_row(L.EMBEDDING, n * d + n, n * d, 0, d, n)]


@register(aten._embedding_bag, aten._embedding_bag_forward_only)
def _embedding_bag(weight: TensorMeta, indices: TensorMeta, offsets: TensorMeta, *_, out=None,
                   **__) -> list[Row]:
    # Gathers each index's row and reduces it into its bag: reads n rows and
    # the indices, writes one row a bag.
    d = weight.shape[-1]
    n = indices.numel
    bags = max(offsets.numel, 1)
    return [memory_row(L.EMBEDDING, n * d + n, bags * d, n * d, d, n)]


@register(aten._embedding_bag_backward, aten._embedding_bag_dense_backward,
          aten._embedding_bag_per_sample_weights_backward)
def _embedding_bag_bwd(*args, out=None, **kwargs) -> list[Row]:
    # Zero the weight gradient, then scatter-add each bag's gradient row to its
    # indices' rows: every input read and every output written once.
    return generic_memory(L.EMBEDDING_BWD, args, kwargs, out)


# embedding_dense_backward_cuda: up to this many indices it zeroes the weight
# gradient and accumulates with one atomic kernel; above it, it sorts the indices
# and reduces segments: arange, a cub radix sort, zeros, unique_by_key (2),
# partials per segment, an exclusive sum (2), partial-segment offsets (2),
# compute_grad_weight and sum_and_scatter.
EMBEDDING_BWD_ATOMIC_MAX_INDICES = 3072
EMBEDDING_BWD_SORT_KERNELS = 13


@register(aten.embedding_dense_backward)
def _embedding_bwd(grad: TensorMeta, indices: TensorMeta, num_weights: int, *_, out=None,
                   **__) -> list[Row]:
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


_pool_rows, _pool_bwd_rows = _pool(L.POOL), _pool(L.POOL_BWD)


def _window_area(kernel_size) -> int:
    """A 2-D pooling window's area from its `kernel_size` argument (an int, or
    one or two ints: ATen repeats a single one)."""
    ks = _per_dim(kernel_size, 2)[:2] or [1, 1]
    return max(ks[0], 1) * max(ks[1], 1)


def _max_pool_nchw(rows: list[Row], x: TensorMeta, out: TensorMeta, kernel_size) -> list[Row]:
    """`rows` (one POOL / POOL_BWD row) marked as ATen's NCHW max-pool kernels
    run it (layout.MAX_POOL_NCHW, with the window elements those kernels
    visit: `out`'s elements times the window's area), unless `x` is stored
    channels-last, which runs the NHWC kernels."""
    if x.channels_last and not x.contiguous:
        return rows
    family, dims, kernels = rows[0]
    window = out.numel * _window_area(kernel_size)
    return [(family, tuple(dims[:L.MEM_LAYOUT]) + (0, L.MAX_POOL_NCHW, window), kernels)]


@register(aten.max_pool2d_with_indices)
def _max_pool2d(x: TensorMeta, kernel_size, *_, out=None, **__) -> list[Row]:
    rows = _pool_rows(x, kernel_size, *_, out=out, **__)
    outs = tensors(out)
    return _max_pool_nchw(rows, x, outs[0], kernel_size) if outs else rows


@register(aten.max_pool2d_with_indices_backward)
def _max_pool2d_bwd(grad: TensorMeta, x: TensorMeta, kernel_size, *_, out=None,
                    **__) -> list[Row]:
    rows = _pool_bwd_rows(grad, x, kernel_size, *_, out=out, **__)
    return _max_pool_nchw(rows, x, grad, kernel_size)


register(aten.avg_pool2d, aten._adaptive_avg_pool2d,
         aten.max_pool3d_with_indices, aten.avg_pool3d, aten._adaptive_avg_pool3d,
         aten.adaptive_max_pool2d, aten.adaptive_max_pool3d, aten.max_pool1d, aten.avg_pool1d,
         aten.fractional_max_pool2d, aten.fractional_max_pool3d, aten.max_unpool2d,
         aten.max_unpool3d)(_pool_rows)
register(aten.avg_pool2d_backward,
         aten._adaptive_avg_pool2d_backward, aten.max_pool3d_with_indices_backward,
         aten.avg_pool3d_backward, aten._adaptive_avg_pool3d_backward,
         aten.adaptive_max_pool2d_backward, aten.adaptive_max_pool3d_backward,
         aten.fractional_max_pool2d_backward, aten.fractional_max_pool3d_backward)(_pool_bwd_rows)


# ---------------------------------------------------------- dropout, losses --

def _bool_elems(t: TensorMeta, like: TensorMeta) -> int:
    """A bool tensor's size in elements of `like`'s dtype (the row's unit)."""
    width = max(like.dtype.itemsize, 1)
    return -(-t.numel // width)


@register(aten.native_dropout)
def _native_dropout(x: TensorMeta, p, train, *_, out=None, **__) -> list[Row]:
    # Fused on CUDA (one kernel, RNG inside): read x, write the output and a bool mask.
    mask = _bool_elems(x, x)
    inner = x.shape[-1] if x.shape else 1
    return [memory_row(L.DROPOUT, x.numel, x.numel + mask, 4 * x.numel, inner,
                       x.numel // max(inner, 1))]


@register(aten.native_dropout_backward)
def _native_dropout_bwd(grad: TensorMeta, mask: TensorMeta, scale, *_, out=None, **__) -> list[Row]:
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
    # A loss reduced to a scalar (a mean or a sum: 0-d outputs, whatever the
    # batch) is a reduction kernel, priced as every sum and mean is; the
    # elementwise network only saw kernels that read one or two elements a
    # write.
    (family, dims, kernels), = generic_memory(L.LOSS, args, kwargs, out, flops_per_elem=2)
    outs = tensors(out)
    if outs and all(len(t.shape) == 0 for t in outs) and \
            any(len(t.shape) > 0 for t in tensors(args)):
        family = L.REDUCTION
    return [(family, dims, kernels)]


@register(aten.nll_loss_backward, aten.nll_loss2d_backward)
def _nll_loss_bwd(grad: TensorMeta, x: TensorMeta, target: TensorMeta, *_, out=None,
                  **__) -> list[Row]:
    # CUDA zeroes the whole input gradient, then one kernel writes -w/N at each
    # target: the input itself is never read.
    return [memory_row(L.FILL, 0, x.numel, 0, 1, x.numel),
            memory_row(L.LOSS, target.numel + grad.numel, target.numel, target.numel, 1,
                       target.numel)]


@register(aten.nll_loss_forward, aten.nll_loss2d_forward)
def _nll_loss_fwd(x: TensorMeta, target: TensorMeta, weight=None, *_, out=None,
                  **__) -> list[Row]:
    # Each target reads its one input element (and its class weight): a
    # gather and a sum, never a pass over the whole input (GPT-2's [tokens,
    # 50,257] log-probabilities).
    n = target.numel
    read = n + n + (n if isinstance(weight, TensorMeta) else 0)
    written = sum(t.numel for t in tensors(out)) or 1
    return [memory_row(L.REDUCTION, read, written, 2 * n, n, 1)]


register(aten.binary_cross_entropy_with_logits,
         aten.binary_cross_entropy, aten.binary_cross_entropy_backward, aten.mse_loss,
         aten.mse_loss_backward, aten.smooth_l1_loss, aten.smooth_l1_loss_backward,
         aten.huber_loss, aten.huber_loss_backward, aten.soft_margin_loss,
         aten.soft_margin_loss_backward, aten.multilabel_margin_loss_forward,
         aten.multilabel_margin_loss_backward, aten.multi_margin_loss,
         aten.multi_margin_loss_backward)(_loss)


# ---------------------------------------------------------------- optimizer --

# multi_tensor_apply launches one kernel per chunk of at most this many tensors,
# by the number of tensor lists the op touches (PyTorch's depth_to_max_tensors).
_MAX_TENSORS_BY_DEPTH = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
_MTA_ELEMS_PER_LAUNCH = 65536 * 320  # chunk size x max blocks per launch


def _multi_tensor_row(first: list, depth: int, read: int, written: int, flops: int) -> Row:
    """The optimizer row of one multi_tensor_apply op over the tensors `first`
    (its first list) touching `depth` lists: its launches by chunk, and one
    "row" per tensor of the mean tensor size (inner x outer = elements, as in
    every other memory-bound row)."""
    n_tensors = len(first)
    total = sum(t.numel for t in first)
    per_launch = _MAX_TENSORS_BY_DEPTH[min(max(depth, 1), 5)]
    kernels = max(math.ceil(n_tensors / per_launch), math.ceil(total / _MTA_ELEMS_PER_LAUNCH), 1)
    inner = max(total // max(n_tensors, 1), 1)
    return memory_row(L.OPTIMIZER, read, written, flops, inner, n_tensors, kernels)


def _foreach(*args, out=None, **kwargs) -> list[Row]:
    lists = [a for a in list(args) + list(kwargs.values())
             if isinstance(a, (list, tuple)) and a and isinstance(a[0], TensorMeta)]
    if not lists:
        return generic_memory(L.OPTIMIZER, args, kwargs, out)
    read = sum(t.numel for lst in lists for t in lst)
    outs = tensors(out)
    # In-place variants write the first list; out-of-place ones return new tensors.
    written = sum(t.numel for t in outs) if outs else sum(t.numel for t in lists[0])
    depth = len(lists) + (1 if outs else 0)
    return [_multi_tensor_row(lists[0], depth, read, written, read)]


@register(aten._amp_foreach_non_finite_check_and_unscale_)
def _amp_unscale(grads, found_inf, inv_scale, *_, out=None, **__) -> list[Row]:
    # GradScaler.unscale_: one multi-tensor kernel per chunk of gradients that
    # multiplies each by 1/scale in place and flags a non-finite value.
    return _foreach(grads, out=None)


@register(aten._amp_update_scale_, aten._amp_update_scale)
def _amp_update(scale, growth_tracker, found_inf, *_, out=None, **__) -> list[Row]:
    # GradScaler.update: one single-thread kernel over three scalars.
    return [memory_row(L.OPTIMIZER, 3, 2, 3, 1, 1)]


@register(aten._fused_adam_, aten._fused_adamw_)
def _fused_adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *_, out=None,
                **__) -> list[Row]:
    # PyTorch's fused Adam / AdamW: one multi-tensor kernel per chunk that reads
    # parameter, gradient and both moments and writes parameter and moments.
    lists = [params, grads, exp_avgs, exp_avg_sqs]
    read = sum(t.numel for lst in lists for t in lst)
    written = sum(t.numel for lst in (params, exp_avgs, exp_avg_sqs) for t in lst)
    total = sum(t.numel for t in params)
    return [_multi_tensor_row(params, len(lists), read, written, 12 * total)]


def _is_multi_tensor(op: Any) -> bool:
    name = getattr(getattr(op, "overloadpacket", op), "__name__", "")
    return name.startswith("_foreach_") or name.startswith("_fused_")


# ------------------------------------------------------ copies, fills, misc --

def _copy(*args, out=None, **kwargs) -> list[Row]:
    return generic_memory(L.COPY, args, kwargs, out)


register(aten.cat, aten.stack, aten.scatter, aten.scatter_add, aten.index_put,
         aten.index_put_, aten.masked_scatter, aten.constant_pad_nd, aten.reflection_pad2d,
         aten.upsample_nearest2d, aten.upsample_bilinear2d, aten.slice_scatter,
         aten.select_scatter, aten.roll, aten.flip, aten.repeat, aten.tril, aten.triu,
         aten.index_add, aten.narrow_copy, aten.slice_backward, aten.select_backward,
         aten.embedding_renorm_, aten.col2im, aten.im2col)(_copy)
# Resampling, padding and index shuffles (and their gradients): each reads its
# inputs and writes its outputs once, gathering or scattering like a copy.
register(aten.upsample_nearest1d, aten.upsample_nearest3d, aten.upsample_linear1d,
         aten.upsample_bicubic2d, aten.upsample_trilinear3d, aten._upsample_nearest_exact1d,
         aten._upsample_nearest_exact2d, aten._upsample_nearest_exact3d,
         aten._upsample_bilinear2d_aa, aten._upsample_bicubic2d_aa,
         aten.upsample_nearest1d_backward, aten.upsample_nearest2d_backward,
         aten.upsample_nearest3d_backward, aten.upsample_linear1d_backward,
         aten.upsample_bilinear2d_backward, aten.upsample_bicubic2d_backward,
         aten.upsample_trilinear3d_backward, aten._upsample_nearest_exact1d_backward,
         aten._upsample_nearest_exact2d_backward, aten._upsample_nearest_exact3d_backward,
         aten._upsample_bilinear2d_aa_backward, aten._upsample_bicubic2d_aa_backward,
         aten.reflection_pad1d, aten.reflection_pad3d, aten.replication_pad1d,
         aten.replication_pad2d, aten.replication_pad3d, aten.reflection_pad1d_backward,
         aten.reflection_pad2d_backward, aten.reflection_pad3d_backward,
         aten.replication_pad1d_backward, aten.replication_pad2d_backward,
         aten.replication_pad3d_backward, aten.grid_sampler_2d, aten.grid_sampler_3d,
         aten.grid_sampler_2d_backward, aten.grid_sampler_3d_backward, aten.index_copy,
         aten.index_copy_, aten.index_fill, aten.index_fill_, aten.index_add_,
         aten.scatter_reduce, aten.masked_scatter_,
         aten.masked_scatter_backward, aten._unsafe_index_put,
         aten._unsafe_masked_index, aten._unsafe_masked_index_put_accumulate,
         aten.diag_embed, aten.diagonal_backward, aten.diagonal_scatter,
         aten.as_strided_scatter, aten.unfold_backward, aten.pixel_shuffle,
         aten.pixel_unshuffle, aten.channel_shuffle, aten.native_channel_shuffle, aten.rot90,
         aten.repeat_interleave, aten.tril_, aten.triu_)(_copy)


@register(aten.gather, aten.index_select, aten.index, aten._unsafe_index, aten.take)
def _gather(src: TensorMeta, *rest, out=None, **kwargs) -> list[Row]:
    """A gather reads, for each output element, one element of the source
    wherever it lies, and the indices: never the rest of the source. Counted
    whole, the gather of each token's target log-probability from a
    [tokens, vocab] tensor was a pass over all of it (1.2 ms on an A100 for
    a 10,240 x 33,712 one, where the kernel touches 10,240 elements)."""
    (family, (_, written, flops, inner, outer), kernels), = \
        generic_memory(L.COPY, (src,) + rest, kwargs, out)
    read = written + sum(t.numel for t in tensors(rest) + tensors(kwargs))
    return [(family, (read, written, flops, inner, outer), kernels)]


def _scatter_rows(dst: TensorMeta, index: TensorMeta, src: Any, out: Any,
                  accumulate: bool) -> list[Row]:
    """An in-place scatter touches only the elements its index names: it
    reads the index and the source (adding or reducing, those elements of
    the destination too) and writes them, one thread an index element; the
    rest of the destination is neither read nor written. Counted whole, the
    gradient of a gather of each token's target log-probability (zeros,
    then this; ``predictor.lowering`` prices ATen's out-of-place form of it
    so) was a pass over the whole [tokens, vocabulary] tensor."""
    unit = row_unit((dst, index, src), out)
    n = max(index.numel, 1)
    touched = elems_in(TensorMeta((n,), dst.dtype), unit)
    read = elems_in(index, unit) + sum(elems_in(t, unit) for t in tensors(src))
    if accumulate:
        read += touched
    inner = max(index.shape[-1] if index.shape else 1, 1)
    return [memory_row(L.COPY, read, touched, 0, inner, max(n // inner, 1))]


@register(aten.scatter_add_, aten.scatter_reduce_)
def _scatter_add_into(dst: TensorMeta, dim, index: TensorMeta, src, *_, out=None,
                      **__) -> list[Row]:
    return _scatter_rows(dst, index, src, out, accumulate=True)


@register(aten.scatter_)
def _scatter_into(dst: TensorMeta, dim, index: TensorMeta, src, *rest, out=None,
                  **kwargs) -> list[Row]:
    return _scatter_rows(dst, index, src, out,
                         accumulate=bool(rest) or kwargs.get("reduce") is not None)


# Scans read and write every element once: memory-bound like a copy.
register(aten.cumsum, aten.cumprod, aten.logcumsumexp, aten.cumsum_, aten.cumprod_,
         aten.cummax, aten.cummin)(_copy)


def copy_kernel(src: TensorMeta, dst: TensorMeta) -> int:
    """Which of PyTorch's CUDA copy kernels turns `src` into `dst`
    (ATen's copy_device_to_device; layout.MEM_GENERIC):

    - layouts that differ (a permuted view made contiguous, NCHW to
      channels-last): the generic strided kernel, COPY_STRIDED, with or
      without a dtype change;
    - the same layout and dtype: cudaMemcpy or the vectorised copy, 0;
    - fp32 to fp16 or bf16: their own vectorised kernels, 0;
    - any other dtype change (bf16 or fp16 to fp32 under autocast, integer
      or bool to float): the unrolled kernel with per-element casts,
      COPY_CAST.

    Float8 casts and layout copies are none of these: the float8 recipe runs
    under torch.compile, whose generated kernels fuse and vectorise them
    (predictor.frontend.float8), 0."""
    if src.dtype.itemsize == 1 and src.dtype.is_floating_point \
            or dst.dtype.itemsize == 1 and dst.dtype.is_floating_point:
        return 0
    if src.layout != dst.layout and src.numel > 1:
        return L.COPY_STRIDED
    if src.dtype == dst.dtype:
        return 0
    if src.dtype == torch.float32 and dst.dtype in (torch.float16, torch.bfloat16):
        return 0
    return L.COPY_CAST


def _with_kernel(rows: list[Row], kind: int) -> list[Row]:
    """`rows` (one memory-bound row) with dims[MEM_GENERIC] = `kind`, the
    non-vectorised kernel PyTorch runs it with (unchanged for 0)."""
    if not kind:
        return rows
    family, dims, kernels = rows[0]
    return [(family, tuple(dims[:L.MEM_LAYOUT]) + (0, kind), kernels)]


def _copy_row(src: TensorMeta, dst: TensorMeta, rows: list[Row]) -> list[Row]:
    """`rows` (one COPY row) with dims[MEM_GENERIC] set from `copy_kernel`."""
    return _with_kernel(rows, copy_kernel(src, dst))


@register(aten._to_copy)
def _to_copy(x: TensorMeta, *args, out=None, **kwargs) -> list[Row]:
    rows = generic_memory(L.COPY, (x,), {}, out)
    dst = tensors(out)
    return _copy_row(x, dst[0], rows) if dst and isinstance(x, TensorMeta) else rows


@register(aten.copy_, aten.copy)
def _copy_(dst: TensorMeta, src: Any, *_, out=None, **__) -> list[Row]:
    # copy_(self, src) and its functional twin copy(self, src): read src and
    # write a tensor of self's dtype and layout (self itself, or the result).
    target = tensors(out)[:1] or tensors(dst)[:1]
    rows = generic_memory(L.COPY, (src,), {}, target)
    if isinstance(src, TensorMeta) and target:
        return _copy_row(src, target[0], rows)
    return rows


@register(aten.clone, aten.contiguous)
def _clone(x: TensorMeta, *_, out=None, **__) -> list[Row]:
    inner = x.shape[-1] if x.shape else 1
    rows = [memory_row(L.COPY, x.numel, x.numel, 0, inner, x.numel // max(inner, 1))]
    dst = tensors(out)
    return _copy_row(x, dst[0], rows) if dst else rows


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
                   "softplus", "mish", "sin", "cos", "rsqrt", "sqrt", "elu", "elu_backward",
                   "softplus_backward", "mish_backward", "glu", "glu_backward",
                   "log_sigmoid_forward", "log_sigmoid_backward", "rrelu_with_noise"}


def elementwise(op: Any, args: tuple, kwargs: dict, out: Any) -> list[Row]:
    name = op.__name__.split(".")[0].rstrip("_")
    fpe = 8 if name in _TRANSCENDENTAL else 1
    rows = generic_memory(L.ELEMENTWISE, args, kwargs, out, flops_per_elem=fpe)
    casting = casting_inputs(tensors(args) + tensors(kwargs)) >= 2
    return _with_kernel(rows, L.CAST_BINARY if casting else 0)


def casting_inputs(ins: list[TensorMeta]) -> int:
    """How many inputs of an elementwise op PyTorch loads through a cast: all
    of its floating tensors (one-element ones are passed as scalars) when they
    are of more than one dtype (an fp32 + bf16 add under autocast: the
    unrolled kernel with `LoadWithCast`, layout.CAST_BINARY), else none.
    Float8 tensors are torch.compile's (predictor.frontend.float8)."""
    floats = [t for t in ins if t.dtype.is_floating_point and t.numel > 1]
    if len({t.dtype for t in floats}) < 2 or any(t.dtype.itemsize == 1 for t in floats):
        return 0
    return len(floats)


def _pointwise(op: Any) -> Extractor:
    """`elementwise` as the extractor of an op that runs one elementwise
    kernel but that ATen does not tag pointwise (activation gradients, masked
    writes)."""

    def extract(*args, out=None, **kwargs) -> list[Row]:
        return elementwise(op, args, kwargs, out)

    return extract


for _op in (aten.leaky_relu_backward, aten.hardtanh_backward, aten.elu_backward,
            aten.softplus_backward, aten.hardswish, aten.hardswish_, aten.hardswish_backward,
            aten.hardsigmoid_backward, aten.rrelu_with_noise, aten.rrelu_with_noise_,
            aten.rrelu_with_noise_backward, aten.mish_, aten.mish_backward, aten.gelu_,
            aten.threshold_, aten.log_sigmoid_forward, aten.log_sigmoid_backward,
            aten._prelu_kernel, aten._prelu_kernel_backward, aten.glu, aten.glu_backward,
            aten._add_relu, aten.masked_fill, aten.masked_fill_, aten.where, aten.addr):
    register(_op)(_pointwise(_op))


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
