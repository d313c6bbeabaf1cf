"""ONNX ops as the aten calls PyTorch runs for them (the ONNX frontend's op table).

Each mapper turns one ONNX node into :class:`_Fwd` entries: an aten
:class:`~predictor.frontend.training_synthesis.Call` (tensors as shapes) whose
rows come from the shared op-family registry, plus where its tensors come
from in the ONNX graph so that the frontend can route gradients. PyTorch's own
choices are mirrored:
``MatMul`` with a weight (and the ``Add`` of its bias) is ``nn.Linear``'s
``addmm`` over the folded leading dims; a batched ``MatMul`` is a ``bmm``;
``GlobalAveragePool`` is the ``mean`` that ``adaptive_avg_pool2d(x, 1)`` runs;
views (Reshape, Flatten, Squeeze, Expand, Slice, a Transpose of the last two
axes) launch nothing, while a Transpose that moves other axes is the copy
``contiguous`` makes. GELU written out with Erf (opsets before 20) is fused
back into the one kernel PyTorch runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
try:
    import onnx
except ImportError:  # an optional dependency
    from predictor.errors import MissingExtraError
    raise MissingExtraError("onnx", "onnx", "ONNX files") from None
import torch

from predictor.families import TensorMeta
from predictor.frontend.onnx_load import OnnxValue, _attr
from predictor.frontend.training_synthesis import Call
from predictor.registry import Registry

aten = torch.ops.aten

PARAM, META, ACT = "param", "meta", "act"

@dataclass
class _Fwd:
    """One forward aten call and where its tensors come from in the ONNX graph."""

    call: Call
    sources: tuple          # ONNX value feeding each arg (None: not a graph tensor)
    outputs: tuple          # ONNX values the call produces (gradients flow back from them)
    free: bool = False      # a view: no forward kernel, but a backward rule may cost
    host: tuple | None = None  # ("linear", input folded?, bias?): see _host


@dataclass
class _Ctx:
    values: dict[str, OnnxValue]
    kinds: dict[str, str]
    train: bool
    opset: int
    p: Path
    consumers: dict[str, list[onnx.NodeProto]]
    skip: set = field(default_factory=set)   # nodes folded into an earlier call
    views: set = field(default_factory=set)  # nodes that are views here (no kernel)

    def t(self, name: str, shape: tuple | None = None) -> TensorMeta:
        v = self.values[name]
        return TensorMeta(tuple(v.shape if shape is None else shape), v.dtype)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.values[name].shape

    def data(self, name: str) -> np.ndarray | None:
        v = self.values.get(name) if name else None
        return None if v is None else v.data

    def is_param(self, name: str) -> bool:
        return self.kinds.get(name) == PARAM


Mapper = Callable[[_Ctx, onnx.NodeProto], list[_Fwd]]
ONNX_OPS: Registry = Registry("ONNX op mapper")  # op_type -> Mapper


def onnx_op(*names: str) -> Callable[[Mapper], Mapper]:
    """Register the mapper of ONNX op types. An op type that already has one
    is refused at import, so no mapper is silently lost."""
    return ONNX_OPS.register(*names)


def _simple(op: Any, ctx: _Ctx, node, *, kind: str | None = None, name: str | None = None,
            extra: tuple = (), kwargs: tuple = ()) -> list[_Fwd]:
    """One call over all tensor inputs -> all tensor outputs."""
    srcs = [i for i in node.input if i]
    args = tuple(ctx.t(i) for i in srcs) + extra
    outs = [o for o in node.output if o and ctx.values.get(o) is not None]
    out = tuple(ctx.t(o) for o in outs)
    call = Call(op, args, kwargs, out[0] if len(out) == 1 else out, kind=kind, name=name)
    return [_Fwd(call, tuple(srcs) + (None,) * len(extra), tuple(outs))]


# Ops that cost nothing: views, metadata, identities. The gradient of their
# first input is the gradient of their output (a view), nothing is launched.
_VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Expand"}
_NON_DIFF = {"Shape", "Size", "ConstantOfShape", "Range", "NonZero", "ArgMax", "ArgMin",
             "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or",
             "Xor", "IsNaN", "IsInf", "Sign", "Floor", "Ceil", "Round", "TopK_indices",
             "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
             "Bernoulli", "Multinomial", "EyeLike", "OneHot"}
# Which inputs of an op carry a gradient (default: every floating input).
_DIFF_INPUTS = {
    "Gather": (0,), "GatherElements": (0,), "GatherND": (0,), "Reshape": (0,), "Expand": (0,),
    "Slice": (0,), "Pad": (0,), "Dropout": (0,), "Tile": (0,), "Resize": (0,), "Upsample": (0,),
    "Split": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "BatchNormalization": (0, 1, 2),
    "Where": (1, 2), "ScatterND": (0, 2), "ScatterElements": (0, 2), "TopK": (0,),
    "LSTM": (0, 1, 2, 3, 5, 6), "GRU": (0, 1, 2, 3, 5), "RNN": (0, 1, 2, 3, 5),
    "CumSum": (0,), "Clip": (0,), "Trilu": (0,),
    "ReduceMean": (0,), "ReduceSum": (0,), "ReduceMax": (0,), "ReduceMin": (0,),
    "ReduceProd": (0,), "ReduceL2": (0,), "ReduceL1": (0,), "ReduceSumSquare": (0,),
    "ReduceLogSumExp": (0,), "Attention": (0, 1, 2), "LayerNormalization": (0, 1, 2),
}

_UNARY = {
    "Relu": aten.relu.default, "Gelu": aten.gelu.default, "Tanh": aten.tanh.default,
    "Sigmoid": aten.sigmoid.default, "Erf": aten.erf.default, "Exp": aten.exp.default,
    "Log": aten.log.default, "Sqrt": aten.sqrt.default, "Reciprocal": aten.reciprocal.default,
    "Neg": aten.neg.default, "Abs": aten.abs.default, "Sin": aten.sin.default,
    "Cos": aten.cos.default, "Softplus": aten.softplus.default,
    "LeakyRelu": aten.leaky_relu.default, "Elu": aten.elu.default, "Selu": aten.elu.default,
    "Celu": aten.elu.default, "HardSigmoid": aten.hardsigmoid.default,
    "HardSwish": aten.hardswish.default, "Mish": aten.mish.default,
    "Floor": aten.floor.default, "Ceil": aten.ceil.default, "Round": aten.round.default,
    "Sign": aten.sign.default, "Not": aten.logical_not.default, "IsNaN": aten.isnan.default,
    "IsInf": aten.isinf.default, "Tan": aten.tan.default, "Asin": aten.asin.default,
    "Acos": aten.acos.default, "Atan": aten.atan.default, "Sinh": aten.sinh.default,
    "Cosh": aten.cosh.default, "Asinh": aten.asinh.default, "Acosh": aten.acosh.default,
    "Atanh": aten.atanh.default, "Softsign": aten.abs.default, "ThresholdedRelu": aten.relu.default,
    "Shrink": aten.relu.default, "BitwiseNot": aten.bitwise_not.default,
    "Swish": aten.silu.default,
}
_BINARY = {
    "Add": aten.add.Tensor, "Sub": aten.sub.Tensor, "Mul": aten.mul.Tensor,
    "Div": aten.div.Tensor, "Pow": aten.pow.Tensor_Tensor, "Equal": aten.eq.Tensor,
    "Less": aten.lt.Tensor, "LessOrEqual": aten.le.Tensor, "Greater": aten.gt.Tensor,
    "GreaterOrEqual": aten.ge.Tensor, "And": aten.logical_and.default,
    "Or": aten.logical_or.default, "Xor": aten.logical_xor.default,
    "Mod": aten.remainder.Tensor, "BitShift": aten.bitwise_left_shift.Tensor,
    "BitwiseAnd": aten.bitwise_and.Tensor, "BitwiseOr": aten.bitwise_or.Tensor,
    "BitwiseXor": aten.bitwise_xor.Tensor, "PRelu": aten.mul.Tensor,
}
_VARIADIC = {"Max": aten.maximum.default, "Min": aten.minimum.default, "Sum": aten.add.Tensor,
             "Mean": aten.add.Tensor}


@onnx_op(*_UNARY)
def _unary(ctx: _Ctx, node) -> list[_Fwd]:
    op = _UNARY[node.op_type]
    kw = ()
    if node.op_type == "Gelu" and _attr(node, "approximate", "none") == "tanh":
        kw = (("approximate", "tanh"),)
    return _simple(op, ctx, node, kind="elementwise", kwargs=kw)


@onnx_op(*_BINARY)
def _binary(ctx: _Ctx, node) -> list[_Fwd]:
    return _simple(_BINARY[node.op_type], ctx, node, kind="elementwise")


@onnx_op(*_VARIADIC)
def _variadic(ctx: _Ctx, node) -> list[_Fwd]:
    srcs = [i for i in node.input if i]
    y = node.output[0]
    op = _VARIADIC[node.op_type]
    if len(srcs) == 1:
        return []
    out = []
    for i, s in enumerate(srcs[1:]):
        left = srcs[0] if i == 0 else None
        call = Call(op, (ctx.t(srcs[0]) if i == 0 else ctx.t(y), ctx.t(s)), out=ctx.t(y),
                    kind="elementwise")
        out.append(_Fwd(call, (left, s), (y,)))
    if node.op_type == "Mean":
        out.append(_Fwd(Call(aten.div.Scalar, (ctx.t(y), len(srcs)), out=ctx.t(y),
                             kind="elementwise"), (None, None), (y,)))
    return out


@onnx_op("Clip")
def _clip(ctx: _Ctx, node) -> list[_Fwd]:
    x = node.input[0]
    call = Call(aten.clamp.default, (ctx.t(x),), out=ctx.t(node.output[0]), kind="elementwise")
    return [_Fwd(call, (x,), (node.output[0],))]


@onnx_op("Where")
def _where(ctx: _Ctx, node) -> list[_Fwd]:
    return _simple(aten.where.self, ctx, node, kind="elementwise")


@onnx_op("Cast", "CastLike")
def _cast(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    if ctx.values[x].elem == ctx.values[y].elem:
        return []
    return [_Fwd(Call(aten._to_copy.default, (ctx.t(x),), out=ctx.t(y)), (x,), (y,))]


@onnx_op("Transpose")
def _transpose(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    shape = ctx.shape(x)
    perm = list(_attr(node, "perm", list(range(len(shape)))[::-1]))
    # Axes of size 1 can move freely; a swap of the last two axes is absorbed
    # by the GEMM that reads it (cuBLAS transposes): both stay views.
    moved = [a for a in perm if shape[a] != 1]
    kept = sorted(moved)
    if moved == kept or (len(moved) >= 2 and moved[:-2] == kept[:-2]
                         and moved[-2:] == kept[-2:][::-1]):
        return []
    # The input in the order the permutation reads it: a copy between two
    # layouts, as `x.permute(...).contiguous()` runs it (families.copy_kernel).
    src = replace(ctx.t(x), contiguous=False)
    return [_Fwd(Call(aten.clone.default, (src,), out=ctx.t(y)), (x,), (y,))]


@onnx_op("Slice")
def _slice(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    call = Call(aten.slice.Tensor, (ctx.t(x),), out=ctx.t(y))
    return [_Fwd(call, (x,), (y,), free=True)]  # a view; its backward writes into zeros


@onnx_op("Split")
def _split(ctx: _Ctx, node) -> list[_Fwd]:
    x = node.input[0]
    outs = [o for o in node.output if o]
    call = Call(aten.split.Tensor, (ctx.t(x),), out=tuple(ctx.t(o) for o in outs))
    return [_Fwd(call, (x,), tuple(outs), free=True)]


@onnx_op("Concat")
def _concat(ctx: _Ctx, node) -> list[_Fwd]:
    srcs = [i for i in node.input if i and ctx.values[i].numel > 0]
    y = node.output[0]
    if len(srcs) <= 1:
        return []
    call = Call(aten.cat.default, ([ctx.t(i) for i in srcs], _attr(node, "axis", 0)),
                out=ctx.t(y))
    return [_Fwd(call, (tuple(srcs), None), (y,))]


@onnx_op("Pad")
def _pad(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    mode = _attr(node, "mode", "constant")
    op = aten.constant_pad_nd.default if mode == "constant" else aten.reflection_pad2d.default
    return [_Fwd(Call(op, (ctx.t(x),), out=ctx.t(y)), (x,), (y,))]


@onnx_op("Tile")
def _tile(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    return [_Fwd(Call(aten.repeat.default, (ctx.t(x),), out=ctx.t(y)), (x,), (y,))]


@onnx_op("Resize", "Upsample")
def _resize(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    mode = _attr(node, "mode", "nearest")
    op = aten.upsample_nearest2d.default if mode == "nearest" else aten.upsample_bilinear2d.default
    return [_Fwd(Call(op, (ctx.t(x),), out=ctx.t(y)), (x,), (y,))]


@onnx_op("DepthToSpace", "SpaceToDepth", "Trilu", "ReverseSequence", "Compress",
         "ScatterND", "ScatterElements", "Scatter", "GatherND", "GatherElements")
def _data_movement(ctx: _Ctx, node) -> list[_Fwd]:
    op = {"GatherElements": aten.gather.default, "GatherND": aten.index.Tensor,
          "Trilu": aten.tril.default}.get(node.op_type, aten.scatter.src)
    return _simple(op, ctx, node, kind="copy", name=node.op_type)


@onnx_op("Gather")
def _gather(ctx: _Ctx, node) -> list[_Fwd]:
    data, idx, y = node.input[0], node.input[1], node.output[0]
    axis = _attr(node, "axis", 0)
    dv, iv = ctx.values[data], ctx.values[idx]
    if ctx.is_param(data) and axis == 0 and dv.dtype.is_floating_point and len(dv.shape) == 2:
        call = Call(aten.embedding.default, (ctx.t(data), ctx.t(idx)), out=ctx.t(y))
        return [_Fwd(call, (data, idx), (y,))]
    if len(iv.shape) == 0 and ctx.kinds.get(idx) != ACT:
        # x[:, k]: a select view; its backward writes into zeros.
        return [_Fwd(Call(aten.select.int, (ctx.t(data),), out=ctx.t(y)), (data,), (y,),
                     free=True)]
    op = aten.index_select.default if len(iv.shape) == 1 else aten.index.Tensor
    call = Call(op, (ctx.t(data), axis, ctx.t(idx)), out=ctx.t(y))
    return [_Fwd(call, (data, None, idx), (y,))]


# ---- GEMMs ---------------------------------------------------------------------

def _matmul_calls(ctx: _Ctx, a: str, b: str, y: str, bias: str | None,
                  outputs: tuple) -> list[_Fwd]:
    sa, sb, sy = ctx.shape(a), ctx.shape(b), ctx.shape(y)
    ta, tb = ctx.values[a].dtype, ctx.values[b].dtype
    if len(sa) == 1:
        sa = (1,) + sa
    if len(sb) == 1:
        sb = sb + (1,)
    k, n = sb[-2], sb[-1]
    if len(sb) == 2:
        # x @ W (or x @ a 2-D activation): the leading dims fold into M, as
        # aten.matmul folds them into one mm.
        m = math.prod(sa[:-1])
        tag = "linear" if ctx.is_param(b) else None
        # A 2-D weight is an nn.Linear's, whose W^T the exporter folded into a
        # [K, N] initializer: PyTorch runs it as x @ W^T on the stored [N, K]
        # weight (a transposed view: the `*_tn` GEMM kernels).
        x2, y2 = TensorMeta((m, k), ta), TensorMeta((m, n), ta)
        w2 = TensorMeta((k, n), tb, tag == "linear")
        folded = len(sa) > 2  # nn.Linear on [..., K]: view, t, mm, view
        if bias is not None:
            call = Call(aten.addmm.default, (ctx.t(bias), x2, w2), out=y2, tag=tag)
            return [_Fwd(call, (bias, a, b), outputs, host=("linear", folded, True))]
        return [_Fwd(Call(aten.mm.default, (x2, w2), out=y2, tag=tag), (a, b), outputs,
                     host=("linear", folded, False))]
    lead = tuple(np.broadcast_shapes(sa[:-2], sb[:-2]))
    bt = math.prod(lead)
    m = sa[-2]
    call = Call(aten.bmm.default, (TensorMeta((bt, m, k), ta), TensorMeta((bt, k, n), tb)),
                out=TensorMeta((bt, m, n), ta))
    fwd = [_Fwd(call, (a, b), outputs)]
    if bias is not None:
        fwd.append(_Fwd(Call(aten.add.Tensor, (ctx.t(y), ctx.t(bias)), out=ctx.t(y)),
                        (None, bias), outputs))
    del sy
    return fwd


def _bias_add(ctx: _Ctx, node) -> tuple[str, onnx.NodeProto] | None:
    """A following Add of a 1-D parameter (a Linear's bias): fused into addmm."""
    y = node.output[0]
    users = ctx.consumers.get(y, [])
    if len(users) != 1 or users[0].op_type != "Add" or len(users[0].input) != 2:
        return None
    add = users[0]
    other = add.input[1] if add.input[0] == y else add.input[0]
    v = ctx.values.get(other)
    n = ctx.shape(y)[-1] if ctx.shape(y) else None
    if ctx.is_param(other) and v is not None and v.shape is not None and \
            math.prod(v.shape) == n and v.shape[-1:] == (n,):
        return other, add
    return None


@onnx_op("MatMul")
def _matmul(ctx: _Ctx, node) -> list[_Fwd]:
    a, b = node.input[0], node.input[1]
    y = node.output[0]
    fused = _bias_add(ctx, node) if len(ctx.shape(b)) == 2 else None
    if fused is not None:
        bias, add = fused
        ctx.skip.add(id(add))
        return _matmul_calls(ctx, a, b, add.output[0], bias, (add.output[0],))
    return _matmul_calls(ctx, a, b, y, None, (y,))


@onnx_op("Gemm")
def _gemm(ctx: _Ctx, node) -> list[_Fwd]:
    a, b = node.input[0], node.input[1]
    c = node.input[2] if len(node.input) > 2 and node.input[2] else None
    y = node.output[0]
    sa, sb = ctx.shape(a), ctx.shape(b)
    if _attr(node, "transA", 0):
        sa = sa[::-1]
    if _attr(node, "transB", 0):
        sb = sb[::-1]
    tag = "linear" if ctx.is_param(b) else None
    # transB: B is stored [N, K] and read transposed (nn.Linear's layout); a
    # weight without it had its transpose folded by the exporter (see MatMul).
    ta = TensorMeta(tuple(sa), ctx.values[a].dtype, bool(_attr(node, "transA", 0)))
    tb = TensorMeta(tuple(sb), ctx.values[b].dtype,
                    bool(_attr(node, "transB", 0)) or tag == "linear")
    if c is not None:
        call = Call(aten.addmm.default, (ctx.t(c), ta, tb), out=ctx.t(y), tag=tag)
        return [_Fwd(call, (c, a, b), (y,), host=("linear", False, True))]
    return [_Fwd(Call(aten.mm.default, (ta, tb), out=ctx.t(y), tag=tag), (a, b), (y,),
                 host=("linear", False, False))]


# ---- convolution -----------------------------------------------------------------

def _conv(ctx: _Ctx, node, transposed: bool) -> list[_Fwd]:
    x, w = node.input[0], node.input[1]
    b = node.input[2] if len(node.input) > 2 and node.input[2] else None
    y = node.output[0]
    nsp = len(ctx.shape(x)) - 2
    strides = list(_attr(node, "strides", [1] * nsp))
    pads = list(_attr(node, "pads", [0] * (2 * nsp)))[:nsp]
    dil = list(_attr(node, "dilations", [1] * nsp))
    groups = int(_attr(node, "group", 1))
    opad = list(_attr(node, "output_padding", [0] * nsp))
    call = Call(aten.convolution.default,
                (ctx.t(x), ctx.t(w), ctx.t(b) if b else None, strides, pads, dil, transposed,
                 opad, groups), out=ctx.t(y))
    return [_Fwd(call, (x, w, b) + (None,) * 6, (y,))]


onnx_op("Conv")(lambda ctx, node: _conv(ctx, node, False))
onnx_op("ConvTranspose")(lambda ctx, node: _conv(ctx, node, True))


# ---- normalisation, softmax -------------------------------------------------------

@onnx_op("Softmax", "LogSoftmax")
def _softmax(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    shape = ctx.shape(x)
    axis = _attr(node, "axis", -1 if ctx.opset >= 13 else 1)
    axis = axis + len(shape) if axis < 0 else axis
    op = aten._softmax.default if node.op_type == "Softmax" else aten._log_softmax.default
    if ctx.opset < 13:  # softmax over the flattened trailing dims
        inner = math.prod(shape[axis:])
        tx = TensorMeta((math.prod(shape[:axis]), inner), ctx.values[x].dtype)
        call = Call(op, (tx, 1, False), out=tx)
    else:
        call = Call(op, (ctx.t(x), axis, False), out=ctx.t(y))
    return [_Fwd(call, (x, None, None), (y,))]


@onnx_op("LayerNormalization")
def _layer_norm(ctx: _Ctx, node) -> list[_Fwd]:
    x, w = node.input[0], node.input[1]
    b = node.input[2] if len(node.input) > 2 and node.input[2] else None
    y = node.output[0]
    shape = ctx.shape(x)
    axis = _attr(node, "axis", -1)
    axis = axis + len(shape) if axis < 0 else axis
    norm = list(shape[axis:])
    stats = TensorMeta(tuple(shape[:axis]) + (1,) * len(norm), torch.float32)
    call = Call(aten.native_layer_norm.default,
                (ctx.t(x), norm, ctx.t(w), ctx.t(b) if b else None, _attr(node, "epsilon", 1e-5)),
                out=(ctx.t(y), stats, stats))
    return [_Fwd(call, (x, None, w, b, None), (y,))]


@onnx_op("GroupNormalization", "InstanceNormalization")
def _group_norm(ctx: _Ctx, node) -> list[_Fwd]:
    x, w, b = node.input[0], node.input[1], node.input[2]
    y = node.output[0]
    shape = ctx.shape(x)
    n, c = shape[0], shape[1] if len(shape) > 1 else 1
    groups = c if node.op_type == "InstanceNormalization" else int(_attr(node, "num_groups", 1))
    call = Call(aten.native_group_norm.default,
                (ctx.t(x), ctx.t(w), ctx.t(b), n, c, math.prod(shape[2:]), groups, 1e-5),
                out=ctx.t(y))
    return [_Fwd(call, (x, w, b) + (None,) * 5, (y,))]


@onnx_op("BatchNormalization")
def _batch_norm(ctx: _Ctx, node) -> list[_Fwd]:
    x, w, b, mean, var = (list(node.input) + [""] * 5)[:5]
    y = node.output[0]
    eps = _attr(node, "epsilon", 1e-5)
    tx, ty = ctx.t(x), ctx.t(y)
    tw, tb = ctx.t(w), ctx.t(b)
    tm = ctx.t(mean) if mean else tw
    tv = ctx.t(var) if var else tw
    if ctx.train:
        call = Call(aten._native_batch_norm_legit_functional.default,
                    (tx, tw, tb, tm, tv, True, _attr(node, "momentum", 0.9), eps),
                    out=(ty, tw, tw, tm, tv))
        # nn.BatchNorm's num_batches_tracked += 1: one scalar kernel per layer.
        counter = TensorMeta((), torch.int64)
        bump = Call(aten.add_.Tensor, (counter, 1), out=counter, kind="elementwise")
        return [_Fwd(call, (x, w, b, None, None, None, None, None), (y,)),
                _Fwd(bump, (None, None), ())]
    call = Call(aten._native_batch_norm_legit_no_training.default,
                (tx, tw, tb, tm, tv, 0.1, eps), out=(ty, tw, tw))
    return [_Fwd(call, (x, w, b, None, None, None, None), (y,))]


@onnx_op("Dropout")
def _dropout(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    ratio = ctx.data(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    p = float(ratio) if ratio is not None and np.size(ratio) == 1 else _attr(node, "ratio", 0.5)
    if not ctx.train or p <= 0.0:
        return []  # an identity at inference (and with p = 0)
    ty = ctx.t(y)
    call = Call(aten.native_dropout.default, (ctx.t(x), p, True),
                out=(ty, TensorMeta(ty.shape, torch.bool)))
    return [_Fwd(call, (x, None, None), (y,))]


# ---- pooling, reductions -------------------------------------------------------------

@onnx_op("MaxPool", "AveragePool", "LpPool")
def _pool(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    ty = ctx.t(y)
    nsp = len(ctx.shape(x)) - 2
    ks = list(_attr(node, "kernel_shape", [1] * nsp))
    st = list(_attr(node, "strides", [1] * nsp))
    pads = list(_attr(node, "pads", [0] * (2 * nsp)))[:nsp]
    if node.op_type == "MaxPool":
        op = aten.max_pool3d_with_indices.default if nsp == 3 else \
            aten.max_pool2d_with_indices.default
        call = Call(op, (ctx.t(x), ks, st, pads, [1] * nsp, bool(_attr(node, "ceil_mode", 0))),
                    out=(ty, TensorMeta(ty.shape, torch.int64)))
        return [_Fwd(call, (x,) + (None,) * 5, (y,))]
    op = aten.avg_pool3d.default if nsp == 3 else aten.avg_pool2d.default
    call = Call(op, (ctx.t(x), ks, st, pads), out=ty)
    return [_Fwd(call, (x, None, None, None), (y,))]


@onnx_op("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _global_pool(ctx: _Ctx, node) -> list[_Fwd]:
    # adaptive_avg_pool2d(x, 1) runs as a mean over the spatial dims (as traced).
    x, y = node.input[0], node.output[0]
    op = aten.mean.dim if node.op_type == "GlobalAveragePool" else aten.amax.default
    call = Call(op, (ctx.t(x), [-2, -1], True), out=ctx.t(y))
    return [_Fwd(call, (x, None, None), (y,))]


_REDUCE = {"ReduceMean": aten.mean.dim, "ReduceSum": aten.sum.dim_IntList,
           "ReduceMax": aten.amax.default, "ReduceMin": aten.amin.default,
           "ReduceProd": aten.prod.dim_int, "ReduceL1": aten.linalg_vector_norm.default,
           "ReduceL2": aten.linalg_vector_norm.default,
           "ReduceSumSquare": aten.linalg_vector_norm.default,
           "ReduceLogSumExp": aten.logsumexp.default, "ReduceLogSum": aten.logsumexp.default,
           "ArgMax": aten.argmax.default, "ArgMin": aten.argmin.default,
           "CumSum": aten.sum.dim_IntList}


@onnx_op(*_REDUCE)
def _reduce(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    if ctx.values[x].numel == ctx.values[y].numel and node.op_type != "CumSum":
        return []  # reducing size-1 axes: a view
    call = Call(_REDUCE[node.op_type], (ctx.t(x),), out=ctx.t(y), kind="reduction")
    return [_Fwd(call, (x,), (y,))]


# ---- recurrent layers, attention ---------------------------------------------------

def _recurrent(ctx: _Ctx, node, mode: int) -> list[_Fwd]:
    """An ONNX LSTM, GRU or RNN node as the one cuDNN call that runs it
    (`mode`: cuDNN's, 2 LSTM, 3 GRU, 1 RNN tanh, 0 RNN relu)."""
    ins = list(node.input) + [""] * 8
    x, w, r, b = ins[0], ins[1], ins[2], ins[3]
    hidden = int(_attr(node, "hidden_size", ctx.shape(r)[-1]))
    bidir = _attr(node, "direction", "forward") == "bidirectional"
    batch_first = bool(_attr(node, "layout", 0))
    outs = [o for o in node.output if o and ctx.values.get(o) is not None]
    weights = [ctx.t(w), ctx.t(r)] + ([ctx.t(b)] if b else [])
    call = Call(aten._cudnn_rnn.default,
                (ctx.t(x), weights, 4, None, None, None, mode, hidden, 0, 1, batch_first, 0.0,
                 ctx.train, bidir),
                out=tuple(ctx.t(o) for o in outs))
    srcs = (x, (w, r) + ((b,) if b else ())) + (None,) * 12
    return [_Fwd(call, srcs, tuple(outs))]


@onnx_op("LSTM")
def _lstm(ctx: _Ctx, node) -> list[_Fwd]:
    return _recurrent(ctx, node, 2)


@onnx_op("GRU")
def _gru(ctx: _Ctx, node) -> list[_Fwd]:
    return _recurrent(ctx, node, 3)


@onnx_op("RNN")
def _rnn(ctx: _Ctx, node) -> list[_Fwd]:
    acts = [a.decode() if isinstance(a, bytes) else str(a)
            for a in (_attr(node, "activations", None) or ["Tanh"])]
    return _recurrent(ctx, node, 0 if acts and acts[0].lower() == "relu" else 1)


def _attention_call(ctx: _Ctx, q: TensorMeta, k: TensorMeta, v: TensorMeta, causal: bool, y: str,
                    srcs: tuple) -> list[_Fwd]:
    call = Call(aten._scaled_dot_product_flash_attention.default, (q, k, v),
                kwargs=(("is_causal", bool(causal)),), out=(ctx.t(y),))
    return [_Fwd(call, srcs, (y,))]


def _heads(t: TensorMeta, heads: int) -> TensorMeta:
    if len(t.shape) == 4:
        return t
    b, s, hd = t.shape
    return TensorMeta((b, heads, s, hd // max(heads, 1)), t.dtype)


@onnx_op("Attention")
def _attention(ctx: _Ctx, node) -> list[_Fwd]:
    # ai.onnx Attention (opset 23): Q, K, V as [B, H, S, D] or [B, S, H*D].
    q, k, v = node.input[0], node.input[1], node.input[2]
    y = node.output[0]
    qh = int(_attr(node, "q_num_heads", 1) or 1)
    kh = int(_attr(node, "kv_num_heads", qh) or qh)
    return _attention_call(ctx, _heads(ctx.t(q), qh), _heads(ctx.t(k), kh),
                           _heads(ctx.t(v), kh), _attr(node, "is_causal", 0), y, (q, k, v))


@onnx_op("com.microsoft.MultiHeadAttention")
def _ms_mha(ctx: _Ctx, node) -> list[_Fwd]:
    q, k, v = node.input[0], node.input[1], node.input[2]
    heads = int(_attr(node, "num_heads", 1))
    kt = _heads(ctx.t(k), heads) if k else _heads(ctx.t(q), heads)
    vt = _heads(ctx.t(v), heads) if v else kt
    return _attention_call(ctx, _heads(ctx.t(q), heads), kt, vt,
                           _attr(node, "unidirectional", 0), node.output[0], (q, k, v))


@onnx_op("com.microsoft.Attention")
def _ms_attention(ctx: _Ctx, node) -> list[_Fwd]:
    # Input [B, S, hidden] @ weights [hidden, 3*hidden] (+ bias), then attention.
    x, w = node.input[0], node.input[1]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    heads = int(_attr(node, "num_heads", 1))
    b, s, hidden = ctx.shape(x)
    n = ctx.shape(w)[-1]
    dt = ctx.values[x].dtype
    qkv = TensorMeta((b * s, n), dt)
    proj = Call(aten.addmm.default if bias else aten.mm.default,
                ((ctx.t(bias),) if bias else ()) + (TensorMeta((b * s, hidden), dt), ctx.t(w)),
                out=qkv, tag="linear")
    d = n // 3 // max(heads, 1)
    qt = TensorMeta((b, heads, s, d), dt)
    fwd = [_Fwd(proj, ((bias,) if bias else ()) + (x, w), (node.output[0],))]
    return fwd + _attention_call(ctx, qt, qt, qt, _attr(node, "unidirectional", 0),
                                 node.output[0], (None, None, None))


# ---- random numbers, fills ---------------------------------------------------------------

@onnx_op("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli")
def _random(ctx: _Ctx, node) -> list[_Fwd]:
    y = node.output[0]
    return [_Fwd(Call(aten.rand.default, (), out=ctx.t(y)), (), (y,))]


@onnx_op("ConstantOfShape", "Range", "EyeLike", "OneHot")
def _fill(ctx: _Ctx, node) -> list[_Fwd]:
    y = node.output[0]
    return [_Fwd(Call(aten.full.default, (), out=ctx.t(y)), (), (y,))]


def _unsupported(ctx: _Ctx, node, label: str) -> list[_Fwd]:
    srcs = [i for i in node.input if i and ctx.values.get(i) is not None
            and ctx.values[i].shape is not None]
    outs = [o for o in node.output if o and ctx.values.get(o) is not None
            and ctx.values[o].shape is not None]
    call = Call(None, tuple(ctx.t(i) for i in srcs), out=tuple(ctx.t(o) for o in outs),
                kind="unsupported", name=label)
    return [_Fwd(call, tuple(srcs), tuple(outs))]


def _diff_inputs(node: onnx.NodeProto, values: dict[str, OnnxValue]) -> list[int]:
    if node.op_type in _NON_DIFF:
        return []
    fixed = _DIFF_INPUTS.get(node.op_type)
    idx = range(len(node.input)) if fixed is None else fixed
    out = []
    for i in idx:
        if i < len(node.input) and node.input[i]:
            v = values.get(node.input[i])
            if v is not None and v.dtype.is_floating_point:
                out.append(i)
    return out


# Kernel-free aten ops that eager PyTorch dispatches around a call (views such
# as t / view / expand / transpose, autograd's detach of a saved output, an
# empty for batch norm's saved statistics): they cost host time
# (predictor.overhead) but launch nothing. (forward, backward, forward at
# inference), counted from fx traces of single layers; see _host.
_HOST_EXTRA = {
    aten.bmm: (5, 3, 5),            # expand x2, _unsafe_view x3 / transposes of the operands
    aten.clone: (1, 1, 1),          # the transpose / permute view it copies
    aten.relu: (1, 1, 0),           # detach of the output saved for threshold_backward
    aten._softmax: (1, 1, 0),
    aten._log_softmax: (1, 1, 0),
    aten.tanh: (1, 1, 0),
    aten.sigmoid: (1, 1, 0),
    aten._native_batch_norm_legit_functional: (1, 0, 1),   # empty (saved statistics)
    aten._native_batch_norm_legit_no_training: (1, 0, 1),
    aten.mean: (0, 1, 0),           # its backward expands the gradient
}


def _host(f: _Fwd, train: bool, needs: tuple = ()) -> tuple[int, int]:
    """(forward, backward) kernel-free host ops around one forward call;
    `needs` says which of its arguments get a gradient."""
    if f.host is not None and f.host[0] == "linear":
        # nn.Linear: view, t, mm, view forward; backward t of the weight, t x2
        # around the weight gradient, t for the input gradient, a view of the
        # bias gradient, and the backward of each view.
        _, folded, bias = f.host
        dgrad = bool(len(needs) > 1 and needs[-2])
        back = 3 + dgrad + (1 + dgrad if folded else 0) + bias
        return (1 + 2 * folded, back if train else 0)
    packet = getattr(f.call.op, "overloadpacket", f.call.op)
    extra = _HOST_EXTRA.get(packet)
    if extra is None:
        return (0, 0)
    return (extra[0], extra[1]) if train else (extra[2], 0)


def _erf_gelus(nodes: list[onnx.NodeProto], ctx: _Ctx) -> dict[int, tuple[str, str]]:
    """GELU written out with Erf (opsets before 20): x * 0.5 * (1 + erf(x / sqrt 2)).
    Returns {id(last node): (x, y)} and marks the other nodes of each match skipped,
    so the pattern prices as the one gelu kernel PyTorch runs."""
    producer = {o: n for n in nodes for o in n.output if o}
    found: dict[int, tuple[str, str]] = {}

    def const(name: str, target: float, tol: float = 1e-3) -> bool:
        d = ctx.data(name)
        return d is not None and np.size(d) == 1 and abs(float(np.asarray(d).ravel()[0]) - target) \
            < tol * max(abs(target), 1)

    def other(node, name):
        return node.input[1] if node.input[0] == name else node.input[0]

    for erf in nodes:
        if erf.op_type != "Erf":
            continue
        pre = producer.get(erf.input[0])
        if pre is None or pre.op_type not in ("Div", "Mul"):
            continue
        x = pre.input[0]
        if not (const(pre.input[1], math.sqrt(2)) if pre.op_type == "Div"
                else const(pre.input[1], 1 / math.sqrt(2))):
            continue
        users = ctx.consumers.get(erf.output[0], [])
        if len(users) != 1 or users[0].op_type != "Add" or not const(other(users[0],
                                                                            erf.output[0]), 1.0):
            continue
        add = users[0]
        chain = [pre, erf, add]
        cur = add.output[0]
        seen_x = seen_half = False
        for _ in range(2):
            users = ctx.consumers.get(cur, [])
            if len(users) != 1 or users[0].op_type != "Mul":
                break
            mul = users[0]
            o = other(mul, cur)
            if o == x or producer.get(o) is not None and producer[o].op_type == "Mul" and \
                    x in producer[o].input and any(const(i, 0.5) for i in producer[o].input):
                seen_x = True
                if o != x:
                    seen_half = True
                    chain.append(producer[o])
            elif const(o, 0.5):
                seen_half = True
            else:
                break
            chain.append(mul)
            cur = mul.output[0]
            if seen_x and seen_half:
                break
        if not (seen_x and seen_half):
            continue
        last = chain[-1]
        for n in chain:
            if n is not last:
                ctx.skip.add(id(n))
        found[id(last)] = (x, last.output[0])
    return found


def _sdpa_attentions(nodes: list[onnx.NodeProto], ctx: _Ctx) -> dict[int, _Fwd]:
    """``F.scaled_dot_product_attention`` as the TorchScript exporter writes it:
    MatMul(q * s, Transpose(k) * s) with the same host-side scalar s = sqrt(scale)
    on both sides, [+ mask], Softmax, [Dropout], MatMul(., v). PyTorch runs
    that as one fused attention kernel (flash / memory-efficient), so it is
    priced as one. (Eager attention, which scales the scores instead, keeps
    its matmuls and softmax, as PyTorch runs them.) Returns {id(last node): call}
    and marks the other nodes of each match skipped."""
    producer = {o: n for n in nodes for o in n.output if o}
    found: dict[int, _Fwd] = {}

    def only_user(name: str, op_types: tuple) -> onnx.NodeProto | None:
        users = ctx.consumers.get(name, [])
        return users[0] if len(users) == 1 and users[0].op_type in op_types else None

    def scaled(name: str) -> tuple[onnx.NodeProto, str] | None:
        node = producer.get(name)
        if node is None or node.op_type != "Mul" or len(node.input) != 2:
            return None
        for x, s in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
            v = ctx.values.get(s)
            if ctx.kinds.get(s) in (PARAM, META) and v is not None and v.numel == 1:
                return node, x
        return None

    def causal_mask(name: str) -> bool:
        todo, seen = [name], set()
        while todo and len(seen) < 64:
            node = producer.get(todo.pop())
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type == "Trilu":
                return True
            todo.extend(i for i in node.input if i)
        return False

    for mm in nodes:
        if mm.op_type != "MatMul" or len(mm.input) != 2:
            continue
        qs, ks = scaled(mm.input[0]), scaled(mm.input[1])
        if qs is None or ks is None:
            continue
        tr = producer.get(ks[1])
        if tr is None or tr.op_type != "Transpose":
            continue
        q, k = qs[1], tr.input[0]
        chain = [mm]
        for node in (qs[0], ks[0]):
            if len(ctx.consumers.get(node.output[0], [])) == 1:
                chain.append(node)
        if len(ctx.consumers.get(tr.output[0], [])) == 1:
            chain.append(tr)
        cur, causal = mm.output[0], False
        masked = only_user(cur, ("Add", "Where"))
        if masked is not None:
            mask = [i for i in masked.input if i and i != cur]
            causal = any(causal_mask(m) for m in mask)
            chain.append(masked)
            cur = masked.output[0]
        soft = only_user(cur, ("Softmax",))
        if soft is None:
            continue
        chain.append(soft)
        cur = soft.output[0]
        drop = only_user(cur, ("Dropout",))
        if drop is not None:
            chain.append(drop)
            cur = drop.output[0]
        last = only_user(cur, ("MatMul",))
        if last is None or last.input[0] != cur:
            continue
        v, y = last.input[1], last.output[0]
        if any(ctx.values.get(n) is None or ctx.values[n].shape is None
               or len(ctx.values[n].shape) < 3 for n in (q, k, v, y)):
            continue
        for node in chain:
            ctx.skip.add(id(node))
        # A mask built from the inputs (padding) is computed and read; a causal
        # mask built from shapes alone is the kernel's is_causal flag (dead code).
        masks = tuple(m for m in (mask if masked is not None else [])
                      if ctx.kinds.get(m) not in (PARAM, META) and not causal)
        call = Call(aten._scaled_dot_product_flash_attention.default,
                    (ctx.t(q), ctx.t(k), ctx.t(v)) + tuple(ctx.t(m) for m in masks),
                    kwargs=(("is_causal", causal),), out=(ctx.t(y),))
        found[id(last)] = _Fwd(call, (q, k, v) + masks, (y,))
        # The kernels read strided q, k, v (last dim contiguous) and write their
        # output as [batch, seq, heads, dim]: the head transposes around them
        # are views, not the copies they would be before a bmm.
        for name in (q, k, v):
            tr = _transpose_behind(name, producer)
            if tr is not None and _keeps_last_axis(tr):
                ctx.views.add(id(tr))
        after = only_user(y, ("Transpose",))
        if after is not None and _keeps_last_axis(after):
            ctx.views.add(id(after))
    return found


def _transpose_behind(name: str, producer: dict) -> onnx.NodeProto | None:
    """The Transpose a tensor comes from through views (Split, Squeeze, Reshape...)."""
    for _ in range(8):
        node = producer.get(name)
        if node is None:
            return None
        if node.op_type == "Transpose":
            return node
        if node.op_type not in ("Split", "Squeeze", "Unsqueeze", "Reshape", "Identity",
                                "Flatten"):
            return None
        name = node.input[0]
    return None


def _keeps_last_axis(node: onnx.NodeProto) -> bool:
    perm = _attr(node, "perm", None)
    return perm is not None and len(perm) > 0 and perm[-1] == len(perm) - 1
