"""Training synthesis: the backward pass, loss and optimizer step of a graph
that holds the forward pass alone (an ONNX file).

The fx frontend traces a whole training step, so autograd and the optimizer
write the backward and optimizer ops for it. A forward-only graph gets them
here instead, one forward op at a time, the way autograd would run them
(torch's derivatives.yaml): each rule turns a forward aten call into the
backward aten calls autograd would make, and their rows then come from the
op-family registry (:mod:`predictor.families`). So both frontends price a
kernel with the same extractor, and a change to an extractor reaches both.

A rule sees the forward call and which of its tensor arguments need a
gradient (`needs`, aligned with `call.args`); the gradient of the call's
first output has that output's shape. Gradient accumulation at tensors read
by several ops, and the order of the walk, belong to the frontend (they need
the graph); the loss and the optimizer step are synthesised here too.

This lives in the frontend layer, not beside the registry, because the
optimizer step replays :mod:`predictor.frontend.optimizers`: the registry sits
below the frontends and imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from predictor.errors import InvalidArgumentError
from predictor.families import (
    Row, TensorMeta, elementwise, extract, generic_memory, reduction, tags, tensors, unsupported,
)
from predictor.frontend import optimizers
from predictor.kernels import layout as L
from predictor.registry import Registry

aten = torch.ops.aten


@dataclass(frozen=True)
class Call:
    """One aten op call as the registry sees it: tensors are :class:`TensorMeta`.

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
BACKWARD_RULES: Registry = Registry("backward rule")  # aten op -> BackwardRule


def backward_rule(*ops: Any) -> Callable[[BackwardRule], BackwardRule]:
    """Register the backward rule of aten op packets or overloads. An op that
    already has one is refused at import, so no rule is silently lost."""
    return BACKWARD_RULES.register(*ops)


def _first(x: Any) -> TensorMeta:
    return tensors(x)[0]


def _t(shape, like: TensorMeta) -> TensorMeta:
    return TensorMeta(tuple(int(d) for d in shape), like.dtype)


def _sum_to(grad: TensorMeta, target: TensorMeta) -> list[Call]:
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


# ---- what autograd keeps for the backward ------------------------------------------
# The forward tensors an op's backward reads (derivatives.yaml's saved values)
# stay alive until that backward runs: most of a training step's peak memory.
# A spec is (argument positions, output positions), or a function of (call,
# needs) returning one; the memory pass of a synthesised step reads it.

SavedSpec = Any
SAVED: Registry = Registry("saved-for-backward rule")  # aten op -> SavedSpec
NOTHING: tuple = ((), ())


def _saves(spec: SavedSpec, *ops: Any) -> None:
    for op in ops:
        SAVED[op] = spec


def saved_for_backward(call: Call, needs: tuple) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(argument positions, output positions) of the tensors the backward of
    `call` reads; nothing when no input needs a gradient. An op without an
    entry keeps what its default backward rule reads: a pointwise or an
    unknown op its tensor inputs (and an unknown op its outputs), a reduction
    its input, a copy nothing."""
    if not any(needs):
        return NOTHING
    spec = SAVED.get(call.op)
    if spec is None:
        spec = SAVED.get(getattr(call.op, "overloadpacket", None))
    if spec is None:
        args = tuple(i for i, a in enumerate(call.args) if isinstance(a, TensorMeta))
        packet_tags = tags(call.op) if call.kind is None else ()
        if call.kind == "copy":
            return NOTHING
        if call.kind == "reduction" or (call.kind is None and torch.Tag.reduction in packet_tags
                                        and torch.Tag.pointwise not in packet_tags):
            return args[:1], ()
        if call.kind == "elementwise" or torch.Tag.pointwise in packet_tags:
            return args, ()
        return args, tuple(range(len(tensors(call.out))))
    return spec(call, needs) if callable(spec) else spec


def _inputs_needing(call: Call, needs: tuple) -> list[TensorMeta]:
    return [a for a, n in zip(call.args, needs) if n and isinstance(a, TensorMeta)]


def _pointwise_bwd(call: Call, needs: tuple) -> list[Call]:
    # Default: one kernel per input needing a gradient, reading the output
    # gradient and the saved inputs (the *_backward kernels of activations).
    y = _first(call.out)
    saved = [a for a in call.args if isinstance(a, TensorMeta)]
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
    saved = [a for a in call.args if isinstance(a, TensorMeta)]
    grads = _inputs_needing(call, needs)
    if not grads:
        return []
    return [Call(call.op, tuple(y) + tuple(saved), out=tuple(grads), kind="unsupported",
                 name=f"{call.op_name}_backward")]


# ---- GEMMs: two matmuls (and a bias reduction) --------------------------------

def _transpose(t: TensorMeta) -> TensorMeta:
    """t.mT: a view, so its storage order flips (what GEMM kernels see)."""
    return TensorMeta(t.shape[:-2] + (t.shape[-1], t.shape[-2]), t.dtype, not t.transposed)


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
    bias_sizes = list(bias.shape) if isinstance(bias, TensorMeta) else None
    outs = (x, w, bias if isinstance(bias, TensorMeta) else None)
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
    mean = outs[1] if len(outs) > 1 else TensorMeta((1,), x.dtype)
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
    if packet in (aten.max_pool2d_with_indices, aten.max_pool3d_with_indices):
        # ATen's argument order: the window (kernel, stride, padding,
        # dilation, ceil_mode; defaults where the forward left them out),
        # then the saved indices, which the backward reads.
        window = tuple(call.args[1:6]) + ([], 0, 1, False)[max(len(call.args) - 2, 0):]
        return [Call(_POOL_BWD[packet], (outs[0], x, *window, *outs[1:2]),
                     out=_t(x.shape, x))]
    return [Call(_POOL_BWD[packet], (outs[0], x), out=_t(x.shape, x))]


@backward_rule(aten.native_dropout)
def _dropout_bwd_rule(call: Call, needs: tuple) -> list[Call]:
    outs = tensors(call.out)
    mask = outs[1] if len(outs) > 1 else TensorMeta(outs[0].shape, torch.bool)
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


def _unary(op: Any, *ops: Any, saved: str = "out") -> None:
    """Register an elementwise op's backward (:func:`_unary_bwd`) and what it saves."""
    backward_rule(op)(_unary_bwd(*ops, saved=saved))
    _saves({"out": ((), (0,)), "in": ((0,), ()), "none": NOTHING}[saved], op)


_unary(aten.relu, aten.threshold_backward.default)
_unary(aten.gelu, aten.gelu_backward.default, saved="in")
_unary(aten.silu, aten.silu_backward.default, saved="in")
_unary(aten.tanh, aten.tanh_backward.default)
_unary(aten.sigmoid, aten.sigmoid_backward.default)
_unary(aten.hardswish, aten.hardswish_backward.default, saved="in")
_unary(aten.hardsigmoid, aten.hardsigmoid_backward.default, saved="in")
_unary(aten.leaky_relu, aten.leaky_relu_backward.default, saved="in")
_unary(aten.elu, aten.elu_backward.default, saved="out")
_unary(aten.softplus, aten.softplus_backward.default, saved="in")
_unary(aten.mish, aten.mish_backward.default, saved="in")
_unary(aten.exp, aten.mul.Tensor)
_unary(aten.log, aten.div.Tensor, saved="in")
_unary(aten.neg, aten.neg.default, saved="none")
_unary(aten.sqrt, aten.mul.Tensor, aten.div.Tensor)
_unary(aten.rsqrt, aten.pow.Tensor_Scalar, aten.mul.Tensor, aten.mul.Tensor)
_unary(aten.reciprocal, aten.mul.Tensor, aten.mul.Tensor, aten.neg.default)
_unary(aten.pow, aten.pow.Tensor_Scalar, aten.mul.Tensor, aten.mul.Tensor, saved="in")
_unary(aten.erf, aten.pow.Tensor_Scalar, aten.neg.default, aten.exp.default,
       aten.mul.Tensor, aten.mul.Tensor, saved="in")
_unary(aten.sin, aten.cos.default, aten.mul.Tensor, saved="in")
_unary(aten.cos, aten.sin.default, aten.neg.default, aten.mul.Tensor, saved="in")
_unary(aten.abs, aten.sgn.default, aten.mul.Tensor, saved="in")
_unary(aten.clamp, aten.ge.Scalar, aten.le.Scalar, aten.logical_and.default,
       aten.where.self, saved="in")


@backward_rule(aten.add, aten.sub)
def _add_bwd(call: Call, needs: tuple) -> list[Call]:
    # The gradient passes through; a broadcast operand reduces it, and sub negates.
    y = _first(call.out)
    out = []
    is_sub = getattr(call.op, "overloadpacket", call.op) is aten.sub
    for i, (a, n) in enumerate(zip(call.args, needs)):
        if not (n and isinstance(a, TensorMeta)):
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
        if not (n and isinstance(a, TensorMeta)):
            continue
        other = call.args[1 - i]
        args = (y, other) if isinstance(other, TensorMeta) else (y,)
        out.append(Call(aten.mul.Tensor, args, out=_t(y.shape, a)))
        out.extend(_sum_to(y, a))
    return out


@backward_rule(aten.div)
def _div_bwd(call: Call, needs: tuple) -> list[Call]:
    y = _first(call.out)
    a, b = call.args[0], call.args[1] if len(call.args) > 1 else None
    out = []
    if needs[0] and isinstance(a, TensorMeta):
        args = (y, b) if isinstance(b, TensorMeta) else (y,)
        out.append(Call(aten.div.Tensor, args, out=_t(y.shape, a)))
        out.extend(_sum_to(y, a))
    if len(needs) > 1 and needs[1] and isinstance(b, TensorMeta):
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
        if n and isinstance(a, TensorMeta):
            out.append(Call(aten.where.self, (cond, y), out=_t(y.shape, a)))
            out.extend(_sum_to(y, a))
    return out


@backward_rule(aten.maximum, aten.minimum)
def _minmax_bwd(call: Call, needs: tuple) -> list[Call]:
    y = _first(call.out)
    out = []
    for a, n in zip(call.args[:2], needs):
        if n and isinstance(a, TensorMeta):
            out += [Call(aten.eq.Tensor, (y, y), out=TensorMeta(y.shape, torch.bool)),
                    Call(aten.where.self, (y, y), out=_t(y.shape, a))]
            out.extend(_sum_to(y, a))
    return out


# ---- copies and data movement ------------------------------------------------------------

@backward_rule(aten.clone, aten._to_copy, aten.constant_pad_nd, aten.reflection_pad2d)
def _copy_like_bwd(call: Call, needs: tuple) -> list[Call]:
    # A permuting copy, a cast or a pad: the gradient is copied back. A copy
    # between layouts or dtypes goes back between the same two, so it runs
    # the kernel the forward's inverse would (families.copy_kernel).
    x = call.args[0]
    y = _first(call.out)
    name = f"{call.op_name}_backward"
    packet = getattr(call.op, "overloadpacket", call.op)
    if isinstance(x, TensorMeta) and packet in (aten.clone, aten._to_copy):
        return [Call(aten._to_copy.default, (y,), out=x, name=name)]
    return [Call(aten.clone.default, (y,), out=_t(x.shape, x), kind="copy", name=name)]


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


# ---- what the rules above read from the forward (see saved_for_backward) -----------

def _gemm_saves(call: Call, needs: tuple) -> tuple:
    # Each operand's gradient reads the other operand.
    off = 1 if getattr(call.op, "overloadpacket", call.op) is aten.addmm else 0
    args = ((off + 1,) if needs[off] else ()) + ((off,) if needs[off + 1] else ())
    return tuple(sorted(args)), ()


def _conv_saves(call: Call, needs: tuple) -> tuple:
    return ((1,) if needs[0] else ()) + ((0,) if needs[1] else ()), ()


def _mul_saves(call: Call, needs: tuple) -> tuple:
    args = [1 - i for i, n in enumerate(needs[:2])
            if n and isinstance(call.args[1 - i], TensorMeta)]
    return tuple(sorted(args)), ()


def _div_saves(call: Call, needs: tuple) -> tuple:
    args = {1} if needs[0] else set()
    if len(needs) > 1 and needs[1]:
        args |= {0, 1}
    return tuple(sorted(i for i in args if isinstance(call.args[i], TensorMeta))), ()


def _index_saves(call: Call, needs: tuple) -> tuple:
    return tuple(i for i, a in enumerate(call.args) if isinstance(a, TensorMeta)
                 and not a.dtype.is_floating_point), ()


_saves(_gemm_saves, aten.mm, aten.addmm, aten.bmm)
_saves(_conv_saves, aten.convolution)
_saves(((), (0,)), aten._softmax, aten._log_softmax)
_saves(((0, 2, 3), (1, 2)), aten.native_layer_norm)
_saves(((0, 1), (1, 2)), aten.native_batch_norm, aten._native_batch_norm_legit_functional,
       aten._native_batch_norm_legit, aten.native_group_norm)
_saves(((0, 1, 2), (0, 1)), aten._scaled_dot_product_flash_attention,
       aten._scaled_dot_product_efficient_attention,
       aten._scaled_dot_product_flash_attention_for_cpu)
_saves(((1,), ()), aten.embedding)
_saves(((0,), (1,)), aten.max_pool2d_with_indices, aten.max_pool3d_with_indices)
_saves(((0,), ()), aten.avg_pool2d, aten.avg_pool3d, aten._adaptive_avg_pool2d,
       aten._adaptive_avg_pool3d)
_saves(((), (1,)), aten.native_dropout)
_saves(NOTHING, aten.mean, aten.sum, aten.add, aten.sub, aten.clone, aten._to_copy,
       aten.constant_pad_nd, aten.reflection_pad2d, aten.cat, aten.slice, aten.select,
       aten.split_with_sizes, aten.split, aten.expand, aten.repeat)
_saves(_mul_saves, aten.mul)
_saves(_div_saves, aten.div)
_saves(((0,), ()), aten.where)
_saves(((0, 1), ()), aten.maximum, aten.minimum)
_saves(_index_saves, aten.gather, aten.index_select, aten.index)


# ---- the loss -----------------------------------------------------------------------

LOSSES = ("mean", "cross_entropy")


def loss_calls(outputs: list[TensorMeta], loss: str,
               autocast: bool = False) -> tuple[list[Call], list[Call]]:
    """(forward calls, backward calls) of a scalar loss over a model's outputs,
    as the fx frontend traces them: "mean" is the mean of the first output
    (its default loss); "cross_entropy" sums class-index cross entropies, one
    per floating output, over its last dim (flattened, like token_loss).
    `autocast`: under CUDA's autocast policy, where log_softmax writes fp32
    whatever its input (``dtype=torch.float32``) and nll_loss runs in fp32;
    the mean runs in its input's dtype, as autocast leaves it."""
    if loss not in LOSSES:
        raise InvalidArgumentError(f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)}")
    floats = [t for t in outputs if t.dtype.is_floating_point] or list(outputs)
    if not floats:
        return [], []
    scalar = TensorMeta((), floats[0].dtype)
    fwd: list[Call] = []
    bwd: list[Call] = [Call(aten.ones_like.default, (scalar,), out=scalar)]
    if loss == "mean":
        y = floats[0]
        fwd.append(Call(aten.mean.default, (y,), out=scalar))
        bwd.append(Call(aten.div.Scalar, (y, 1), out=y))
        return fwd, bwd
    if autocast:
        scalar = TensorMeta((), torch.float32)
        bwd = [Call(aten.ones_like.default, (scalar,), out=scalar)]
    for y in floats:
        classes = y.shape[-1] if y.shape else 1
        rows = max(y.numel // max(classes, 1), 1)
        flat_in = TensorMeta((rows, classes), y.dtype)
        flat = TensorMeta((rows, classes), torch.float32) if autocast else flat_in
        target = TensorMeta((rows,), torch.int64)
        fwd += [Call(aten.zeros.default, ([rows],), out=target),
                Call(aten._log_softmax.default, (flat_in, 1, autocast and y.dtype != flat.dtype),
                     out=flat),
                Call(aten.nll_loss_forward.default, (flat, target, None, 1, -100),
                     out=(scalar, scalar))]
        bwd += [Call(aten.nll_loss_backward.default, (scalar, flat, target, None, 1, -100, scalar),
                     out=flat),
                Call(aten._log_softmax_backward_data.default, (flat, flat, 1, y.dtype),
                     out=flat_in)]
    fwd += [Call(aten.add.Tensor, (scalar, scalar), out=scalar)] * (len(floats) - 1)
    return fwd, bwd


# ---- the optimizer step --------------------------------------------------------------

def optimizer_calls(params: list[TensorMeta], optimizer: str | None) -> list[Call]:
    """The optimizer step over `params` as the aten calls the fx frontend
    traces: ``predictor.frontend.optimizers.step`` run on meta tensors (no
    memory) and recorded, so both frontends issue the same foreach kernels."""
    name = optimizers.check(optimizer)
    if name is None or not params:
        return []
    recorded: list[Call] = []

    def as_t(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return TensorMeta(tuple(int(d) for d in x.shape), x.dtype)
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


def grad_scaler_calls(params: list[TensorMeta]) -> tuple[list[Call], list[Call]]:
    """fp16 autocast's ``GradScaler`` after backward, as the fx frontend traces
    it (``predictor.frontend.autocast``): (the unscale of every gradient, before
    the optimizer step; the scale update, after it). The loss scale itself is
    one multiply the caller adds to the loss."""
    from predictor.frontend import autocast as amp

    recorded: list[Call] = []

    def as_t(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return TensorMeta(tuple(int(d) for d in x.shape), x.dtype)
        if isinstance(x, (list, tuple)):
            return [as_t(i) for i in x] if isinstance(x, list) else tuple(as_t(i) for i in x)
        return x

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            recorded.append(Call(func, as_t(tuple(args)), tuple(sorted(
                (k, as_t(v)) for k, v in kwargs.items())), as_t(out)))
            return out

    grads = [torch.empty(p.shape, dtype=p.dtype, device="meta") for p in params]
    scale, growth = (t.to("meta") for t in amp.scaler_state())
    with Recorder():
        found_inf = amp.unscale(grads, scale)
    unscale = list(recorded)
    recorded.clear()
    with Recorder():
        amp.update_scale(scale, growth, found_inf)
    return unscale, list(recorded)


def optimizer_rows(params: list[TensorMeta], optimizer: str | None) -> list[Row]:
    """Rows of one optimizer step over parameters of these shapes."""
    rows: list[Row] = []
    for call in optimizer_calls(params, optimizer):
        rows.extend(call_rows(call)[0])
    return rows
