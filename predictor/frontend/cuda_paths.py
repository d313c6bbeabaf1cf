"""Take the CUDA code path while tracing on fake CPU tensors.

A few composite aten ops choose their implementation from the device: on a
GPU they run one fused kernel, on a CPU they decompose into several ops. The
trace runs on fake CPU tensors, so without help it would record the CPU
decomposition and the predictor would price kernels the GPU never runs.

``CudaPaths`` is a ``TorchFunctionMode`` active during the trace that sends
those calls to the aten op the CUDA build dispatches to:

- ``dropout`` (training, 0 < p < 1, not in place): ATen's ``dropout`` calls
  ``native_dropout`` on CUDA (``is_fused_kernel_acceptable``): one fused kernel
  writing the output and a bool mask, and ``native_dropout_backward`` (one
  masked-scale kernel) in the backward. On a CPU it runs ``bernoulli_``,
  ``div_`` and ``mul`` (three float passes) and a ``mul`` backward.
  In-place dropout takes the decomposed path on CUDA too and is left alone.
- ``gru``, ``rnn_tanh``, ``rnn_relu`` (``nn.GRU``, ``nn.RNN``, padded
  input): a CUDA build runs the whole stack as one cuDNN call,
  ``_cudnn_rnn``, and its backward as ``_cudnn_rnn_backward``; a CPU has no
  fused GRU or RNN layer and decomposes every time step into GEMMs,
  ``unsafe_split`` and pointwise ops (thousands of ops for a sequence of a
  few hundred). The trace calls ``_cudnn_rnn`` as ATen's cuDNN path does
  (weights as one flat buffer; under CUDA's autocast, input, state and
  weights in its dtype, as ``AutocastRNN.cpp`` casts them), which lowers to
  one recurrent row per layer and direction. ``_cudnn_rnn_backward`` has no
  shape function in torch; `_cudnn_rnn_backward_meta` is registered as its
  Meta kernel (its gradients have the shapes of what they differentiate).
  LSTMs already trace as oneDNN's layer kernel (``mkldnn_rnn_layer``) on a
  CPU, and packed sequences take the CPU path, both left alone.
- ``lstm_cell``, ``gru_cell`` (``nn.LSTMCell``, ``nn.GRUCell``, stepped from
  Python): on a GPU ATen's cell computes the two gate GEMMs
  (``x @ W_ih^T``, ``h @ W_hh^T``, no bias) and hands them to one fused
  pointwise kernel, ``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell``
  (biases, gates and state in one pass), whose backward is one kernel too
  plus the biases' column sums. A CPU adds the biases in the GEMMs and runs
  every gate's sigmoid, tanh, product and sum as a kernel of its own, about
  ten forward and twenty backward a step (a Tacotron 2 decoder step has two
  cells). ``rnn_tanh_cell`` and ``rnn_relu_cell`` run decomposed on both,
  and so does an LSTM cell without biases here (torch's shape function for
  the fused LSTM cell reads them).
  The GRU cell's fused kernels have no shape function in torch:
  `_fused_gru_cell_meta` and `_fused_gru_cell_backward_meta` are
  registered as their Meta kernels.
- ``rms_norm`` (``nn.RMSNorm``, ``F.rms_norm``): ATen sends it to
  ``_fused_rms_norm``, on a GPU one kernel (layer norm's, without the mean)
  and ``_fused_rms_norm_backward`` (the input's gradient and the weight's
  column sum), except for channels-last or complex input or a weight of
  another dtype, which take the composite. A CPU build has no such kernel:
  its ``_fused_rms_norm`` decomposes into a power, a mean, an add, a rsqrt
  and two products, forward, and their gradients. The trace records the
  GPU's op as `predictor.fused_ops.fused_rms_norm`
  (``predictor::_fused_rms_norm``, whose gradient is ATen's
  ``_fused_rms_norm_backward``). CUDA's autocast runs
  ``rms_norm`` in fp32; so does the trace under amp.
- ``group_norm`` (``nn.GroupNorm``) of a channels-last input: ATen's CUDA
  ``native_group_norm`` makes its input contiguous (NCHW) and writes an
  NCHW output, where a CPU build keeps the channels-last format
  (``group_norm.cpp``: ``X.device().is_cpu() ? X.suggest_memory_format() :
  Contiguous``). The trace makes the same copy, so the norm's output and
  what follows it (the activation, the next convolution's copy back into
  channels-last: ``families._format_copies``) are in the format a GPU has
  them in. A channels-last diffusion UNet pays two copies a group norm.
- ``conv2d``, ``conv3d`` (and their transposes) of an NCHW input with a
  channels-last filter: cuDNN's convolution runs channels-last when its
  input or its filter is (``cudnn_conv_suggest_memory_format``), so ATen
  copies the input into channels-last and writes a channels-last output.
  The shape function of a convolution on CPU tensors follows the input
  alone (``torch._meta_registrations``' ``pick_memory_format``): the trace
  would carry NCHW on through the model. The trace copies the input as
  ATen does (a strided copy, priced as one), so the output and what reads
  it are channels-last, as on the GPU.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode

from predictor.fused_ops import fused_rms_norm
from predictor.lowering import is_channels_last

_DROPOUTS = (F.dropout, torch.dropout)
# torch.gru / rnn_tanh / rnn_relu (nn.GRU, nn.RNN call them as torch._VF.*) and
# cuDNN's mode for each (cudnnRNNMode_t).
_RNNS = {torch.gru: 3, torch.rnn_tanh: 1, torch.rnn_relu: 0}
# The arguments of their `.input` overloads (and torch.lstm's), in order.
RNN_ARGS = ("input", "hx", "params", "has_biases", "num_layers", "dropout", "train",
            "bidirectional", "batch_first")


def _cudnn_rnn_backward_meta(input, weight, weight_stride0, weight_buf, hx, cx, output,
                             grad_output, grad_hy, grad_cy, mode, hidden_size, proj_size,
                             num_layers, batch_first, dropout, train, bidirectional,
                             batch_sizes, dropout_state, reserve, output_mask):
    """Shapes of ``_cudnn_rnn_backward``'s outputs: each gradient has the shape of
    what it differentiates (undefined where `output_mask` leaves it out)."""
    dx = input.new_empty(input.shape) if output_mask[0] else None
    dhx = hx.new_empty(hx.shape) if output_mask[1] else None
    dcx = cx.new_empty(cx.shape) if output_mask[2] and cx is not None else None
    dw = [w.new_empty(w.shape) for w in weight] if output_mask[3] else []
    return dx, dhx, dcx, dw


def _fused_gru_cell_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """Shapes of ``_thnn_fused_gru_cell``'s outputs: the new state, and the
    workspace its backward reads (five [batch, hidden] slices: the reset,
    update and new gates, the hidden gates' new-gate part and the state)."""
    return hx.new_empty(hx.shape), hx.new_empty((hx.shape[0], 5 * hx.shape[1]))


def _fused_gru_cell_backward_meta(grad_hy, workspace, has_bias):
    """Shapes of ``_thnn_fused_gru_cell_backward``'s outputs: both gates'
    gradients, the state's, and (with biases) the biases' sums of them."""
    batch, hidden = grad_hy.shape
    gates = grad_hy.new_empty((batch, 3 * hidden))
    bias = grad_hy.new_empty((3 * hidden,)) if has_bias else None
    return gates, grad_hy.new_empty((batch, 3 * hidden)), grad_hy.new_empty(grad_hy.shape), \
        bias, None if bias is None else grad_hy.new_empty((3 * hidden,))


def _register_meta(name: str, fn) -> None:
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "Meta"):
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl(name, fn, "Meta")
    _LIBS.append(lib)  # a Library unregisters its kernels when collected


_LIBS: list = []
_register_meta("_cudnn_rnn_backward", _cudnn_rnn_backward_meta)
_register_meta("_thnn_fused_gru_cell", _fused_gru_cell_meta)
_register_meta("_thnn_fused_gru_cell_backward", _fused_gru_cell_backward_meta)


def _cudnn_rnn(mode: int, args: tuple, kwargs: dict, amp_dtype):
    """``torch.gru`` / ``rnn_tanh`` / ``rnn_relu`` on padded input as CUDA runs it
    (one ``_cudnn_rnn``), or None where that does not apply (a packed
    sequence, real tensors)."""
    if len(args) + len(kwargs) != len(RNN_ARGS) or "batch_sizes" in kwargs:
        return None
    v = {**dict(zip(RNN_ARGS, args)), **kwargs}
    x, hx, params = v["input"], v["hx"], v["params"]
    if not isinstance(params, (list, tuple)) or not params \
            or not all(isinstance(t, FakeTensor) for t in (x, hx, *params)):
        return None
    if amp_dtype is not None and torch.is_autocast_enabled("cpu") and x.is_floating_point():
        x, hx = x.to(amp_dtype), hx.to(amp_dtype)
        params = [w.to(amp_dtype) for w in params]
    params = list(params)
    hidden = hx.shape[-1]
    # The weights as one flat buffer (cuDNN's), allocated, not copied: on a GPU
    # the module's weights are views into it.
    buf = params[0].new_empty((sum(w.numel() for w in params),))
    out = torch.ops.aten._cudnn_rnn(
        x, params, 4 if v["has_biases"] else 2, buf, hx, None, mode, hidden, 0,
        int(v["num_layers"]), bool(v["batch_first"]), float(v["dropout"]), bool(v["train"]),
        bool(v["bidirectional"]), [], None)
    return out[0], out[1]


# torch.lstm_cell / gru_cell (nn.LSTMCell, nn.GRUCell call them as torch._VF.*)
# and the arguments of their schema, in order.
_CELLS = (torch.lstm_cell, torch.gru_cell)
CELL_ARGS = ("input", "hx", "w_ih", "w_hh", "b_ih", "b_hh")


def _fused_cell(func, args: tuple, kwargs: dict):
    """``torch.lstm_cell`` / ``gru_cell`` as ATen's CUDA cell runs it (two gate
    GEMMs, one fused pointwise kernel), or None where that does not apply
    (real tensors)."""
    v = {**dict(zip(CELL_ARGS, args)), **kwargs}
    x, hx = v.get("input"), v.get("hx")
    state = list(hx) if func is torch.lstm_cell and isinstance(hx, (list, tuple)) else [hx]
    if not all(isinstance(t, FakeTensor) for t in (x, v.get("w_ih"), v.get("w_hh"), *state)):
        return None
    if func is torch.lstm_cell and v.get("b_ih") is None:
        return None  # torch's shape function for the fused LSTM cell needs its biases
    igates = torch.matmul(x, v["w_ih"].t())
    hgates = torch.matmul(state[0], v["w_hh"].t())
    if func is torch.lstm_cell:
        hy, cy, _ = torch.ops.aten._thnn_fused_lstm_cell(igates, hgates, state[1],
                                                         v.get("b_ih"), v.get("b_hh"))
        return hy, cy
    return torch.ops.aten._thnn_fused_gru_cell(igates, hgates, state[0], v.get("b_ih"),
                                               v.get("b_hh"))[0]


# ATen's CUDA build routes rms_norm to its fused kernel from torch 2.8 on (the
# release that added _fused_rms_norm); before, the composite runs there too.
_RMS_NORMS = (F.rms_norm, torch.rms_norm) if hasattr(torch.ops.aten, "_fused_rms_norm") else ()


def _rms_norm(args: tuple, kwargs: dict, amp_dtype):
    """``rms_norm`` as ATen's CUDA build runs it (`fused_rms_norm`), or None
    where the composite runs there too (channels-last or complex input, a
    weight of another dtype) or the tensors are real."""
    names = ("input", "normalized_shape", "weight", "eps")
    v = {**dict(zip(names, args)), **kwargs}
    x, w = v.get("input"), v.get("weight")
    if not isinstance(x, FakeTensor) or (w is not None and not isinstance(w, FakeTensor)):
        return None
    if x.is_complex() or not x.is_floating_point():
        return None
    if is_channels_last(x):
        return None
    if amp_dtype is not None and torch.is_autocast_enabled("cpu"):
        # CUDA's autocast runs rms_norm in fp32 (autocast_mode.cpp's fp32 list)
        x = x.float()
        w = None if w is None else w.float()
    if w is not None and w.dtype != x.dtype:
        return None
    shape = v["normalized_shape"]
    shape = [int(shape)] if isinstance(shape, int) else [int(d) for d in shape]
    eps = v.get("eps")
    return fused_rms_norm(x, shape, w, None if eps is None else float(eps))[0]


_GROUP_NORMS = (F.group_norm, torch.group_norm)


def _group_norm(func, args: tuple, kwargs: dict):
    """A group norm of a channels-last fake input as the CUDA build runs it,
    on an NCHW copy; None for any other input."""
    x = args[0] if args else kwargs.get("input")
    if not isinstance(x, FakeTensor) or not is_channels_last(x):
        return None
    if args:
        return func(x.contiguous(), *args[1:], **kwargs)
    return func(**{**kwargs, "input": x.contiguous()})


_CONVS = (torch.conv2d, torch.conv3d, torch.conv_transpose2d, torch.conv_transpose3d)


def strides_like_channels_last(t: Any) -> bool:
    """c10's ``is_strides_like_channels_last`` for a 4-D or 5-D tensor: the
    order of its strides is channels-last, size-1 dims included. It is how
    ATen tells a channels-last 1x1 filter (strides C, 1, C, C) from an NCHW
    one (C, 1, 1, 1), though both hold their bytes alike; and how it picks
    the memory format of a convolution (``suggest_memory_format``)."""
    if not isinstance(t, torch.Tensor) or t.dim() not in (4, 5):
        return False
    try:
        sizes, strides = t.shape, t.stride()
    except (RuntimeError, NotImplementedError):   # tensors without strides
        return False
    least = 0
    for d in ((1, 3, 2, 0) if t.dim() == 4 else (1, 4, 3, 2, 0)):
        if sizes[d] == 0 or strides[d] < least:
            return False
        if d == 0 and least == strides[1]:
            return False
        least = strides[d] * (sizes[d] if sizes[d] > 1 else 1)
    return True


def _conv(func, args: tuple, kwargs: dict):
    """A convolution of an NCHW fake input with a channels-last filter, on a
    channels-last copy of the input as ATen's cuDNN path makes; None
    otherwise."""
    x = args[0] if args else kwargs.get("input")
    w = args[1] if len(args) > 1 else kwargs.get("weight")
    if not isinstance(x, FakeTensor) or not isinstance(w, torch.Tensor) or x.dim() not in (4, 5):
        return None
    if strides_like_channels_last(x) or not strides_like_channels_last(w) or x.shape[1] <= 1:
        return None
    fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    x = x.contiguous(memory_format=fmt)
    if args:
        return func(x, *args[1:], **kwargs)
    return func(**{**kwargs, "input": x})


def _dropout_args(func, args: tuple, kwargs: dict) -> tuple:
    """(input, p, training, inplace) of an F.dropout / torch.dropout call."""
    names = ("input", "p", "training", "inplace") if func is F.dropout else ("input", "p", "train")
    v = {**dict(zip(names, args)), **kwargs}
    return v.get("input"), v.get("p", 0.5), v.get("training", v.get("train", True)), \
        v.get("inplace", False)


class CudaPaths(TorchFunctionMode):
    """Route device-dependent composite ops to their CUDA implementation.
    `amp_dtype`: the dtype of the trace's CUDA autocast, if any."""

    def __init__(self, amp_dtype=None):
        super().__init__()
        self.amp_dtype = amp_dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _RNNS:
            out = _cudnn_rnn(_RNNS[func], args, kwargs, self.amp_dtype)
            if out is not None:
                return out
        if func in _RMS_NORMS:
            out = _rms_norm(args, kwargs, self.amp_dtype)
            if out is not None:
                return out
        if func in _GROUP_NORMS:
            out = _group_norm(func, args, kwargs)
            if out is not None:
                return out
        if func in _CONVS:
            out = _conv(func, args, kwargs)
            if out is not None:
                return out
        if func in _CELLS:
            out = _fused_cell(func, args, kwargs)
            if out is not None:
                return out
        if func in _DROPOUTS:
            x, p, training, inplace = _dropout_args(func, args, kwargs)
            if (isinstance(x, torch.Tensor) and training and not inplace
                    and isinstance(p, (int, float)) and 0.0 < float(p) < 1.0 and x.numel() > 0):
                return torch.ops.aten.native_dropout(x, float(p), True)[0]
        return func(*args, **kwargs)
