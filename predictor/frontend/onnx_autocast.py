"""CUDA's autocast policy applied to the forward calls of an ONNX graph.

An ONNX file holds one precision (the one it was exported in), while the
training step people run is the fp32 model under ``torch.autocast("cuda",
dtype)``. So, as the fx frontend traces it (``predictor.frontend.autocast``),
each forward call gets the dtype autocast gives its aten op, with the same
per-op rules (``autocast.policy()``, read from ATen's CUDA lists):

- lower precision (``mm``, ``addmm``, ``bmm``, ``convolution``, attention, a
  cuDNN RNN): floating inputs are cast to the autocast dtype and the call runs
  in it;
- fp32 (layer/group norm, ``nll_loss``, ``exp``/``log``/``pow``, upsampling):
  half inputs are cast up and the call runs in fp32;
- fp32 output (``_softmax``, ``_log_softmax``, ``sum``, as CUDA autocast
  passes ``dtype=torch.float32`` to ``softmax``/``log_softmax``/``sum``): the
  kernel reads its input as it is and writes fp32 (no cast kernel: CUDA's
  softmax converts an fp16 input on the fly, ``half_to_float``), except a
  bf16 input to softmax, which ATen converts to fp32 first (a cast);
- every other call runs in the promoted dtype of its floating inputs, as
  PyTorch's type promotion gives it (an fp32 bias added to a half activation
  is fp32; batch norm keeps its input's dtype, as cuDNN runs it).

Casts are ``aten._to_copy`` calls of their own, with a graph value of their
own, so the training synthesis prices their forward and backward (the cast of
the half gradient back to fp32) and routes gradients through them. A
parameter (a float initializer) is cast once per step and the copy reused, as
autocast's weight-cast cache does. Parameters stay fp32: the optimizer
updates fp32 master weights with fp32 gradients.
"""

from __future__ import annotations

import dataclasses

import onnx
import torch

from predictor.families import TensorMeta
from predictor.frontend import autocast
from predictor.frontend.onnx_ops import PARAM, _Fwd
from predictor.frontend.training_synthesis import Call

aten = torch.ops.aten

_ELEM = {torch.bfloat16: onnx.TensorProto.BFLOAT16, torch.float16: onnx.TensorProto.FLOAT16,
         torch.float32: onnx.TensorProto.FLOAT}
# Core aten ops the ONNX lowering emits where a model calls the composite op
# that carries the CUDA rule (softmax.int -> _softmax, layer_norm ->
# native_layer_norm, nll_loss -> nll_loss_forward, lstm -> _cudnn_rnn).
_CORE = {"_softmax": "set_opt_dtype", "_log_softmax": "set_opt_dtype",
         "native_group_norm": "fp32", "nll_loss_forward": "fp32", "_cudnn_rnn": "lower",
         "_scaled_dot_product_efficient_attention": "lower"}
_KEEP_INPUT_DTYPE = ("_native_batch_norm_legit_functional", "_native_batch_norm_legit",
                     "_native_batch_norm_legit_no_training", "native_batch_norm",
                     "native_dropout", "max_pool2d_with_indices", "avg_pool2d",
                     "_adaptive_avg_pool2d", "embedding")


def _floating(t) -> bool:
    return isinstance(t, TensorMeta) and t.dtype.is_floating_point and t.dtype != torch.float64


def _with(t: TensorMeta, dtype: torch.dtype) -> TensorMeta:
    return dataclasses.replace(t, dtype=dtype)


class OnnxAutocast:
    """The policy for one ONNX graph: `apply` rewrites one forward entry into
    the entries autocast runs (casts first), `view` carries a value's dtype
    through a view. `values` (the graph's OnnxValues) gets an entry per cast."""

    def __init__(self, amp: str, values: dict, kinds: dict[str, str]):
        self.amp = autocast.check(amp)
        self.dtype = autocast.AMP_DTYPES[self.amp]
        self.values = values
        self.kinds = kinds
        self.runtime: dict[str, torch.dtype] = {}
        self.cache: dict[tuple[str, torch.dtype], str] = {}
        self.rules = autocast.policy()
        self.casts = 0

    # ---- dtypes of graph values --------------------------------------------------
    def dtype_of(self, name, meta: TensorMeta) -> torch.dtype:
        if isinstance(name, str) and name in self.runtime:
            return self.runtime[name]
        return meta.dtype

    def view(self, src: str, dst: str) -> None:
        """`dst` is a view (or an identity) of `src`: same runtime dtype."""
        if src in self.runtime:
            self.runtime[dst] = self.runtime[src]

    def rule(self, op) -> str:
        packet = getattr(op, "overloadpacket", op)
        base = getattr(packet, "__name__", str(packet))
        overload = getattr(op, "_overloadname", "default")
        for key in (f"{base}.{overload}", base):
            if key in self.rules:
                return self.rules[key]
        return _CORE.get(base, "none")

    # ---- the rewrite ----------------------------------------------------------------
    def _cast(self, name, meta: TensorMeta, frm: torch.dtype, to: torch.dtype,
              out: list[_Fwd]) -> str | None:
        """A cast of graph value `name` from `frm` to `to`; returns the copy's name."""
        if not isinstance(name, str) or not name:
            return None
        cacheable = self.kinds.get(name) == PARAM and to == self.dtype
        key = (name, to)
        if cacheable and key in self.cache:
            return self.cache[key]
        self.casts += 1
        new = f"{name}::autocast{self.casts}"
        src = self.values.get(name)
        shape = src.shape if src is not None and src.shape is not None else meta.shape
        self.values[new] = dataclasses.replace(src, elem=_ELEM[to], data=None) \
            if src is not None else None
        self.runtime[new] = to
        out.append(_Fwd(Call(aten._to_copy.default, (TensorMeta(tuple(shape), frm),),
                             out=TensorMeta(tuple(shape), to)), (name,), (new,)))
        if cacheable:
            self.cache[key] = new
        return new

    def apply(self, f: _Fwd) -> list[_Fwd]:
        call = f.call
        rule = self.rule(call.op)
        base = getattr(getattr(call.op, "overloadpacket", call.op), "__name__", "")
        out: list[_Fwd] = []
        sources = tuple(f.sources) + (None,) * (len(call.args) - len(f.sources))
        if rule == "set_opt_dtype" and base in ("_softmax", "_log_softmax") and call.args \
                and _floating(call.args[0]) \
                and self.dtype_of(sources[0], call.args[0]) == torch.bfloat16:
            # softmax(x, dtype=float32) fuses the conversion for fp16 inputs only
            # (half_to_float); a bf16 input is converted first (ATen SoftMax.cpp).
            rule = "fp32"
        in_dtypes: list[tuple[TensorMeta, torch.dtype]] = []

        def arg(a, src):
            """The argument as the kernel reads it (cast when the rule says so)."""
            if isinstance(a, list):
                srcs = src if isinstance(src, tuple) else (None,) * len(a)
                pairs = [arg(x, s) for x, s in zip(a, srcs)]
                return [p[0] for p in pairs], tuple(p[1] for p in pairs)
            if not _floating(a):
                return a, src
            have = self.dtype_of(src, a)
            want = have
            if rule == "lower":
                want = self.dtype
            elif rule == "fp32":
                want = torch.float32
            if want != have:
                new = self._cast(src, a, have, want, out)
                if new is not None:
                    src = new
            in_dtypes.append((a, want))
            return _with(a, want), src

        args, srcs = [], []
        for a, s in zip(call.args, sources):
            na, ns = arg(a, s)
            args.append(na)
            srcs.append(ns)
        kwargs = tuple((k, arg(v, None)[0]) for k, v in call.kwargs)

        if rule == "lower":
            res = self.dtype
        elif rule in ("fp32", "set_opt_dtype", "append_dtype"):
            res = torch.float32
        elif base in _KEEP_INPUT_DTYPE and in_dtypes:
            res = in_dtypes[0][1]
        elif in_dtypes:
            # Type promotion: dimensioned tensors win over 0-dim ones.
            dims = [d for t, d in in_dtypes if t.shape] or [d for _, d in in_dtypes]
            res = dims[0]
            for d in dims[1:]:
                res = torch.promote_types(res, d)
        else:
            res = None  # a creation op or a cast: its output dtype is its own

        def result(o):
            if isinstance(o, (tuple, list)):
                return type(o)(result(x) for x in o)
            if res is None or not _floating(o) or base == "_to_copy":
                return o
            return _with(o, res)

        outs = result(call.out)
        if base == "native_layer_norm" and isinstance(outs, tuple):
            outs = (outs[0],) + tuple(_with(o, torch.float32) if _floating(o) else o
                                      for o in outs[1:])
        for o, t in zip(f.outputs, call.out if isinstance(call.out, (tuple, list))
                        else (call.out,)):
            if isinstance(o, str) and _floating(t):
                self.runtime[o] = t.dtype if res is None or base == "_to_copy" else res
        new_call = dataclasses.replace(call, args=tuple(args), kwargs=kwargs, out=outs)
        out.append(dataclasses.replace(f, call=new_call, sources=tuple(srcs)))
        return out
