"""Trace a training step under CUDA's autocast policy on fake CPU tensors.

What people train with is ``torch.autocast("cuda", dtype=torch.bfloat16)`` (or
float16 with a ``GradScaler``): each aten op gets the dtype autocast's policy
gives it. The trace runs on fake *CPU* tensors, and CPU autocast has a
different policy (it leaves softmax and layer norm in half precision and casts
ops CUDA leaves alone), while CUDA autocast's kernels only cast tensors that
live on a GPU. So ``CudaAutocast`` registers, for the duration of a trace,
Python kernels at the ``AutocastCPU`` dispatch key of every aten op that has
an autocast kernel on either device, each applying *CUDA's* rule for the op
(``aten/src/ATen/autocast_mode.cpp``, ``KERNEL_CUDA`` lists):

- lower precision: matmuls, convolutions, attention, RNN cells run in the
  autocast dtype (floating inputs cast to it);
- fp32: layer/group/rms norm, losses, exp/log/pow and friends, upsampling run
  in fp32 (half inputs cast up);
- fp32 with an output dtype: softmax, log_softmax, sum, prod, cumsum, cumprod,
  vector/matrix norms get ``dtype=torch.float32`` when the caller gave none;
- promote: ops mixing inputs (addcmul, index_put, ...) run in the widest
  floating dtype among them;
- banned: ``binary_cross_entropy`` (autocast refuses it; use the logits form);
- every other op with a CPU autocast kernel runs untouched, as on CUDA (a
  composite op, such as ``cross_entropy_loss``, by its decomposition, so that
  its parts meet the policy: the log_softmax in fp32).

Casts are ``aten._to_copy`` nodes in the graph, so they are priced as the
kernels they are, and autograd records their backward (the cast of a half
gradient back to fp32). As autocast does, a cast of an fp32 leaf that
requires grad (a parameter) to the autocast dtype is made once per region and
reused (the weight-cast cache): one cast kernel per parameter per iteration.
Doubles are never cast. Ops outside ``aten`` (torchvision's, for instance)
are not covered.

The registrations are process-wide while a trace runs; the region of the step
that autocast covers (forward and loss) is entered with ``region()``.

``GradScaler`` (fp16): the loss is multiplied by the scale before backward,
``_amp_foreach_non_finite_check_and_unscale_`` unscales every gradient and
``_amp_update_scale_`` updates the scale after the optimizer step, as
``torch.amp.GradScaler`` runs them. The optimizer reads the found-inf flag on
the host (``.item()``): that synchronisation is not modelled.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from predictor.errors import InvalidArgumentError
from predictor.frontend import float8
from predictor.frontend.cuda_paths import RNN_ARGS

# fp8: bf16 autocast with every eligible nn.Linear in float8 (torchao's
# tensorwise recipe, predictor.frontend.float8).
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16",
           "half": "fp16", "fp8": "fp8", "float8": "fp8"}

# CUDA's autocast policy per aten op ("name" or "name.overload"), from
# aten/src/ATen/autocast_mode.cpp (KERNEL_CUDA / AT_FORALL_* lists).
LOWER = (
    "_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "cudnn_convolution", "cudnn_convolution_transpose", "prelu", "addmm", "addmv", "addr",
    "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm",
    "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "group_norm", "rms_norm",
    "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist",
    "renorm", "logsumexp", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
    "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)
# softmax/log_softmax with dtype=float32 on an fp16 input: on CUDA, one kernel
# with half_to_float=True (aten/src/ATen/native/SoftMax.cpp); a bf16 input is
# converted to fp32 first.
HALF_TO_FLOAT = {"softmax.int": torch.ops.aten._softmax.default,
                 "log_softmax.int": torch.ops.aten._log_softmax.default}
# norm without a dtype argument: CUDA calls the overload that takes one, with fp32.
APPEND_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype",
                "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
           "index_put", "tensordot", "scatter_add")
BANNED = ("binary_cross_entropy",)
# Registered by CUDA builds outside autocast_mode.cpp (aten/src/ATen/cudnn/
# AutocastRNN.cpp casts a cuDNN RNN's input and weights to half): the CPU
# trace records aten.lstm, which cuDNN runs as _cudnn_rnn.
LOWER_CUDA_BUILD = ("lstm.input", "gru.input", "rnn_tanh.input", "rnn_relu.input")

_KEY = torch._C.DispatchKey.AutocastCPU
_LOCK = threading.Lock()


def check(amp: Any) -> str | None:
    """The canonical name of an ``amp=`` argument ("bf16", "fp16", "fp8" or None)."""
    if amp is None:
        return None
    key = str(amp).replace("torch.", "").strip().lower()
    if key in ("none", "off", "fp32", "float32", ""):
        return None
    if key not in ALIASES:
        raise InvalidArgumentError(f"unknown amp {amp!r}; choose bf16, fp16, fp8 or none")
    return ALIASES[key]


def policy() -> dict[str, str]:
    """CUDA's autocast rule per aten op name ("lower", "fp32", "set_opt_dtype",
    "append_dtype", "promote", "banned")."""
    out: dict[str, str] = {}
    for names, rule in ((LOWER, "lower"), (LOWER_CUDA_BUILD, "lower"), (FP32, "fp32"),
                        (SET_OPT_DTYPE, "set_opt_dtype"), (tuple(APPEND_DTYPE), "append_dtype"),
                        (PROMOTE, "promote"), (BANNED, "banned")):
        for n in names:
            out[n] = rule
    return out


def _op(name: str):
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def _eligible(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64


class CudaAutocast:
    """CUDA's autocast policy on CPU tensors, for one trace (a context manager);
    `region()` is the ``with torch.autocast("cuda", dtype)`` block."""

    def __init__(self, amp: str):
        self.amp = check(amp)
        if self.amp is None:
            raise InvalidArgumentError("CudaAutocast needs amp='bf16', 'fp16' or 'fp8'")
        self.dtype = AMP_DTYPES[self.amp]
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._lib = None

    # ---- casts ---------------------------------------------------------------
    def _cast(self, x: Any, to: torch.dtype) -> Any:
        if isinstance(x, (list, tuple)):
            return type(x)(self._cast(i, to) for i in x)
        if not _eligible(x) or x.dtype == to:
            return x
        cacheable = (to == self.dtype and x.dtype == torch.float32 and x.requires_grad
                     and x.is_leaf and not x._is_view())
        if cacheable:
            hit = self._cache.get(id(x))
            if hit is not None and hit[0] is x:
                return hit[1]
        y = x.to(to)
        if cacheable:
            self._cache[id(x)] = (x, y)
        return y

    def _widest(self, args: tuple, kwargs: dict) -> torch.dtype:
        out = self.dtype
        for x in list(args) + list(kwargs.values()):
            for t in (x if isinstance(x, (list, tuple)) else (x,)):
                if _eligible(t):
                    out = torch.promote_types(out, t.dtype)
        return out

    def _kernel(self, name: str, rule: str):
        op = _op(name)
        exclude = torch._C.DispatchKeySet(_KEY)
        schema_args = [a.name for a in op._schema.arguments]
        dtype_pos = schema_args.index("dtype") if "dtype" in schema_args else None
        dtype_kwarg_only = dtype_pos is not None and op._schema.arguments[dtype_pos].kwarg_only
        target = _op(APPEND_DTYPE[name]) if rule == "append_dtype" else op

        composite = torch._C._dispatch_has_kernel_for_dispatch_key(
            op.name(), "CompositeImplicitAutograd")

        def kernel(*args, **kwargs):
            if rule == "none" and composite:
                # No CUDA rule: autocast falls through, and the ops the
                # composite is made of meet the policy one by one.
                return op.decompose(*args, **kwargs)
            with torch._C._ExcludeDispatchKeyGuard(exclude):
                if name == "linear" and self.amp == "fp8":
                    v = {**dict(zip(("input", "weight", "bias"), args)), **kwargs}
                    if float8.eligible(v["weight"]):
                        # The fp32 master weight goes to float8 directly: no bf16 copy.
                        return float8.linear(self._cast(v["input"], self.dtype), v["weight"],
                                             self._cast(v.get("bias"), self.dtype))
                if rule == "lower":
                    args, kwargs = self._cast(args, self.dtype), {
                        k: self._cast(v, self.dtype) for k, v in kwargs.items()}
                    if name == "lstm.input":
                        fused = _lstm_layers(args, kwargs)
                        if fused is not None:
                            return fused
                    if name in LOWER_CUDA_BUILD and self.dtype == torch.float16:
                        # The CPU has no fp16 LSTM layer kernel to trace (oneDNN's
                        # needs AMX-FP16 and no grad): trace the bf16 one, which
                        # has the same shapes and element width, through free
                        # bitcast views, so the graph keeps fp16 around it.
                        return _bitcast(op(*_bitcast(args, torch.bfloat16),
                                           **_bitcast(kwargs, torch.bfloat16)),
                                        torch.float16)
                elif rule == "fp32":
                    args, kwargs = self._cast(args, torch.float32), {
                        k: self._cast(v, torch.float32) for k, v in kwargs.items()}
                elif rule == "promote":
                    to = self._widest(args, kwargs)
                    args, kwargs = self._cast(args, to), {
                        k: self._cast(v, to) for k, v in kwargs.items()}
                elif rule == "set_opt_dtype":
                    if args and _eligible(args[0]):
                        given = (args[dtype_pos] if not dtype_kwarg_only
                                 and len(args) > dtype_pos else kwargs.get("dtype"))
                        if given is None and name in HALF_TO_FLOAT \
                                and args[0].dtype == torch.float16:
                            # CUDA's softmax(x, dim, dtype=float32) on fp16 runs one
                            # kernel that reads fp16 and writes fp32 (half_to_float):
                            # no cast (the CPU decomposition would record one).
                            dim = args[1] if len(args) > 1 else kwargs["dim"]
                            return HALF_TO_FLOAT[name](args[0], dim, True)
                        if given is None:
                            if not dtype_kwarg_only and len(args) > dtype_pos:
                                args = args[:dtype_pos] + (torch.float32,) + args[dtype_pos + 1:]
                            else:
                                kwargs = {**kwargs, "dtype": torch.float32}
                elif rule == "append_dtype":
                    if args and _eligible(args[0]):
                        return target(*args, **kwargs, dtype=torch.float32)
                elif rule == "banned":
                    raise InvalidArgumentError(
                        f"aten.{name} is unsafe to autocast (torch refuses it under CUDA "
                        "autocast); use binary_cross_entropy_with_logits / BCEWithLogitsLoss")
                return op(*args, **kwargs)

        return kernel

    # ---- registration ----------------------------------------------------------
    def __enter__(self) -> "CudaAutocast":
        _LOCK.acquire()
        try:
            rules = policy()
            names = [n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names()
                     if n.startswith("aten::")
                     and torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastCPU")]
            lib = torch.library.Library("aten", "IMPL")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
                for name in sorted(set(names) | set(rules)):
                    if not _has_op(name):
                        continue
                    lib.impl(name, self._kernel(name, rules.get(name, "none")), "AutocastCPU")
            self._lib = lib
        except BaseException:
            _LOCK.release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._lib is not None:
                self._lib._destroy()
                self._lib = None
            self._cache.clear()
        finally:
            _LOCK.release()

    @contextlib.contextmanager
    def region(self):
        """The autocast-enabled part of the step (forward and loss)."""
        self._cache.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            try:
                yield
            finally:
                self._cache.clear()


class _Bitcast(torch.autograd.Function):
    """A same-width dtype view (no kernel) whose gradient is the view back."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.src = x.dtype
        return x.view(dtype)

    @staticmethod
    def backward(ctx, g):
        return g.view(ctx.src), None


def _bitcast(x: Any, dtype: torch.dtype) -> Any:
    """Floating 2-byte tensors in `x` (nested lists, tuples, dicts) viewed as `dtype`."""
    if isinstance(x, dict):
        return {k: _bitcast(v, dtype) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_bitcast(i, dtype) for i in x)
    if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16) \
            and x.dtype != dtype:
        return _Bitcast.apply(x, dtype)
    return x


_LSTM_MODE = 2  # oneDNN's (and cuDNN's) code for an LSTM cell


def _lstm_layers(args: tuple, kwargs: dict):
    """``aten.lstm.input`` in half precision as one LSTM-layer kernel per layer
    and direction (``aten.mkldnn_rnn_layer``, what the trace lowers to cuDNN's
    LSTM), or None where this does not apply (real tensors, projections).

    ATen's CPU ``lstm`` takes oneDNN's per-layer kernel for fp32 always, but for
    bf16 only where the CPU has oneDNN's bf16 kernels (AVX-512 BF16 or AMX) and
    for fp16 only without grad; elsewhere it decomposes each time step into
    GEMMs, ``unsafe_split`` and pointwise ops, a program a GPU never runs. On
    fake tensors the kernel takes any dtype, so the trace calls it the way
    ATen's oneDNN path does (``aten/src/ATen/native/mkldnn/RNN.cpp``,
    ``mkldnn_impl``): time-major contiguous input, the layers in turn, the
    directions concatenated, dropout between layers (one fused kernel, as CUDA
    runs it), the final states stacked. The same graph on every CPU."""
    v = {**dict(zip(RNN_ARGS, args)), **kwargs}
    x, hx, params = v["input"], list(v["hx"]), list(v["params"])
    layers, dirs = int(v["num_layers"]), 2 if v["bidirectional"] else 1
    biases, train, batch_first = bool(v["has_biases"]), bool(v["train"]), bool(v["batch_first"])
    p = float(v["dropout"])
    per = 4 if biases else 2
    tensors = [x, *hx, *params]
    if len(hx) != 2 or len(params) != layers * dirs * per \
            or not all(isinstance(t, FakeTensor) for t in tensors):
        return None
    h0, c0 = hx
    hidden = h0.shape[-1]
    if batch_first:
        x = x.transpose(0, 1)
    x = x.contiguous()
    hy, cy = [], []
    for layer in range(layers):
        outs = []
        for d in range(dirs):
            i = layer * dirs + d
            w = params[i * per:(i + 1) * per]
            if not biases:
                w = [*w, w[0].new_zeros(w[0].shape[0]), w[0].new_zeros(w[0].shape[0])]
            out, h, c, _ = torch.ops.aten.mkldnn_rnn_layer(
                x, w[0], w[1], w[2], w[3], h0[i], c0[i], d > 0, [], _LSTM_MODE, hidden,
                layers, biases, dirs == 2, batch_first, train)
            outs.append(out)
            hy.append(h)
            cy.append(c)
        x = outs[0] if dirs == 1 else torch.cat(outs, -1)
        if train and 0.0 < p < 1.0 and layer < layers - 1:
            x = torch.ops.aten.native_dropout(x, p, True)[0]
    if batch_first:
        x = x.transpose(0, 1)
    return x, torch.stack(hy, 0), torch.stack(cy, 0)


def _has_op(name: str) -> bool:
    try:
        _op(name)
    except (AttributeError, RuntimeError):
        return False
    return True


# ---- GradScaler (fp16) -----------------------------------------------------------
# torch.amp.GradScaler's defaults: init_scale 2**16, growth_factor 2,
# backoff_factor 0.5, growth_interval 2000.
INIT_SCALE = 2.0 ** 16


def scaler_state() -> tuple[torch.Tensor, torch.Tensor]:
    """The scaler's scale and growth tracker (made outside the step, as a real
    scaler's are after its first step)."""
    return torch.full((), INIT_SCALE, dtype=torch.float32), torch.zeros((), dtype=torch.int32)


def scale_loss(loss: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``scaler.scale(loss)``: one multiply."""
    return loss * scale


def unscale(grads: list[torch.Tensor], scale: torch.Tensor) -> torch.Tensor:
    """``scaler.unscale_``: the inverse scale, a found-inf flag, and one
    multi-tensor kernel that checks and unscales every gradient in place."""
    inv_scale = scale.double().reciprocal().float()
    found_inf = torch.full((), 0.0, dtype=torch.float32)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group in by_dtype.values():
        torch._amp_foreach_non_finite_check_and_unscale_(group, found_inf, inv_scale)
    return found_inf


def update_scale(scale: torch.Tensor, growth_tracker: torch.Tensor,
                 found_inf: torch.Tensor) -> None:
    """``scaler.update()``: one small kernel."""
    torch._amp_update_scale_(scale, growth_tracker, found_inf, 2.0, 0.5, 2000)
